"""The SQL the store runs inside its transactions, and the row-to-record conversions.

Every function takes an open ORM ``Session`` that is already in a transaction; none of
them commits. ``db/store.py`` decides the transaction boundaries.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    Connection,
    Table,
    Text,
    and_,
    case,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from db.artifacts import upsert_artifacts
from db.errors import RevisionNotFound, SessionNotFound
from db.models import INSTRUCTION_ROLES, MessageRow, RevisionRow, RunRow, SessionRow
from db.records import (
    MessageRecord,
    MessageText,
    NewMessage,
    NewRun,
    RevisionRecord,
    RunRecord,
    SessionState,
    StoredMention,
    ToolCallState,
    decode_outcomes,
    encode_outcomes,
)

_RUNS: Table = RunRow.__table__  # type: ignore[assignment]

# Updates here never need the ORM to sync objects in memory: each transaction is short.
NO_SYNC = {"synchronize_session": False}


@dataclass(frozen=True, slots=True)
class ProjectionFigures:
    """A session's token figures with a given revision active."""

    projection_tokens: int  # covered instructions + the block + every later message
    unsummarized_tokens: int  # messages the revision's snapshot did not include


def find_session(session: Session, session_id: str, *, lock: bool = False) -> SessionRow:
    """Return the session row; ``lock`` takes its row lock (FOR UPDATE on PostgreSQL)."""
    statement = select(SessionRow).where(SessionRow.session_id == session_id)
    if lock:
        statement = statement.with_for_update()
    row = session.scalars(statement).one_or_none()
    if row is None:
        raise SessionNotFound(f"no session {session_id!r}")
    return row


def insert_session_if_absent(
    session: Session, session_id: str, metadata: dict[str, Any], now: datetime,
    session_format: str = "chat", system_tokens: int = 0,
) -> bool:
    """Insert a fresh session row unless the id exists; return whether it was inserted.

    Its system prompt's ``system_tokens`` start its totals, as a chat session's first
    message, its system message, would (``tokens_since_compaction`` too: nothing is
    compacted yet)."""
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    statement = (
        dialect.insert(SessionRow)
        .values(session_id=session_id, metadata_=metadata, created_at=now,
                format=session_format, system_tokens=system_tokens,
                total_tokens=system_tokens, projection_tokens=system_tokens,
                tokens_since_compaction=system_tokens)
        .on_conflict_do_nothing(index_elements=[SessionRow.session_id])
        .returning(SessionRow.id)
    )
    return session.execute(statement).first() is not None


def append_rows(
    session: Session, session_id: str, messages: Sequence[NewMessage], now: datetime
) -> list[int]:
    """Reserve seqs under the session's row lock, insert the messages, fold their
    identifiers into the session's artifact index, return the seqs.

    The counter moves in the same UPDATE that takes the row lock, so seq order is commit
    order: no message can commit below a seq that a concurrent snapshot already saw.
    """
    count, added_tokens = len(messages), sum(message.tokens for message in messages)
    reserved = session.execute(
        update(SessionRow)
        .where(SessionRow.session_id == session_id)
        .values(
            head_seq=SessionRow.head_seq + count,
            total_tokens=SessionRow.total_tokens + added_tokens,
            projection_tokens=SessionRow.projection_tokens + added_tokens,
            tokens_since_compaction=SessionRow.tokens_since_compaction + added_tokens,
            last_appended_at=now,
        )
        .returning(SessionRow.id, SessionRow.head_seq),
        execution_options=NO_SYNC,
    ).one_or_none()
    if reserved is None:
        raise SessionNotFound(f"no session {session_id!r}")
    session_pk, head_seq = reserved
    seqs = list(range(head_seq - count + 1, head_seq + 1))
    # One executemany; SQLAlchemy pages it into multi-row INSERTs (insertmanyvalues).
    # render_nulls: an ORM bulk insert otherwise omits None columns, so rows with and
    # without a tool_call_id fall into different batches, one statement per role change.
    session.execute(
        insert(MessageRow),
        [
            {
                "session_id": session_pk,
                "seq": seq,
                "role": message.role,
                "tool_call_id": message.tool_call_id,
                "body": message.body,
                "tokens": message.tokens,
                "created_at": now,
                "identifiers": None if message.identifiers is None else
                [list(mention) for mention in message.identifiers],
                "search_text": message.search_text,
                "outcomes": encode_outcomes(message.outcomes),
            }
            for seq, message in zip(seqs, messages, strict=True)
        ],
        execution_options={"render_nulls": True},
    )
    upsert_artifacts(session, session_pk, [
        (seq, message.identifiers) for seq, message in zip(seqs, messages, strict=True)
        if message.identifiers
    ])
    return seqs


