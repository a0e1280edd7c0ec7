"""When a transiently failed job is tried again: retries bounded by time, not by count
alone.

A database or provider outage of a minute must not use up a job's retries in seconds,
so each countdown doubles (with jitter, so that the jobs of one outage do not return
together) up to ``retry_backoff_max_s``, never sooner than the failure asked (a
``Retry-After``, the provider breaker's reopening), until ``retry_window_s`` after the
job's first attempt is spent; ``max_transient_retries`` stays a backstop. The retries
of a database outage wait at most one reconciler period, so that once the database is
back every job it held up runs within a period, as the reconciler's repairs do.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# The first retry waits 2 to 4 s, the next 4 to 8 s, and so on.
FIRST_BACKOFF_S = 4.0


# The reason of a failure because the database could not be reached (worker/errors.py).
STORE_UNAVAILABLE = "store_unavailable"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The plain retry values of the settings."""

    max_retries: int
    window_s: float
    backoff_max_s: float


def backoff_s(retries: int, backoff_max_s: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with equal jitter: between half and all of the step.

    The step is Celery's ``retry_backoff`` step; Celery's own jitter is full (from 0 s),
    which would let the jobs of one outage retry at once.
    """
    # Imported here: worker.errors imports this module, and the commands that only need
    # the error tree would otherwise load Celery.
    from celery.utils.time import get_exponential_backoff_interval

    step = get_exponential_backoff_interval(FIRST_BACKOFF_S, retries, backoff_max_s)
    return (rng or random).uniform(step / 2, step)


def next_retry_s(policy: RetryPolicy, *, retries: int, elapsed_s: float | None,
                 retry_after_s: float | None, rng: random.Random | None = None
                 ) -> float | None:
    """The countdown of the next attempt, or None when the job must end now.

    ``retries`` were made already; ``elapsed_s`` is the time since the first attempt
    began (None when unknown: the count alone then bounds the retries). An earliest
    time beyond ``backoff_max_s`` is cut to it (a retry held longer would outlive the
    broker's visibility timeout); the retry then waits again if it must.
    """
    if retries >= policy.max_retries:
        return None
    countdown = min(policy.backoff_max_s,
                    max(backoff_s(retries, policy.backoff_max_s, rng), retry_after_s or 0.0))
    if elapsed_s is not None and elapsed_s + countdown > policy.window_s:
        return None
    return countdown


def backoff_max_for(reason: str, backoff_max_s: float, reconcile_interval_s: float) -> float:
    """The longest backoff of a failure with ``reason``: a database outage's is cut to
    the reconciler period (0: no reconciler, no cut). Its attempts are cheap (they end at
    the lease, before any LLM call), and a 600 s wait would otherwise leave sessions
    stranded for up to 10 minutes after the database returns."""
    if reason == STORE_UNAVAILABLE and reconcile_interval_s > 0:
        return min(backoff_max_s, reconcile_interval_s)
    return backoff_max_s
