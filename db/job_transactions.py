"""A compaction job's three transactions, in SQLAlchemy Core (no ORM unit of work).

1. :func:`take_lease`: one ``UPDATE ... RETURNING`` takes the lease and reads the row.
2. :func:`read_snapshot`: the session with its active revision (one join), its active
   messages, and the sizes of its last few revisions, in one read snapshot (on
   PostgreSQL one statement). On PostgreSQL a job runs the two as one statement,
   :func:`take_lease_with_snapshot`.
3. :func:`commit_swap` or :func:`commit_failure`: everything the job writes at its end,
   under the session's row lock: the revision (compare-and-swap), the session's figures,
   the breaker, the lease release, the queue marker and the run row. On PostgreSQL a
   compaction first tries :func:`try_checked_swap`, the same in one statement.

``db/store.py`` owns the transactions; these functions never commit. The lease's and the
swap's statements are built once, at import, with bound parameters: a job neither builds
them nor recomputes their cache keys (together ~1.3 ms of CPU a job on the bench machine,
docs/BENCHMARKS.md section 1), and SQLAlchemy's compiled cache serves them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import closing
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    CTE,
    ColumnClause,
    ColumnElement,
    CompoundSelect,
    Connection,
    FromClause,
    Insert,
    Row,
    Select,
    Table,
    Text,
    Update,
    and_,
    bindparam,
    case,
    cast,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    union_all,
    update,
)

from db.errors import LeaseLost, RevisionConflict, SessionNotFound
from db.models import INSTRUCTION_ROLES, MessageRow, RevisionRow, RunRow, SessionRow
from db.queries import insert_run, iterate_active_texts, run_values
from db.records import (
    NO_GATE,
    BreakerUpdate,
    JobMessage,
    JobSnapshot,
    MessageText,
    NewRevision,
    NewRun,
    RevisionRecord,
    RevisionSizes,
    SessionState,
    SnapshotGate,
)
from db.row_stream import Processor, result_processors, stream_rows
from db.scan import breaker_admits

_SESSIONS: Table = SessionRow.__table__  # type: ignore[assignment]
_REVISIONS: Table = RevisionRow.__table__  # type: ignore[assignment]
_MESSAGES: Table = MessageRow.__table__  # type: ignore[assignment]
_RUNS: Table = RunRow.__table__  # type: ignore[assignment]
_SESSION_COLUMNS = tuple(_SESSIONS.c)
# The active revision's columns in the snapshot's join, prefixed apart from the session's.
_REVISION_LABELS = tuple(column.label(f"revision_{column.name}") for column in _REVISIONS.c)
CLOSED = BreakerUpdate(state="closed", failures=0, opened_at=None)
# Constants written into the statements' text, not bound: psycopg caches its conversion of
# a statement's placeholders only for a text of at most 4,096 characters and 50
# parameters (``psycopg._queries``), and re-parses a longer one on every execution.
_ZERO: ColumnClause[Any] = literal_column("0")
_IS_INSTRUCTION = _MESSAGES.c.role.in_(
    [literal_column(f"'{role}'") for role in INSTRUCTION_ROLES])


# PostgreSQL only: the lease's commit does not wait for its WAL flush (an fdatasync).
# Losing a lease in a server crash costs no correctness: the crash also breaks the job's
# connection, and the swap re-checks the lease under the row lock (LeaseLost:
# nothing written) besides comparing-and-swapping the active revision; a later durable
# commit (the swap's) flushes the WAL up to its own record, the lease's with it. Set for
# the statement's own transaction only (``set_config(..., true)``): the pooled connection,
# and the swap that reuses it, stay synchronous. Evaluated once the row matched, before
# anything is written; the function's result is never NULL.
_LEASE_COMMITS_ASYNCHRONOUSLY = literal_column(
    "set_config('synchronous_commit', 'off', true)").is_not(None)
# LIKE's escape character for a take-over suffix (an owner ends in ":" + task id).
_LIKE_ESCAPE = "/"


def _lease_statement(*, take_over: bool, asynchronous_commit: bool) -> Update:
    owner = _SESSIONS.c.lease_owner
    free = [owner.is_(None), owner == bindparam("owner"),
            _SESSIONS.c.lease_expires_at <= bindparam("now")]
    if take_over:
        free.append(owner.like(bindparam("take_over_pattern"), escape=_LIKE_ESCAPE))
    conditions = [_SESSIONS.c.session_id == bindparam("leased_session_id"), or_(*free)]
    if asynchronous_commit:
        conditions.append(_LEASE_COMMITS_ASYNCHRONOUSLY)
    return (update(_SESSIONS).where(*conditions)
            .values(lease_owner=bindparam("owner"),
                    lease_expires_at=bindparam("expires_at",
                                               type_=_SESSIONS.c.lease_expires_at.type))
            .returning(*_SESSION_COLUMNS))


# (take_over, asynchronous_commit) -> the lease's UPDATE ... RETURNING.
_LEASE_STATEMENTS = {(take_over, asynchronous): _lease_statement(
    take_over=take_over, asynchronous_commit=asynchronous)
    for take_over in (False, True) for asynchronous in (False, True)}


def take_lease(connection: Connection, session_id: str, owner: str, ttl_s: float,
               now: datetime, *, take_over: str | None = None) -> SessionState | None:
    """Take or renew the lease and return the session row as it now is; None when another
    owner holds an unexpired lease. ``take_over`` also takes a lease whose owner ends
    with ``":" + take_over`` (an earlier delivery of the same message, lost with its
    worker). SessionNotFound when the session does not exist. On PostgreSQL the
    statement's commit is asynchronous (see ``_LEASE_COMMITS_ASYNCHRONOUSLY``)."""
    statement = _LEASE_STATEMENTS[take_over is not None,
                                  connection.dialect.name == "postgresql"]
    row = connection.execute(
        statement, _lease_parameters(session_id, owner, ttl_s, now, take_over)).first()
    if row is not None:
        return to_session_state(row)
    _check_exists(connection, session_id)
    return None


