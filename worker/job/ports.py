"""The ports a job talks through: the database as the job needs it, and the provider-wide
breaker. ``db.Store`` and ``worker.shared_state.provider_breaker.ProviderBreaker`` implement them in
production; ``tests/support/fake_store.py`` implements the store in memory for the unit
suite."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from db import (
    NO_SKIP,
    BreakerUpdate,
    JobSnapshot,
    MessageText,
    NewRevision,
    NewRun,
    ParkedJob,
    SessionState,
    SnapshotSkipRule,
)
from worker.summarizers import Summarizer

JobMessage = TypeVar("JobMessage")


class JobLedgerPort(Protocol):
    """The job's port onto the database (its ledger of sessions, messages, revisions and
    runs): the ``db.Store`` methods one job uses, with their contract. A job is three
    transactions at most, ``start_job_with_snapshot`` (on PostgreSQL one statement), then
    ``commit_job`` or ``finish_job`` (``get_session`` and ``set_breaker`` only on a rare
    path: a failure before the lease, the breaker's half-open trial; ``renew_lease``
    from the heartbeat of a long job; ``job_snapshot`` for a preview).

    Unknown sessions raise ``db.SessionNotFound`` (``finish_job`` records the run
    anyway); ``commit_job`` raises ``db.LeaseLost`` or ``db.RevisionConflict`` and then
    writes nothing; an unreachable database raises ``db.StoreUnavailable``.
    """

    def start_job_with_snapshot(
        self, session_id: str, owner: str, ttl_s: float, now: datetime, *,
        take_over: str | None = None, history: int = 2,
        to_message: Callable[[MessageText], JobMessage], skip_rule: SnapshotSkipRule = NO_SKIP,
    ) -> JobSnapshot[JobMessage] | None: ...

    def renew_lease(self, session_id: str, owner: str, ttl_s: float, now: datetime) -> bool: ...

    def get_session(self, session_id: str) -> SessionState: ...

    def set_breaker(self, session_id: str, update: BreakerUpdate) -> None: ...

    def job_snapshot(self, session_id: str, *, history: int = 2,
                     to_message: Callable[[MessageText], JobMessage],
                     skip_rule: SnapshotSkipRule = NO_SKIP) -> JobSnapshot[JobMessage]: ...

    def commit_job(
        self, session_id: str, *, expected_revision_id: int | None, lease_owner: str,
        revision: NewRevision, run: NewRun, now: datetime, breaker: BreakerUpdate | None = None,
    ) -> int: ...

    def finish_job(self, run: NewRun, *, lease_owner: str | None,
                   breaker: BreakerUpdate | None = None,
                   clear_queue_marker: bool = False) -> int: ...


class ProviderBreakerPort(Protocol):
    """The provider-wide breaker as the pipeline sees it."""

    def admit(self) -> bool: ...
    def record_success(self) -> None: ...
    def record_failure(self) -> None: ...
    def fail_trial(self) -> None: ...
    def reopens_in_s(self) -> float | None: ...


class ReplayRunPort(Protocol):
    """One run of a batched job's summarizer (``worker.summarizers.batch_replay``)."""

    @property
    def summarizer(self) -> Summarizer: ...

    def pending_records(self) -> list[dict[str, Any]]: ...


class BatchModePort(Protocol):
    def replay(self, answers: Mapping[str, Mapping[str, Any]]) -> ReplayRunPort: ...


class BatchStorePort(Protocol):
    """The store methods of a parked job (``db/store_batches.py``)."""

    def park_job(self, run: NewRun, park: ParkedJob, *, lease_owner: str) -> int: ...

    def parked_jobs(self, *, session_id: str | None = None, state: str | None = None,
                    batch_id: str | None = None, limit: int | None = None
                    ) -> list[ParkedJob]: ...

    def drop_parked_job(self, session_id: str) -> bool: ...


@dataclass(frozen=True)
class Batching:
    """Batch mode's parts (``COMPACTOR_LLM_MODE=batch``; None on ``JobDeps``: sync)."""

    mode: BatchModePort
    store: BatchStorePort
