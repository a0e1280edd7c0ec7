"""The values the store takes and returns: frozen dataclasses, never ORM objects."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

# One identifier's occurrences in a message from one source: value, kind, source, count,
# and the tokens of its summary line (None where ingest did not count it).
StoredMention = tuple[str, str, str, int, int | None]
# One tool result's outcome: the call id it answers, its status, and the lines that say so.
StoredOutcome = tuple[str, str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to append: the dict verbatim, plus what queries need from it.

    ``identifiers``, ``search_text`` and ``outcomes`` (each of its tool results', in
    order; empty when it holds none) are computed by the worker at ingest; None leaves
    the message unindexed or unclassified (``compactor db backfill`` does it later).
    """

    body: dict[str, Any]
    role: str
    tool_call_id: str | None
    tokens: int
    identifiers: tuple[StoredMention, ...] | None = None
    search_text: str | None = None
    outcomes: tuple[StoredOutcome, ...] | None = None


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """A stored message at its position ``seq`` (1-based, contiguous per session)."""

    seq: int
    body: dict[str, Any]
    role: str
    tool_call_id: str | None
    tokens: int
    identifiers: tuple[StoredMention, ...] | None = None  # None: not indexed yet
    outcomes: tuple[StoredOutcome, ...] | None = None  # None: not classified yet


@dataclass(frozen=True, slots=True)
class MessageText:
    """An active message as a job reads it: the body as the JSON text stored, never
    decoded into dicts, so the job parses it straight into its own model; and its
    identifiers as their JSON text too, decoded (``decode_mention_lists``) only for the
    messages a job summarizes, as it tallies them (decoded into tuples and strings, a
    long session's mentions take much more memory than their text); so are its tool
    results' outcomes, decoded only for the span's results. The session's format comes
    with each, so the body is parsed as what it is, once."""

    seq: int
    body_json: str
    tokens: int
    identifiers_json: str | None  # None: not indexed yet
    outcomes_json: str | None  # None: not classified yet
    session_format: str  # the session's: chat, responses or anthropic


# Texts decoded per json.loads by decode_mention_lists: one call's overhead spread over
# many messages, and only a batch's lists alive at a time.
MENTION_TEXTS_PER_DECODE = 256


def decode_mention_lists(identifiers_json: Sequence[str]) -> Iterator[list[list[Any]]]:
    """Each text's mentions as the JSON decodes them (a list ``[value, kind, source,
    count, line_tokens]`` each, without ``line_tokens`` where stored before it was kept),
    decoded a batch of texts at a time: one call's overhead spread over many messages
    instead of paid per message, and no tuples."""
    return _decode_lists(identifiers_json)


def decode_outcome_lists(outcomes_json: Sequence[str]) -> Iterator[list[list[Any]]]:
    """Each text's tool result outcomes as the JSON decodes them (a list ``[call_id,
    status, lines]`` each), a batch of texts at a time, as ``decode_mention_lists``."""
    return _decode_lists(outcomes_json)


def _decode_lists(texts: Sequence[str]) -> Iterator[list[list[Any]]]:
    for start in range(0, len(texts), MENTION_TEXTS_PER_DECODE):
        batch = texts[start:start + MENTION_TEXTS_PER_DECODE]
        yield from json.loads(f"[{','.join(batch)}]")


# One encoder for every message's outcomes (``json.dumps`` with options builds one per
# call); its text is what a job decodes.
_OUTCOMES_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def encode_outcomes(outcomes: Sequence[StoredOutcome] | None) -> str | None:
    """The JSON text ``messages.outcomes`` holds of a message's outcomes (None: NULL)."""
    return None if outcomes is None else _OUTCOMES_ENCODER.encode(outcomes)


def decode_outcomes(outcomes_json: str | None) -> tuple[StoredOutcome, ...] | None:
    """A message's outcomes from ``messages.outcomes`` (None: not classified)."""
    if outcomes_json is None:
        return None
    return tuple((call_id, status, tuple(lines))
                 for call_id, status, lines in json.loads(outcomes_json))


