"""One compaction job, step by step: lease → breaker → snapshot → plan → summarize →
merge → validate → swap. Every path ends in one :class:`JobResult`; on any failure
nothing is written but the run record and the breaker update. Correctness rests on the
store's compare-and-swap of the active revision; the lease only saves wasted work.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from db import (
    BreakerUpdate,
    JobSnapshot,
    MessageText,
    NewRevision,
    RevisionRecord,
    SessionState,
    SnapshotGate,
    StoreError,
    decode_mention_lists,
)
from worker.compaction import (
    Boundary,
    Breaker,
    BreakerState,
    CallOutcome,
    Group,
    MergedSummary,
    StoredMessage,
    Summary,
    TextGrams,
    admit,
    apply_strategy,
    breaker_after_failure,
    classify_calls,
    collect_artifacts,
    continues_conversation,
    decide_compaction,
    featured_values,
    group_messages,
    merge_summaries,
    parse_message,
    parse_message_json,
    plan_boundary,
    prune_groups,
    read_record,
    rerank_featured,
    summary_block_message,
    validate_summary,
    verbatim_items,
)
from worker.errors import (
    BreakerOpen,
    BreakerScope,
    CompactionError,
    LeaseHeld,
    Outcome,
    ProviderBreakerOpen,
    StoredMessageInvalid,
    SummaryInvalid,
    to_job_error,
)
from worker.job.heartbeat import LeaseHeartbeat
from worker.job.outcome import job_span_attributes
from worker.job.values import JobDeps, JobPolicy, JobRequest, JobResult, JobTrace, Skip
from worker.summarizers import Summarizer, SummaryDraft, SummaryWork
from worker.tracing.spans import open_span

JOB_SPAN = "compaction.job"
# How many of the newest revisions the trigger weighs (their savings guard re-compaction).
RECENT_HISTORY = 2
# The validation reason under which a model's summary is replaced by the deterministic one.
CONTRADICTS = "summary_contradicts_history"


@dataclass(frozen=True)
class Admitted:
    """What the breakers let this job do: the summarizer, and the outcome of a commit."""

    summarizer: Summarizer
    outcome: Outcome  # compacted; fallback (provider breaker open); breaker_open
    open_breaker: Breaker | None  # the session's, when a fallback commit must keep it open


@dataclass(frozen=True, slots=True)
class SnapshotMessage:
    """A snapshot's message as the job reads it, with the identifiers ingest stored (as
    their JSON text: only the span's are decoded, as they are tallied)."""

    stored: StoredMessage
    mentions_json: str | None  # None: not indexed yet


@dataclass(frozen=True)
class JobPlan:
    """Where the snapshot's span ends: what the rest of the job works on. The snapshot's
    message list is not kept: the boundary's groups hold every message the job uses,
    ``span_mentions`` the identifiers stored for the span's (by seq)."""

    session: SessionState
    revision: RevisionRecord | None
    boundary: Boundary
    decision: str
    span_mentions: dict[int, str]

    @property
    def prior_summary_tokens(self) -> int:
        return self.revision.summary_tokens if self.revision else 0

    def without_span(self) -> JobPlan:
        """The plan once its span is pruned (:func:`prune_span`): the stored span (every
        old tool output in full) can be freed before the artifacts are tallied and the
        summarizer runs, and so can its stored mentions, once tallied."""
        return dataclasses.replace(self, boundary=dataclasses.replace(self.boundary, span=()),
                                   span_mentions={})


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


