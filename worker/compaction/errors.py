"""The base of the job error tree, and the errors the pure core raises; policy lives on
the classes. ``worker/errors.py`` extends this tree with the errors of the adapters and
the job's own (provider, lease, delivery, message), and draws the whole tree.
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
    PARKED = "parked"  # its summarizer requests wait in a batch (COMPACTOR_LLM_MODE=batch)
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
        # What the failed step had measured (job figure names: LLM calls and tokens
        # spent before the failure), so that a failed job reports its cost too.
        self.figures: dict[str, int | float] = {}


class TransientError(CompactionError):
    """Raised when a retry later may succeed (the session is not at fault)."""

    retryable = True


class SessionFailure(CompactionError):
    """Raised when this session's job failed for good; counts on its breaker."""

    counts_on = BreakerScope.SESSION


class SummaryInvalid(SessionFailure):
    """Raised when the summary fails validation; ``reason`` names the check."""


class ContextOverflow(SessionFailure):
    """Raised when the summarizer still reports context-length exceeded after a re-plan."""


class ConfigurationError(CompactionError):
    """Raised when the service is set up wrong (a missing file, an unusable value): no
    session is at fault and a retry cannot help until an operator fixes it."""


class TokenizerUnavailable(ConfigurationError):
    """Raised when no offline copy of the encoding file can be found or verified."""
