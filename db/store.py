"""The session store, the one door to the database for the worker and the scheduler.

Every public method is one transaction on PostgreSQL or SQLite (the due-session iterator
one per page; ``queue_markers`` one around the caller's block; a one-statement read on
PostgreSQL none, the statement being its own snapshot). Values go in and out as
the frozen dataclasses of ``db/records.py``. ``sqlalchemy.exc`` errors are translated
here, once, into ``db/errors.py``. Writes lock the session row (``SELECT ... FOR
UPDATE`` on PostgreSQL; ``BEGIN IMMEDIATE`` on SQLite); reads run in one consistent
snapshot (see ``db.engine.derive_read_engine``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Engine, Update, func, select
from sqlalchemy.orm import Session

from db import job_transactions as job
from db import leases
from db import projection as views
from db import queries as q
from db.artifacts import count_unindexed, select_artifacts, select_unindexed, write_index
from db.engine import SQLITE_BEGIN_OPTION, create_db_engine, derive_read_engine
from db.errors import SessionExists, SessionNotFound, translate_errors
from db.lifecycle import collect_garbage, delete_session, pop_newest_message
from db.models import RevisionRow, RunRow, SessionRow
from db.queue import QueueMarkers
from db.recall import check_query, search_messages
from db.reconcile import HeldSession, read_dead_leases, read_due_among, read_held_sessions
from db.records import (
    NO_GATE,
    ArtifactRecord,
    BreakerUpdate,
    DeletedSession,
    GcBatch,
    GcPolicy,
    IndexedMessage,
    JobMessage,
    JobSnapshot,
    MessageRecord,
    MessageText,
    NewMessage,
    NewRevision,
    NewRun,
    RecallHit,
    RevisionRecord,
    RunRecord,
    SessionState,
    Snapshot,
    SnapshotGate,
    ToolCallState,
)
from db.revisions import load_active_revision, roll_back, roll_forward, swap_in
from db.scan import (
    DueCriteria,
    DueCursor,
    DuePage,
    DueRow,
    DueWhy,
    count_exclusions,
    read_due_page,
)

T = TypeVar("T")
# An append's intake check: given the session's tool-call state, the rows to insert and
# whatever the caller wants back (its report).
AppendCheck = Callable[[ToolCallState], tuple[Sequence[NewMessage], T]]


class Store:
    """The durable store of sessions, messages, revisions and runs."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._read_engine = derive_read_engine(engine)
        # A single statement sees one snapshot by itself: on PostgreSQL it needs no
        # BEGIN and COMMIT, two round trips of the platform's hot read.
        self._statement_engine = self._read_engine if engine.dialect.name == "sqlite" \
            else engine.execution_options(isolation_level="AUTOCOMMIT")
        # A one-statement write is atomic by itself: no BEGIN and COMMIT round trips (on
        # SQLite the begin hook's own option, not pysqlite's AUTOCOMMIT, which would give
        # transaction control back to the driver once the connection returns to the pool).
        self._write_statement_engine = \
            engine.execution_options(**{SQLITE_BEGIN_OPTION: "AUTOCOMMIT"}) \
            if engine.dialect.name == "sqlite" \
            else engine.execution_options(isolation_level="AUTOCOMMIT")

    @classmethod
    def from_url(cls, url: str, *, sqlite_busy_timeout_ms: int = 10_000,
                 call_timeout_s: float | None = None) -> Store:
        """Open the store of the database at ``url`` (its own engine and pool); with
        ``call_timeout_s``, a PostgreSQL call that overruns it fails as StoreUnavailable
        (``db/call_deadline.py``)."""
        return cls(create_db_engine(url, sqlite_busy_timeout_ms=sqlite_busy_timeout_ms,
                                    call_timeout_s=call_timeout_s))

    def check_schema(self) -> None:
        """Raise SchemaMissing unless the database is at the packaged migrations' head."""
        from db.migrate import check_schema  # alembic loads only where the schema is checked

        check_schema(self._engine)

    def close(self) -> None:
        """Close every pooled connection (the store is unusable afterwards)."""
        self._read_engine.dispose()
        self._engine.dispose()

    # --- sessions and messages ------------------------------------------------------

    def create_session(
        self, session_id: str, metadata: dict[str, Any], now: datetime
    ) -> SessionState:
        """Create an empty session; raises SessionExists when the id is taken."""
        with self._write() as session:
            _insert_new_session(session, session_id, metadata, now)
            return q.to_session_state(q.find_session(session, session_id))

    def import_session(
        self, session_id: str, metadata: dict[str, Any], messages: Sequence[NewMessage],
        now: datetime,
    ) -> SessionState:
        """Create a session with its whole history at once (SessionExists when present)."""
        with self._write() as session:
            _insert_new_session(session, session_id, metadata, now)
            if messages:
                q.append_rows(session, session_id, messages, now)
            return q.to_session_state(q.find_session(session, session_id))

    def append_messages(
        self, session_id: str, messages: Sequence[NewMessage], *, now: datetime,
        create: bool = False, metadata: dict[str, Any] | None = None,
    ) -> list[int]:
        """Append messages unchecked and return their seqs; ``create`` makes a missing
        session first (with ``metadata``; an existing session's is left alone)."""
        with self._write() as session:
            if create:
                q.insert_session_if_absent(session, session_id, metadata or {}, now)
            if not messages:
                q.find_session(session, session_id)
                return []
            return q.append_rows(session, session_id, messages, now)

    def append_checked(
        self, session_id: str, check: AppendCheck[T], *, now: datetime, create: bool = False,
        metadata: dict[str, Any] | None = None,
    ) -> tuple[list[int], T]:
        """Append the rows ``check`` returns; return their seqs and ``check``'s report.

        One transaction under the session's row lock: ``check`` gets the tool-call state
        read under it, so two concurrent appends never both answer one open call; what
        ``check`` raises rolls everything back. ``create`` as in ``append_messages``.
        """
        with self._write() as session:
            if create:
                q.insert_session_if_absent(session, session_id, metadata or {}, now)
            row = q.find_session(session, session_id, lock=True)
            messages, report = check(q.read_tool_call_state(session, row.id))
            if not messages:
                return [], report
            return q.append_rows(session, session_id, messages, now), report

    def get_session(self, session_id: str) -> SessionState:
        """Return the session's current state (SessionNotFound when unknown)."""
        with self._read() as session:
            return q.to_session_state(q.find_session(session, session_id))

    def list_sessions(self, *, after: str | None = None, limit: int = 100,
                      breaker_state: str | None = None) -> list[SessionState]:
        """Return up to ``limit`` sessions ordered by id, starting after ``after`` (keyset),
        only those whose breaker is in ``breaker_state`` when given."""
        statement = select(SessionRow).order_by(SessionRow.session_id).limit(limit)
        if after is not None:
            statement = statement.where(SessionRow.session_id > after)
        if breaker_state is not None:
            statement = statement.where(SessionRow.breaker_state == breaker_state)
        with self._read() as session:
            return [q.to_session_state(row) for row in session.scalars(statement)]

    def messages(self, session_id: str, *, after_seq: int = 0) -> list[MessageRecord]:
        """Return the full stored history after ``after_seq`` (compaction deletes nothing)."""
        with self._read() as session:
            row = q.find_session(session, session_id)
            return q.select_history(session, row.id, after_seq=after_seq)

    def artifacts(self, session_id: str, *, limit: int = 1000) -> list[ArtifactRecord]:
        """Return the session's identifier index (every message stored), most frequent
        first."""
        with self._read() as session:
            row = q.find_session(session, session_id)
            return select_artifacts(session, row.id, limit=limit)

    def recall(self, session_id: str, query: str, *, limit: int = 20) -> list[RecallHit]:
        """Return the stored messages where ``query`` appears (as written, any case), in
        seq order; ValueError when the query is under three characters."""
        checked = check_query(query)
        with self._read() as session:
            row = q.find_session(session, session_id)
            return search_messages(session, row.id, checked, limit=limit)

    # --- the backfill of messages stored before identifiers were ---------------------

    def count_unindexed_messages(self) -> int:
        """Count the messages of every session that were never indexed."""
        with self._read() as session:
            return count_unindexed(session)

    def unindexed_messages(self, session_id: str, *, limit: int) -> list[tuple[int, Any]]:
        """Return ``(seq, body)`` of the session's first ``limit`` unindexed messages."""
        with self._read() as session:
            return select_unindexed(session, q.find_session(session, session_id).id,
                                    limit=limit)

    def index_messages(self, session_id: str, indexed: Sequence[IndexedMessage]) -> int:
        """Write the index of unindexed messages and fold it into the artifact index, in
        one transaction under the session's row lock; return how many were written."""
        with self._write() as session:
            row = q.find_session(session, session_id, lock=True)
            return write_index(session, row.id, indexed)

    # --- the compacted view ---------------------------------------------------------

    def snapshot(self, session_id: str) -> Snapshot:
        """Read the session, its active revision and its active messages in one snapshot."""
        with self._read() as session:
            row = q.find_session(session, session_id)
            revision = load_active_revision(session, row)
            through_seq = revision.through_seq if revision else 0
            return Snapshot(
                session=q.to_session_state(row),
                revision=revision,
                messages=q.select_active(session, row.id, through_seq),
            )

    def job_snapshot(self, session_id: str, *, history: int = 2,
                     to_message: Callable[[MessageText], JobMessage],
                     gate: SnapshotGate = NO_GATE) -> JobSnapshot[JobMessage]:
        """The snapshot a job plans from, in one consistent read: the session joined to
        its active revision, its active messages (each converted by ``to_message`` as its
        row arrives), and the sizes of its ``history`` newest revisions
        (``JobSnapshot.recent_revisions``); on PostgreSQL one statement, on SQLite a read
        transaction of three. A session that ``gate`` shuts (its breaker refuses the job,
        or it is under the trigger) has only its row and revision read
        (``JobSnapshot.breaker_refused``, ``JobSnapshot.under_trigger``)."""
        with translate_errors(), self._statement_engine.connect() as connection, \
                connection.begin():
            return job.read_snapshot(connection, session_id, history=history,
                                     to_message=to_message, gate=gate)

    def projection(self, session_id: str) -> list[dict[str, Any]]:
        """Return what a model is sent, in one statement: the instructions the active
        revision covers, its block, every later message (no revision: every message)."""
        with self._read_statement() as session:
            return views.select_projection(session, session_id)

    def revisions(self, session_id: str) -> list[RevisionRecord]:
        """Return every revision of the session, newest first (rolled-back ones included)."""
        with self._read() as session:
            row = q.find_session(session, session_id)
            revisions = session.scalars(
                select(RevisionRow)
                .where(RevisionRow.session_id == row.id)
                .order_by(RevisionRow.id.desc())
            )
            return [q.to_revision_record(revision, session_id) for revision in revisions]

    def get_revision(self, revision_id: int) -> RevisionRecord:
        """Return one revision by id (RevisionNotFound when unknown)."""
        with self._read() as session:
            revision = q.find_revision(session, revision_id)
            owner = session.get_one(SessionRow, revision.session_id)
            return q.to_revision_record(revision, owner.session_id)

    # --- compaction -----------------------------------------------------------------

    def swap_revision(
        self, session_id: str, *, expected_revision_id: int | None, lease_owner: str | None,
        revision: NewRevision, run: NewRun, now: datetime, breaker: BreakerUpdate | None = None,
    ) -> int:
        """Swap in a new active revision and record its run; return the revision id.

        One transaction under the session's row lock. Raises LeaseLost when
        ``lease_owner`` is given and no longer holds an unexpired lease, and
        RevisionConflict when the active revision is not ``expected_revision_id``; on
        any error nothing is written. Also sets the breaker: closed, unless ``breaker``
        is given (a fallback committed while it is open leaves it open).
        """
        if run.session_id != session_id:
            raise ValueError(f"run is for {run.session_id!r}, not {session_id!r}")
        with self._write() as session:
            return swap_in(
                session, session_id, expected_revision_id=expected_revision_id,
                lease_owner=lease_owner, revision=revision, run=run, now=now, breaker=breaker,
            )

    def commit_job(
        self, session_id: str, *, expected_revision_id: int | None, lease_owner: str,
        revision: NewRevision, run: NewRun, now: datetime, breaker: BreakerUpdate | None = None,
    ) -> int:
        """End a job that compacted, in one transaction under the session's row lock: the
        compare-and-swap of ``swap_revision`` (same errors, nothing written on any), the
        run row, the lease released and the queue marker cleared if it is ``run.task_id``'s.
        Return the revision id.

        On PostgreSQL first as one statement in autocommit (``job.try_checked_swap``);
        when that writes nothing, in a transaction that tells why (or writes: an append
        raced the statement)."""
        if self._engine.dialect.name == "postgresql":
            with translate_errors(), self._write_statement_engine.begin() as connection:
                revision_id = job.try_checked_swap(
                    connection, session_id, expected_revision_id=expected_revision_id,
                    lease_owner=lease_owner, revision=revision, run=run, now=now,
                    breaker=breaker)
            if revision_id is not None:
                return revision_id
        with translate_errors(), self._engine.begin() as connection:
            return job.commit_swap(
                connection, session_id, expected_revision_id=expected_revision_id,
                lease_owner=lease_owner, revision=revision, run=run, now=now, breaker=breaker,
                release_lease=True, queue_job_id=run.task_id,
            )

    def finish_job(self, run: NewRun, *, lease_owner: str | None,
                   breaker: BreakerUpdate | None = None, clear_queue_marker: bool = False
                   ) -> int:
        """End a job that did not compact, in one transaction: the run row and, for its
        session if it exists, the breaker, the release of ``lease_owner``'s lease (when
        given) and, with ``clear_queue_marker``, the queue marker if it is
        ``run.task_id``'s. Return the run id."""
        if breaker is not None:
            leases.check_breaker(breaker)
        with translate_errors(), self._engine.begin() as connection:
            return job.commit_failure(
                connection, run, breaker=breaker, lease_owner=lease_owner,
                queue_job_id=run.task_id if clear_queue_marker else None,
            )

    def rollback(
        self, session_id: str, *, to_revision_id: int | None = None
    ) -> RevisionRecord | None:
        """Point the session at the active revision's parent, or at ``to_revision_id``.

        ``to_revision_id`` must be a strict ancestor of the active revision, else
        RevisionNotFound (also raised when there is no active revision). Returns the new
        active revision (None: no summary). Revisions are never deleted.
        """
        with self._write() as session:
            return roll_back(session, session_id, to_revision_id)

    def roll_forward(self, session_id: str, *, to_revision_id: int) -> RevisionRecord:
        """Re-activate ``to_revision_id``, a descendant of the active revision (one a
        rollback left): RevisionNotFound otherwise. Returns it."""
        with self._write() as session:
            return roll_forward(session, session_id, to_revision_id)

    def record_run(self, run: NewRun, *, breaker: BreakerUpdate | None = None) -> int:
        """Record a job attempt and, when given and the session exists, its breaker state."""
        statement = None if breaker is None else leases.set_breaker(run.session_id, breaker)
        with self._write() as session:
            run_id = q.insert_run(session, run, revision_id=run.revision_id)
            if statement is not None:
                session.execute(statement, execution_options=q.NO_SYNC)
            return run_id

    def record_kept_run(self, run: NewRun) -> bool:
        """Record a run a job could not write itself, unless a run of the same attempt
        (task, attempt and start) is stored: its commit may have gone through while its
        answer was lost. False when it was. The session's row, when it exists, is
        locked first, so two sweeps writing the same run insert it once."""
        with self._write() as session:
            with contextlib.suppress(SessionNotFound):
                q.find_session(session, run.session_id, lock=True)
            stored = session.execute(
                select(RunRow.id).where(
                    RunRow.session_id == run.session_id, RunRow.started_at == run.started_at,
                    RunRow.task_id == run.task_id, RunRow.attempt == run.attempt)
                .limit(1)).first()
            if stored is not None:
                return False
            q.insert_run(session, run, revision_id=run.revision_id)
            return True

    def record_lost_run(self, run: NewRun, *, since: datetime) -> bool:
        """Record the run of an attempt that died without writing its own, unless a run
        of its task finished at or after ``since`` (the attempt's start, as its finder
        knows it): the attempt recorded itself before dying. False when it had. The
        session's row, when it exists, is locked first, so two finders write it once."""
        with self._write() as session:
            with contextlib.suppress(SessionNotFound):
                q.find_session(session, run.session_id, lock=True)
            stored = session.execute(
                select(RunRow.id).where(
                    RunRow.session_id == run.session_id, RunRow.task_id == run.task_id,
                    RunRow.finished_at >= since)
                .limit(1)).first()
            if stored is not None:
                return False
            q.insert_run(session, run, revision_id=run.revision_id)
            return True

    def runs(
        self, *, session_id: str | None = None, outcome: str | None = None, limit: int = 100,
        since: datetime | None = None, until: datetime | None = None,
    ) -> list[RunRecord]:
        """Return recorded runs, newest first, optionally for one session and/or outcome,
        started at or after ``since`` and before ``until``."""
        statement = select(RunRow).order_by(RunRow.started_at.desc(), RunRow.id.desc())
        if session_id is not None:
            statement = statement.where(RunRow.session_id == session_id)
        if outcome is not None:
            statement = statement.where(RunRow.outcome == outcome)
        if since is not None:
            statement = statement.where(RunRow.started_at >= since)
        if until is not None:
            statement = statement.where(RunRow.started_at < until)
        with self._read() as session:
            return [q.to_run_record(row) for row in session.scalars(statement.limit(limit))]

    # --- leases and breaker ----------------------------------------------------------

    def start_job(self, session_id: str, owner: str, ttl_s: float, now: datetime, *,
                  take_over: str | None = None) -> SessionState | None:
        """Take the lease as ``acquire_lease`` does and return the session as it now is,
        in one statement; None when another owner holds it. ``take_over`` also takes a
        lease whose owner ends in ``":" + take_over`` (SessionNotFound when unknown)."""
        with translate_errors(), self._write_statement_engine.begin() as connection:
            return job.take_lease(connection, session_id, owner, ttl_s, now,
                                  take_over=take_over)

    def start_job_with_snapshot(
        self, session_id: str, owner: str, ttl_s: float, now: datetime, *,
        take_over: str | None = None, history: int = 2,
        to_message: Callable[[MessageText], JobMessage], gate: SnapshotGate = NO_GATE,
    ) -> JobSnapshot[JobMessage] | None:
        """``start_job`` then ``job_snapshot`` (``gate`` as there): the
        snapshot, whose session is the row as the lease left it; None when another owner
        holds the lease (and nothing is read). On PostgreSQL one statement in autocommit
        (``job.take_lease_with_snapshot``), on SQLite two transactions."""
        if self._engine.dialect.name != "postgresql":
            if self.start_job(session_id, owner, ttl_s, now, take_over=take_over) is None:
                return None
            return self.job_snapshot(session_id, history=history, to_message=to_message,
                                     gate=gate)
        with translate_errors(), self._write_statement_engine.begin() as connection:
            return job.take_lease_with_snapshot(
                connection, session_id, owner, ttl_s, now, take_over=take_over,
                history=history, to_message=to_message, gate=gate)

    def acquire_lease(self, session_id: str, owner: str, ttl_s: float, now: datetime) -> bool:
        """Take or renew the session's lease until ``now + ttl_s``; False when another
        owner holds an unexpired lease."""
        return self._update_one(session_id, leases.acquire_lease(session_id, owner, ttl_s, now))

    def renew_lease(self, session_id: str, owner: str, ttl_s: float, now: datetime) -> bool:
        """Extend ``owner``'s lease to ``now + ttl_s``; False when it no longer holds it."""
        return self._update_one(session_id, leases.renew_lease(session_id, owner, ttl_s, now))

    def release_lease(self, session_id: str, owner: str) -> bool:
        """Release the lease if ``owner`` holds it; return whether it did."""
        return self._update_one(session_id, leases.release_lease(session_id, owner))

    def set_breaker(self, session_id: str, update: BreakerUpdate) -> None:
        """Persist the session's breaker fields."""
        self._update_one(session_id, leases.set_breaker(session_id, update))

    def count_breakers(self) -> dict[str, int]:
        """Sessions per breaker state other than closed (``open``, ``half_open``)."""
        statement = (select(SessionRow.breaker_state, func.count())
                     .where(SessionRow.breaker_state != "closed")
                     .group_by(SessionRow.breaker_state))
        with self._read() as session:
            return {state: int(count) for state, count in session.execute(statement)}

    # --- scheduling: the due-session scan and queued-job markers ---------------------

    def due_sessions_page(
        self, why: DueWhy, criteria: DueCriteria, now: datetime, *, limit: int,
        after: DueCursor | None = None,
    ) -> DuePage:
        """Read one keyset page of ``why``'s tier of due sessions, most to gain first."""
        with self._read() as session:
            return read_due_page(session, why, criteria, now, limit=limit, after=after)

    def iter_due_sessions(
        self, criteria: DueCriteria, now: datetime, *, page_size: int
    ) -> Iterator[DueRow]:
        """Yield every due session once, tier by tier, one short read per page.

        No snapshot stays open between pages, so a session whose figures change
        meanwhile may be skipped or seen twice; the queue marker makes a second sighting
        harmless and the next scan picks up a skipped one.
        """
        for why in DueWhy:
            after: DueCursor | None = None
            while True:
                page = self.due_sessions_page(why, criteria, now, limit=page_size, after=after)
                yield from page.sessions
                if page.next_after is None:
                    break
                after = page.next_after

    def count_scan_exclusions(self, criteria: DueCriteria, now: datetime) -> dict[str, int]:
        """Sessions by the first reason a scan at ``now`` leaves them out (``db.Exclusion``),
        and ``eligible`` ones; a full read, for explaining a scan, not for running one."""
        with self._read() as session:
            return count_exclusions(session, criteria, now)

    @contextmanager
    def queue_markers(self) -> Iterator[QueueMarkers]:
        """One write transaction over queued-job markers: what is marked or cleared
        through it commits together on exit, or not at all."""
        with self._write() as session:
            yield QueueMarkers(session.connection())

    def held_sessions(self, *, queued_before: datetime, limit: int) -> list[HeldSession]:
        """Sessions with a marker set before ``queued_before`` or a lease (the reconciler)."""
        with self._read() as session:
            return read_held_sessions(session, queued_before=queued_before, limit=limit)

    def dead_leases(self, *, now: datetime, limit: int) -> list[HeldSession]:
        """Sessions whose lease expired before ``now`` (the reconciler's quick sweep)."""
        with self._read() as session:
            return read_dead_leases(session, now=now, limit=limit)

    def due_among(self, session_ids: Sequence[str], criteria: DueCriteria,
                  now: datetime) -> dict[str, tuple[DueWhy, int]]:
        """Of ``session_ids``, those the scan would take were their marker and lease free."""
        if not session_ids:
            return {}
        with self._read() as session:
            return read_due_among(session, session_ids, criteria, now)

    def clear_queue_marker(self, session_id: str, job_id: str) -> bool:
        """Clear the session's queued-job marker if it is still ``job_id``'s."""
        with self.queue_markers() as markers:
            return markers.clear(session_id, job_id)

    # --- the data lifecycle: erasing and collecting -----------------------------------

    def delete_session(self, session_id: str, *, force: bool = False,
                       now: datetime) -> DeletedSession:
        """Erase the session with every row of it (``db.lifecycle.SESSION_TABLES``) in one
        transaction; SessionLeased while a job holds its lease, unless ``force``."""
        with self._write() as session:
            return delete_session(session, session_id, force=force, now=now)

    def pop_message(self, session_id: str, *, seq: int, now: datetime) -> MessageRecord:
        """Erase message ``seq`` if it is still the newest and no compaction read it, with
        its search text and its part of the artifact index, in one transaction; return
        it. MessagePinned otherwise (a rolled-back revision's reading counts);
        SessionLeased while a job's lease is recorded, expired or not."""
        with self._write() as session:
            return pop_newest_message(session, session_id, seq, now)

    def collect_garbage(
        self, policy: GcPolicy, now: datetime, *, dry_run: bool = False,
        on_batch: Callable[[GcBatch], None] | None = None,
    ) -> list[GcBatch]:
        """Remove superseded revisions, then old runs, one transaction per batch (a dry
        run counts and writes nothing); return every batch."""
        return collect_garbage(self._write, policy, now, dry_run=dry_run, on_batch=on_batch)

    # --- transactions ---------------------------------------------------------------

    def _update_one(self, session_id: str, statement: Update) -> bool:
        """Run a conditional UPDATE of one session; SessionNotFound when it does not exist."""
        with self._write() as session:
            changed = session.execute(
                statement.returning(SessionRow.id), execution_options=q.NO_SYNC
            ).first()
            if changed is None:
                q.find_session(session, session_id)
            return changed is not None

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with translate_errors(), Session(self._engine) as session, session.begin():
            yield session

    @contextmanager
    def _read_statement(self) -> Iterator[Session]:
        with translate_errors(), Session(self._statement_engine) as session:
            yield session

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with translate_errors(), Session(self._read_engine) as session, session.begin():
            yield session


def _insert_new_session(
    session: Session, session_id: str, metadata: dict[str, Any], now: datetime
) -> None:
    if not q.insert_session_if_absent(session, session_id, metadata, now):
        raise SessionExists(f"session {session_id!r} already exists")

