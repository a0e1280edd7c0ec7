"""The provider breaker on real Redis: its scripts agree with the pure transitions of
``worker/compaction/breaker.py`` (kept in memory by ``InMemoryBreakerState``) over a grid of
states and clocks, concurrent failures are all counted, concurrent admissions of a
half-open breaker let exactly one trial through, and a failed trial reopens it."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
import redis

from tests.support.e2e import redis_under_prefix
from worker.compaction import Breaker, BreakerState
from worker.shared_state.keys import RedisKeys
from worker.shared_state.provider_breaker import (
    InMemoryBreakerState,
    ProviderAdmission,
    ProviderBreaker,
    ProviderBreakerStore,
)

pytestmark = pytest.mark.integration

COOLDOWN_S = 60
THRESHOLD = 3
START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def keys() -> Iterator[RedisKeys]:
    prefix = f"test-breaker-{uuid.uuid4().hex[:10]}:"
    with redis_under_prefix(prefix):
        yield RedisKeys(prefix)


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    with redis_under_prefix(f"unused-{uuid.uuid4().hex}:") as running:
        yield running


def reach(state: ProviderBreakerStore | InMemoryBreakerState, failures: int,
          half_open: bool) -> None:
    """Put a breaker in a state the way jobs do: failures, then maybe a trial."""
    for _ in range(failures):
        state.record_failure(START, THRESHOLD)
    if half_open:
        assert state.admit(START + timedelta(seconds=COOLDOWN_S), COOLDOWN_S) \
            is ProviderAdmission.TRIAL


GRID = [(failures, half_open, offset_s) for failures in (0, 1, THRESHOLD, THRESHOLD + 2)
        for half_open in (False, True) for offset_s in (0, COOLDOWN_S - 1, COOLDOWN_S,
                                                       2 * COOLDOWN_S + 1)
        if not half_open or failures >= THRESHOLD]


@pytest.mark.parametrize(("failures", "half_open", "offset_s"), GRID)
def test_the_redis_scripts_agree_with_the_pure_transitions(
    client: redis.Redis, keys: RedisKeys, failures: int, half_open: bool, offset_s: int,
) -> None:
    shared, local = ProviderBreakerStore(client, keys), InMemoryBreakerState()
    for state in (shared, local):
        reach(state, failures, half_open)
    now = START + timedelta(seconds=offset_s)

    assert shared.admit(now, COOLDOWN_S) is local.admit(now, COOLDOWN_S)
    assert shared.load() == local.load()
    for state in (shared, local):
        state.record_failure(now, THRESHOLD)
    assert shared.load() == local.load()


def test_hundreds_of_concurrent_failures_are_all_counted(client: redis.Redis,
                                                         keys: RedisKeys) -> None:
    def fail(_: int) -> None:
        ProviderBreakerStore(client, keys).record_failure(START, threshold=1_000)

    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(fail, range(400)))

    assert ProviderBreakerStore(client, keys).load() == Breaker(BreakerState.CLOSED, 400)


def test_of_concurrent_admissions_to_a_half_open_breaker_exactly_one_is_the_trial(
    client: redis.Redis, keys: RedisKeys,
) -> None:
    reach(ProviderBreakerStore(client, keys), THRESHOLD, half_open=False)
    later = START + timedelta(seconds=COOLDOWN_S)

    def admit(_: int) -> ProviderAdmission:
        return ProviderBreakerStore(client, keys).admit(later, COOLDOWN_S)

    with ThreadPoolExecutor(max_workers=32) as pool:
        admissions = Counter(pool.map(admit, range(200)))

    assert admissions == {ProviderAdmission.TRIAL: 1, ProviderAdmission.REFUSED: 199}


def test_a_failed_trial_reopens_the_breaker_and_a_stale_one_changes_nothing(
    client: redis.Redis, keys: RedisKeys,
) -> None:
    clock = [START]
    state = ProviderBreakerStore(client, keys)
    breaker = ProviderBreaker(state, threshold=THRESHOLD, cooldown_s=COOLDOWN_S,
                              clock=lambda: clock[0])
    reach(state, THRESHOLD, half_open=False)
    clock[0] = START + timedelta(seconds=COOLDOWN_S)
    assert breaker.admit()
    clock[0] += timedelta(seconds=5)

    breaker.fail_trial()

    assert state.load() == Breaker(BreakerState.OPEN, THRESHOLD + 1, clock[0])
    breaker.fail_trial()  # no trial out any more
    assert state.load() == Breaker(BreakerState.OPEN, THRESHOLD + 1, clock[0])
    assert not breaker.admit()