def _lease_parameters(session_id: str, owner: str, ttl_s: float, now: datetime,
                      take_over: str | None) -> dict[str, Any]:
    """``_lease_statement``'s parameters."""
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be positive, got {ttl_s}")
    parameters: dict[str, Any] = {"leased_session_id": session_id, "owner": owner, "now": now,
                                  "expires_at": now + timedelta(seconds=ttl_s)}
    if take_over is not None:
        parameters["take_over_pattern"] = "%" + _escape_like(f":{take_over}")
    return parameters


def _escape_like(value: str) -> str:
    """``value`` matched literally by LIKE ... ESCAPE ``_LIKE_ESCAPE``."""
    for special in (_LIKE_ESCAPE, "%", "_"):
        value = value.replace(special, _LIKE_ESCAPE + special)
    return value


def read_snapshot(connection: Connection, session_id: str, *, history: int,
                  to_message: Callable[[MessageText], JobMessage],
                  gate: SnapshotGate = NO_GATE) -> JobSnapshot[JobMessage]:
    """Read the session, its active revision, its active messages (each converted by
    ``to_message`` as its row is fetched) and the sizes of its ``history`` newest
    revisions (never their summaries): on PostgreSQL in one statement (its own
    snapshot, run it in autocommit), elsewhere in three (run them in a read snapshot).
    A session that ``gate`` shuts has only its row and revision read."""
    if connection.dialect.name == "postgresql":
        return _read_snapshot_in_one_statement(connection, session_id, history=history,
                                               to_message=to_message, gate=gate)
    row = connection.execute(_SESSION_WITH_REVISION, {"session_id": session_id}).first()
    if row is None:
        raise SessionNotFound(f"no session {session_id!r}")
    session = to_session_state(row)
    revision = _active_revision(session_id, row)
    if shut := gate.row_alone(session, revision):
        return shut
    recent: tuple[RevisionSizes, ...] = ()
    if history > 0:
        sizes = connection.execute(_RECENT_SIZES, {"session_pk": row.id, "history": history})
        recent = tuple(RevisionSizes(before, after) for _id, before, after in sizes)
    through_seq = revision.through_seq if revision else 0
    messages = [to_message(text)
                for text in iterate_active_texts(connection, row.id, through_seq)]
    return JobSnapshot(session=session, revision=revision, messages=messages,
                       recent_revisions=recent)


# The session joined to its active revision.
_SESSION_WITH_REVISION: Select[Any] = (
    select(*_SESSION_COLUMNS, *_REVISION_LABELS)
    .select_from(_SESSIONS.outerjoin(
        _REVISIONS, _REVISIONS.c.id == _SESSIONS.c.active_revision_id))
    .where(_SESSIONS.c.session_id == bindparam("session_id"))
)
# The sizes of a session's newest revisions, newest first.
_RECENT_SIZES: Select[Any] = (
    select(_REVISIONS.c.id, _REVISIONS.c.projection_tokens_before,
           _REVISIONS.c.projection_tokens_after)
    .where(_REVISIONS.c.session_id == bindparam("session_pk"))
    .order_by(_REVISIONS.c.id.desc())
    .limit(bindparam("history"))
)


def _active_revision(session_id: str, row: Row[Any]) -> RevisionRecord | None:
    """The active revision of a ``_SESSION_WITH_REVISION`` row; None when it has none."""
    return _revision_of(session_id, row._mapping)


def _revision_of(session_id: str, mapping: Mapping[Any, Any]) -> RevisionRecord | None:
    if mapping["revision_id"] is None:
        return None
    return RevisionRecord(
        session_id=session_id,
        **{c.name: mapping[f"revision_{c.name}"] for c in _REVISIONS.c if c.name != "session_id"},
    )


# The snapshot statement's parts (its column ``part``).
_HEAD_PART, _MESSAGE_PART, _SIZE_PART = 0, 1, 2