def _start(trace: JobTrace, deps: JobDeps, policy: JobPolicy) -> tuple[Admitted, JobPlan]:
    """Take the lease with the snapshot, pass the session's breaker, plan, then pass the
    provider's; only the plan outlives this call (the snapshot's list of messages is
    freed with it). A job the plan skips never takes the provider breaker's one trial."""
    with trace.step("lease"):  # the snapshot too: on PostgreSQL the same statement
        # Set first: a snapshot that fails to read may leave the lease taken.
        trace.lease_tried = True
        snapshot = _take_lease(trace.request, deps, policy)
    admitted = _admit(trace, deps, policy, snapshot.session,
                      breaker_refused=snapshot.breaker_refused)
    with trace.step("plan"):
        plan = plan_job(trace, deps, policy, snapshot)
    if admitted.outcome is Outcome.COMPACTED:
        admitted = _admit_provider(deps, policy)
    return admitted, plan


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
    gate = SnapshotGate(
        cooldown_start=None if policy.fallback_when_open
        else now - timedelta(seconds=policy.breaker_cooldown_s),
        trigger_tokens=None if request.force else policy.trigger.trigger_tokens)
    snapshot = deps.store.start_job_with_snapshot(
        request.session_id, deps.lease_owner(request), policy.lease_ttl_s, now,
        take_over=request.task_id if earlier_may_hold else None,
        history=RECENT_HISTORY, to_message=_to_snapshot_message, gate=gate)
    if snapshot is None:
        raise LeaseHeld("another job holds this session's lease", reason="lease_held")
    return snapshot


def _compact(trace: JobTrace, deps: JobDeps, policy: JobPolicy) -> JobResult:
    """Lease, plan and summarize, then swap. This frame holds the only reference to the
    plan's stored span (every old tool output in full): it is dropped here once pruned,
    before the artifacts are tallied, and only the pruned span and its mentions stay."""
    admitted, plan = _start(trace, deps, policy)
    # The job's last transaction releases the lease; the heartbeat only extends it while
    # this owner still holds it.
    with LeaseHeartbeat(lambda: _renew_lease(trace.request, deps, policy),
                        policy.lease_heartbeat_s):
        with trace.step("summarize"):
            span = prune_span(deps, policy, plan)
            mentions, plan = plan.span_mentions, plan.without_span()
            work = summary_work(trace, deps, policy, plan, span, mentions)
            del span, mentions  # the work holds what it needs of them
            draft = admitted.summarizer.summarize(work)
            trace.summarizer = draft.kind
            trace.note(**dataclasses.asdict(draft.usage))
        return _merge_and_swap(trace, deps, admitted, plan, work, draft)


def _merge_and_swap(trace: JobTrace, deps: JobDeps, admitted: Admitted, plan: JobPlan,
                    work: SummaryWork, draft: SummaryDraft) -> JobResult:
    rejected: SummaryInvalid | None = None
    try:
        revision = _merge_and_validate(trace, deps, plan, work, draft)
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
        revision = _merge_and_validate(trace, deps, plan, work, draft)
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


def _merge_and_validate(trace: JobTrace, deps: JobDeps, plan: JobPlan, work: SummaryWork,
                        draft: SummaryDraft) -> Revision:
    with trace.step("merge"):
        merged = merge_summaries(work.prior, draft.summary, counter=deps.counter,
                                 budget_tokens=work.budget_tokens,
                                 identifiers=_ranked_identifiers(work, draft))
    with trace.step("validate"):
        return _validate(trace, deps, plan, work, draft, merged)


def _admit(trace: JobTrace, deps: JobDeps, policy: JobPolicy,
           session: SessionState, *, breaker_refused: bool) -> Admitted:
    """Pick the summarizer the session's breaker allows; raise when the job must not run
    (``breaker_refused``: the snapshot was read without messages, the breaker refusing
    at the lease's instant, even if its cooldown has ended since)."""
    with trace.step("breaker"):
        breaker = trace.breaker = _session_breaker(session)
        trace.breaker_state = breaker.state.value
        admission = admit(breaker, deps.clock(), policy.breaker_cooldown_s)
        if breaker_refused or not admission.allowed:
            # A refused snapshot holds no message: no fallback runs on it (and the gate
            # refuses only under the skip policy).
            if breaker_refused or not policy.fallback_when_open:
                raise BreakerOpen("the session's breaker is open", reason="breaker_open")
            return Admitted(deps.fallback, Outcome.BREAKER_OPEN, breaker)
        if admission.breaker != breaker:  # the trial after the cooldown: record half-open
            deps.store.set_breaker(trace.request.session_id, _breaker_update(admission.breaker))
            trace.breaker = admission.breaker
            trace.breaker_state = admission.breaker.state.value
        return Admitted(deps.summarizer, Outcome.COMPACTED, None)


