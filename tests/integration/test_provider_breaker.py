"""The provider breaker on real Redis: its scripts agree with the pure transitions of
``worker/compaction/breaker.py`` (kept in memory by ``InMemoryBreakerState``) over a grid of
states and clocks, concurrent failures are all counted, concurrent admissions of a
half-open breaker let exactly one trial through, a failed trial reopens it, and a trial
slower than the cooldown still has no second trial beside it, in Redis or in memory."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import redis

from tests.support.e2e import REDIS_URL, redis_under_prefix
from worker.compaction import Breaker, BreakerState
from worker.runtime import utc_now
from worker.shared_state.keys import RedisKeys
from worker.shared_state.provider_breaker import (
    BreakerStateStore,
    InMemoryBreakerState,
    ProviderAdmission,
    ProviderBreaker,
    ProviderBreakerStore,
)

pytestmark = pytest.mark.integration

COOLDOWN_S = 60
TRIAL_S = 195  # the default settings' one LLM call: (5 + 60) s x 3 attempts
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
        assert state.admit(START + timedelta(seconds=COOLDOWN_S), COOLDOWN_S, TRIAL_S) \
            is ProviderAdmission.TRIAL


GRID = [(failures, half_open, offset_s) for failures in (0, 1, THRESHOLD, THRESHOLD + 2)
        for half_open in (False, True) for offset_s in (0, COOLDOWN_S - 1, COOLDOWN_S,
                                                       2 * COOLDOWN_S + 1,
                                                       COOLDOWN_S + TRIAL_S - 1,
                                                       COOLDOWN_S + TRIAL_S)
        if not half_open or failures >= THRESHOLD]


@pytest.mark.parametrize(("failures", "half_open", "offset_s"), GRID)
def test_the_redis_scripts_agree_with_the_pure_transitions(
    client: redis.Redis, keys: RedisKeys, failures: int, half_open: bool, offset_s: int,
) -> None:
    shared, local = ProviderBreakerStore(client, keys), InMemoryBreakerState()
    for state in (shared, local):
        reach(state, failures, half_open)
    now = START + timedelta(seconds=offset_s)

    assert shared.admit(now, COOLDOWN_S, TRIAL_S) is local.admit(now, COOLDOWN_S, TRIAL_S)
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
        return ProviderBreakerStore(client, keys).admit(later, COOLDOWN_S, TRIAL_S)

    with ThreadPoolExecutor(max_workers=32) as pool:
        admissions = Counter(pool.map(admit, range(200)))

    assert admissions == {ProviderAdmission.TRIAL: 1, ProviderAdmission.REFUSED: 199}


def test_a_failed_trial_reopens_the_breaker_and_a_stale_one_changes_nothing(
    client: redis.Redis, keys: RedisKeys,
) -> None:
    clock = [START]
    state = ProviderBreakerStore(client, keys)
    breaker = ProviderBreaker(state, threshold=THRESHOLD, cooldown_s=COOLDOWN_S,
                              trial_s=TRIAL_S, clock=lambda: clock[0])
    reach(state, THRESHOLD, half_open=False)
    clock[0] = START + timedelta(seconds=COOLDOWN_S)
    assert breaker.admit()
    clock[0] += timedelta(seconds=5)

    breaker.fail_trial()

    assert state.load() == Breaker(BreakerState.OPEN, THRESHOLD + 1, clock[0])
    breaker.fail_trial()  # no trial out any more
    assert state.load() == Breaker(BreakerState.OPEN, THRESHOLD + 1, clock[0])
    assert not breaker.admit()


# The storm: a breaker that every trial fails, admitted by many threads at once. Each
# trial's call takes TRIAL_RUN_S, longer than the cooldown; the trial's hold is the
# longest a call may take (at least TRIAL_RUN_S), as production passes one LLM call's.
STORM_COOLDOWN_S = 0.2
TRIAL_RUN_S = 0.7
STORM_TRIAL_S = 2.0  # the hold outlasts a trial by far, however slow a loaded machine runs it
STORM_S = 4.0
STRAY_EVERY_S = 0.3  # above the cooldown: a stray failure while open restarts it
ADMITTERS = 200


@dataclass
class Storm:
    """What the admitters saw: the most trials in flight at once, trials, admissions."""

    peak_in_flight: int = 0
    trials: int = 0
    admissions: int = 0
    in_flight: int = 0


def run_storm(state: BreakerStateStore) -> Storm:
    """ADMITTERS threads ask for admission until STORM_S has passed; an admitted job holds
    its trial for TRIAL_RUN_S and fails it. A stray job (admitted before the breaker
    opened) fails every STRAY_EVERY_S meanwhile, as the slow calls of an outage do."""
    storm, lock = Storm(), threading.Lock()
    deadline = time.monotonic() + STORM_S
    for _ in range(THRESHOLD):
        state.record_failure(utc_now(), THRESHOLD)

    def breaker() -> ProviderBreaker:
        return ProviderBreaker(state, threshold=THRESHOLD, cooldown_s=STORM_COOLDOWN_S,
                               trial_s=STORM_TRIAL_S, clock=utc_now)

    def admitter() -> None:
        mine = breaker()
        while time.monotonic() < deadline:
            admitted = mine.admit()
            with lock:
                storm.admissions += 1
                if admitted:
                    storm.trials += 1
                    storm.in_flight += 1
                    storm.peak_in_flight = max(storm.peak_in_flight, storm.in_flight)
            if not admitted:
                time.sleep(0.005)
                continue
            time.sleep(TRIAL_RUN_S)
            with lock:
                storm.in_flight -= 1
            mine.record_failure()

    def stray() -> None:
        mine = breaker()
        while time.monotonic() < deadline:
            time.sleep(STRAY_EVERY_S)
            mine.record_failure()

    threads = [threading.Thread(target=admitter) for _ in range(ADMITTERS)]
    threads.append(threading.Thread(target=stray))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return storm


@pytest.mark.parametrize("where", ["redis", "memory"])
def test_a_trial_slower_than_the_cooldown_never_has_a_second_trial_beside_it(
    keys: RedisKeys, where: str,
) -> None:
    # A connection per admitter: an exhausted pool would fail open and admit everyone.
    wide = redis.Redis.from_url(REDIS_URL, max_connections=2 * ADMITTERS)
    state = ProviderBreakerStore(wide, keys) if where == "redis" else InMemoryBreakerState()

    storm = run_storm(state)
    wide.close()

    assert storm.peak_in_flight == 1, storm
    assert storm.trials >= 3, storm  # three cooldowns and more passed: three trials
    assert storm.admissions >= 10 * ADMITTERS, storm


def test_a_trial_that_never_reports_is_replaced_once_its_longest_run_has_passed(
    client: redis.Redis, keys: RedisKeys,
) -> None:
    clock = [START]
    state = ProviderBreakerStore(client, keys)
    lost, other = (ProviderBreaker(state, threshold=THRESHOLD, cooldown_s=COOLDOWN_S,
                                   trial_s=TRIAL_S, clock=lambda: clock[0]) for _ in range(2))
    reach(state, THRESHOLD, half_open=False)
    clock[0] = START + timedelta(seconds=COOLDOWN_S)
    assert lost.admit()  # and its worker dies

    clock[0] += timedelta(seconds=TRIAL_S - 1)
    assert not other.admit()
    clock[0] += timedelta(seconds=1)
    assert other.admit()
    assert state.load() == Breaker(BreakerState.HALF_OPEN, THRESHOLD, clock[0])