@dataclass(frozen=True, slots=True)
class UnindexedMessage:
    """A stored message the backfill reads: its body, and which of what ingest computes
    it was stored without (identifiers and search text: before migration 0003; tool
    outcomes: before 0010)."""

    seq: int
    body: dict[str, Any]
    needs_identifiers: bool
    needs_outcomes: bool


@dataclass(frozen=True, slots=True)
class IndexedMessage:
    """What the worker computed for a message stored before identifiers or outcomes
    were: the backfill writes each once (None: already stored, not computed again)."""

    seq: int
    identifiers: tuple[StoredMention, ...] | None
    search_text: str | None
    outcomes: tuple[StoredOutcome, ...] | None


@dataclass(frozen=True, slots=True)
class ArtifactRecord:
    """One identifier of a session, over every message stored so far."""

    value: str
    kind: str
    first_seq: int
    last_seq: int
    count: int
    sources: frozenset[str]


@dataclass(frozen=True, slots=True)
class RecallHit:
    """A stored message where a recalled value or phrase appears, with an excerpt."""

    seq: int
    role: str
    excerpt: str


@dataclass(frozen=True, slots=True)
class SessionState:
    """Every column of a session row except its internal key."""

    session_id: str
    metadata: dict[str, Any]
    session_format: str  # chat, responses or anthropic: its messages' wire format
    head_seq: int
    active_revision_id: int | None
    system_tokens: int  # its system prompt's, when kept outside the messages (Anthropic)
    total_tokens: int  # every message's and the system prompt's
    projection_tokens: int
    tokens_since_compaction: int
    created_at: datetime
    last_appended_at: datetime | None
    last_compacted_at: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    breaker_state: str
    breaker_failures: int
    breaker_opened_at: datetime | None
    queued_at: datetime | None
    queued_job_id: str | None


@dataclass(frozen=True, slots=True)
class NewRevision:
    """A summary to swap in: it covers ``seq <= through_seq`` of a snapshot at
    ``snapshot_head_seq``; ``block`` is the message inserted into the projection."""

    through_seq: int
    snapshot_head_seq: int
    summary: dict[str, Any]
    block: dict[str, Any]
    block_tokens: int
    # The span's artifacts as the JSON array the row stores: the job encodes them once,
    # straight from its own objects, with no list of dicts beside them.
    artifacts_json: str
    summary_tokens: int
    span_tokens: int
    projection_tokens_before: int
    model: str | None
    prompt_version: str | None
    summarizer: str


@dataclass(frozen=True, slots=True)
class RevisionRecord:
    """A stored revision; ``session_id`` is the session's external id."""

    id: int
    session_id: str
    parent_revision_id: int | None
    through_seq: int
    snapshot_head_seq: int
    summary: dict[str, Any]
    block: dict[str, Any]
    block_tokens: int
    artifacts: list[dict[str, Any]]
    summary_tokens: int
    span_tokens: int
    projection_tokens_before: int
    projection_tokens_after: int
    model: str | None
    prompt_version: str | None
    summarizer: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class NewRun:
    """One job attempt to record; ``session_id`` may name a session that is unknown."""

    session_id: str
    task_id: str | None
    attempt: int
    reason: str
    outcome: str
    failure_class: str | None
    failure_message: str | None
    figures: dict[str, Any]
    revision_id: int | None
    started_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class RunRecord(NewRun):
    """A stored run: the recorded fields plus its ``id``."""

    id: int


@dataclass(frozen=True, slots=True)
class BreakerUpdate:
    """The session breaker's persisted fields (state: closed, open or half_open)."""

    state: str
    failures: int
    opened_at: datetime | None


@dataclass(frozen=True, slots=True)
class RevisionSizes:
    """A revision's projection sizes before and after it: what the trigger's history needs."""

    projection_tokens_before: int
    projection_tokens_after: int


JobMessage = TypeVar("JobMessage")