def _admit_provider(deps: JobDeps, policy: JobPolicy) -> Admitted:
    """Fall back from a provider whose breaker is open (it is not the session's fault)."""
    summarizer = deps.summarizer
    if summarizer.uses_provider and not deps.provider_breaker.admit():
        if not policy.fallback_when_open:
            raise ProviderBreakerOpen("the provider breaker is open",
                                      reason="provider_breaker_open",
                                      retry_after_s=deps.provider_breaker.reopens_in_s())
        return Admitted(deps.fallback, Outcome.FALLBACK, None)
    return Admitted(summarizer, Outcome.COMPACTED, None)


def read_job_snapshot(session_id: str, deps: JobDeps) -> JobSnapshot[SnapshotMessage]:
    """Read the job's snapshot, each message parsed from its stored JSON text as its row
    arrives (one copy of the session in memory, never a dict tree beside the models)."""
    return deps.store.job_snapshot(session_id, history=RECENT_HISTORY,
                                   to_message=_to_snapshot_message)


def _to_snapshot_message(text: MessageText) -> SnapshotMessage:
    try:
        message = parse_message_json(text.body_json)
    except ValidationError as exc:
        raise StoredMessageInvalid(text.seq, exc.error_count()) from None  # quotes contents
    return SnapshotMessage(StoredMessage(text.seq, message, text.tokens), text.identifiers_json)


def plan_job(trace: JobTrace, deps: JobDeps, policy: JobPolicy,
             snapshot: JobSnapshot[SnapshotMessage]) -> JobPlan:
    """Decide whether to compact the snapshot, and where the span ends; Skip when not
    (``worker.job.preview`` runs it without the rest of the job)."""
    revision = snapshot.revision
    stored = [m.stored for m in snapshot.messages]
    prior_tokens = revision.summary_tokens if revision else 0
    # Under the trigger only the row was read: its projection is the same sum, kept by
    # every append, swap and rollback.
    tokens_before = snapshot.session.projection_tokens if snapshot.under_trigger \
        else sum(m.tokens for m in stored) + prior_tokens
    request = trace.request
    decision = decide_compaction(tokens_before, _recent_savings(snapshot),
                                 policy.trigger, request.force)
    trace.note(tokens_before=tokens_before, decision=decision.reason.value)
    if not decision.compact:
        raise Skip(decision.reason.value)
    boundary = plan_boundary(group_messages(stored),
                             prior_through_seq=revision.through_seq if revision else 0,
                             summary_tokens=prior_tokens, policy=policy.trigger)
    if boundary is None or not boundary.span:
        raise Skip("nothing_to_summarize")
    span_mentions = {m.stored.seq: m.mentions_json for m in snapshot.messages
                     if m.mentions_json and m.stored.seq <= boundary.through_seq}
    return JobPlan(snapshot.session, revision, boundary, decision.reason.value, span_mentions)


def _recent_savings(snapshot: JobSnapshot[SnapshotMessage]) -> list[float]:
    """Share of the projection each of the last compactions saved, newest first."""
    return [1 - r.projection_tokens_after / r.projection_tokens_before
            for r in snapshot.recent_revisions if r.projection_tokens_before > 0]


@dataclass(frozen=True)
class PrunedSpan:
    """The plan's span as the summarizer reads it (old tool outputs pruned), with what
    only the span as stored tells: its calls' outcomes, its seqs and its tokens; and
    whether the verbatim tail goes on with the span's latest conversation."""

    groups: tuple[Group, ...]
    outcomes: tuple[CallOutcome, ...]
    seqs: tuple[int, ...]
    tokens: int
    tail_continues: bool


def prune_span(deps: JobDeps, policy: JobPolicy, plan: JobPlan) -> PrunedSpan:
    """Prune the plan's span; the stored span is not needed after this."""
    stored = plan.boundary.span
    groups = prune_groups(stored, audit_mode=policy.audit_mode, counter=deps.counter)
    if policy.span_strategy is not None:
        groups = apply_strategy(groups, policy.span_strategy, deps.counter)
    messages = [m for group in stored for m in group.messages]
    tail = [m for group in plan.boundary.tail for m in group.messages]
    return PrunedSpan(tuple(groups), tuple(classify_calls(stored)),
                      tuple(m.seq for m in messages), sum(m.tokens for m in messages),
                      continues_conversation(messages, tail))