def _snapshot_statement(session: Any, revision: Any, source: FromClause,
                        found: ColumnElement[bool]) -> CompoundSelect[Any]:
    """PostgreSQL: the snapshot as one statement, which sees one snapshot by itself (no
    BEGIN and COMMIT round trips, nor two more statements'): the session with its active
    revision, its active messages in seq order and its newest revisions' sizes, as the
    rows of one ``UNION ALL`` told apart by ``part``, each part's columns NULL in the
    others' rows. The session row is ``session``'s columns with ``revision``'s (labelled
    as ``_REVISION_LABELS``), read from ``source`` where ``found``; the other parts find
    it through a CTE of its id and bound alone, which keeps the text within psycopg's
    cache (see ``_ZERO``). The CTE holds no row when the bound ``SnapshotGate`` shuts
    the session: its breaker refuses a job whose clock less the cooldown is
    ``cooldown_start`` (``breaker_admits`` false), or its projection is at most
    ``trigger_tokens``; then only the session row is read."""
    cooldown_start = bindparam("cooldown_start", type_=session.c.breaker_opened_at.type)
    head = (select(session.c.id, revision.c.through_seq).select_from(source)
            .where(found, breaker_admits(session.c, cooldown_start),
                   session.c.projection_tokens > bindparam("trigger_tokens"))
            .cte("head"))
    message_columns = (_MESSAGES.c.seq.label("message_seq"),
                       _MESSAGES.c.body.cast(Text).label("message_body"),
                       _MESSAGES.c.tokens.label("message_tokens"),
                       _MESSAGES.c.identifiers.cast(Text).label("message_identifiers"))
    size_columns = (_REVISIONS.c.id.label("size_revision_id"),
                    _REVISIONS.c.projection_tokens_before.label("size_before"),
                    _REVISIONS.c.projection_tokens_after.label("size_after"))

    def nulls(columns: tuple[Any, ...]) -> list[Any]:
        return [cast(null(), column.type).label(column.name) for column in columns]

    def part(number: int) -> Any:
        return literal_column(str(number)).label("part")

    # The first part's columns name and type the union's; the others' NULLs take them.
    def bare_nulls(count: int) -> list[Any]:
        return [literal_column("NULL") for _ in range(count)]

    head_columns = (*session.c, *(c.label(f"revision_{c.name}") for c in revision.c))
    session_part = (select(part(_HEAD_PART), *head_columns, *nulls(message_columns),
                           *nulls(size_columns)).select_from(source).where(found))
    through_seq = func.coalesce(head.c.through_seq, _ZERO)
    messages_part = (
        select(part(_MESSAGE_PART), *bare_nulls(len(head_columns)), *message_columns,
               *bare_nulls(len(size_columns)))
        .where(_MESSAGES.c.session_id == head.c.id,
               or_(_MESSAGES.c.seq > through_seq, _IS_INSTRUCTION))
        .order_by(_MESSAGES.c.seq)
    )
    sizes_part = (
        select(part(_SIZE_PART), *bare_nulls(len(head_columns) + len(message_columns)),
               *size_columns)
        .where(_REVISIONS.c.session_id == head.c.id)
        .order_by(_REVISIONS.c.id.desc())
        .limit(bindparam("history"))
    )
    return union_all(session_part, messages_part, sizes_part)


_SNAPSHOT_STATEMENT = _snapshot_statement(
    _SESSIONS, _REVISIONS,
    _SESSIONS.outerjoin(_REVISIONS, _REVISIONS.c.id == _SESSIONS.c.active_revision_id),
    _SESSIONS.c.session_id == bindparam("session_id"))
# Where the message and size columns sit in its rows (read by position, not by name:
# a Row's attribute lookup costs ~10x a tuple index, and a message row has four).
_SNAPSHOT_KEYS = tuple(str(column.key) for column in _SNAPSHOT_STATEMENT.selected_columns)
_SNAPSHOT_POSITIONS = {key: position for position, key in enumerate(_SNAPSHOT_KEYS)}
_SEQ, _BODY, _TOKENS, _IDENTIFIERS, _SIZE_ID, _SIZE_BEFORE, _SIZE_AFTER = (
    _SNAPSHOT_POSITIONS[key] for key in (
        "message_seq", "message_body", "message_tokens", "message_identifiers",
        "size_revision_id", "size_before", "size_after"))


# What a gate without a check binds: every opening is before the first, every projection
# over the second.
_ANY_BREAKER = datetime.max.replace(tzinfo=UTC)
_ANY_PROJECTION = -1


