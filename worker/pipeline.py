"""One compaction job, step by step: lease → breaker → snapshot → plan → summarize →
validate → swap. Every path ends in one :class:`JobResult`; on any failure nothing is
written but the run record and the breaker update. Correctness rests on the store's
compare-and-swap of the active revision; the lease only saves wasted work.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any

from db import BreakerUpdate, NewRevision, Snapshot
from db import errors as store_errors
from worker.compaction.breaker import Breaker, BreakerState, admit, breaker_after_failure
from worker.compaction.grouping import group_messages
from worker.compaction.identifiers import extract_identifiers
from worker.compaction.messages import StoredMessage, parse_message
from worker.compaction.plan import Boundary, decide_compaction, plan_boundary
from worker.compaction.pruning import prune_groups
from worker.compaction.schema import Summary, render_summary_block, summary_block_message
from worker.compaction.strategies import apply_strategy
from worker.compaction.validation import validate_summary
from worker.errors import (
    BreakerOpen,
    BreakerScope,
    CompactionError,
    InternalError,
    JobRejected,
    LeaseHeld,
    Outcome,
    ProviderBreakerOpen,
    StaleSnapshot,
    TransientError,
)
from worker.job import JobContext, JobDeps, JobPolicy, JobRequest, JobResult, Skip
from worker.summarizers import Summarizer, SummaryDraft, SummaryWork


def run(request: JobRequest, deps: JobDeps, policy: JobPolicy) -> JobResult:
    """Run one job to its outcome; never raises a :class:`CompactionError`."""
    ctx = JobContext.start(request, deps)
    try:
        with ctx.step("lease"):
            _take_lease(ctx, policy)
        try:
            return _compact(ctx, policy)
        finally:
            # A release that fails must not turn a committed swap into a failure: the
            # lease then expires after lease_ttl_s (a redelivery takes it over at once).
            with contextlib.suppress(store_errors.StoreError):
                deps.store.release_lease(request.session_id, ctx.owner)
    except Skip as skip:
        return _finish(ctx, Outcome.SKIPPED, skip.reason)
    except CompactionError as exc:
        return _fail(ctx, policy, exc)
    except store_errors.SessionNotFound as exc:
        return _fail(ctx, policy, JobRejected(str(exc), reason="unknown_session"))
    except store_errors.StoreUnavailable as exc:
        return _fail(ctx, policy, _transient_store_error(exc))
    except Exception as exc:
        # Only the class: an exception's text may quote message contents.
        return _fail(ctx, policy, InternalError(f"unexpected {type(exc).__name__}",
                                               reason="internal_error"))


def record_failure(request: JobRequest, deps: JobDeps, policy: JobPolicy,
                   exc: CompactionError) -> JobResult:
    """End a job that must not run (rejected message, delivery cap) with its outcome."""
    return _fail(JobContext.start(request, deps), policy, exc)


def _take_lease(ctx: JobContext, policy: JobPolicy) -> None:
    """Take the session's lease; a redelivery takes over the one its lost delivery left."""
    store, session_id, now = ctx.deps.store, ctx.request.session_id, ctx.deps.clock()
    if store.acquire_lease(session_id, ctx.owner, policy.lease_ttl_s, now):
        return
    holder = store.get_session(session_id).lease_owner
    # Owners end in the task id, so this holder is an earlier delivery of this message. Were
    # it still alive, it would find its lease gone at the swap and write nothing.
    if (ctx.request.redelivered and holder and holder.endswith(f":{ctx.request.task_id}")
            and store.release_lease(session_id, holder)
            and store.acquire_lease(session_id, ctx.owner, policy.lease_ttl_s, now)):
        return
    raise LeaseHeld("another job holds this session's lease", reason="lease_held")


def _compact(ctx: JobContext, policy: JobPolicy) -> JobResult:
    summarizer, open_breaker = _check_breakers(ctx, policy)
    with ctx.step("snapshot"):
        snapshot = ctx.deps.store.snapshot(ctx.request.session_id)
    with ctx.step("plan"):
        boundary = _plan(ctx, policy, snapshot)
    with ctx.step("summarize"):
        work = _summary_work(ctx, policy, snapshot, boundary)
        draft = summarizer.summarize(work)
        ctx.record_draft(draft)
    with ctx.step("validate"):
        revision = _validated_revision(ctx, policy, snapshot, boundary, work, draft)
    if summarizer.uses_provider:
        ctx.deps.provider_breaker.record_success()
    outcome = _success_outcome(ctx, draft, open_breaker is not None)
    with ctx.step("swap"):
        revision_id = _swap(ctx, snapshot, revision, outcome, draft, open_breaker)
    ctx.revision_id, ctx.parent_revision_id = revision_id, snapshot.session.active_revision_id
    ctx.breaker_state = (open_breaker.state if open_breaker else BreakerState.CLOSED).value
    return ctx.result(outcome, reason=str(ctx.figures["decision"]))


