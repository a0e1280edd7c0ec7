"""A job's end: everything it writes, under the session's row lock.

:func:`swap_in_one_statement` (PostgreSQL) and :func:`commit_swap` (SQLite) write a
compaction: the revision (compare-and-swap), the session's figures, the breaker, the lease
release, the queue marker and the run row. :func:`commit_failure` ends a job that did
not compact.

One version per dialect. PostgreSQL runs the whole swap as one statement in autocommit
(no BEGIN and COMMIT round trips, nor a lock statement's): its lock and checks are CTEs,
and its result names the check that failed, so an error needs no second statement to
tell LeaseLost from RevisionConflict. A statement's snapshot is taken before it waits for
the row lock; were an append to commit meanwhile, its sums would miss the appended
messages, so the statement writes only when the locked row's ``head_seq`` is the one its
snapshot sees, and is run again (a fresh snapshot) when it is not. SQLite takes the lock
first (``BEGIN IMMEDIATE``) and writes statement by statement in that transaction.

``db/store_jobs.py`` owns the transactions; these functions never commit.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    CTE,
    Connection,
    Insert,
    Row,
    Select,
    Text,
    Update,
    and_,
    bindparam,
    case,
    cast,
    func,
    insert,
    null,
    or_,
    select,
    update,
)

from db.errors import LeaseLost, RevisionConflict, SessionNotFound
from db.job_rows import IS_INSTRUCTION, MESSAGES, REVISIONS, RUNS, SESSIONS, ZERO
from db.queries import insert_run, run_values
from db.records import BreakerUpdate, NewRevision, NewRun

CLOSED = BreakerUpdate(state="closed", failures=0, opened_at=None)


def _lock_for_swap(session_id_parameter: str) -> Select[Any]:
    """The swap's lock: the session row with its parent's bounds, under FOR UPDATE (the
    row as ``e``: a one-letter alias keeps the one-statement swap's text within psycopg's
    cache, see ``db.job_rows.ZERO``)."""
    row = SESSIONS.alias("e")
    return (
        select(row.c.id, row.c.head_seq, row.c.active_revision_id, row.c.lease_owner,
               row.c.lease_expires_at, row.c.queued_job_id, row.c.system_tokens,
               select(REVISIONS.c.through_seq)
               .where(REVISIONS.c.id == row.c.active_revision_id)
               .scalar_subquery().label("parent_through_seq"))
        .where(row.c.session_id == bindparam(session_id_parameter))
        .with_for_update(of=row)
    )


_LOCK_FOR_SWAP = _lock_for_swap("session_id")
# The revision's columns the job gives, bound as "revision_<column>".
_REVISION_VALUES = ("session_id", "parent_revision_id", "through_seq", "snapshot_head_seq",
                    "summary", "block", "block_tokens", "artifacts", "summary_tokens",
                    "span_tokens", "projection_tokens_before", "model", "prompt_version",
                    "summarizer", "created_at")


def _revision_insert(*, cast_artifacts: bool, session: CTE | None = None) -> Insert:
    """INSERT ... SELECT the revision with its projection size summed from the messages
    in the same statement (under the row lock no append can commit meanwhile), plus the
    session's system prompt (bound as ``system_tokens``, read under the lock); with
    ``session`` (a CTE of the session's ``id`` and ``system_tokens``), of that session,
    and nothing when the CTE holds no row.

    The artifacts arrive as the JSON text the job encoded once (``artifacts_json``), bound
    as text so the column type does not serialize them again: cast to the column's type on
    PostgreSQL; SQLite keeps JSON as text, and a CAST there would take the type name's
    NUMERIC affinity (text to 0)."""
    values: dict[str, Any] = {name: bindparam(f"revision_{name}", type_=REVISIONS.c[name].type)
                              for name in _REVISION_VALUES}
    artifacts = bindparam("revision_artifacts", type_=Text)
    values["artifacts"] = (cast(artifacts, REVISIONS.c.artifacts.type) if cast_artifacts
                           else artifacts)
    through_seq = values["through_seq"]
    covered_instructions = and_(MESSAGES.c.seq <= through_seq, IS_INSTRUCTION)
    kept = or_(covered_instructions, MESSAGES.c.seq > through_seq)
    messages_tokens = func.coalesce(func.sum(case((kept, MESSAGES.c.tokens), else_=ZERO)), ZERO)
    if session is None:
        system_tokens = bindparam("system_tokens", type_=SESSIONS.c.system_tokens.type)
        source = select(*values.values(), values["block_tokens"] + system_tokens
                        + messages_tokens).where(MESSAGES.c.session_id == values["session_id"])
    else:
        values["session_id"] = session.c.id
        source = (select(*values.values(), values["block_tokens"] + session.c.system_tokens
                         + messages_tokens)
                  .select_from(session.outerjoin(MESSAGES,
                                                 MESSAGES.c.session_id == session.c.id))
                  .group_by(session.c.id, session.c.system_tokens))
    return (insert(REVISIONS).from_select([*values, "projection_tokens_after"], source)
            .returning(REVISIONS.c.id, REVISIONS.c.projection_tokens_after,
                       REVISIONS.c.session_id))


# SQLite's swap, statement by statement.
_INSERT_REVISION = _revision_insert(cast_artifacts=False)
# The session after a swap; the other columns it sets are the execution's parameters.
_UPDATE_SWAPPED_SESSION: Update = (
    update(SESSIONS).where(SESSIONS.c.id == bindparam("session_pk"))
    .values(tokens_since_compaction=(
        select(func.coalesce(func.sum(MESSAGES.c.tokens), ZERO))
        .where(MESSAGES.c.session_id == bindparam("session_pk"),
               MESSAGES.c.seq > bindparam("snapshot_head_seq"))
        .scalar_subquery()))
)
# The swap's session columns set from parameters, bound as "session_<column>" in the
# one-statement swap.
_SWAPPED_SESSION_VALUES = ("last_compacted_at", "breaker_state", "breaker_failures",
                           "breaker_opened_at")
# The run's columns given by the job (the revision's id comes from the INSERT).
_RUN_VALUES = tuple(c.name for c in RUNS.c if c.name not in ("id", "revision_id"))


def _checked_swap() -> Select[Any]:
    """PostgreSQL: a job's whole swap in one statement. ``locked`` is ``commit_swap``'s
    lock; ``checked`` holds its row only when every check passes and the row the
    statement's snapshot sees (``seen``) has the locked row's ``head_seq`` (no append
    committed while it waited for the lock); the writes read ``checked``, so a failed
    check writes nothing. The statement returns the locked row with the snapshot's
    ``head_seq`` and the new revision's id (NULL when nothing was written): what
    ``swap_in_one_statement`` tells the failed check from."""
    # Parameters never named as a sessions column: the UPDATE below would take them as
    # the values of those columns. One-letter aliases keep the text within psycopg's cache
    # (see ``db.job_rows.ZERO``).
    locked = _lock_for_swap("locked_session_id").cte("k")
    seen = SESSIONS.alias("n")
    checked = select(locked.c.id, locked.c.system_tokens).select_from(
        locked.join(seen, seen.c.id == locked.c.id)).where(
        locked.c.lease_owner == bindparam("expected_lease_owner"),
        locked.c.lease_expires_at > bindparam("now", type_=SESSIONS.c.lease_expires_at.type),
        locked.c.active_revision_id.is_not_distinct_from(bindparam(
            "revision_parent_revision_id", type_=REVISIONS.c.parent_revision_id.type)),
        func.coalesce(locked.c.parent_through_seq, ZERO)
        <= bindparam("revision_through_seq", type_=REVISIONS.c.through_seq.type),
        bindparam("revision_snapshot_head_seq", type_=REVISIONS.c.snapshot_head_seq.type)
        <= locked.c.head_seq,
        seen.c.head_seq == locked.c.head_seq,
    ).cte("c")
    new_revision = _revision_insert(cast_artifacts=True, session=checked).cte("r")
    queued_here = SESSIONS.c.queued_job_id == bindparam("queue_job_id")
    swapped = (
        update(SESSIONS)
        .where(SESSIONS.c.id.in_(select(new_revision.c.session_id)))
        .values({
            "active_revision_id": select(new_revision.c.id).scalar_subquery(),
            "projection_tokens":
                select(new_revision.c.projection_tokens_after).scalar_subquery(),
            "tokens_since_compaction": (
                select(func.coalesce(func.sum(MESSAGES.c.tokens), ZERO))
                .where(MESSAGES.c.session_id == SESSIONS.c.id,
                       MESSAGES.c.seq > bindparam("revision_snapshot_head_seq"))
                .scalar_subquery()),
            **{name: bindparam(f"session_{name}", type_=SESSIONS.c[name].type)
               for name in _SWAPPED_SESSION_VALUES},
            "lease_owner": null(), "lease_expires_at": null(),
            "queued_at": case((queued_here, None), else_=SESSIONS.c.queued_at),
            "queued_job_id": case((queued_here, None), else_=SESSIONS.c.queued_job_id),
        })
        .cte("s"))
    run = select(*(bindparam(f"run_{name}", type_=RUNS.c[name].type) for name in _RUN_VALUES),
                 new_revision.c.id)
    recorded = (insert(RUNS).from_select([*_RUN_VALUES, "revision_id"], run)
                .returning(RUNS.c.revision_id).cte("w"))
    return (select(locked.c.head_seq, locked.c.active_revision_id, locked.c.lease_owner,
                   locked.c.lease_expires_at, locked.c.parent_through_seq,
                   seen.c.head_seq.label("seen_head_seq"),
                   select(recorded.c.revision_id).scalar_subquery().label("revision_id"))
            .select_from(locked.join(seen, seen.c.id == locked.c.id)).add_cte(swapped))


_CHECKED_SWAP = _checked_swap()


def swap_in_one_statement(
    connection: Connection, session_id: str, *, expected_revision_id: int | None,
    lease_owner: str, revision: NewRevision, run: NewRun, now: datetime,
    breaker: BreakerUpdate | None = None,
) -> int:
    """PostgreSQL, in autocommit: ``commit_swap`` in one statement (``_checked_swap``),
    same errors, nothing written on any. Return the revision id. Run again only when an
    append committed while it waited for the row lock."""
    _check_job(session_id, run, revision)
    breaker = breaker or CLOSED
    run_columns = run_values(run, revision_id=None)
    parameters = {
        **_revision_parameters(0, expected_revision_id, revision, now),
        "locked_session_id": session_id, "expected_lease_owner": lease_owner, "now": now,
        "queue_job_id": run.task_id, "session_last_compacted_at": now,
        "session_breaker_state": breaker.state, "session_breaker_failures": breaker.failures,
        "session_breaker_opened_at": breaker.opened_at,
        **{f"run_{name}": run_columns[name] for name in _RUN_VALUES},
    }
    while True:
        row = connection.execute(_CHECKED_SWAP, parameters).first()
        if row is None:
            raise SessionNotFound(f"no session {session_id!r}")
        if row.revision_id is not None:
            return int(row.revision_id)
        _check_swap(session_id, row, lease_owner, expected_revision_id, revision, now)


def commit_swap(
    connection: Connection, session_id: str, *, expected_revision_id: int | None,
    lease_owner: str, revision: NewRevision, run: NewRun, now: datetime,
    breaker: BreakerUpdate | None = None,
) -> int:
    """SQLite, in a write transaction: compare-and-swap the active revision, record the
    run, release ``lease_owner``'s lease and clear the queue marker if it is still
    ``run.task_id``'s. Return the revision id. LeaseLost, RevisionConflict,
    SessionNotFound, or ValueError for a revision out of its parent's bounds.

    Under the row lock: the lock (with the parent's bounds), then the revision (its
    projection size measured by the INSERT itself), the session and the run."""
    _check_job(session_id, run, revision)
    locked = connection.execute(_LOCK_FOR_SWAP, {"session_id": session_id}).first()
    if locked is None:
        raise SessionNotFound(f"no session {session_id!r}")
    _check_swap(session_id, locked, lease_owner, expected_revision_id, revision, now)
    breaker = breaker or CLOSED
    created = connection.execute(_INSERT_REVISION, {**_revision_parameters(
        locked.id, expected_revision_id, revision, now),
        "system_tokens": locked.system_tokens}).one()
    session_values: dict[str, Any] = {
        "last_compacted_at": now, "breaker_state": breaker.state,
        "breaker_failures": breaker.failures, "breaker_opened_at": breaker.opened_at,
        "lease_owner": None, "lease_expires_at": None}
    if run.task_id is not None and locked.queued_job_id == run.task_id:
        session_values |= {"queued_at": None, "queued_job_id": None}
    connection.execute(_UPDATE_SWAPPED_SESSION, {
        "session_pk": locked.id, "snapshot_head_seq": revision.snapshot_head_seq,
        **session_values, "active_revision_id": created.id,
        "projection_tokens": created.projection_tokens_after})
    insert_run(connection, run, revision_id=created.id)
    return int(created.id)


def _revision_parameters(session_pk: int, parent_id: int | None, revision: NewRevision,
                         now: datetime) -> dict[str, Any]:
    """``_revision_insert``'s parameters."""
    return {"revision_session_id": session_pk, "revision_parent_revision_id": parent_id,
            "revision_created_at": now,
            "revision_artifacts": revision.artifacts_json,
            **{f"revision_{name}": getattr(revision, name) for name in _REVISION_VALUES
               if name not in ("session_id", "parent_revision_id", "created_at", "artifacts")}}


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
        owned = SESSIONS.c.lease_owner == lease_owner
        values |= {"lease_owner": case((owned, None), else_=SESSIONS.c.lease_owner),
                   "lease_expires_at": case((owned, None), else_=SESSIONS.c.lease_expires_at)}
    if queue_job_id is not None:
        queued = SESSIONS.c.queued_job_id == queue_job_id
        values |= {"queued_at": case((queued, None), else_=SESSIONS.c.queued_at),
                   "queued_job_id": case((queued, None), else_=SESSIONS.c.queued_job_id)}
    if values:
        connection.execute(
            update(SESSIONS).where(SESSIONS.c.session_id == run.session_id).values(values))
    return run_id


def _check_job(session_id: str, run: NewRun, revision: NewRevision) -> None:
    """ValueError for a run of another session, or a revision past its own snapshot
    (what no row lock can tell)."""
    if run.session_id != session_id:
        raise ValueError(f"run is for {run.session_id!r}, not {session_id!r}")
    if not revision.through_seq <= revision.snapshot_head_seq:
        raise ValueError(f"session {session_id!r}: need through_seq {revision.through_seq} "
                         f"<= snapshot_head_seq {revision.snapshot_head_seq}")


def _check_swap(session_id: str, locked: Row[Any], owner: str, expected_revision_id: int | None,
                revision: NewRevision, now: datetime) -> None:
    """Raise what refuses the swap of ``revision`` onto the ``locked`` row: LeaseLost,
    RevisionConflict, or ValueError for a revision that would un-summarize its parent's
    span or see the future."""
    expires_at = locked.lease_expires_at
    if locked.lease_owner != owner or expires_at is None or expires_at <= now:
        raise LeaseLost(f"session {session_id!r}: lease is held by {locked.lease_owner!r} "
                        f"until {expires_at}, not by {owner!r}")
    if locked.active_revision_id != expected_revision_id:
        raise RevisionConflict(f"session {session_id!r}: active revision is "
                               f"{locked.active_revision_id}, expected {expected_revision_id}")
    floor_seq, head_seq = locked.parent_through_seq or 0, locked.head_seq
    if not floor_seq <= revision.through_seq <= revision.snapshot_head_seq <= head_seq:
        raise ValueError(
            f"session {session_id!r}: need parent through_seq {floor_seq} <= through_seq "
            f"{revision.through_seq} <= snapshot_head_seq {revision.snapshot_head_seq} <= "
            f"head_seq {head_seq}"
        )