def _read_snapshot_in_one_statement(
    connection: Connection, session_id: str, *, history: int,
    to_message: Callable[[MessageText], JobMessage], gate: SnapshotGate,
    statement: CompoundSelect[Any] = _SNAPSHOT_STATEMENT,
    parameters: dict[str, Any] | None = None,
) -> JobSnapshot[JobMessage]:
    """Run ``_SNAPSHOT_STATEMENT`` (or ``statement``, a ``_snapshot_statement`` with
    ``parameters`` besides ``history`` and ``gate``'s), converting each message as its
    row arrives (streamed: the driver never holds the whole result set beside the
    converted messages)."""
    bound = {"history": history,
             "cooldown_start": _ANY_BREAKER if gate.cooldown_start is None
             else gate.cooldown_start,
             "trigger_tokens": _ANY_PROJECTION if gate.trigger_tokens is None
             else gate.trigger_tokens}
    rows = stream_rows(connection, statement, {"session_id": session_id, **bound}
                       if parameters is None else {**parameters, **bound})
    # Closed here when ``to_message`` raises: the stream holds the connection's lock until
    # it ends, and the transaction's rollback would wait on it for ever.
    with closing(rows):
        return snapshot_from_rows(rows, session_id, to_message=to_message,
                                  head_processors=result_processors(statement,
                                                                    connection.dialect),
                                  gate=gate)


def snapshot_from_rows(rows: Iterable[Sequence[Any]], session_id: str, *,
                       to_message: Callable[[MessageText], JobMessage],
                       head_processors: Sequence[Processor],
                       gate: SnapshotGate = NO_GATE) -> JobSnapshot[JobMessage]:
    """The snapshot from ``_SNAPSHOT_STATEMENT``'s raw rows, in any order; the head row's
    values are processed by ``head_processors`` (its columns' types); ``gate``: the one
    the statement was bound with."""
    head: dict[str, Any] | None = None
    seqs: list[int] = []
    messages: list[JobMessage] = []
    sizes: list[tuple[int, RevisionSizes]] = []
    for row in rows:
        part = row[0]
        if part == _MESSAGE_PART:
            seqs.append(row[_SEQ])
            messages.append(to_message(MessageText(
                row[_SEQ], row[_BODY], row[_TOKENS], row[_IDENTIFIERS])))
        elif part == _HEAD_PART:
            head = {key: process(value) if process and value is not None else value
                    for key, process, value in zip(_SNAPSHOT_KEYS, head_processors, row,
                                                   strict=True)}
        else:
            sizes.append((row[_SIZE_ID], RevisionSizes(row[_SIZE_BEFORE], row[_SIZE_AFTER])))
    if head is None:
        raise SessionNotFound(f"no session {session_id!r}")
    if seqs != sorted(seqs):  # SQL orders a UNION's rows by its ORDER BY alone
        messages = [message for _seq, message in sorted(
            zip(seqs, messages, strict=True), key=lambda pair: pair[0])]
    sizes.sort(key=lambda pair: pair[0], reverse=True)
    session, revision = session_state_of(head), _revision_of(session_id, head)
    # The statement read no message nor size of a session the gate shuts.
    return gate.row_alone(session, revision) or JobSnapshot(
        session=session, revision=revision, messages=messages,
        recent_revisions=tuple(size for _id, size in sizes))


def _leased_snapshot_statement(*, take_over: bool) -> CompoundSelect[Any]:
    """PostgreSQL: ``_lease_statement`` and ``_SNAPSHOT_STATEMENT`` as one statement (one
    round trip): its head is the row the lease's UPDATE returns, joined to the active
    revision, so nothing is read when the lease is not taken.

    The statement's snapshot is taken before its UPDATE waits for the row lock; were a
    write (an append, a swap) to commit meanwhile, the UPDATE would return the row as
    that write left it while the messages and the revision are read as they were
    before. The head is therefore kept only when the row the snapshot sees has the same
    ``head_seq`` and active revision as the one the lease returned; when it does not,
    the lease is taken but the statement returns no row (``take_lease_with_snapshot``
    then reads a fresh snapshot)."""
    # One-letter names, as ``r``: the text stays within psycopg's cache (see ``_ZERO``).
    lease = _lease_statement(take_over=take_over, asynchronous_commit=True).cte("l")
    seen, revision = _SESSIONS.alias("seen"), _REVISIONS.alias("r")
    return _snapshot_statement(
        lease, revision,
        lease.join(seen, seen.c.id == lease.c.id).outerjoin(
            revision, revision.c.id == lease.c.active_revision_id),
        and_(seen.c.head_seq == lease.c.head_seq,
             seen.c.active_revision_id.is_not_distinct_from(lease.c.active_revision_id)))


# take_over -> the lease and the snapshot in one statement.
_LEASED_SNAPSHOT_STATEMENTS = {take_over: _leased_snapshot_statement(take_over=take_over)
                               for take_over in (False, True)}


