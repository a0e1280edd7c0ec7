"""The error tree of a compaction job; policy lives on the classes.

::

    CompactionError                    outcome      retry   counts on
    ├── TransientError                 failed       yes     -
    │   ├── ProviderBreakerOpen        failed       yes     - (waits out the cooldown)
    │   └── ProviderError              failed       yes     provider breaker
    │       └── ProviderRateLimited    failed       yes     provider breaker (Retry-After)
    ├── SessionFailure                 failed       no      session breaker
    │   ├── SummaryInvalid             failed       no      session breaker (typed reason)
    │   ├── ContextOverflow            failed       no      session breaker (after one re-plan)
    │   ├── DeliveryCapExceeded        failed       no      session breaker
    │   └── InternalError              failed       no      session breaker (unexpected)
    ├── StaleSnapshot                  conflict     no      -
    ├── LeaseHeld                      skipped      no      -
    ├── BreakerOpen                    breaker_open no      -
    └── JobRejected                    rejected     no      -

The task has one ``except CompactionError`` and reads ``outcome``, ``retryable`` and
``counts_on`` from the instance. Third-party errors are translated into these once, at
the adapters (``worker/llm.py``); the store has its own small tree in ``db/errors.py``
that the pipeline maps here.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar


class Outcome(StrEnum):
    """The outcome of one job, as logged in ``compaction.job`` and stored in ``runs``."""

    COMPACTED = "compacted"
    FALLBACK = "fallback"
    SKIPPED = "skipped"
    BREAKER_OPEN = "breaker_open"
    CONFLICT = "conflict"
    REJECTED = "rejected"
    FAILED = "failed"


class BreakerScope(StrEnum):
    """Which breaker a failure counts on."""

    SESSION = "session"
    PROVIDER = "provider"


class CompactionError(Exception):
    """Base of every error a job can end with."""

    outcome: ClassVar[Outcome] = Outcome.FAILED
    retryable: ClassVar[bool] = False
    counts_on: ClassVar[BreakerScope | None] = None

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or type(self).__name__


class TransientError(CompactionError):
    """Raised when a retry later may succeed (the session is not at fault)."""

    retryable = True


class ProviderBreakerOpen(TransientError):
    """Raised when the provider breaker is open: retry later, without counting another
    provider failure (that would restart the cooldown and keep it open forever)."""


class ProviderError(TransientError):
    """Raised when the LLM endpoint fails: timeout, connection, 5xx, 429 after retries."""

    counts_on = BreakerScope.PROVIDER


class ProviderRateLimited(ProviderError):
    """Raised when the endpoint answers 429; ``retry_after_s`` is its requested delay."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message, reason="rate_limited")
        self.retry_after_s = retry_after_s


class SessionFailure(CompactionError):
    """Raised when this session's job failed for good; counts on its breaker."""

    counts_on = BreakerScope.SESSION


class SummaryInvalid(SessionFailure):
    """Raised when the summary fails validation; ``reason`` names the check."""


class ContextOverflow(SessionFailure):
    """Raised when the summarizer still reports context-length exceeded after a re-plan."""


class DeliveryCapExceeded(SessionFailure):
    """Raised when a job was delivered more times than allowed (its worker keeps dying)."""


class StaleSnapshot(CompactionError):
    """Raised when the active revision changed since the snapshot (compare-and-swap lost)."""

    outcome = Outcome.CONFLICT


class LeaseHeld(CompactionError):
    """Raised when another job holds the session's lease."""

    outcome = Outcome.SKIPPED


class BreakerOpen(CompactionError):
    """Raised when the session's breaker is open and policy says skip."""

    outcome = Outcome.BREAKER_OPEN


class JobRejected(CompactionError):
    """Raised when a job message is malformed or names an unknown session."""

    outcome = Outcome.REJECTED


class InternalError(SessionFailure):
    """Raised when a job hits an unexpected error; counts on the session's breaker so a
    session that keeps crashing its job ends breaker-open instead of looping."""