def select_history(session: Session, session_pk: int, *, after_seq: int = 0) -> list[MessageRecord]:
    """Return every message with seq > ``after_seq``, in order."""
    return _select_messages(session, session_pk, MessageRow.seq > after_seq)


def iterate_active_texts(connection: Connection, session_pk: int, through_seq: int,
                         session_format: str) -> Iterator[MessageText]:
    """Yield the messages a revision leaves active, in order, as each row is fetched,
    their bodies as the stored JSON text: a job parses each into its model at once (as
    ``session_format`` says), so the driver's rows, a decoded dict tree and the models
    never all coexist."""
    rows = connection.execute(
        select(MessageRow.seq, MessageRow.body.cast(Text), MessageRow.tokens,
               MessageRow.identifiers.cast(Text), MessageRow.outcomes)
        .where(MessageRow.session_id == session_pk, _is_active(through_seq))
        .order_by(MessageRow.seq)
    )
    for seq, body_json, tokens, identifiers_json, outcomes_json in rows:
        yield MessageText(seq, body_json, tokens, identifiers_json, outcomes_json,
                          session_format)


def _is_active(through_seq: int) -> Any:
    return or_(MessageRow.seq > through_seq, MessageRow.role.in_(INSTRUCTION_ROLES))


def read_tool_call_state(session: Session, row: SessionRow) -> ToolCallState:
    """Read the open and answered tool call ids from two narrow queries (no bodies but
    the last non-tool message's).

    A call's id is in ``tool_call_id`` on its own row where its format gives each call
    a row (a Responses ``function_call``); otherwise in the body of the last message
    that is not a result (a chat assistant message's ``tool_calls``, an Anthropic
    assistant message's ``tool_use`` blocks).
    """
    ids = session.execute(
        select(MessageRow.seq, MessageRow.role, MessageRow.tool_call_id)
        .where(MessageRow.session_id == row.id, MessageRow.tool_call_id.is_not(None))
    ).all()
    answers = [(seq, str(call_id)) for seq, role, call_id in ids if role == "tool"]
    answered_ids = frozenset(call_id for _, call_id in answers)
    own_rows = tuple(str(call_id) for _, role, call_id in sorted(ids)
                     if role != "tool" and call_id not in answered_ids)
    last_call = session.execute(
        select(MessageRow.seq, MessageRow.body)
        .where(MessageRow.session_id == row.id, MessageRow.role != "tool")
        .order_by(MessageRow.seq.desc())
        .limit(1)
    ).first()
    if last_call is None:
        return ToolCallState(own_rows, answered_ids, row.format)
    last_seq, body = last_call
    answered_after = {call_id for seq, call_id in answers if seq > last_seq}
    open_ids = own_rows + tuple(call_id for call_id in _body_call_ids(body)
                                if call_id not in answered_after)
    return ToolCallState(open_ids, answered_ids, row.format)


def _body_call_ids(body: dict[str, Any]) -> list[str]:
    if body.get("role") != "assistant":
        return []
    calls = [call["id"] for call in body.get("tool_calls") or ()]
    content = body.get("content")
    if isinstance(content, list):
        calls += [block["id"] for block in content
                  if isinstance(block, dict) and block.get("type") == "tool_use"]
    return calls


def _select_messages(session: Session, session_pk: int, condition: Any
                     ) -> list[MessageRecord]:
    rows = session.execute(
        select(
            MessageRow.seq, MessageRow.body, MessageRow.role, MessageRow.tool_call_id,
            MessageRow.tokens, MessageRow.identifiers, MessageRow.outcomes,
        )
        .where(MessageRow.session_id == session_pk, condition)
        .order_by(MessageRow.seq)
    )
    return [MessageRecord(seq, body, role, tool_call_id, tokens, _mentions(identifiers),
                          decode_outcomes(outcomes))
            for seq, body, role, tool_call_id, tokens, identifiers, outcomes in rows]


def _mentions(stored: list[list[Any]] | None) -> tuple[StoredMention, ...] | None:
    if stored is None:
        return None
    # Ingest wrote each as [value, kind, source, count, line_tokens] from a Mention: the
    # JSON decoder already gives those types, so the rows are only frozen, not converted
    # one by one. Rows stored before line counts were kept have four fields.
    if stored and len(stored[0]) < 5:
        return tuple((*mention, None) for mention in stored)
    return cast(tuple[StoredMention, ...], tuple(map(tuple, stored)))