def take_lease_with_snapshot(
    connection: Connection, session_id: str, owner: str, ttl_s: float, now: datetime, *,
    take_over: str | None = None, history: int,
    to_message: Callable[[MessageText], JobMessage], gate: SnapshotGate = NO_GATE,
) -> JobSnapshot[JobMessage] | None:
    """PostgreSQL (run it in autocommit): ``take_lease`` and ``read_snapshot`` in one
    statement; the snapshot, whose session is the row the lease left, or None when
    another owner holds the lease (nothing else is read then). Two statements more when
    the lease is not taken (which owner holds it), or when a write committed while the
    statement waited for the row lock (a fresh snapshot)."""
    try:
        return _read_snapshot_in_one_statement(
            connection, session_id, history=history, to_message=to_message, gate=gate,
            statement=_LEASED_SNAPSHOT_STATEMENTS[take_over is not None],
            parameters=_lease_parameters(session_id, owner, ttl_s, now, take_over))
    except SessionNotFound:
        pass  # no head row: the lease was not taken, or its snapshot is stale
    holder = connection.execute(_LEASE_HOLDER, {"session_id": session_id}).first()
    if holder is None:
        raise SessionNotFound(f"no session {session_id!r}")
    if holder.lease_owner != owner:
        return None
    return _read_snapshot_in_one_statement(connection, session_id, history=history,
                                           to_message=to_message, gate=gate)


_LEASE_HOLDER: Select[Any] = select(_SESSIONS.c.lease_owner).where(
    _SESSIONS.c.session_id == bindparam("session_id"))


def _lock_for_swap(session_id_parameter: str) -> Select[Any]:
    """The swap's lock: the session row with its parent's bounds, under FOR UPDATE."""
    return (
        select(_SESSIONS.c.id, _SESSIONS.c.head_seq, _SESSIONS.c.active_revision_id,
               _SESSIONS.c.lease_owner, _SESSIONS.c.lease_expires_at,
               _SESSIONS.c.queued_job_id,
               select(_REVISIONS.c.through_seq)
               .where(_REVISIONS.c.id == _SESSIONS.c.active_revision_id)
               .scalar_subquery().label("parent_through_seq"))
        .where(_SESSIONS.c.session_id == bindparam(session_id_parameter))
        .with_for_update(of=_SESSIONS)
    )


_LOCK_FOR_SWAP = _lock_for_swap("session_id")
# The revision's columns the job gives, bound as "revision_<column>".
_REVISION_VALUES = ("session_id", "parent_revision_id", "through_seq", "snapshot_head_seq",
                    "summary", "block", "block_tokens", "artifacts", "summary_tokens",
                    "span_tokens", "projection_tokens_before", "model", "prompt_version",
                    "summarizer", "created_at")


def _revision_insert(*, cast_artifacts: bool, session: CTE | None = None) -> Insert:
    """INSERT ... SELECT the revision with its projection size summed from the messages
    in the same statement (under the row lock no append can commit meanwhile); with
    ``session`` (a CTE of the session's ``id``), of that session, and nothing when the
    CTE holds no row.

    The artifacts arrive as the JSON text the job encoded once (``artifacts_json``), bound
    as text so the column type does not serialize them again: cast to the column's type on
    PostgreSQL; SQLite keeps JSON as text, and a CAST there would take the type name's
    NUMERIC affinity (text to 0)."""
    values: dict[str, Any] = {name: bindparam(f"revision_{name}", type_=_REVISIONS.c[name].type)
                              for name in _REVISION_VALUES}
    artifacts = bindparam("revision_artifacts", type_=Text)
    values["artifacts"] = (cast(artifacts, _REVISIONS.c.artifacts.type) if cast_artifacts
                           else artifacts)
    through_seq = values["through_seq"]
    covered_instructions = and_(_MESSAGES.c.seq <= through_seq, _IS_INSTRUCTION)
    kept = or_(covered_instructions, _MESSAGES.c.seq > through_seq)
    projection = values["block_tokens"] + func.coalesce(
        func.sum(case((kept, _MESSAGES.c.tokens), else_=_ZERO)), _ZERO)
    if session is None:
        source = select(*values.values(), projection).where(
            _MESSAGES.c.session_id == values["session_id"])
    else:
        values["session_id"] = session.c.id
        source = (select(*values.values(), projection)
                  .select_from(session.outerjoin(_MESSAGES,
                                                 _MESSAGES.c.session_id == session.c.id))
                  .group_by(session.c.id))
    return (insert(_REVISIONS).from_select([*values, "projection_tokens_after"], source)
            .returning(_REVISIONS.c.id, _REVISIONS.c.projection_tokens_after,
                       _REVISIONS.c.session_id))


# SQLite writes a swap statement by statement, PostgreSQL in one (``_one_statement_swap``).
_INSERT_REVISION = _revision_insert(cast_artifacts=False)
# The tokens appended after the job's snapshot: what the new revision leaves uncompacted.
_TOKENS_SINCE_SNAPSHOT = (
    select(func.coalesce(func.sum(_MESSAGES.c.tokens), _ZERO))
    .where(_MESSAGES.c.session_id == bindparam("session_pk"),
           _MESSAGES.c.seq > bindparam("snapshot_head_seq"))
    .scalar_subquery()
)
# The session after a swap; the other columns it sets are the execution's parameters.
_UPDATE_SWAPPED_SESSION: Update = (
    update(_SESSIONS).where(_SESSIONS.c.id == bindparam("session_pk"))
    .values(tokens_since_compaction=_TOKENS_SINCE_SNAPSHOT)
)
# The swap's session columns set from parameters, bound as "session_<column>" in the
# one-statement write.
_SWAPPED_SESSION_VALUES = ("last_compacted_at", "breaker_state", "breaker_failures",
                           "breaker_opened_at")
