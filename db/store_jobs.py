"""The store's job methods: a job's lease with its snapshot, its swap or its failure,
and the lease's and the breaker's single-purpose updates.

One version of each statement per dialect (``db/job_lease.py``, ``db/job_snapshot.py``,
``db/job_swap.py``): on PostgreSQL the lease with the snapshot is one statement and the
swap another, each in autocommit; on SQLite each is a transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy import func, select

from db import leases
from db.errors import translate_errors
from db.job_lease import take_lease, take_lease_with_snapshot
from db.job_snapshot import read_snapshot
from db.job_swap import commit_failure, commit_swap, swap_in_one_statement
from db.models import SessionRow
from db.records import (
    NO_SKIP,
    BreakerUpdate,
    JobMessage,
    JobSnapshot,
    MessageText,
    NewRevision,
    NewRun,
    SessionState,
    SnapshotSkipRule,
)
from db.store_base import StoreBase


class JobStoreMethods(StoreBase):
    """What a compaction job asks of the store (``worker.job.ports.JobLedgerPort``)."""

    def start_job(self, session_id: str, owner: str, ttl_s: float, now: datetime, *,
                  take_over: str | None = None) -> SessionState | None:
        """Take or renew ``owner``'s lease until ``now + ttl_s`` and return the session as
        it now is, in one statement; None when another owner holds an unexpired lease.
        ``take_over`` also takes a lease whose owner ends in ``":" + take_over``
        (SessionNotFound when unknown)."""
        with translate_errors(), self._write_statement_engine.begin() as connection:
            return take_lease(connection, session_id, owner, ttl_s, now,
                                  take_over=take_over)

    def start_job_with_snapshot(
        self, session_id: str, owner: str, ttl_s: float, now: datetime, *,
        take_over: str | None = None, history: int = 2,
        to_message: Callable[[MessageText], JobMessage], skip_rule: SnapshotSkipRule = NO_SKIP,
    ) -> JobSnapshot[JobMessage] | None:
        """``start_job`` then ``job_snapshot`` (``skip_rule`` as there): the
        snapshot, whose session is the row as the lease left it; None when another owner
        holds the lease (and nothing is read). On PostgreSQL one statement in autocommit
        (``db.job_lease.take_lease_with_snapshot``), on SQLite two transactions."""
        if self._engine.dialect.name != "postgresql":
            if self.start_job(session_id, owner, ttl_s, now, take_over=take_over) is None:
                return None
            return self.job_snapshot(session_id, history=history, to_message=to_message,
                                     skip_rule=skip_rule)
        with translate_errors(), self._write_statement_engine.begin() as connection:
            return take_lease_with_snapshot(
                connection, session_id, owner, ttl_s, now, take_over=take_over,
                history=history, to_message=to_message, skip_rule=skip_rule)


    def job_snapshot(self, session_id: str, *, history: int = 2,
                     to_message: Callable[[MessageText], JobMessage],
                     skip_rule: SnapshotSkipRule = NO_SKIP) -> JobSnapshot[JobMessage]:
        """The snapshot a job plans from, in one consistent read: the session joined to
        its active revision, its active messages (each converted by ``to_message`` as its
        row arrives), and the sizes of its ``history`` newest revisions
        (``JobSnapshot.recent_revisions``); on PostgreSQL one statement, on SQLite a read
        transaction of three. A session that ``skip_rule`` matches (its breaker refuses the job,
        or it is under the trigger) has only its row and revision read
        (``JobSnapshot.breaker_refused``, ``JobSnapshot.under_trigger``)."""
        with translate_errors(), self._statement_engine.connect() as connection, \
                connection.begin():
            return read_snapshot(connection, session_id, history=history,
                                     to_message=to_message, skip_rule=skip_rule)

    def commit_job(
        self, session_id: str, *, expected_revision_id: int | None, lease_owner: str,
        revision: NewRevision, run: NewRun, now: datetime, breaker: BreakerUpdate | None = None,
    ) -> int:
        """End a job that compacted, under the session's row lock: compare-and-swap the
        active revision (RevisionConflict when it is not ``expected_revision_id``;
        LeaseLost when ``lease_owner`` no longer holds an unexpired lease; nothing written
        on any error), set the breaker (closed unless ``breaker`` says otherwise), record
        the run, release the lease and clear the queue marker if it is ``run.task_id``'s.
        Return the revision id. On PostgreSQL one statement in autocommit
        (``db.job_swap.swap_in_one_statement``), on SQLite one transaction."""
        postgresql = self._engine.dialect.name == "postgresql"
        swap = swap_in_one_statement if postgresql else commit_swap
        engine = self._write_statement_engine if postgresql else self._engine
        with translate_errors(), engine.begin() as connection:
            return swap(connection, session_id, expected_revision_id=expected_revision_id,
                        lease_owner=lease_owner, revision=revision, run=run, now=now,
                        breaker=breaker)

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
            return commit_failure(
                connection, run, breaker=breaker, lease_owner=lease_owner,
                queue_job_id=run.task_id if clear_queue_marker else None,
            )

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
