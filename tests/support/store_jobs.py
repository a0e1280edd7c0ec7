"""A job's store calls, one sentence each, for tests that set a session up or read it
back through the path a job takes (``Store.start_job``, ``job_snapshot``,
``commit_job``): the store has no second path for them."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from db import BreakerUpdate, JobSnapshot, MessageText, NewRevision, NewRun, SessionState
from worker.job.ports import JobLedgerPort

# The lease a swap takes when the test names no owner: long enough for any test.
SWAPPER = "test-host:1:swap"
SWAPPER_TTL_S = 3600.0


class LeasingStore(JobLedgerPort, Protocol):
    """A job's port with the lease alone (``Store.start_job``)."""

    def start_job(self, session_id: str, owner: str, ttl_s: float, now: datetime, *,
                  take_over: str | None = None) -> SessionState | None: ...


def take_lease(store: LeasingStore, session_id: str, owner: str, ttl_s: float,
               now: datetime) -> bool:
    """Take or renew ``owner``'s lease; False when another owner holds it."""
    return store.start_job(session_id, owner, ttl_s, now) is not None


def swap_in(store: LeasingStore, session_id: str, *, expected_revision_id: int | None,
            revision: NewRevision, run: NewRun, now: datetime, owner: str | None = None,
            breaker: BreakerUpdate | None = None) -> int:
    """Swap ``revision`` in as a job ends (``commit_job``: the lease released after); as
    ``owner``, whose lease the test took, or else after taking ``SWAPPER``'s lease at
    ``now`` (LeaseLost when another owner holds one)."""
    if owner is None:
        owner = SWAPPER
        take_lease(store, session_id, owner, SWAPPER_TTL_S, now)
    return store.commit_job(session_id, expected_revision_id=expected_revision_id,
                            lease_owner=owner, revision=revision, run=run, now=now,
                            breaker=breaker)


def read_snapshot(store: JobLedgerPort, session_id: str) -> JobSnapshot[MessageText]:
    """The session, its active revision and its active messages, as a job reads them."""
    return store.job_snapshot(session_id, to_message=keep_text)


def keep_text(text: MessageText) -> MessageText:
    return text