# The run's columns given by the job (the revision's id comes from the INSERT).
_RUN_VALUES = tuple(c.name for c in _RUNS.c if c.name not in ("id", "revision_id"))


def _one_statement_swap(*, release_lease: bool, clear_queue_marker: bool) -> Insert:
    """PostgreSQL: the revision, the session and the run written by one statement
    (data-modifying CTEs, which PostgreSQL runs once each whether read or not): two round
    trips fewer than a statement each. They see one snapshot, taken after the row lock
    the transaction already holds, as three statements would."""
    new_revision = _revision_insert(cast_artifacts=True).cte("new_revision")
    values: dict[str, Any] = {
        "active_revision_id": select(new_revision.c.id).scalar_subquery(),
        "projection_tokens": select(new_revision.c.projection_tokens_after).scalar_subquery(),
        "tokens_since_compaction": _TOKENS_SINCE_SNAPSHOT,
        **{name: bindparam(f"session_{name}", type_=_SESSIONS.c[name].type)
           for name in _SWAPPED_SESSION_VALUES},
    }
    if release_lease:
        values |= {"lease_owner": None, "lease_expires_at": None}
    if clear_queue_marker:
        values |= {"queued_at": None, "queued_job_id": None}
    swapped = (update(_SESSIONS).where(_SESSIONS.c.id == bindparam("session_pk"))
               .values(values).cte("swapped_session"))
    run = select(*(bindparam(f"run_{name}", type_=_RUNS.c[name].type) for name in _RUN_VALUES),
                 new_revision.c.id)
    return (insert(_RUNS).from_select([*_RUN_VALUES, "revision_id"], run)
            .returning(_RUNS.c.revision_id).add_cte(swapped))


# (release_lease, clear_queue_marker) -> PostgreSQL's one-statement write of a swap.
_ONE_STATEMENT_SWAPS = {(release, clear): _one_statement_swap(
    release_lease=release, clear_queue_marker=clear)
    for release in (False, True) for clear in (False, True)}


def _checked_swap() -> Insert:
    """PostgreSQL: a job's whole swap in one statement, run in autocommit (no BEGIN and
    COMMIT round trips, nor a lock statement's): ``commit_swap``'s lock and checks as a
    CTE (``checked``: a row only when they all pass), then its writes, which read that
    row, so that a failed check writes nothing.

    A statement's snapshot is taken before it waits for the row lock, and its reads of
    the messages see that snapshot: were an append to commit while it waits, the sums
    would miss its messages. ``checked`` also requires the locked row's ``head_seq``
    (the newest version, which the lock reads) to be the newest seq the snapshot sees;
    when it is not, nothing is written and ``commit_job`` runs ``commit_swap``."""
    newest_seq = (select(func.coalesce(func.max(_MESSAGES.c.seq), _ZERO))
                  .where(_MESSAGES.c.session_id == _SESSIONS.c.id).scalar_subquery())
    # Parameters never named as a sessions column: the UPDATE below would take them as
    # the values of those columns.
    locked = (_lock_for_swap("locked_session_id").add_columns(newest_seq.label("newest_seq"))
              .cte("locked"))
    checked = select(locked.c.id).where(
        locked.c.lease_owner == bindparam("expected_lease_owner"),
        locked.c.lease_expires_at > bindparam("now", type_=_SESSIONS.c.lease_expires_at.type),
        locked.c.active_revision_id.is_not_distinct_from(bindparam(
            "revision_parent_revision_id", type_=_REVISIONS.c.parent_revision_id.type)),
        func.coalesce(locked.c.parent_through_seq, _ZERO)
        <= bindparam("revision_through_seq", type_=_REVISIONS.c.through_seq.type),
        bindparam("revision_snapshot_head_seq", type_=_REVISIONS.c.snapshot_head_seq.type)
        <= locked.c.head_seq,
        locked.c.head_seq == locked.c.newest_seq,
    ).cte("checked")
    new_revision = _revision_insert(cast_artifacts=True, session=checked).cte("created")
    queued_here = _SESSIONS.c.queued_job_id == bindparam("queue_job_id")
    swapped = (
        update(_SESSIONS)
        .where(_SESSIONS.c.id.in_(select(new_revision.c.session_id)))
        .values({
            "active_revision_id": select(new_revision.c.id).scalar_subquery(),
            "projection_tokens":
                select(new_revision.c.projection_tokens_after).scalar_subquery(),
            "tokens_since_compaction": (
                select(func.coalesce(func.sum(_MESSAGES.c.tokens), _ZERO))
                .where(_MESSAGES.c.session_id == _SESSIONS.c.id,
                       _MESSAGES.c.seq > bindparam("revision_snapshot_head_seq"))
                .scalar_subquery()),
            **{name: bindparam(f"session_{name}", type_=_SESSIONS.c[name].type)
               for name in _SWAPPED_SESSION_VALUES},
            "lease_owner": null(), "lease_expires_at": null(),
            "queued_at": case((queued_here, None), else_=_SESSIONS.c.queued_at),
            "queued_job_id": case((queued_here, None), else_=_SESSIONS.c.queued_job_id),
        })
        .cte("swapped"))
    run = select(*(bindparam(f"run_{name}", type_=_RUNS.c[name].type) for name in _RUN_VALUES),
                 new_revision.c.id)
    return (insert(_RUNS).from_select([*_RUN_VALUES, "revision_id"], run)
            .returning(_RUNS.c.revision_id).add_cte(swapped))


