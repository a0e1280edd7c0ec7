"""The job's plan: its snapshot read (each message parsed as its row arrives), the
trigger and anti-thrash decision, the boundary, the span pruned with each tool result's
outcome classified, and the summarizer's work. ``worker.job.preview`` runs these steps
without the rest of the job."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from pydantic import ValidationError
from pydantic_core import from_json

from db import (
    JobSnapshot,
    MessageText,
    RevisionRecord,
    SessionState,
    decode_mention_lists,
    decode_outcome_lists,
)
from worker.compaction import (
    Boundary,
    CallOutcome,
    Group,
    SessionFormat,
    StoredItem,
    StoredMessage,
    Summary,
    apply_strategy,
    classify_calls,
    collect_artifacts,
    continues_conversation,
    decide_compaction,
    group_items,
    group_messages,
    label_numbers,
    noting_passed_values,
    parse_message_json,
    plan_boundary,
    prune_groups,
    read_item,
)
from worker.errors import (
    StoredMessageInvalid,
)
from worker.job.values import JobDeps, JobPolicy, JobTrace, Skip
from worker.summarizers import SummaryWork

# How many of the newest revisions the trigger weighs (their savings guard re-compaction).
RECENT_HISTORY = 2
# A row's format by its stored value, without the enum's call per row (Python 3.11).
_FORMATS = {session_format.value: session_format for session_format in SessionFormat}
_CHAT = SessionFormat.CHAT
_NO_RESULTS = "[]"


class SnapshotMessage(NamedTuple):
    """A snapshot's message as the job reads it, with the identifiers and the tool
    results' outcomes ingest stored (as their JSON text: only the span's are decoded). A
    named tuple: one is made per row, and a frozen dataclass's guarded setattr per field
    costs more."""

    seq: int
    tokens: int
    stored: StoredMessage | None  # a chat message; None: invalid, or another format's item
    mentions_json: str | None  # None: not indexed yet
    outcomes_json: str | None  # None: not classified yet
    item: StoredItem | None = None  # a Responses or Anthropic item, read through its view
    errors: int = 0  # what the chat model found wrong with it


@dataclass(frozen=True)
class JobPlan:
    """Where the snapshot's span ends: what the rest of the job works on. The snapshot's
    message list is not kept: the boundary's groups hold every message the job uses,
    ``span_mentions`` the identifiers stored for the span's (by seq), ``span_outcomes``
    the outcomes stored for the span's tool results (by seq; a seq without one is
    classified from its text)."""

    session: SessionState
    revision: RevisionRecord | None
    boundary: Boundary
    decision: str
    span_mentions: dict[int, str]
    span_outcomes: dict[int, str]

    @property
    def prior_summary_tokens(self) -> int:
        return self.revision.summary_tokens if self.revision else 0

    def without_span(self) -> JobPlan:
        """The plan once its span is pruned (:func:`prune_span`): the stored span (every
        old tool output in full) can be freed before the artifacts are tallied and the
        summarizer runs, and so can its stored mentions, once tallied, and its outcomes."""
        return dataclasses.replace(self, boundary=dataclasses.replace(self.boundary, span=()),
                                   span_mentions={}, span_outcomes={})


def read_job_snapshot(session_id: str, deps: JobDeps) -> JobSnapshot[SnapshotMessage]:
    """Read the job's snapshot, each message parsed from its stored JSON text as its row
    arrives (one copy of the session in memory, never a dict tree beside the models)."""
    return deps.store.job_snapshot(session_id, history=RECENT_HISTORY,
                                   to_message=to_snapshot_message)


def to_snapshot_message(text: MessageText) -> SnapshotMessage:
    """Parse a message as it arrives, as its session's format says: a chat message into
    its model; a Responses or Anthropic item into its view and the chat messages the core
    reads of it, once (its dict tree is dropped at once)."""
    session_format = _FORMATS[text.session_format]
    if session_format is not _CHAT:
        body = cast("dict[str, Any]", from_json(text.body_json))
        return SnapshotMessage(text.seq, text.tokens, None, text.identifiers_json,
                               text.outcomes_json,
                               read_item(session_format, text.seq, text.tokens, body))
    try:
        message = parse_message_json(text.body_json)
    except ValidationError as exc:
        return SnapshotMessage(text.seq, text.tokens, None, text.identifiers_json,
                               text.outcomes_json, errors=exc.error_count())
    return SnapshotMessage(text.seq, text.tokens, StoredMessage(text.seq, message, text.tokens),
                           text.identifiers_json, text.outcomes_json)


def group_snapshot(snapshot: JobSnapshot[SnapshotMessage]) -> list[Group]:
    """The snapshot's atomic groups, by its session's format's pairing rules.

    Raises:
        StoredMessageInvalid: a chat session's stored row is not a chat message.
    """
    session_format = SessionFormat(snapshot.session.session_format)
    stored: list[StoredMessage] = []
    items: list[StoredItem] = []
    for message in snapshot.messages:
        if message.stored is not None:
            stored.append(message.stored)
        elif message.item is not None:
            items.append(message.item)
        else:
            raise StoredMessageInvalid(message.seq, message.errors)
    if session_format is SessionFormat.CHAT:
        return group_messages(stored)
    return group_items(session_format, items)


def plan_job(trace: JobTrace, deps: JobDeps, policy: JobPolicy,
             snapshot: JobSnapshot[SnapshotMessage]) -> JobPlan:
    """Decide whether to compact the snapshot, and where the span ends; Skip when not
    (``worker.job.preview`` runs it without the rest of the job)."""
    revision, session = snapshot.revision, snapshot.session
    prior_tokens = revision.summary_tokens if revision else 0
    # Under the trigger only the row was read: its projection is the same sum, kept by
    # every append, swap and rollback.
    tokens_before = session.projection_tokens if snapshot.under_trigger \
        else sum(m.tokens for m in snapshot.messages) + prior_tokens + session.system_tokens
    request = trace.request
    decision = decide_compaction(tokens_before, _recent_savings(snapshot),
                                 policy.trigger, request.force)
    trace.record_figures(tokens_before=tokens_before, decision=decision.reason.value)
    if not decision.compact:
        raise Skip(decision.reason.value)
    boundary = plan_boundary(group_snapshot(snapshot),
                             prior_through_seq=revision.through_seq if revision else 0,
                             summary_tokens=prior_tokens, policy=policy.trigger,
                             system_tokens=session.system_tokens)
    if boundary is None or not boundary.span:
        raise Skip("nothing_to_summarize")
    through_seq = boundary.through_seq
    span_mentions = {m.seq: m.mentions_json for m in snapshot.messages
                     if m.mentions_json and m.seq <= through_seq}
    # A message that holds no tool result stored "[]": nothing to look up.
    span_outcomes = {m.seq: m.outcomes_json for m in snapshot.messages
                     if m.outcomes_json and m.outcomes_json != _NO_RESULTS
                     and m.seq <= through_seq}
    return JobPlan(session, revision, boundary, decision.reason.value, span_mentions,
                   span_outcomes)


def _recent_savings(snapshot: JobSnapshot[SnapshotMessage]) -> list[float]:
    """Share of the projection each of the last compactions saved, newest first."""
    return [1 - r.projection_tokens_after / r.projection_tokens_before
            for r in snapshot.recent_revisions if r.projection_tokens_before > 0]


@dataclass(frozen=True)
class PrunedSpan:
    """The plan's span as the summarizer reads it (old tool outputs pruned), with what
    only the span as stored tells: its calls' outcomes, its seqs, its tokens and its bare
    numbers' labels; and
    whether the verbatim tail goes on with the span's latest conversation."""

    groups: tuple[Group, ...]
    outcomes: tuple[CallOutcome, ...]
    seqs: tuple[int, ...]
    tokens: int
    tail_continues: bool
    number_labels: dict[str, str]  # the span's bare numbers with the labels its text gave