def summary_work(trace: JobTrace, deps: JobDeps, policy: JobPolicy, plan: JobPlan,
                 span: PrunedSpan, mentions: dict[int, str]) -> SummaryWork:
    """What the summarizer reads: the pruned span, the prior summary, the identifiers
    ingest found in the span (their JSON text by seq in ``mentions``, decoded a batch at
    a time as they are tallied: a job never scans the span for them)."""
    prior = plan.revision
    indexed = [seq for seq in span.seqs if seq in mentions]
    found = decode_mention_lists([mentions[seq] for seq in indexed])
    work = SummaryWork(
        span=span.groups,
        prior=Summary.model_validate(prior.summary) if prior else None,
        artifacts=tuple(collect_artifacts(zip(indexed, found, strict=True))),
        outcomes=span.outcomes,
        span_tokens=span.tokens,
        budget_tokens=policy.summary_budget.for_span(span.tokens, plan.prior_summary_tokens),
        counter=deps.counter,
        tail_continues=span.tail_continues,
    )
    work.use_stored_line_counts()
    trace.note(span_tokens=work.span_tokens, span_messages=len(span.seqs),
               artifacts=len(work.artifacts))
    return work


def _ranked_identifiers(work: SummaryWork, draft: SummaryDraft) -> list[str]:
    """The span's identifiers, most salient first: the error codes that ended a call and
    the values of the draft's decisions and pending items lead."""
    texts = [*draft.summary.key_decisions, *draft.summary.pending]
    featured = featured_values(work.failures, texts, work.artifacts)
    ranked = rerank_featured(work.ranked_artifacts, featured)
    return [artifact.value for artifact in ranked if artifact.kind != "tool"]


def _validate(trace: JobTrace, deps: JobDeps, plan: JobPlan, work: SummaryWork,
              draft: SummaryDraft, merged: MergedSummary) -> Revision:
    validated = validate_summary(
        draft.summary, merged,
        span_tokens=work.span_tokens,
        budget_tokens=work.budget_tokens,
        replaced_tokens=work.span_tokens + plan.prior_summary_tokens,
        counter=deps.counter,
        record=read_record(work.span, outcomes=work.outcomes, artifacts=work.artifacts,
                           prior=work.prior, tail_continues=work.tail_continues),
    )
    block = summary_block_message(validated.fitted.text)
    # The block was counted once, at the merge; only the message's framing is added.
    framing_tokens = deps.counter.count_message(parse_message({**block, "content": ""}))
    summary_tokens = framing_tokens + validated.fitted.tokens
    # The block's own items need no scan: it holds them verbatim.
    block_text = TextGrams(validated.fitted.text, known=verbatim_items(validated.summary),
                           asked=len(work.artifacts))
    trace.note(summary_tokens=summary_tokens, identifiers_reattached=len(validated.reattached),
               identifiers_recall_only=sum(a.kind != "tool" and not block_text.contains(a.value)
                                           for a in work.artifacts),
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
        breaker=_breaker_update(open_breaker) if open_breaker else None,
    )


def _session_breaker(session: SessionState) -> Breaker:
    return Breaker(state=BreakerState(session.breaker_state), failures=session.breaker_failures,
                   opened_at=session.breaker_opened_at)


def _breaker_update(breaker: Breaker) -> BreakerUpdate:
    return BreakerUpdate(state=breaker.state.value, failures=breaker.failures,
                         opened_at=breaker.opened_at)


def _fail(trace: JobTrace, deps: JobDeps, policy: JobPolicy, exc: CompactionError) -> JobResult:
    """Record the run and the breaker update; nothing else is written."""
    if exc.figures:  # what the failed step had spent (LLM calls and tokens)
        trace.note(**exc.figures)
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
            breaker = _session_breaker(deps.store.get_session(trace.request.session_id))
        except StoreError:
            # Unknown session, or a store that fails: the outcome event must still go out.
            return None
    breaker = breaker_after_failure(breaker, deps.clock(), policy.breaker_threshold)
    trace.breaker_state = breaker.state.value
    return _breaker_update(breaker)


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