def _check_breakers(ctx: JobContext, policy: JobPolicy) -> tuple[Summarizer, Breaker | None]:
    """Pick the summarizer the breakers allow; raise when the job must not run.

    Returns the session's breaker too when it is open (a fallback commit keeps it so).
    """
    with ctx.step("breaker"):
        session = ctx.deps.store.get_session(ctx.request.session_id)
        ctx.breaker_state = session.breaker_state
        breaker = _session_breaker(session)
        admission = admit(breaker, ctx.deps.clock(), policy.breaker_cooldown_s)
        if not admission.allowed:
            if not policy.fallback_when_open:
                raise BreakerOpen("the session's breaker is open", reason="breaker_open")
            return ctx.deps.fallback, breaker
        if admission.breaker != breaker:  # the trial after the cooldown: record half-open
            ctx.deps.store.set_breaker(ctx.request.session_id, _breaker_update(admission.breaker))
            ctx.breaker_state = admission.breaker.state.value
        summarizer = ctx.deps.summarizer
        if summarizer.uses_provider and not ctx.deps.provider_breaker.admit():
            if not policy.fallback_when_open:
                raise ProviderBreakerOpen("the provider breaker is open",
                                          reason="provider_breaker_open")
            ctx.fallback_reason = "provider_breaker_open"
            return ctx.deps.fallback, None
        return summarizer, None


def _plan(ctx: JobContext, policy: JobPolicy, snapshot: Snapshot) -> Boundary:
    revision = snapshot.revision
    stored = [StoredMessage(m.seq, parse_message(m.body), m.tokens) for m in snapshot.messages]
    block_tokens = revision.summary_tokens if revision else 0
    tokens_before = sum(m.tokens for m in stored) + block_tokens
    ctx.figures["tokens_before"] = tokens_before
    decision = decide_compaction(tokens_before, _recent_savings(ctx), policy.trigger,
                                 ctx.request.force)
    ctx.figures["decision"] = decision.reason
    if not decision.compact:
        raise Skip(decision.reason)
    boundary = plan_boundary(
        group_messages(stored),
        prior_through_seq=revision.through_seq if revision else 0,
        summary_tokens=block_tokens,
        policy=policy.trigger,
    )
    if boundary is None or not boundary.span:
        raise Skip("nothing_to_summarize")
    return boundary


def _summary_work(
    ctx: JobContext, policy: JobPolicy, snapshot: Snapshot, boundary: Boundary
) -> SummaryWork:
    span_messages = [m for group in boundary.span for m in group.messages]
    span_tokens = sum(m.tokens for m in span_messages)
    ctx.figures["span_tokens"] = span_tokens
    ctx.figures["span_messages"] = len(span_messages)
    prior = Summary.model_validate(snapshot.revision.summary) if snapshot.revision else None
    span = prune_groups(boundary.span, audit_mode=policy.audit_mode, counter=ctx.deps.counter)
    if policy.span_strategy is not None:
        span = apply_strategy(span, policy.span_strategy, ctx.deps.counter)
    return SummaryWork(
        span=tuple(span),
        prior=prior,
        artifacts=tuple(extract_identifiers(span_messages)),
        span_tokens=span_tokens,
        budget_tokens=policy.summary_budget_tokens,
    )


def _recent_savings(ctx: JobContext) -> list[float]:
    """Share of the projection each of the last compactions saved, newest first."""
    revisions = ctx.deps.store.revisions(ctx.request.session_id)[:2]
    return [1 - r.projection_tokens_after / r.projection_tokens_before
            for r in revisions if r.projection_tokens_before > 0]


@dataclass(frozen=True)
class _Revision:
    summary: Summary
    block: dict[str, Any]
    block_tokens: int
    artifacts: list[dict[str, Any]]
    through_seq: int