_CHECKED_SWAP = _checked_swap()


def try_checked_swap(
    connection: Connection, session_id: str, *, expected_revision_id: int | None,
    lease_owner: str, revision: NewRevision, run: NewRun, now: datetime,
    breaker: BreakerUpdate | None = None,
) -> int | None:
    """``commit_swap`` with ``release_lease`` and the queue marker of ``run.task_id``, in
    one statement (``_checked_swap``; PostgreSQL, in autocommit). Return the revision id;
    None when it wrote nothing (a check failed, or an append raced it): ``commit_swap``
    then tells which, or writes."""
    if run.session_id != session_id or not revision.through_seq <= revision.snapshot_head_seq:
        return None
    breaker = breaker or CLOSED
    run_columns = run_values(run, revision_id=None)
    written = connection.execute(_CHECKED_SWAP, {
        **_revision_parameters(0, expected_revision_id, revision, now),
        "locked_session_id": session_id, "expected_lease_owner": lease_owner, "now": now,
        "queue_job_id": run.task_id, "session_last_compacted_at": now,
        "session_breaker_state": breaker.state, "session_breaker_failures": breaker.failures,
        "session_breaker_opened_at": breaker.opened_at,
        **{f"run_{name}": run_columns[name] for name in _RUN_VALUES},
    }).first()
    return None if written is None else int(written.revision_id)


def commit_swap(
    connection: Connection, session_id: str, *, expected_revision_id: int | None,
    lease_owner: str | None, revision: NewRevision, run: NewRun, now: datetime,
    breaker: BreakerUpdate | None = None, release_lease: bool = False,
    queue_job_id: str | None = None,
) -> int:
    """Compare-and-swap the active revision and record the run; with ``release_lease``
    also release ``lease_owner``'s lease, and clear the queue marker if it is still
    ``queue_job_id``'s. Return the revision id.

    Under the row lock: the lock (with the parent's bounds), then the revision (its
    projection size measured by the INSERT itself), the session and the run: one
    statement on PostgreSQL (``_one_statement_swap``), three on SQLite.
    """
    if run.session_id != session_id:
        raise ValueError(f"run is for {run.session_id!r}, not {session_id!r}")
    locked = connection.execute(_LOCK_FOR_SWAP, {"session_id": session_id}).first()
    if locked is None:
        raise SessionNotFound(f"no session {session_id!r}")
    _check_lease(session_id, locked.lease_owner, locked.lease_expires_at, lease_owner, now)
    if locked.active_revision_id != expected_revision_id:
        raise RevisionConflict(f"session {session_id!r}: active revision is "
                               f"{locked.active_revision_id}, expected {expected_revision_id}")
    _check_bounds(session_id, locked.parent_through_seq or 0, locked.head_seq, revision)
    breaker = breaker or CLOSED
    write = _write_in_one_statement if connection.dialect.name == "postgresql" \
        else _write_statement_by_statement
    return write(connection, locked.id, revision, run, now, {
        "last_compacted_at": now, "breaker_state": breaker.state,
        "breaker_failures": breaker.failures, "breaker_opened_at": breaker.opened_at,
    }, expected_revision_id=expected_revision_id, release_lease=release_lease,
        clear_queue_marker=queue_job_id is not None and locked.queued_job_id == queue_job_id)


def _revision_parameters(session_pk: int, parent_id: int | None, revision: NewRevision,
                         now: datetime) -> dict[str, Any]:
    """``_INSERT_REVISION``'s parameters."""
    return {"revision_session_id": session_pk, "revision_parent_revision_id": parent_id,
            "revision_created_at": now,
            "revision_artifacts": revision.artifacts_json,
            **{f"revision_{name}": getattr(revision, name) for name in _REVISION_VALUES
               if name not in ("session_id", "parent_revision_id", "created_at", "artifacts")}}


