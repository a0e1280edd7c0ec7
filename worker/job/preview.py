"""What a job would do to a session, without doing it (``compactor compact --dry-run``).

It runs the job's own steps up to the summarizer (``planning.plan_job``: the trigger,
anti-thrash and the boundary; ``planning.summary_work``: the pruned span) and asks the
LLM summarizer for its call plan (``plan_summary_calls``, as a job makes it). It reads the
session once and writes nothing: no lease, no LLM call, no run row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from worker.compaction import ChunkPlan, CompactionError
from worker.job.planning import plan_job, prune_span, read_job_snapshot, summary_work
from worker.job.values import JobDeps, JobPolicy, JobRequest, JobTrace, Skip
from worker.summarizers import SummaryWork


@runtime_checkable
class PlansCalls(Protocol):
    """A summarizer that can say which LLM calls it would make (the LLM one)."""

    def plan_calls(self, work: SummaryWork) -> tuple[ChunkPlan, int]: ...


@dataclass(frozen=True, slots=True)
class CompactionPreview:
    """A job's plan for one session. ``decision`` is the job's (``over_trigger``,
    ``forced``, ...); when it would not compact, ``skip_reason`` says why and the span
    figures are zero. ``failure`` is the reason the plan itself fails (``too_many_calls``,
    ``context_overflow``): the job would fail the same way."""

    session_id: str
    decision: str | None
    tokens_before: int
    skip_reason: str | None = None
    span_first_seq: int | None = None
    span_last_seq: int | None = None
    span_messages: int = 0
    span_tokens: int = 0
    tail_messages: int = 0
    tail_tokens: int = 0
    summarizer: str = ""
    chunks: int = 0
    merge_rounds: int = 0
    llm_calls: int = 0
    # Estimates: what the calls read (chunks as rendered, partial summaries at their output
    # budget; prompt framing not counted) and the most they may write.
    est_input_tokens: int = 0
    max_output_tokens: int = 0
    failure: str | None = None


def preview_compaction(request: JobRequest, deps: JobDeps, policy: JobPolicy
                       ) -> CompactionPreview:
    """Plan the job ``request`` would run, reading the store only."""
    trace = JobTrace(request, started_at=deps.clock())
    snapshot = read_job_snapshot(request.session_id, deps)
    try:
        plan = plan_job(trace, deps, policy, snapshot)
    except Skip as skip:
        return CompactionPreview(request.session_id, trace.figures.decision,
                                 trace.figures.tokens_before or 0, skip_reason=skip.reason)
    work = summary_work(trace, deps, policy, plan, prune_span(deps, policy, plan),
                        plan.span_mentions)
    span, tail = plan.boundary.span, plan.boundary.tail
    preview = CompactionPreview(
        request.session_id, plan.decision, trace.figures.tokens_before or 0,
        span_first_seq=span[0].first_seq, span_last_seq=span[-1].last_seq,
        span_messages=sum(len(group.messages) for group in span),
        span_tokens=work.span_tokens,
        tail_messages=sum(len(group.messages) for group in tail),
        tail_tokens=plan.boundary.tail_tokens,
        summarizer=deps.summarizer.kind,
    )
    if not isinstance(deps.summarizer, PlansCalls):
        return preview  # extractive: no LLM call
    try:
        calls, output_tokens = deps.summarizer.plan_calls(work)
    except CompactionError as error:
        return replace(preview, failure=error.reason)
    merged = sum(len(batch) for batches in calls.merge_rounds for batch in batches
                 if len(batch) > 1)
    return replace(
        preview, chunks=len(calls.chunks), merge_rounds=len(calls.merge_rounds),
        llm_calls=calls.calls,
        est_input_tokens=sum(chunk.tokens for chunk in calls.chunks) + merged * output_tokens,
        max_output_tokens=calls.calls * output_tokens,
    )
