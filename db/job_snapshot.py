"""A job's snapshot: the session joined to its active revision, its active messages and
the sizes of its newest revisions, read in one snapshot: on PostgreSQL one statement
(:data:`SNAPSHOT_STATEMENT`, which ``db/job_lease.py`` also heads with the lease), on
SQLite three in a read transaction.

``db/store_jobs.py`` owns the transactions; these functions never commit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import closing
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    CompoundSelect,
    Connection,
    FromClause,
    Select,
    Text,
    bindparam,
    cast,
    func,
    literal_column,
    null,
    or_,
    select,
    union_all,
)

from db.errors import SessionNotFound
from db.job_rows import (
    IS_INSTRUCTION,
    MESSAGES,
    REVISION_LABELS,
    REVISION_PREFIX,
    REVISIONS,
    SESSION_COLUMNS,
    SESSIONS,
    ZERO,
    revision_of,
    session_state_of,
    to_session_state,
)
from db.queries import iterate_active_texts
from db.records import (
    NO_SKIP,
    JobMessage,
    JobSnapshot,
    MessageText,
    RevisionSizes,
    SnapshotSkipRule,
)
from db.row_stream import Processor, result_processors, stream_rows
from db.scan import breaker_admits


def read_snapshot(connection: Connection, session_id: str, *, history: int,
                  to_message: Callable[[MessageText], JobMessage],
                  skip_rule: SnapshotSkipRule = NO_SKIP) -> JobSnapshot[JobMessage]:
    """Read the session, its active revision, its active messages (each converted by
    ``to_message`` as its row is fetched) and the sizes of its ``history`` newest
    revisions (never their summaries): on PostgreSQL in one statement (its own
    snapshot, run it in autocommit), elsewhere in three (run them in a read snapshot).
    A session that ``skip_rule`` matches has only its row and revision read."""
    if connection.dialect.name == "postgresql":
        return read_snapshot_in_one_statement(connection, session_id, history=history,
                                               to_message=to_message, skip_rule=skip_rule)
    row = connection.execute(_SESSION_WITH_REVISION, {"session_id": session_id}).first()
    if row is None:
        raise SessionNotFound(f"no session {session_id!r}")
    session = to_session_state(row)
    revision = revision_of(session_id, row._mapping)
    if shut := skip_rule.row_alone(session, revision):
        return shut
    recent: tuple[RevisionSizes, ...] = ()
    if history > 0:
        sizes = connection.execute(_RECENT_SIZES, {"session_pk": row.id, "history": history})
        recent = tuple(RevisionSizes(before, after) for _id, before, after in sizes)
    through_seq = revision.through_seq if revision else 0
    messages = [to_message(text)
                for text in iterate_active_texts(connection, row.id, through_seq,
                                                 session.session_format)]
    return JobSnapshot(session=session, revision=revision, messages=messages,
                       recent_revisions=recent)


# The session joined to its active revision.
_SESSION_WITH_REVISION: Select[Any] = (
    select(*SESSION_COLUMNS, *REVISION_LABELS)
    .select_from(SESSIONS.outerjoin(
        REVISIONS, REVISIONS.c.id == SESSIONS.c.active_revision_id))
    .where(SESSIONS.c.session_id == bindparam("session_id"))
)
# The sizes of a session's newest revisions, newest first.
_RECENT_SIZES: Select[Any] = (
    select(REVISIONS.c.id, REVISIONS.c.projection_tokens_before,
           REVISIONS.c.projection_tokens_after)
    .where(REVISIONS.c.session_id == bindparam("session_pk"))
    .order_by(REVISIONS.c.id.desc())
    .limit(bindparam("history"))
)


# The snapshot statement's parts (its column ``part``).
HEAD_PART, MESSAGE_PART, SIZE_PART = 0, 1, 2


def snapshot_statement(session: Any, revision: Any, source: FromClause,
                        found: ColumnElement[bool]) -> CompoundSelect[Any]:
    """PostgreSQL: the snapshot as one statement, which sees one snapshot by itself (no
    BEGIN and COMMIT round trips, nor two more statements'): the session with its active
    revision, its active messages in seq order and its newest revisions' sizes, as the
    rows of one ``UNION ALL`` told apart by ``part``, each part's columns NULL in the
    others' rows. The session row is ``session``'s columns with ``revision``'s (labelled
    as ``REVISION_LABELS``), read from ``source`` where ``found``; the other parts find
    it through a CTE of its id and bound alone, which keeps the text within psycopg's
    cache (see ``db.job_rows.ZERO``). The CTE holds no row when the bound ``SnapshotSkipRule``
    matches the session: its breaker refuses a job whose clock less the cooldown is
    ``cooldown_start`` (``breaker_admits`` false), or its projection is at most
    ``trigger_tokens``; then only the session row is read."""
    cooldown_start = bindparam("cooldown_start", type_=session.c.breaker_opened_at.type)
    head = (select(session.c.id, session.c.format, revision.c.through_seq).select_from(source)
            .where(found, breaker_admits(session.c, cooldown_start),
                   session.c.projection_tokens > bindparam("trigger_tokens"))
            .cte("h"))
    # Short labels (``m_``: a message's, ``s_``: a revision's sizes) keep the text within
    # psycopg's cache.
    message_columns = (MESSAGES.c.seq.label("m_seq"),
                       MESSAGES.c.body.cast(Text).label("m_body"),
                       MESSAGES.c.tokens.label("m_tokens"),
                       MESSAGES.c.identifiers.cast(Text).label("m_identifiers"),
                       MESSAGES.c.outcomes.label("m_outcomes"))
    size_columns = (REVISIONS.c.id.label("s_id"),
                    REVISIONS.c.projection_tokens_before.label("s_before"),
                    REVISIONS.c.projection_tokens_after.label("s_after"))

    def nulls(columns: tuple[Any, ...]) -> list[Any]:
        return [cast(null(), column.type).label(column.name) for column in columns]

    def part(number: int) -> Any:
        return literal_column(str(number)).label("part")

    # The first part's columns name and type the union's; the others' NULLs take them.
    def bare_nulls(count: int) -> list[Any]:
        return [literal_column("NULL") for _ in range(count)]

    head_columns = (*session.c, *(c.label(f"{REVISION_PREFIX}{c.name}") for c in revision.c))
    session_part = (select(part(HEAD_PART), *head_columns, *nulls(message_columns),
                           *nulls(size_columns)).select_from(source).where(found))
    through_seq = func.coalesce(head.c.through_seq, ZERO)
    # A message row carries its session's format in the session row's format column (a
    # column of its own would take the statement past psycopg's cached length).
    format_at = list(session.c.keys()).index("format")
    messages_part = (
        select(part(MESSAGE_PART), *bare_nulls(format_at), head.c.format,
               *bare_nulls(len(head_columns) - format_at - 1), *message_columns,
               *bare_nulls(len(size_columns)))
        .where(MESSAGES.c.session_id == head.c.id,
               or_(MESSAGES.c.seq > through_seq, IS_INSTRUCTION))
        .order_by(MESSAGES.c.seq)
    )
    sizes_part = (
        select(part(SIZE_PART), *bare_nulls(len(head_columns) + len(message_columns)),
               *size_columns)
        .where(REVISIONS.c.session_id == head.c.id)
        .order_by(REVISIONS.c.id.desc())
        .limit(bindparam("history"))
    )
    return union_all(session_part, messages_part, sizes_part)


SNAPSHOT_STATEMENT = snapshot_statement(
    SESSIONS, REVISIONS,
    SESSIONS.outerjoin(REVISIONS, REVISIONS.c.id == SESSIONS.c.active_revision_id),
    SESSIONS.c.session_id == bindparam("session_id"))
# Where the message and size columns sit in its rows (read by position, not by name:
# a Row's attribute lookup costs ~10x a tuple index, and a message row has six).
SNAPSHOT_KEYS = tuple(str(column.key) for column in SNAPSHOT_STATEMENT.selected_columns)
SNAPSHOT_POSITIONS = {key: position for position, key in enumerate(SNAPSHOT_KEYS)}
(_SEQ, _BODY, _TOKENS, _IDENTIFIERS, _OUTCOMES, _FORMAT, _SIZE_ID, _SIZE_BEFORE,
 _SIZE_AFTER) = (SNAPSHOT_POSITIONS[key] for key in (
    "m_seq", "m_body", "m_tokens", "m_identifiers", "m_outcomes", "format", "s_id",
    "s_before", "s_after"))


# What a skip rule without a check binds: every opening is before the first, every projection
# over the second.
_ANY_BREAKER = datetime.max.replace(tzinfo=UTC)
_ANY_PROJECTION = -1


def read_snapshot_in_one_statement(
    connection: Connection, session_id: str, *, history: int,
    to_message: Callable[[MessageText], JobMessage], skip_rule: SnapshotSkipRule,
    statement: CompoundSelect[Any] = SNAPSHOT_STATEMENT,
    parameters: dict[str, Any] | None = None,
) -> JobSnapshot[JobMessage]:
    """Run ``SNAPSHOT_STATEMENT`` (or ``statement``, a ``snapshot_statement`` with
    ``parameters`` besides ``history`` and ``skip_rule``'s), converting each message as its
    row arrives (streamed: the driver never holds the whole result set beside the
    converted messages)."""
    bound = {"history": history,
             "cooldown_start": _ANY_BREAKER if skip_rule.cooldown_start is None
             else skip_rule.cooldown_start,
             "trigger_tokens": _ANY_PROJECTION if skip_rule.trigger_tokens is None
             else skip_rule.trigger_tokens}
    rows = stream_rows(connection, statement, {"session_id": session_id, **bound}
                       if parameters is None else {**parameters, **bound})
    # Closed here when ``to_message`` raises: the stream holds the connection's lock until
    # it ends, and the transaction's rollback would wait on it for ever.
    with closing(rows):
        return snapshot_from_rows(rows, session_id, to_message=to_message,
                                  head_processors=result_processors(statement,
                                                                    connection.dialect),
                                  skip_rule=skip_rule)


def snapshot_from_rows(rows: Iterable[Sequence[Any]], session_id: str, *,
                       to_message: Callable[[MessageText], JobMessage],
                       head_processors: Sequence[Processor],
                       skip_rule: SnapshotSkipRule = NO_SKIP) -> JobSnapshot[JobMessage]:
    """The snapshot from ``SNAPSHOT_STATEMENT``'s raw rows, in any order; the head row's
    values are processed by ``head_processors`` (its columns' types); ``skip_rule``: the one
    the statement was bound with."""
    head: dict[str, Any] | None = None
    seqs: list[int] = []
    messages: list[JobMessage] = []
    sizes: list[tuple[int, RevisionSizes]] = []
    for row in rows:
        part = row[0]
        if part == MESSAGE_PART:
            seqs.append(row[_SEQ])
            messages.append(to_message(MessageText(
                row[_SEQ], row[_BODY], row[_TOKENS], row[_IDENTIFIERS], row[_OUTCOMES],
                row[_FORMAT])))
        elif part == HEAD_PART:
            head = {key: process(value) if process and value is not None else value
                    for key, process, value in zip(SNAPSHOT_KEYS, head_processors, row,
                                                   strict=True)}
        else:
            sizes.append((row[_SIZE_ID], RevisionSizes(row[_SIZE_BEFORE], row[_SIZE_AFTER])))
    if head is None:
        raise SessionNotFound(f"no session {session_id!r}")
    if seqs != sorted(seqs):  # SQL orders a UNION's rows by its ORDER BY alone
        messages = [message for _seq, message in sorted(
            zip(seqs, messages, strict=True), key=lambda pair: pair[0])]
    sizes.sort(key=lambda pair: pair[0], reverse=True)
    session, revision = session_state_of(head), revision_of(session_id, head)
    # The statement read no message nor size of a session the skip rule matches.
    return skip_rule.row_alone(session, revision) or JobSnapshot(
        session=session, revision=revision, messages=messages,
        recent_revisions=tuple(size for _id, size in sizes))
