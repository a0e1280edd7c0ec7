"""Retries bounded by time: a short outage does not use them up, the window ends them,
a Retry-After or the provider breaker's reopening is the earliest retry."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from worker.job.retries import (
    STORE_UNAVAILABLE,
    RetryPolicy,
    backoff_max_for,
    backoff_s,
    next_retry_s,
)
from worker.settings.config import Settings
from worker.shared_state.provider_breaker import InMemoryBreakerState, ProviderBreaker

DEFAULTS = Settings()
POLICY = RetryPolicy(DEFAULTS.max_transient_retries, DEFAULTS.retry_window_s,
                     DEFAULTS.retry_backoff_max_s)


def retry_times(policy: RetryPolicy, seed: int, *, job_s: float = 1.0) -> list[float]:
    """When each attempt after the first begins, for a job that always fails."""
    rng, elapsed, retries = random.Random(seed), 0.0, 0
    times: list[float] = []
    while True:
        elapsed += job_s
        countdown = next_retry_s(policy, retries=retries, elapsed_s=elapsed,
                                 retry_after_s=None, rng=rng)
        if countdown is None:
            return times
        elapsed += countdown
        retries += 1
        times.append(elapsed)


def test_a_45_second_outage_leaves_retries_that_land_after_it() -> None:
    for seed in range(200):
        times = retry_times(POLICY, seed)
        assert any(t > 45 for t in times)
        assert sum(t <= 45 for t in times) <= 4


def first_retry_after(times: list[float], outage_s: float) -> float:
    return min(t for t in times if t > outage_s) - outage_s


def test_after_a_10_minute_database_outage_each_job_retries_within_a_reconciler_period(
) -> None:
    period = DEFAULTS.reconcile_interval_s
    store_policy = RetryPolicy(DEFAULTS.max_transient_retries, DEFAULTS.retry_window_s,
                               backoff_max_for(STORE_UNAVAILABLE, DEFAULTS.retry_backoff_max_s,
                                               period))
    waits = [first_retry_after(retry_times(store_policy, seed), 600) for seed in range(200)]
    assert max(waits) <= period
    # Uncut, the 600 s backoff leaves jobs waiting up to 10 minutes after the outage.
    uncut = [first_retry_after(retry_times(POLICY, seed), 600) for seed in range(200)]
    assert max(uncut) > period


def test_only_a_database_outage_cuts_the_backoff_and_only_with_a_reconciler() -> None:
    assert backoff_max_for(STORE_UNAVAILABLE, 600, 300) == 300
    assert backoff_max_for(STORE_UNAVAILABLE, 120, 300) == 120
    assert backoff_max_for(STORE_UNAVAILABLE, 600, 0) == 600
    assert backoff_max_for("server_error", 600, 300) == 600


def test_retries_spread_over_the_window_and_end_with_it() -> None:
    for seed in range(50):
        times = retry_times(POLICY, seed)
        assert times[-1] <= POLICY.window_s
        assert times[-1] > POLICY.window_s - 2 * POLICY.backoff_max_s - 2 * len(times)


def test_the_count_is_a_backstop_and_bounds_alone_when_the_time_is_unknown() -> None:
    policy = RetryPolicy(max_retries=3, window_s=10**9, backoff_max_s=600)
    assert next_retry_s(policy, retries=2, elapsed_s=None, retry_after_s=None) is not None
    assert next_retry_s(policy, retries=3, elapsed_s=None, retry_after_s=None) is None
    assert next_retry_s(policy, retries=3, elapsed_s=1.0, retry_after_s=None) is None


def test_backoff_doubles_with_equal_jitter_up_to_its_cap() -> None:
    rng = random.Random(7)
    for retries, (low, high) in enumerate([(2, 4), (4, 8), (8, 16), (16, 32)]):
        assert all(low <= backoff_s(retries, 600, rng) <= high for _ in range(100))
    assert all(300 <= backoff_s(20, 600, rng) <= 600 for _ in range(100))


def test_the_earliest_retry_is_respected_but_capped_at_the_longest_backoff() -> None:
    assert next_retry_s(POLICY, retries=0, elapsed_s=0, retry_after_s=50) == 50
    assert next_retry_s(POLICY, retries=0, elapsed_s=0, retry_after_s=5_000) == 600
    # A wait that would end beyond the window ends the job now instead.
    assert next_retry_s(POLICY, retries=0, elapsed_s=3_590, retry_after_s=50) is None


def test_a_job_the_open_provider_breaker_refused_retries_when_it_reopens() -> None:
    now = [datetime(2025, 6, 1, tzinfo=UTC)]
    breaker = ProviderBreaker(InMemoryBreakerState(), threshold=1, cooldown_s=60, trial_s=60,
                              clock=lambda: now[0])
    assert breaker.reopens_in_s() is None
    breaker.record_failure()
    now[0] += timedelta(seconds=15)
    assert breaker.reopens_in_s() == 45
    assert not breaker.admit()
    now[0] += timedelta(seconds=50)
    assert breaker.reopens_in_s() == 0
