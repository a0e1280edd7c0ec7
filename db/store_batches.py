"""The store's Batch API methods: a job parked with its run record, and the poller's
reads and writes of parked jobs (``db/parked.py``), each one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from db import parked
from db.job_swap import commit_failure
from db.parked import ParkedJob
from db.records import NewRun
from db.store_base import StoreBase


class BatchStoreMethods(StoreBase):
    """What batch mode asks of the store: parking, and the poller's collection."""

    def park_job(self, run: NewRun, park: ParkedJob, *, lease_owner: str) -> int:
        """End a job whose requests wait for a batch, in one transaction: its parked
        record (in place of any earlier one), its run row, the release of its lease and
        of its queue marker (the poller sends the job again once answers are in).
        Return the run id."""
        with self._write() as session:
            run_id = commit_failure(session.connection(), run, breaker=None,
                                    lease_owner=lease_owner, queue_job_id=run.task_id)
            parked.write_park(session, park)
            return run_id

    def parked_jobs(self, *, session_id: str | None = None, state: str | None = None,
                    batch_id: str | None = None, limit: int | None = None) -> list[ParkedJob]:
        """The parked jobs matching every filter given, oldest first."""
        with self._read() as session:
            return parked.read_parks(session, session_id=session_id, state=state,
                                     batch_id=batch_id, limit=limit)

    def drop_parked_job(self, session_id: str) -> bool:
        """Erase the session's parked job (its result was applied, or it went stale)."""
        with self._write() as session:
            return parked.drop_park(session, session_id)

    def mark_parks_submitted(self, session_ids: Sequence[str], batch_id: str) -> None:
        with self._write() as session:
            parked.mark_submitted(session, session_ids, batch_id)

    def add_park_answers(self, answers: dict[str, dict[str, Any]]) -> None:
        """Add the answers a batch gave (session -> request key -> line) to their jobs."""
        with self._write() as session:
            parked.add_answers(session, answers)

    def count_parked_jobs(self) -> tuple[dict[str, int], int]:
        """Parked jobs per state (open, submitted, answered), and the batches they wait on."""
        with self._read() as session:
            return parked.count_parks(session)