def _write_in_one_statement(
    connection: Connection, session_pk: int, revision: NewRevision, run: NewRun,
    now: datetime, session_values: dict[str, Any], *, expected_revision_id: int | None,
    release_lease: bool, clear_queue_marker: bool,
) -> int:
    run_columns = run_values(run, revision_id=None)
    return int(connection.execute(_ONE_STATEMENT_SWAPS[release_lease, clear_queue_marker], {
        **_revision_parameters(session_pk, expected_revision_id, revision, now),
        "session_pk": session_pk, "snapshot_head_seq": revision.snapshot_head_seq,
        **{f"session_{name}": value for name, value in session_values.items()},
        **{f"run_{name}": run_columns[name] for name in _RUN_VALUES},
    }).scalar_one())


def _write_statement_by_statement(
    connection: Connection, session_pk: int, revision: NewRevision, run: NewRun,
    now: datetime, session_values: dict[str, Any], *, expected_revision_id: int | None,
    release_lease: bool, clear_queue_marker: bool,
) -> int:
    created = connection.execute(_INSERT_REVISION, _revision_parameters(
        session_pk, expected_revision_id, revision, now)).one()
    if release_lease:
        session_values |= {"lease_owner": None, "lease_expires_at": None}
    if clear_queue_marker:
        session_values |= {"queued_at": None, "queued_job_id": None}
    connection.execute(_UPDATE_SWAPPED_SESSION, {
        "session_pk": session_pk, "snapshot_head_seq": revision.snapshot_head_seq,
        **session_values, "active_revision_id": created.id,
        "projection_tokens": created.projection_tokens_after})
    insert_run(connection, run, revision_id=created.id)
    return int(created.id)


def commit_failure(connection: Connection, run: NewRun, *, breaker: BreakerUpdate | None,
                   lease_owner: str | None, queue_job_id: str | None = None) -> int:
    """Record a run, and for its session (ignored when unknown) in one UPDATE: set the
    breaker, release ``lease_owner``'s lease, clear ``queue_job_id``'s queue marker.
    Return the run id."""
    run_id = insert_run(connection, run, revision_id=run.revision_id)
    values: dict[str, Any] = {}
    if breaker is not None:
        values |= {"breaker_state": breaker.state, "breaker_failures": breaker.failures,
                   "breaker_opened_at": breaker.opened_at}
    if lease_owner is not None:
        owned = _SESSIONS.c.lease_owner == lease_owner
        values |= {"lease_owner": case((owned, None), else_=_SESSIONS.c.lease_owner),
                   "lease_expires_at": case((owned, None), else_=_SESSIONS.c.lease_expires_at)}
    if queue_job_id is not None:
        queued = _SESSIONS.c.queued_job_id == queue_job_id
        values |= {"queued_at": case((queued, None), else_=_SESSIONS.c.queued_at),
                   "queued_job_id": case((queued, None), else_=_SESSIONS.c.queued_job_id)}
    if values:
        connection.execute(
            update(_SESSIONS).where(_SESSIONS.c.session_id == run.session_id).values(values))
    return run_id


def to_session_state(row: Row[Any]) -> SessionState:
    """The session's record from a Core row of its table's columns."""
    return session_state_of(row._mapping)


def session_state_of(m: Mapping[Any, Any]) -> SessionState:
    """The session's record from its table's columns by name."""
    return SessionState(
        session_id=m["session_id"], metadata=m["metadata"], head_seq=m["head_seq"],
        active_revision_id=m["active_revision_id"], total_tokens=m["total_tokens"],
        projection_tokens=m["projection_tokens"],
        tokens_since_compaction=m["tokens_since_compaction"], created_at=m["created_at"],
        last_appended_at=m["last_appended_at"], last_compacted_at=m["last_compacted_at"],
        lease_owner=m["lease_owner"], lease_expires_at=m["lease_expires_at"],
        breaker_state=m["breaker_state"], breaker_failures=m["breaker_failures"],
        breaker_opened_at=m["breaker_opened_at"], queued_at=m["queued_at"],
        queued_job_id=m["queued_job_id"],
    )


def _check_exists(connection: Connection, session_id: str) -> None:
    found = connection.execute(
        select(_SESSIONS.c.id).where(_SESSIONS.c.session_id == session_id)).first()
    if found is None:
        raise SessionNotFound(f"no session {session_id!r}")


def _check_lease(session_id: str, holder: str | None, expires_at: datetime | None,
                 owner: str | None, now: datetime) -> None:
    if owner is None:
        return
    if holder != owner or expires_at is None or expires_at <= now:
        raise LeaseLost(f"session {session_id!r}: lease is held by {holder!r} until "
                        f"{expires_at}, not by {owner!r}")


def _check_bounds(session_id: str, floor_seq: int, head_seq: int,
                  revision: NewRevision) -> None:
    """Refuse a revision that would un-summarize its parent's span or see the future."""
    if not floor_seq <= revision.through_seq <= revision.snapshot_head_seq <= head_seq:
        raise ValueError(
            f"session {session_id!r}: need parent through_seq {floor_seq} <= through_seq "
            f"{revision.through_seq} <= snapshot_head_seq {revision.snapshot_head_seq} <= "
            f"head_seq {head_seq}"
        )