def prune_span(deps: JobDeps, policy: JobPolicy, plan: JobPlan) -> PrunedSpan:
    """Prune the plan's span; the stored span is not needed after this. Its calls'
    outcomes are those ingest stored, each classified from its text where none is."""
    stored = plan.boundary.span
    outcomes = dict(zip(plan.span_outcomes, decode_outcome_lists(list(
        plan.span_outcomes.values())), strict=True))
    groups = prune_groups(stored, audit_mode=policy.audit_mode, counter=deps.counter)
    if policy.span_strategy is not None:
        groups = apply_strategy(groups, policy.span_strategy, deps.counter)
    messages = [m for group in stored for m in group.messages]
    tail = [m for group in plan.boundary.tail for m in group.messages]
    return PrunedSpan(tuple(groups), tuple(classify_calls(stored, outcomes)),
                      tuple(m.seq for m in messages), sum(m.tokens for m in messages),
                      continues_conversation(messages, tail),
                      label_numbers(stored, plan.span_mentions))


def summary_work(trace: JobTrace, deps: JobDeps, policy: JobPolicy, plan: JobPlan,
                 span: PrunedSpan, mentions: dict[int, str]) -> SummaryWork:
    """What the summarizer reads: the pruned span, the prior summary, the identifiers
    ingest found in the span (their JSON text by seq in ``mentions``, decoded a batch at
    a time as they are tallied: a job never scans the span for them)."""
    prior = plan.revision
    indexed = [seq for seq in span.seqs if seq in mentions]
    found = decode_mention_lists([mentions[seq] for seq in indexed])
    passed: dict[int, tuple[str, ...]] = {}
    work = SummaryWork(
        span=span.groups,
        prior=Summary.model_validate(prior.summary) if prior else None,
        artifacts=tuple(collect_artifacts(
            noting_passed_values(zip(indexed, found, strict=True), passed))),
        outcomes=span.outcomes,
        span_tokens=span.tokens,
        budget_tokens=policy.summary_budget.for_span(span.tokens, plan.prior_summary_tokens),
        counter=deps.counter,
        tail_continues=span.tail_continues,
        number_labels=span.number_labels,
        passed_values=passed,
    )
    work.use_stored_line_counts()
    trace.record_figures(span_tokens=work.span_tokens, span_messages=len(span.seqs),
                         artifacts=len(work.artifacts))
    return work