def _validated_revision(
    ctx: JobContext, policy: JobPolicy, snapshot: Snapshot, boundary: Boundary,
    work: SummaryWork, draft: SummaryDraft,
) -> _Revision:
    counter = ctx.deps.counter
    artifacts = work.artifacts
    prior_tokens = snapshot.revision.summary_tokens if snapshot.revision else 0
    validated = validate_summary(
        draft.summary.model_dump(mode="json"),
        finish_reason=None,
        span_tokens=int(ctx.figures["span_tokens"]),
        identifiers=[a.value for a in artifacts],
        budget_tokens=policy.summary_budget_tokens,
        replaced_tokens=int(ctx.figures["span_tokens"]) + prior_tokens,
        counter=counter,
        prior=work.prior,
    )
    block = summary_block_message(render_summary_block(validated.summary))
    block_tokens = counter.count_message(parse_message(block))
    ctx.figures["summary_tokens"] = block_tokens
    ctx.figures["identifiers_reattached"] = len(validated.reattached)
    ctx.figures["artifacts"] = len(artifacts)
    ctx.figures["tokens_after"] = boundary.projected_tokens(block_tokens)
    return _Revision(validated.summary, block, block_tokens,
                     [_artifact_dict(a) for a in artifacts], boundary.through_seq)


def _artifact_dict(artifact: Any) -> dict[str, Any]:
    return {"value": artifact.value, "kind": artifact.kind, "count": artifact.count,
            "first_seq": artifact.first_seq}


def _success_outcome(ctx: JobContext, draft: SummaryDraft, open_breaker: bool) -> Outcome:
    if open_breaker:
        return Outcome.BREAKER_OPEN
    if ctx.fallback_reason:
        return Outcome.FALLBACK
    return Outcome.COMPACTED


def _swap(ctx: JobContext, snapshot: Snapshot, revision: _Revision, outcome: Outcome,
          draft: SummaryDraft, open_breaker: Breaker | None) -> int:
    now = ctx.deps.clock()
    new_revision = NewRevision(
        through_seq=revision.through_seq,
        snapshot_head_seq=snapshot.session.head_seq,
        summary=revision.summary.model_dump(mode="json"),
        block=revision.block,
        block_tokens=revision.block_tokens,
        artifacts=revision.artifacts,
        summary_tokens=revision.block_tokens,
        span_tokens=int(ctx.figures["span_tokens"]),
        projection_tokens_before=int(ctx.figures["tokens_before"]),
        model=draft.model,
        prompt_version=draft.prompt_version,
        summarizer=draft.kind,
    )
    try:
        return ctx.deps.store.swap_revision(
            ctx.request.session_id,
            expected_revision_id=snapshot.session.active_revision_id,
            lease_owner=ctx.owner,
            revision=new_revision,
            run=ctx.new_run(outcome, now),
            now=now,
            breaker=_breaker_update(open_breaker) if open_breaker else None,
        )
    except store_errors.RevisionConflict as exc:
        raise StaleSnapshot(str(exc), reason="active_revision_changed") from exc
    except store_errors.LeaseLost as exc:
        raise StaleSnapshot(str(exc), reason="lease_lost") from exc


def _session_breaker(session: Any) -> Breaker:
    return Breaker(state=BreakerState(session.breaker_state), failures=session.breaker_failures,
                   opened_at=session.breaker_opened_at)


def _fail(ctx: JobContext, policy: JobPolicy, exc: CompactionError) -> JobResult:
    """Record the run and the breaker update; nothing else is written."""
    breaker_update = None
    if exc.counts_on is BreakerScope.SESSION:
        breaker_update = _failed_breaker(ctx, policy)
    elif exc.counts_on is BreakerScope.PROVIDER:
        ctx.deps.provider_breaker.record_failure()
    ctx.error = exc
    return _finish(ctx, exc.outcome, exc.reason, breaker=breaker_update)


def _failed_breaker(ctx: JobContext, policy: JobPolicy) -> BreakerUpdate | None:
    try:
        session = ctx.deps.store.get_session(ctx.request.session_id)
    except store_errors.StoreError:
        # Unknown session, or a store that fails: the outcome event must still go out.
        return None
    breaker = breaker_after_failure(_session_breaker(session), ctx.deps.clock(),
                                    policy.breaker_threshold)
    ctx.breaker_state = breaker.state.value
    return _breaker_update(breaker)


def _breaker_update(breaker: Breaker) -> BreakerUpdate:
    return BreakerUpdate(state=breaker.state.value, failures=breaker.failures,
                         opened_at=breaker.opened_at)


def _finish(ctx: JobContext, outcome: Outcome, reason: str,
            breaker: BreakerUpdate | None = None) -> JobResult:
    now = ctx.deps.clock()
    result = ctx.result(outcome, reason=reason)
    try:
        ctx.deps.store.record_run(ctx.new_run(outcome, now, reason=reason), breaker=breaker)
    except store_errors.StoreError as exc:
        # The outcome event still goes out; the missing run row is named in it.
        result = replace(result, run_recorded=False, record_error=str(exc))
    return result


def _transient_store_error(exc: Exception) -> CompactionError:
    return TransientError(f"database unavailable: {exc}", reason="store_unavailable")


