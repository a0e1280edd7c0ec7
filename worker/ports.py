"""The ports a job talks through: the store as the job needs it, and the provider-wide
breaker. ``db.Store`` and ``worker.provider_breaker.ProviderBreaker`` implement them in
production; ``tests/support/fake_store.py`` implements the store in memory for the unit
suite."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from db import BreakerUpdate, NewRevision, NewRun, RevisionRecord, SessionState, Snapshot


class JobStore(Protocol):
    """The store methods one job uses, with ``db.Store``'s contract.

    Unknown sessions raise ``db.SessionNotFound``; the swap raises ``db.LeaseLost`` or
    ``db.RevisionConflict`` and then writes nothing; an unreachable database raises
    ``db.StoreUnavailable``.
    """

    def acquire_lease(self, session_id: str, owner: str, ttl_s: float, now: datetime) -> bool: ...

    def release_lease(self, session_id: str, owner: str) -> bool: ...

    def get_session(self, session_id: str) -> SessionState: ...

    def set_breaker(self, session_id: str, update: BreakerUpdate) -> None: ...

    def snapshot(self, session_id: str) -> Snapshot: ...

    def revisions(self, session_id: str) -> list[RevisionRecord]: ...

    def swap_revision(
        self, session_id: str, *, expected_revision_id: int | None, lease_owner: str | None,
        revision: NewRevision, run: NewRun, now: datetime, breaker: BreakerUpdate | None = None,
    ) -> int: ...

    def record_run(self, run: NewRun, *, breaker: BreakerUpdate | None = None) -> int: ...


class ProviderBreakerPort(Protocol):
    """The provider-wide breaker as the pipeline sees it."""

    def admit(self) -> bool: ...
    def record_success(self) -> None: ...
    def record_failure(self) -> None: ...
    def fail_trial(self) -> None: ...