@dataclass(frozen=True, slots=True)
class JobSnapshot(Generic[JobMessage]):
    """What one job reads in one snapshot: a session, its active revision, and its
    active messages up to ``session.head_seq`` (instructions covered by the revision,
    then everything after its ``through_seq``), already in the job's own form (each
    converted from its :class:`MessageText` as its row arrived), and
    ``recent_revisions``: the sizes of the newest revisions, newest first, as many as the
    job asked for. ``breaker_refused`` and ``under_trigger``: what its
    :class:`SnapshotSkipRule` found in the session row; either one means neither the messages
    nor the sizes were read (both empty): the job does not run."""

    session: SessionState
    revision: RevisionRecord | None
    messages: list[JobMessage]
    recent_revisions: tuple[RevisionSizes, ...]
    breaker_refused: bool = False
    under_trigger: bool = False


@dataclass(frozen=True, slots=True)
class SnapshotSkipRule:
    """When a job's snapshot reads the session row alone: its breaker refuses the job
    (``cooldown_start``: the job's clock less the breaker's cooldown; the breaker is not
    closed and opened after that instant, so it is still cooling down), or its
    projection is at most ``trigger_tokens`` (a job that is not forced skips it). A None
    leaves that check to the job. The rules of the worker's ``admit`` and
    ``decide_compaction`` (``worker/compaction/``); the snapshot statement states them in
    SQL, and these methods read the answers back from the row."""

    cooldown_start: datetime | None = None
    trigger_tokens: int | None = None

    def breaker_refuses(self, session: SessionState) -> bool:
        return (self.cooldown_start is not None and session.breaker_state != "closed"
                and session.breaker_opened_at is not None
                and session.breaker_opened_at > self.cooldown_start)

    def under_trigger(self, session: SessionState) -> bool:
        return self.trigger_tokens is not None and session.projection_tokens <= self.trigger_tokens

    def row_alone(self, session: SessionState, revision: RevisionRecord | None
                  ) -> JobSnapshot[Any] | None:
        """The snapshot of a session this rule matches: its row and revision, no message and
        no size; None when the job reads on."""
        breaker_refused, under_trigger = self.breaker_refuses(session), self.under_trigger(session)
        if not (breaker_refused or under_trigger):
            return None
        return JobSnapshot(session=session, revision=revision, messages=[],
                           recent_revisions=(), breaker_refused=breaker_refused,
                           under_trigger=under_trigger)


NO_SKIP = SnapshotSkipRule()  # every message is read


@dataclass(frozen=True, slots=True)
class ToolCallState:
    """What an append's intake check needs of the stored session, read under its row lock.

    ``answered_ids`` comes from the ``tool_call_id`` column, never from the bodies: every
    stored call has a result except the open ones (intake closes a call, with a placeholder
    result if need be, before anything else is stored), so the two together are every id
    the session used.
    """

    open_ids: tuple[str, ...]  # the last call group's calls without a result, in call order
    answered_ids: frozenset[str]  # every tool call id a stored tool result answers
    session_format: str = "chat"  # the session's wire format (sessions.format)


@dataclass(frozen=True, slots=True)
class DeletedSession:
    """What erasing a session removed: rows per table (in ``SESSION_TABLES`` order), the
    queued-job marker it carried, and the lease ``force`` broke (None: none was held)."""

    session_id: str
    removed: dict[str, int]
    queued_job_id: str | None
    broken_lease_owner: str | None


@dataclass(frozen=True, slots=True)
class GcPolicy:
    """What garbage collection keeps: the active revision and ``keep_revisions`` of its
    ancestors always; other revisions and runs younger than their retention (s); whole
    sessions last appended to within ``session_retention_s`` (None: every session)."""

    keep_revisions: int
    revision_retention_s: float
    run_retention_s: float
    batch_size: int
    session_retention_s: float | None = None

    def __post_init__(self) -> None:
        if self.keep_revisions < 0 or self.batch_size <= 0:
            raise ValueError(f"invalid gc policy {self!r}")


@dataclass(frozen=True, slots=True)
class GcBatch:
    """One committed batch: rows of ``table`` removed (or, in a dry run, removable)."""

    table: str
    removed: int
    next_after: int | None  # keyset cursor of the next batch; None: the table is done
