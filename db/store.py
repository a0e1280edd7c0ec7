"""The session store, the one door to the database for the worker and the scheduler.

Every public method is one transaction on PostgreSQL or SQLite (the due-session iterator
one per page; ``queue_markers`` one around the caller's block; a one-statement read on
PostgreSQL none, the statement being its own snapshot). Values go in and out as
the frozen dataclasses of ``db/records.py``. ``sqlalchemy.exc`` errors are translated
once, into ``db/errors.py``, by the transactions of ``db/store_base.py``. The job's and
the scheduler's methods live in ``db/store_jobs.py`` and ``db/store_scheduling.py``,
which ``Store`` inherits. Writes lock the session row (``SELECT ... FOR
UPDATE`` on PostgreSQL; ``BEGIN IMMEDIATE`` on SQLite); reads run in one consistent
snapshot (see ``db.engine.derive_read_engine``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from db import leases
from db import projection as views
from db import queries as q
from db.artifacts import count_unindexed, select_artifacts, select_unindexed, write_index
from db.costs import CostedRun, read_costed_runs
from db.engine import create_db_engine
from db.errors import SessionExists, SessionNotFound
from db.lifecycle import collect_garbage, delete_session, pop_newest_message
from db.models import RevisionRow, RunRow, SessionRow
from db.recall import check_query, search_messages
from db.records import (
    ArtifactRecord,
    BreakerUpdate,
    DeletedSession,
    GcBatch,
    GcPolicy,
    IndexedMessage,
    MessageRecord,
    NewMessage,
    NewRun,
    RecallHit,
    RevisionRecord,
    RunRecord,
    SessionState,
    ToolCallState,
    UnindexedMessage,
)
from db.revisions import roll_back, roll_forward
from db.store_batches import BatchStoreMethods
from db.store_jobs import JobStoreMethods
from db.store_scheduling import SchedulingStoreMethods

T = TypeVar("T")
# An append's intake check: given the session's tool-call state, the rows to insert and
# whatever the caller wants back (its report).
AppendCheck = Callable[[ToolCallState], tuple[Sequence[NewMessage], T]]


class Store(JobStoreMethods, SchedulingStoreMethods, BatchStoreMethods):
    """The durable store of sessions, messages, revisions and runs."""

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
        self, session_id: str, metadata: dict[str, Any], now: datetime, *,
        session_format: str = "chat", system_tokens: int = 0,
    ) -> SessionState:
        """Create an empty session of ``session_format`` (chat, responses, anthropic)
        whose system prompt outside its messages counts ``system_tokens``; raises
        SessionExists when the id is taken."""
        with self._write() as session:
            _insert_new_session(session, session_id, metadata, now, session_format,
                                system_tokens)
            return q.to_session_state(q.find_session(session, session_id))

    def import_session(
        self, session_id: str, metadata: dict[str, Any], messages: Sequence[NewMessage],
        now: datetime, *, session_format: str = "chat", system_tokens: int = 0,
    ) -> SessionState:
        """Create a session with its whole history at once (SessionExists when present),
        ``system_tokens`` as in ``create_session``."""
        with self._write() as session:
            _insert_new_session(session, session_id, metadata, now, session_format,
                                system_tokens)
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
        metadata: dict[str, Any] | None = None, session_format: str = "chat",
        system_tokens: int = 0,
    ) -> tuple[list[int], T]:
        """Append the rows ``check`` returns; return their seqs and ``check``'s report.

        One transaction under the session's row lock: ``check`` gets the tool-call state
        read under it (the session's format with it), so two concurrent appends never
        both answer one open call; what ``check`` raises rolls everything back.
        ``create`` as in ``append_messages``, of ``session_format`` and
        ``system_tokens`` (as in ``create_session``).
        """
        with self._write() as session:
            if create:
                q.insert_session_if_absent(session, session_id, metadata or {}, now,
                                           session_format, system_tokens)
            row = q.find_session(session, session_id, lock=True)
            messages, report = check(q.read_tool_call_state(session, row))
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

    # --- the backfill of messages stored before identifiers or outcomes were ---------

    def count_unindexed_messages(self) -> int:
        """Count the messages of every session never indexed or never classified."""
        with self._read() as session:
            return count_unindexed(session)

    def unindexed_messages(self, session_id: str, *, limit: int) -> list[UnindexedMessage]:
        """Return the session's first ``limit`` messages never indexed or classified."""
        with self._read() as session:
            return select_unindexed(session, q.find_session(session, session_id).id,
                                    limit=limit)

    def index_messages(self, session_id: str, indexed: Sequence[IndexedMessage]) -> int:
        """Write what was missing of messages' index and outcomes and fold their
        identifiers into the artifact index, in one transaction under the session's row
        lock; return how many were written."""
        with self._write() as session:
            row = q.find_session(session, session_id, lock=True)
            return write_index(session, row.id, indexed)

    def set_system_tokens(self, session_id: str, system_tokens: int) -> int:
        """Set the count of the session's system prompt kept outside its messages (0 in
        sessions stored before migration 0009), moving its totals by the difference as
        a count at creation would have, under its row lock; return the difference."""
        with self._write() as session:
            row = q.find_session(session, session_id, lock=True)
            difference = system_tokens - row.system_tokens
            row.system_tokens = system_tokens
            row.total_tokens += difference
            row.projection_tokens += difference
            if row.active_revision_id is None:  # unsummarized until a revision reads on
                row.tokens_since_compaction += difference
            return difference

    # --- the compacted view ---------------------------------------------------------

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

    # --- revisions and runs ----------------------------------------------------------

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
        answer was lost. False when it was."""
        return self._record_run_once(run, RunRow.started_at == run.started_at,
                                     RunRow.attempt == run.attempt)

    def record_lost_run(self, run: NewRun, *, since: datetime) -> bool:
        """Record the run of an attempt that died without writing its own, unless a run
        of its task finished at or after ``since`` (the attempt's start, as its finder
        knows it): the attempt recorded itself before dying. False when it had."""
        return self._record_run_once(run, RunRow.finished_at >= since)

    def _record_run_once(self, run: NewRun, *same_attempt: ColumnElement[bool]) -> bool:
        """Insert ``run`` unless a run of its session and task matching ``same_attempt``
        is stored. The session's row, when it exists, is locked first, so two writers of
        the same run insert it once."""
        with self._write() as session:
            with contextlib.suppress(SessionNotFound):
                q.find_session(session, run.session_id, lock=True)
            stored = session.execute(
                select(RunRow.id).where(RunRow.session_id == run.session_id,
                                        RunRow.task_id == run.task_id, *same_attempt)
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

    def costed_runs(self, *, since: datetime, until: datetime | None = None
                    ) -> list[CostedRun]:
        """Return the runs started at or after ``since`` (and before ``until``), oldest
        first, each compaction with the session's requests since its previous one."""
        with self._read() as session:
            return read_costed_runs(session, since, until)

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



def _insert_new_session(
    session: Session, session_id: str, metadata: dict[str, Any], now: datetime,
    session_format: str, system_tokens: int,
) -> None:
    if not q.insert_session_if_absent(session, session_id, metadata, now, session_format,
                                      system_tokens):
        raise SessionExists(f"session {session_id!r} already exists")

