"""A job's lease: one ``UPDATE ... RETURNING`` takes it and reads the session row
(:func:`take_lease`); on PostgreSQL a job takes it with its snapshot in one statement
(:func:`take_lease_with_snapshot`), the lease's UPDATE as a CTE heading
``db/job_snapshot.py``'s statement.

When the lease is not taken, or a write committed while the statement waited for the row
lock, one more statement says who holds the lease and the snapshot is read again by
``db/job_snapshot.py``'s statement: the same snapshot, not a second version of it.

``db/store_jobs.py`` owns the transactions; these functions never commit. The statements
are built once, at import, with bound parameters, and SQLAlchemy's compiled cache serves
them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    CompoundSelect,
    Connection,
    Select,
    Update,
    and_,
    bindparam,
    literal_column,
    or_,
    select,
    update,
)

from db.errors import SessionNotFound
from db.job_rows import REVISIONS, SESSION_COLUMNS, SESSIONS, check_exists, to_session_state
from db.job_snapshot import read_snapshot_in_one_statement, snapshot_statement
from db.records import NO_SKIP, JobMessage, JobSnapshot, MessageText, SessionState, SnapshotSkipRule

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
    owner = SESSIONS.c.lease_owner
    free = [owner.is_(None), owner == bindparam("owner"),
            SESSIONS.c.lease_expires_at <= bindparam("now")]
    if take_over:
        free.append(owner.like(bindparam("take_over_pattern"), escape=_LIKE_ESCAPE))
    conditions = [SESSIONS.c.session_id == bindparam("leased_session_id"), or_(*free)]
    if asynchronous_commit:
        conditions.append(_LEASE_COMMITS_ASYNCHRONOUSLY)
    return (update(SESSIONS).where(*conditions)
            .values(lease_owner=bindparam("owner"),
                    lease_expires_at=bindparam("expires_at",
                                               type_=SESSIONS.c.lease_expires_at.type))
            .returning(*SESSION_COLUMNS))


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
    check_exists(connection, session_id)
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


def _leased_snapshot_statement(*, take_over: bool) -> CompoundSelect[Any]:
    """PostgreSQL: ``_lease_statement`` and ``SNAPSHOT_STATEMENT`` as one statement (one
    round trip): its head is the row the lease's UPDATE returns, joined to the active
    revision, so nothing is read when the lease is not taken.

    The statement's snapshot is taken before its UPDATE waits for the row lock; were a
    write (an append, a swap) to commit meanwhile, the UPDATE would return the row as
    that write left it while the messages and the revision are read as they were
    before. The head is therefore kept only when the row the snapshot sees has the same
    ``head_seq`` and active revision as the one the lease returned; when it does not,
    the lease is taken but the statement returns no row (``take_lease_with_snapshot``
    then reads a fresh snapshot)."""
    # One-letter names (``l``, ``n``, ``r``): the text stays within psycopg's cache (see
    # ``db.job_rows.ZERO``).
    lease = _lease_statement(take_over=take_over, asynchronous_commit=True).cte("l")
    seen, revision = SESSIONS.alias("n"), REVISIONS.alias("r")
    return snapshot_statement(
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
    to_message: Callable[[MessageText], JobMessage], skip_rule: SnapshotSkipRule = NO_SKIP,
) -> JobSnapshot[JobMessage] | None:
    """PostgreSQL (run it in autocommit): ``take_lease`` and ``read_snapshot`` in one
    statement; the snapshot, whose session is the row the lease left, or None when
    another owner holds the lease (nothing else is read then). Two statements more when
    the lease is not taken (which owner holds it), or when a write committed while the
    statement waited for the row lock (a fresh snapshot)."""
    try:
        return read_snapshot_in_one_statement(
            connection, session_id, history=history, to_message=to_message, skip_rule=skip_rule,
            statement=_LEASED_SNAPSHOT_STATEMENTS[take_over is not None],
            parameters=_lease_parameters(session_id, owner, ttl_s, now, take_over))
    except SessionNotFound:
        pass  # no head row: the lease was not taken, or its snapshot is stale
    holder = connection.execute(_LEASE_HOLDER, {"session_id": session_id}).first()
    if holder is None:
        raise SessionNotFound(f"no session {session_id!r}")
    if holder.lease_owner != owner:
        return None
    return read_snapshot_in_one_statement(connection, session_id, history=history,
                                           to_message=to_message, skip_rule=skip_rule)


_LEASE_HOLDER: Select[Any] = select(SESSIONS.c.lease_owner).where(
    SESSIONS.c.session_id == bindparam("session_id"))
