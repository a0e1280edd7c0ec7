"""One compaction job, step by step: lease → breaker → snapshot → plan → summarize →
update (timed as step ``merge``) → validate → swap. Every path ends in one
:class:`JobResult`; on any failure nothing is written but the run record and the
breaker update. Correctness rests on the store's compare-and-swap of the active
revision; the lease only saves wasted work.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from db import (
    BreakerUpdate,
    JobSnapshot,
    NewRevision,
    ParkedJob,
    SnapshotSkipRule,
    StoreError,
)
from worker.compaction import (
    BreakerState,
    Summary,
    TextGrams,
    UpdatedSummary,
    breaker_after_failure,
    featured_values,
    is_bare_number,
    parse_message,
    read_party_turn,
    read_record,
    rerank_featured,
    summary_block_message,
    update_summary,
    validate_summary,
    verbatim_items,
)
from worker.errors import (
    BreakerScope,
    CompactionError,
    LeaseHeld,
    Outcome,
    SummaryInvalid,
    to_job_error,
)
from worker.job import batched
from worker.job.admission import (
    Admitted,
    admit_job,
    admit_provider,
    breaker_update,
    session_breaker,
)
from worker.job.heartbeat import LeaseHeartbeat
from worker.job.outcome import job_span_attributes
from worker.job.planning import (
    RECENT_HISTORY,
    JobPlan,
    SnapshotMessage,
    plan_job,
    prune_span,
    summary_work,
    to_snapshot_message,
)
from worker.job.values import JobDeps, JobPolicy, JobRequest, JobResult, JobTrace, Skip
from worker.summarizers import SummaryDraft, SummaryWork
from worker.tracing.spans import open_span

JOB_SPAN = "compaction.job"
# The validation reason under which a model's summary is replaced by the deterministic one.
CONTRADICTS = "summary_contradicts_history"


@dataclass(frozen=True)
class Revision:
    """A validated summary, rendered and measured, ready to swap in."""

    summary: Summary
    block: dict[str, Any]
    summary_tokens: int


def run(request: JobRequest, deps: JobDeps, policy: JobPolicy) -> JobResult:
    """Run one job to its outcome; never raises. Three store transactions at most: the
    lease with the snapshot (on PostgreSQL one statement), and the one write that ends
    the job."""
    with _collector_paused():
        return _traced(request, lambda: _run(request, deps, policy))


def _traced(request: JobRequest, job: Callable[[], JobResult]) -> JobResult:
    """Run ``job`` inside the job's span (its steps' and LLM calls' parent, the Celery
    task's child), noted with what its outcome event reports."""
    with open_span(JOB_SPAN, {"compaction.session_id": request.session_id,
                              "compaction.task_id": request.task_id}) as span:
        result = job()
        if span.is_recording():
            span.note(job_span_attributes(result))
            if result.outcome in (Outcome.FAILED, Outcome.REJECTED):
                span.fail(result.failure_class or result.reason)
        return result


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Hold the cyclic garbage collector off for one job. A job's objects die by reference
    count when it ends; its allocations would otherwise set off collections that walk
    everything it holds (several full ones on a long snapshot, a noticeable share of the
    job's CPU). The first collection after the job takes any cycles it left."""
    if not gc.isenabled():  # someone else holds it off: leave it to them
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _run(request: JobRequest, deps: JobDeps, policy: JobPolicy) -> JobResult:
    trace = JobTrace(request, started_at=deps.clock())
    # The job's own counter: each distinct line or block is encoded once per job.
    deps = dataclasses.replace(deps, counter=deps.counter.for_job())
    try:
        return _compact(trace, deps, policy)
    except Skip as skip:
        return _finish(trace, deps, Outcome.SKIPPED, skip.reason)
    except Exception as exc:
        return _fail(trace, deps, policy, to_job_error(exc))


def record_failure(request: JobRequest, deps: JobDeps, policy: JobPolicy,
                   exc: CompactionError) -> JobResult:
    """End a job that must not run (rejected message, delivery cap) with its outcome."""
    return _traced(request, lambda: _fail(JobTrace(request, started_at=deps.clock()), deps,
                                           policy, exc))


def _renew_lease(request: JobRequest, deps: JobDeps, policy: JobPolicy) -> bool:
    return deps.store.renew_lease(request.session_id, deps.lease_owner(request),
                                  policy.lease_ttl_s, deps.clock())


def _start(trace: JobTrace, deps: JobDeps, policy: JobPolicy
           ) -> tuple[Admitted, JobPlan, ParkedJob | None]:
    """Take the lease with the snapshot, pass the session's breaker, plan, then pass the
    provider's; only the plan outlives this call (the snapshot's list of messages is
    freed with it). A job the plan skips never takes the provider breaker's one trial."""
    with trace.step("lease"):  # the snapshot too: on PostgreSQL the same statement
        # Set first: a snapshot that fails to read may leave the lease taken.
        trace.lease_tried = True
        snapshot = _take_lease(trace.request, deps, policy)
    park = None
    if deps.batching is not None:  # a parked job resumes as of the head it parked at
        snapshot, park = batched.read_park(deps.batching, snapshot)
    admitted = admit_job(trace, deps, policy, snapshot.session,
                      breaker_refused=snapshot.breaker_refused)
    with trace.step("plan"):
        plan = plan_job(trace, deps, policy, snapshot)
    if admitted.outcome is Outcome.COMPACTED:
        admitted = admit_provider(deps, policy)
    return admitted, plan, park


def _take_lease(request: JobRequest, deps: JobDeps, policy: JobPolicy
                ) -> JobSnapshot[SnapshotMessage]:
    """Take the session's lease and read the job's snapshot (whose session row is the
    one the lease left); a redelivery or a retry takes over the lease an earlier
    delivery or attempt of its message left (owners end in the task id, so that holder
    is an earlier one of this message: a lost delivery, which were it still alive would
    find its lease gone at the swap and write nothing, or an attempt that ended while
    the database was down and could not release it). The messages are left unread
    when the job will not run: a breaker still cooling down skips it (the skip policy),
    a projection under the trigger too (unless forced)."""
    earlier_may_hold = request.redelivered or request.attempt > 1
    now = deps.clock()
    skip_rule = SnapshotSkipRule(
        cooldown_start=None if policy.fallback_when_open
        else now - timedelta(seconds=policy.breaker_cooldown_s),
        trigger_tokens=None if request.force else policy.trigger.trigger_tokens)
    snapshot = deps.store.start_job_with_snapshot(
        request.session_id, deps.lease_owner(request), policy.lease_ttl_s, now,
        take_over=request.task_id if earlier_may_hold else None,
        history=RECENT_HISTORY, to_message=to_snapshot_message, skip_rule=skip_rule)
    if snapshot is None:
        raise LeaseHeld("another job holds this session's lease", reason="lease_held")
    return snapshot


def _compact(trace: JobTrace, deps: JobDeps, policy: JobPolicy) -> JobResult:
    """Lease, plan and summarize, then swap. This frame holds the only reference to the
    plan's stored span (every old tool output in full): it is dropped here once pruned,
    before the artifacts are tallied, and only the pruned span and its mentions stay."""
    admitted, plan, park = _start(trace, deps, policy)
    # The job's last transaction releases the lease; the heartbeat only extends it while
    # this owner still holds it.
    with batched.dropped_on_failure(deps.batching, park, plan.session.session_id), \
            LeaseHeartbeat(lambda: _renew_lease(trace.request, deps, policy),
                           policy.lease_heartbeat_s):
        with trace.step("summarize"):
            span = prune_span(deps, policy, plan)
            mentions, plan = plan.span_mentions, plan.without_span()
            work = summary_work(trace, deps, policy, plan, span, mentions)
            del span, mentions  # the work holds what it needs of them
            drafted = batched.summarize(trace, deps, admitted, plan, work, park)
            if isinstance(drafted, JobResult):  # parked until a batch answers
                return drafted
            admitted, draft = drafted
            trace.summarizer = draft.kind
            trace.record_figures(**dataclasses.asdict(draft.usage))
        result = _update_and_swap(trace, deps, admitted, plan, work, draft)
    batched.drop_applied(deps.batching, park, plan.session.session_id)
    return result


def _update_and_swap(trace: JobTrace, deps: JobDeps, admitted: Admitted, plan: JobPlan,
                     work: SummaryWork, draft: SummaryDraft) -> JobResult:
    rejected: SummaryInvalid | None = None
    try:
        revision = _update_and_validate(trace, deps, plan, work, draft)
    except SummaryInvalid as exc:
        if exc.reason != CONTRADICTS or not admitted.summarizer.uses_provider:
            raise
        # The model said what the span's record refutes: the deterministic summary, true to
        # the record by construction, replaces it; the run row keeps what was refuted. The
        # provider answered, so its breaker's trial proved nothing.
        deps.provider_breaker.fail_trial()
        rejected, admitted = exc, Admitted(deps.fallback, Outcome.FALLBACK, admitted.open_breaker)
        with trace.step("summarize_fallback"):
            draft = deps.fallback.summarize(work)
        trace.summarizer = draft.kind
        revision = _update_and_validate(trace, deps, plan, work, draft)
    else:
        if admitted.summarizer.uses_provider:
            deps.provider_breaker.record_success()
    reason = rejected.reason if rejected else plan.decision
    with trace.step("swap"):
        trace.revision_id = _swap(trace, deps, plan, work, draft, revision, admitted,
                                  reason, rejected)
    trace.parent_revision_id = plan.session.active_revision_id
    if admitted.open_breaker is None:  # the swap closed it
        trace.breaker_state = BreakerState.CLOSED.value
    result = trace.result(admitted.outcome, reason, rejected)
    return dataclasses.replace(result, queue_marker_cleared=True)


def _update_and_validate(trace: JobTrace, deps: JobDeps, plan: JobPlan, work: SummaryWork,
                         draft: SummaryDraft) -> Revision:
    with trace.step("merge"):
        updated = update_summary(work.prior, draft.summary, counter=deps.counter,
                                 budget_tokens=work.budget_tokens,
                                 identifiers=_ranked_identifiers(work, draft),
                                 labels=work.number_labels, tool_numbers=_tool_numbers(work),
                                 parties=read_party_turn(work.prior, work.requests))
    with trace.step("validate"):
        return _validate(trace, deps, plan, work, draft, updated)


def _ranked_identifiers(work: SummaryWork, draft: SummaryDraft) -> list[str]:
    """The span's identifiers, most salient first: the error codes that ended a call and
    the values of the draft's decisions and pending items lead."""
    texts = [*draft.summary.key_decisions, *draft.summary.pending]
    featured = featured_values(work.failures, texts, work.artifacts)
    ranked = rerank_featured(work.ranked_artifacts, featured)
    return [artifact.value for artifact in ranked if artifact.kind != "tool"]


def _tool_numbers(work: SummaryWork) -> frozenset[str]:
    """The span's bare numbers only a tool returned (no user or assistant said them)."""
    # ``isdigit`` first: one C call rules out nearly every value.
    return frozenset(a.value for a in work.artifacts
                     if a.value.isdigit() and is_bare_number(a.value) and not a.is_said)


def _validate(trace: JobTrace, deps: JobDeps, plan: JobPlan, work: SummaryWork,
              draft: SummaryDraft, updated: UpdatedSummary) -> Revision:
    validated = validate_summary(
        draft.summary, updated,
        span_tokens=work.span_tokens,
        budget_tokens=work.budget_tokens,
        replaced_tokens=work.span_tokens + plan.prior_summary_tokens,
        counter=deps.counter,
        record=read_record(work.span, outcomes=work.outcomes, artifacts=work.artifacts,
                           prior=work.prior, tail_continues=work.tail_continues,
                           ledger=work.requests),
        span_summary_tokens=draft.tokens,
    )
    block = summary_block_message(validated.fitted.text, plan.session.session_format)
    # The block was counted once, at the update; only the message's framing is added.
    framing_tokens = deps.counter.count_message(parse_message({**block, "content": ""}))
    summary_tokens = framing_tokens + validated.fitted.tokens
    # The block's own items need no scan: it holds them verbatim.
    block_text = TextGrams(validated.fitted.text, known=verbatim_items(validated.summary),
                           asked=len(work.artifacts))
    held = block_text.contains_each([a.value for a in work.artifacts if a.kind != "tool"])
    trace.record_figures(
        summary_tokens=summary_tokens, identifiers_reattached=len(validated.reattached),
        identifiers_recall_only=held.count(False),
        tokens_after=plan.boundary.projected_tokens(summary_tokens))
    return Revision(validated.summary, block, summary_tokens)


def _swap(trace: JobTrace, deps: JobDeps, plan: JobPlan, work: SummaryWork,
          draft: SummaryDraft, revision: Revision, admitted: Admitted, reason: str,
          rejected: SummaryInvalid | None) -> int:
    """Compare-and-swap the revision in, with the run row (``rejected``: the summary it
    replaced, when one was), the lease release and the queue marker, in one store
    transaction."""
    now, session = deps.clock(), plan.session
    new_revision = NewRevision(
        through_seq=plan.boundary.through_seq, snapshot_head_seq=session.head_seq,
        summary=revision.summary.model_dump(mode="json"), block=revision.block,
        # The store keeps the block's tokens under both names; they are one figure.
        block_tokens=revision.summary_tokens, summary_tokens=revision.summary_tokens,
        artifacts_json=work.artifacts_json, span_tokens=work.span_tokens,
        projection_tokens_before=trace.figures.tokens_before or 0,
        model=draft.model, prompt_version=draft.prompt_version, summarizer=draft.kind,
    )
    open_breaker = admitted.open_breaker
    return deps.store.commit_job(
        session.session_id, expected_revision_id=session.active_revision_id,
        lease_owner=deps.lease_owner(trace.request), revision=new_revision,
        run=trace.new_run(admitted.outcome, reason, rejected, now), now=now,
        breaker=breaker_update(open_breaker) if open_breaker else None,
    )


def _fail(trace: JobTrace, deps: JobDeps, policy: JobPolicy, exc: CompactionError) -> JobResult:
    """Record the run and the breaker update; nothing else is written."""
    if exc.figures:  # what the failed step had spent (LLM calls and tokens)
        trace.record_figures(**exc.figures)
    breaker_update = None
    if exc.counts_on is BreakerScope.SESSION:
        breaker_update = _failed_breaker(trace, deps, policy)
    if exc.counts_on is BreakerScope.PROVIDER:
        deps.provider_breaker.record_failure()
    else:
        # A provider trial that ended any other way (an invalid summary) proved nothing:
        # it fails as a trial, and the provider breaker reopens instead of staying half-open.
        deps.provider_breaker.fail_trial()
    return _finish(trace, deps, exc.outcome, exc.reason, exc, breaker_update)


def _failed_breaker(trace: JobTrace, deps: JobDeps, policy: JobPolicy) -> BreakerUpdate | None:
    """The breaker after this failure: from the row the lease read (no other job writes
    it while the lease is held), else from a fresh read."""
    breaker = trace.breaker
    if breaker is None:
        try:
            breaker = session_breaker(deps.store.get_session(trace.request.session_id))
        except StoreError:
            # Unknown session, or a store that fails: the outcome event must still go out.
            return None
    breaker = breaker_after_failure(breaker, deps.clock(), policy.breaker_threshold)
    trace.breaker_state = breaker.state.value
    return breaker_update(breaker)


def _finish(trace: JobTrace, deps: JobDeps, outcome: Outcome, reason: str,
            error: CompactionError | None = None, breaker: BreakerUpdate | None = None
            ) -> JobResult:
    """Record the run, the breaker, the lease release and (unless a retry may follow) the
    queue marker's clearing, in one store transaction."""
    result = trace.result(outcome, reason, error)
    final = error is None or not error.retryable
    # Released only where this owner holds it: a job that found it held leaves it alone.
    lease_owner = deps.lease_owner(trace.request) if trace.lease_tried else None
    run = trace.new_run(outcome, reason, error, deps.clock())
    try:
        deps.store.finish_job(run, lease_owner=lease_owner, breaker=breaker,
                              clear_queue_marker=final)
        result = dataclasses.replace(result, queue_marker_cleared=final)
    except StoreError as exc:
        # The outcome event still goes out, naming the missing run row; the task keeps
        # the row for the reconciler to write.
        result = dataclasses.replace(result, run_recorded=False, record_error=str(exc),
                                     unrecorded_run=run)
    return result