def measure_projection(
    session: Session, row: SessionRow, through_seq: int, snapshot_head_seq: int,
    block_tokens: int,
) -> ProjectionFigures:
    """Compute the session's projection size with a revision of these bounds, in SQL
    (no revision: all zeros, so everything counts). The system prompt is always in the
    projection, and unsummarized while no revision's snapshot has read anything."""

    def tokens_where(condition: Any) -> Any:
        return func.coalesce(func.sum(case((condition, MessageRow.tokens), else_=0)), 0)

    covered_instructions = and_(
        MessageRow.seq <= through_seq, MessageRow.role.in_(INSTRUCTION_ROLES)
    )
    instruction_tokens, tail_tokens, unsummarized_tokens = session.execute(
        select(
            tokens_where(covered_instructions),
            tokens_where(MessageRow.seq > through_seq),
            tokens_where(MessageRow.seq > snapshot_head_seq),
        ).where(MessageRow.session_id == row.id)
    ).one()
    return ProjectionFigures(
        projection_tokens=(row.system_tokens + int(instruction_tokens) + block_tokens
                           + int(tail_tokens)),
        unsummarized_tokens=int(unsummarized_tokens) + (
            row.system_tokens if snapshot_head_seq == 0 else 0),
    )


def find_revision(session: Session, revision_id: int) -> RevisionRow:
    row = session.get(RevisionRow, revision_id)
    if row is None:
        raise RevisionNotFound(f"no revision {revision_id}")
    return row


def insert_run(executor: Session | Connection, run: NewRun, *,
               revision_id: int | None) -> int:
    """Insert the run row (one Core statement, in an ORM session or a job's connection);
    return its id."""
    return int(executor.execute(
        insert(_RUNS).returning(_RUNS.c.id), run_values(run, revision_id=revision_id),
    ).scalar_one())


def run_values(run: NewRun, *, revision_id: int | None) -> dict[str, Any]:
    """The run row's values by column (its id aside)."""
    return {"session_id": run.session_id, "task_id": run.task_id, "attempt": run.attempt,
            "reason": run.reason, "outcome": run.outcome, "failure_class": run.failure_class,
            "failure_message": run.failure_message, "figures": run.figures,
            "revision_id": revision_id, "started_at": run.started_at,
            "finished_at": run.finished_at}


def to_session_state(row: SessionRow) -> SessionState:
    return SessionState(
        session_id=row.session_id, metadata=row.metadata_, head_seq=row.head_seq,
        session_format=row.format,
        active_revision_id=row.active_revision_id, system_tokens=row.system_tokens,
        total_tokens=row.total_tokens,
        projection_tokens=row.projection_tokens,
        tokens_since_compaction=row.tokens_since_compaction, created_at=row.created_at,
        last_appended_at=row.last_appended_at, last_compacted_at=row.last_compacted_at,
        lease_owner=row.lease_owner, lease_expires_at=row.lease_expires_at,
        breaker_state=row.breaker_state, breaker_failures=row.breaker_failures,
        breaker_opened_at=row.breaker_opened_at, queued_at=row.queued_at,
        queued_job_id=row.queued_job_id,
    )


def to_revision_record(row: RevisionRow, session_id: str) -> RevisionRecord:
    return RevisionRecord(
        id=row.id, session_id=session_id, parent_revision_id=row.parent_revision_id,
        through_seq=row.through_seq, snapshot_head_seq=row.snapshot_head_seq,
        summary=row.summary, block=row.block, block_tokens=row.block_tokens,
        artifacts=row.artifacts, summary_tokens=row.summary_tokens, span_tokens=row.span_tokens,
        projection_tokens_before=row.projection_tokens_before,
        projection_tokens_after=row.projection_tokens_after, model=row.model,
        prompt_version=row.prompt_version, summarizer=row.summarizer, created_at=row.created_at,
    )


def to_run_record(row: RunRow) -> RunRecord:
    return RunRecord(
        id=row.id, session_id=row.session_id, task_id=row.task_id, attempt=row.attempt,
        reason=row.reason, outcome=row.outcome, failure_class=row.failure_class,
        failure_message=row.failure_message, figures=row.figures,
        revision_id=row.revision_id, started_at=row.started_at, finished_at=row.finished_at,
    )
