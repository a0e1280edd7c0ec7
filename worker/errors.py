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
    │   ├── JobTimedOut                failed       no      session breaker (soft time limit)
    │   ├── StoredMessageInvalid       failed       no      session breaker (a bad stored row)
    │   └── InternalError              failed       no      session breaker (unexpected)
    ├── StaleSnapshot                  conflict     no      -
    ├── LeaseHeld                      skipped      no      -
    ├── BreakerOpen                    breaker_open no      -
    ├── JobRejected                    rejected     no      -
    │   └── MessagesRejected           rejected     no      - (intake refused an append)
    └── ConfigurationError             failed       no      - (an operator must act)
        ├── TokenizerUnavailable       failed       no      -
        └── ProviderAuthFailed         failed       no      - (401/403: reason auth_failed)

The base, the policy enums and the errors the pure core raises live in the core
(``worker/compaction/errors.py``); this module extends them and is the one place to
import the whole tree from. The task has one ``except CompactionError`` and reads
``outcome``, ``retryable`` and ``counts_on`` from the instance. Third-party errors are
translated into these once, at the adapters (``worker/summarizers/openai_client.py``);
the store has its own small tree in ``db/errors.py``, mapped here once by :func:`to_job_error`.
"""

from __future__ import annotations

from db import LeaseLost, RevisionConflict, SessionNotFound, StoreUnavailable
from worker.compaction import (
    BreakerScope,
    CompactionError,
    ConfigurationError,
    ContextOverflow,
    Outcome,
    Problem,
    SessionFailure,
    SummaryInvalid,
    TokenizerUnavailable,
    TransientError,
)
from worker.job.retries import STORE_UNAVAILABLE

__all__ = [
    "BreakerOpen",
    "BreakerScope",
    "CompactionError",
    "ConfigurationError",
    "ContextOverflow",
    "DeliveryCapExceeded",
    "InternalError",
    "JobRejected",
    "JobTimedOut",
    "LeaseHeld",
    "MessagesRejected",
    "Outcome",
    "ProviderAuthFailed",
    "ProviderBreakerOpen",
    "ProviderError",
    "ProviderRateLimited",
    "SessionFailure",
    "StaleSnapshot",
    "StoredMessageInvalid",
    "SummaryInvalid",
    "TokenizerUnavailable",
    "TransientError",
    "to_job_error",
]


class ProviderBreakerOpen(TransientError):
    """Raised when the provider breaker is open: retry later, without counting another
    provider failure (that would restart the cooldown and keep it open forever), and no
    sooner than ``retry_after_s``, when the breaker admits its trial."""

    def __init__(self, message: str, *, reason: str | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message, reason=reason)
        self.retry_after_s = retry_after_s


class ProviderError(TransientError):
    """Raised when the LLM endpoint fails: timeout, connection, 5xx, 429 after retries, or
    a 2xx reply that is no chat completion (``invalid_response``)."""

    counts_on = BreakerScope.PROVIDER


class ProviderRateLimited(ProviderError):
    """Raised when the endpoint answers 429; ``retry_after_s`` is its requested delay."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message, reason="rate_limited")
        self.retry_after_s = retry_after_s


class ProviderAuthFailed(ConfigurationError):
    """Raised when the endpoint refuses the credentials (401) or the permission (403).

    No retry can help and no session is at fault; nor is it an outage, so it counts on
    neither breaker: every job fails at once with ``auth_failed`` until an operator
    fixes the key."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="auth_failed")


class DeliveryCapExceeded(SessionFailure):
    """Raised when a job was delivered more times than allowed (its worker keeps dying)."""


class JobTimedOut(SessionFailure):
    """Raised when a job outlives ``task_soft_time_limit_s`` (reason ``time_limit``): it
    ends with its run row and event before the hard limit would kill it unrecorded."""


class StoredMessageInvalid(SessionFailure):
    """Raised when a stored message no longer parses as a chat message (reason
    ``stored_message_invalid``): a row written around ingest (a hand edit, a faulty
    migration). Nothing of the session can be summarized until it is mended, so it counts
    on the session's breaker; the message's seq is named, never its contents."""

    def __init__(self, seq: int, problems: int) -> None:
        super().__init__(f"stored message seq {seq} no longer parses as a chat message "
                         f"({problems} problem(s))", reason="stored_message_invalid")
        self.seq = seq


class InternalError(SessionFailure):
    """Raised when a job hits an unexpected error; counts on the session's breaker so a
    session that keeps crashing its job ends breaker-open instead of looping."""


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


class MessagesRejected(JobRejected):
    """Raised when intake rejects messages to append (or the session id they are for);
    ``problems`` says why."""

    def __init__(self, session_id: str, problems: tuple[Problem, ...]) -> None:
        kinds = sorted({problem.kind.value for problem in problems})
        super().__init__(f"messages for session {session_id!r} rejected: {', '.join(kinds)}",
                         reason="messages_rejected")
        self.problems = problems


def to_job_error(exc: Exception) -> CompactionError:
    """Map what a job raised to the error its outcome reports: the one place where store
    errors become outcomes (an unexpected error counts on the session's breaker)."""
    # Imported here: the tree is the command line's too, which never loads Celery.
    from celery.exceptions import SoftTimeLimitExceeded

    if isinstance(exc, CompactionError):
        return exc
    if isinstance(exc, SessionNotFound):
        return JobRejected(str(exc), reason="unknown_session")
    if isinstance(exc, RevisionConflict):
        return StaleSnapshot(str(exc), reason="active_revision_changed")
    if isinstance(exc, LeaseLost):
        return StaleSnapshot(str(exc), reason="lease_lost")
    if isinstance(exc, StoreUnavailable):
        return TransientError(f"database unavailable: {exc}", reason=STORE_UNAVAILABLE)
    if isinstance(exc, SoftTimeLimitExceeded):
        return JobTimedOut("the job outlived its soft time limit", reason="time_limit")
    # Only the class: an exception's text may quote message contents.
    return InternalError(f"unexpected {type(exc).__name__}", reason="internal_error")
