"""The data lifecycle's SQL: erasing a session, erasing its newest message, and
collecting idle sessions, superseded revisions and old runs in batches.

Each function runs inside a write transaction that ``db/store.py`` opens (garbage
collection opens one per batch through the store's own ``write``); none commits. Each
takes the row lock of every session it touches, the lock a swap, a rollback and an append
take, so none of them can interleave with a running job's writes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Delete, delete, func, or_, select, update
from sqlalchemy.orm import Session

from db import queries as q
from db.artifacts import recount_artifacts
from db.errors import MessagePinned, SessionLeased
from db.models import ArtifactRow, MessageRow, ParkedJobRow, RevisionRow, RunRow, SessionRow
from db.records import DeletedSession, GcBatch, GcPolicy, MessageRecord


@dataclass(frozen=True, slots=True)
class SessionTable:
    """A table holding a session's rows, and the DELETE of them given the session's
    (internal key, external id)."""

    name: str
    delete_rows: Callable[[int, str], Delete]


# Children before parents: erasing a session runs these in order, one DELETE each. A new
# table that holds a session's rows is one more entry here, placed before what it refers to.
SESSION_TABLES: tuple[SessionTable, ...] = (
    SessionTable("runs", lambda pk, sid: delete(RunRow).where(RunRow.session_id == sid)),
    SessionTable("artifacts",
                 lambda pk, sid: delete(ArtifactRow).where(ArtifactRow.session_id == pk)),
    SessionTable("messages",
                 lambda pk, sid: delete(MessageRow).where(MessageRow.session_id == pk)),
    SessionTable("parked_jobs",
                 lambda pk, sid: delete(ParkedJobRow).where(ParkedJobRow.session_id == pk)),
    SessionTable("revisions",
                 lambda pk, sid: delete(RevisionRow).where(RevisionRow.session_id == pk)),
    SessionTable("sessions", lambda pk, sid: delete(SessionRow).where(SessionRow.id == pk)),
)


def delete_session(session: Session, session_id: str, *, force: bool,
                   now: datetime) -> DeletedSession:
    """Erase the session and every row of it; SessionLeased while a job holds its lease
    unless ``force``."""
    row = q.find_session(session, session_id, lock=True)
    leased = _holds_lease(row, now)
    if leased and not force:
        raise SessionLeased(f"session {session_id!r}: a job ({row.lease_owner!r}) holds its "
                            f"lease until {row.lease_expires_at}")
    removed = _erase_session(session, row.id, session_id)
    return DeletedSession(session_id, removed, row.queued_job_id,
                          row.lease_owner if leased else None)


def _erase_session(session: Session, pk: int, session_id: str) -> dict[str, int]:
    """Delete the rows of a session whose row lock this transaction holds."""
    # The session points at its active revision: unhook it before the revisions go.
    session.execute(update(SessionRow).where(SessionRow.id == pk)
                    .values(active_revision_id=None), execution_options=q.NO_SYNC)
    return {table.name: _count(session, table.delete_rows(pk, session_id))
            for table in SESSION_TABLES}


def pop_newest_message(session: Session, session_id: str, seq: int,
                       now: datetime) -> MessageRecord:
    """Erase message ``seq`` if it is the session's newest and no compaction has read it,
    with what was derived from it: its search text goes with its row, its identifiers
    leave the artifact index. The head and token figures step back, so the next append
    takes ``seq`` again: nothing that names ``seq`` outlives the message."""
    row = q.find_session(session, session_id, lock=True)
    if row.lease_owner is not None:
        # Expired too: its job may still be alive, renew it and swap what it read.
        raise SessionLeased(f"session {session_id!r}: a job ({row.lease_owner!r}) holds "
                            f"its lease")
    frozen_seq = session.scalar(select(func.max(RevisionRow.snapshot_head_seq))
                                .where(RevisionRow.session_id == row.id)) or 0
    if seq != row.head_seq or seq <= frozen_seq:
        raise MessagePinned(f"session {session_id!r}: message {seq} is not erasable (newest "
                            f"{row.head_seq}, read by a compaction through {frozen_seq})")
    [record] = q.select_history(session, row.id, after_seq=seq - 1)
    session.execute(delete(MessageRow).where(MessageRow.session_id == row.id,
                                             MessageRow.seq == seq),
                    execution_options=q.NO_SYNC)
    recount_artifacts(session, row.id, {value for value, *_ in record.identifiers or ()})
    row.head_seq -= 1
    row.total_tokens -= record.tokens
    row.projection_tokens -= record.tokens
    row.tokens_since_compaction -= record.tokens
    return record


def collect_garbage(
    write: Callable[[], AbstractContextManager[Session]], policy: GcPolicy, now: datetime,
    *, dry_run: bool, on_batch: Callable[[GcBatch], None] | None,
) -> list[GcBatch]:
    """Run the session batches, then the revision batches, then the run batches, each in
    its own ``write()`` transaction, so no lock is held for longer than one batch."""
    batches: list[GcBatch] = []
    for collect in (collect_sessions, collect_revisions, collect_runs):
        after: int | None = 0
        while after is not None:
            with write() as session:
                batch = collect(session, policy, now, after=after, apply=not dry_run)
            after = batch.next_after
            if batch.removed or after is not None:
                batches.append(batch)
                if on_batch is not None:
                    on_batch(batch)
    return batches


def collect_sessions(session: Session, policy: GcPolicy, now: datetime, *,
                     after: int, apply: bool) -> GcBatch:
    """Erase the next ``batch_size`` sessions (by key, after ``after``) idle for longer
    than the session retention, as ``delete_session`` does; a session a job holds the
    lease of is left for the next run.

    Sessions are chosen and locked by one statement, so each is idle when it is erased:
    an append that committed first keeps its session, and one that comes later waits for
    this transaction and finds no session."""
    if policy.session_retention_s is None:
        return GcBatch("sessions", 0, None)
    cutoff = now - timedelta(seconds=policy.session_retention_s)
    last_active = func.coalesce(SessionRow.last_appended_at, SessionRow.created_at)
    # PostgreSQL re-evaluates the WHERE clause on the newest version of a row FOR UPDATE
    # had to wait for, so a session an append touched meanwhile drops out (and the LIMIT
    # takes the next one); SQLite's BEGIN IMMEDIATE already keeps every writer out.
    rows = session.execute(
        select(SessionRow.id, SessionRow.session_id)
        .where(last_active < cutoff, SessionRow.id > after,
               or_(SessionRow.lease_expires_at.is_(None), SessionRow.lease_expires_at <= now))
        .order_by(SessionRow.id).limit(policy.batch_size).with_for_update()).all()
    if not rows:
        return GcBatch("sessions", 0, None)
    if apply:
        for pk, session_id in rows:
            _erase_session(session, pk, session_id)
    return GcBatch("sessions", len(rows), rows[-1].id)


def collect_revisions(session: Session, policy: GcPolicy, now: datetime, *,
                      after: int, apply: bool) -> GcBatch:
    """Remove the superseded revisions of the next ``batch_size`` sessions (by key, after
    ``after``) that have any revision older than the retention."""
    cutoff = now - timedelta(seconds=policy.revision_retention_s)
    pks = list(session.scalars(
        select(RevisionRow.session_id).distinct()
        .where(RevisionRow.created_at < cutoff, RevisionRow.session_id > after)
        .order_by(RevisionRow.session_id).limit(policy.batch_size)))
    if not pks:
        return GcBatch("revisions", 0, None)
    locked = session.execute(select(SessionRow.id, SessionRow.active_revision_id)
                             .where(SessionRow.id.in_(pks)).order_by(SessionRow.id)
                             .with_for_update())
    active: dict[int, int | None] = {pk: revision_id for pk, revision_id in locked}
    doomed = _superseded(session, active, policy.keep_revisions, cutoff)
    if apply and doomed:
        _remove_revisions(session, doomed)
    return GcBatch("revisions", len(doomed), pks[-1])


def collect_runs(session: Session, policy: GcPolicy, now: datetime, *, after: int,
                 apply: bool) -> GcBatch:
    """Remove the next ``batch_size`` runs (by id, after ``after``) older than the
    retention."""
    cutoff = now - timedelta(seconds=policy.run_retention_s)
    ids = list(session.scalars(
        select(RunRow.id).where(RunRow.started_at < cutoff, RunRow.id > after)
        .order_by(RunRow.id).limit(policy.batch_size)))
    if not ids:
        return GcBatch("runs", 0, None)
    if apply:
        session.execute(delete(RunRow).where(RunRow.id.in_(ids)),
                        execution_options=q.NO_SYNC)
    return GcBatch("runs", len(ids), ids[-1])


def _superseded(session: Session, active: dict[int, int | None], keep: int,
                cutoff: datetime) -> list[int]:
    """Ids of the revisions of these sessions outside each active chain's kept part and
    older than ``cutoff``."""
    rows = session.execute(select(RevisionRow.id, RevisionRow.parent_revision_id,
                                  RevisionRow.created_at)
                           .where(RevisionRow.session_id.in_(list(active))))
    parents: dict[int, int | None] = {}
    doomed_age: set[int] = set()
    for revision_id, parent_id, created_at in rows:
        parents[revision_id] = parent_id
        if created_at < cutoff:
            doomed_age.add(revision_id)
    kept: set[int] = set()
    for active_id in active.values():
        walk: int | None = active_id
        for _ in range(keep + 1):
            if walk is None:
                break
            kept.add(walk)
            walk = parents.get(walk)
    return sorted(doomed_age - kept)


def _remove_revisions(session: Session, doomed: Sequence[int]) -> None:
    """Delete ``doomed``; a survivor whose parent goes becomes a root (rolling back past
    it uncompacts the session), and a run keeps its row without the revision."""
    session.execute(update(RevisionRow)
                    .where(RevisionRow.parent_revision_id.in_(doomed),
                           RevisionRow.id.not_in(doomed))
                    .values(parent_revision_id=None), execution_options=q.NO_SYNC)
    session.execute(update(RunRow).where(RunRow.revision_id.in_(doomed))
                    .values(revision_id=None), execution_options=q.NO_SYNC)
    session.execute(delete(RevisionRow).where(RevisionRow.id.in_(doomed)),
                    execution_options=q.NO_SYNC)


def _holds_lease(row: SessionRow, now: datetime) -> bool:
    expires_at = row.lease_expires_at
    return row.lease_owner is not None and expires_at is not None and expires_at > now


def _count(session: Session, statement: Delete) -> int:
    result = session.execute(statement, execution_options=q.NO_SYNC)
    return int(result.rowcount)  # type: ignore[attr-defined]
