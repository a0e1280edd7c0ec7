"""The circuit breaker as pure transitions (the caller stores the state and passes ``now``).

One machine serves the per-session breaker and the provider-wide one; only the
threshold and cooldown differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class Breaker:
    """Consecutive ``failures``; ``opened_at`` is when it last opened or half-opened.

    Half-opening restamps ``opened_at``: the trial holds the breaker from then until it
    reports or its longest run has passed (``admit``'s ``trial_s``), so a trial whose
    worker died is not waited on forever: the next job then becomes the trial.
    """

    state: BreakerState = BreakerState.CLOSED
    failures: int = 0
    opened_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Admission:
    allowed: bool
    breaker: Breaker


def breaker_after_failure(breaker: Breaker, now: datetime, threshold: int) -> Breaker:
    """Count a failure: open at ``threshold``; a failed trial (half-open) reopens at once.

    A failure reported while already open (a job admitted before another opened it)
    restarts the cooldown.
    """
    if threshold < 1:
        raise ValueError(f"threshold must be at least 1, got {threshold}")
    failures = breaker.failures + 1
    if breaker.state is not BreakerState.CLOSED or failures >= threshold:
        return Breaker(BreakerState.OPEN, failures, now)
    return Breaker(BreakerState.CLOSED, failures, None)


def breaker_after_success(breaker: Breaker) -> Breaker:
    """Close the breaker and forget past failures, whatever its state."""
    return Breaker()


def breaker_after_stray_failure(breaker: Breaker, now: datetime, threshold: int) -> Breaker:
    """Count the failure of a job that is not the half-open trial (one admitted before
    the breaker opened): it proves nothing the trial will not, so the trial keeps the
    breaker; in any other state as ``breaker_after_failure``."""
    if breaker.state is BreakerState.HALF_OPEN:
        return Breaker(BreakerState.HALF_OPEN, breaker.failures + 1, breaker.opened_at)
    return breaker_after_failure(breaker, now, threshold)


def admit(breaker: Breaker, now: datetime, cooldown_s: float, *,
          trial_s: float = 0.0) -> Admission:
    """Decide whether a job may run; after the cooldown, one trial runs half-open.

    While a trial is out, others are refused until it reports (a success closes the
    breaker, a failure reopens it) or the longer of a cooldown and ``trial_s`` (the
    longest the trial can run) has passed since it was admitted: one trial at a time.
    """
    if breaker.state is BreakerState.CLOSED:
        return Admission(True, breaker)
    wait_s = cooldown_s if breaker.state is BreakerState.OPEN else max(cooldown_s, trial_s)
    if breaker.opened_at is None or now - breaker.opened_at >= timedelta(seconds=wait_s):
        # No stamp means no known opening time: take the trial rather than wedge.
        return Admission(True, Breaker(BreakerState.HALF_OPEN, breaker.failures, now))
    return Admission(False, breaker)
