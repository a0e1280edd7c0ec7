"""The fleet-wide LLM rate limit on real Redis: workers with their own connections share
one spacing, a backlog past the longest wait is refused at once, and an unreachable Redis
lets the call through with a warning."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from structlog.testing import capture_logs

from tests.support.e2e import REDIS_URL, redis_under_prefix
from worker.errors import ProviderError
from worker.shared_state.keys import RedisKeys
from worker.shared_state.rate_limit import FleetRateLimiter

pytestmark = pytest.mark.integration

CALLS_PER_S = 20.0
INTERVAL_S = 1 / CALLS_PER_S


@pytest.fixture
def keys() -> Iterator[RedisKeys]:
    prefix = f"test-rate-{uuid.uuid4().hex[:10]}:"
    with redis_under_prefix(prefix):
        yield RedisKeys(prefix)


def test_workers_with_their_own_connections_share_one_spacing(keys: RedisKeys) -> None:
    workers, calls_each = 3, 4
    clients = [redis.Redis.from_url(REDIS_URL) for _ in range(workers)]
    limiters = [FleetRateLimiter(client, keys, CALLS_PER_S) for client in clients]
    asked: list[float] = []
    started: list[float] = []
    start = threading.Barrier(workers)

    def call(limiter: FleetRateLimiter) -> None:
        start.wait()
        for _ in range(calls_each):
            asked.append(time.monotonic())
            limiter.acquire()
            started.append(time.monotonic())

    threads = [threading.Thread(target=call, args=(limiter,)) for limiter in limiters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for client in clients:
        client.close()

    # Limited per worker instead, the 12 calls would span 3 intervals, not 11.
    assert len(started) == workers * calls_each
    assert max(started) - min(asked) >= (workers * calls_each - 1) * INTERVAL_S * 0.95


def test_a_backlog_past_the_longest_wait_is_refused_without_waiting(keys: RedisKeys) -> None:
    slept: list[float] = []
    with redis.Redis.from_url(REDIS_URL) as client:
        limiter = FleetRateLimiter(client, keys, 1.0, max_wait_s=1.2, sleep=slept.append)

        assert limiter.acquire() == 0.0
        assert 0.5 < limiter.acquire() <= 1.0  # the slot a second after the first
        with pytest.raises(ProviderError) as refused:
            limiter.acquire()

    assert refused.value.reason == "rate_limit_backlog"
    assert len(slept) == 1


def test_an_unreachable_redis_lets_the_call_through_with_a_warning(keys: RedisKeys) -> None:
    down = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    limiter = FleetRateLimiter(down, keys, CALLS_PER_S)

    with capture_logs() as logs:
        waited_s = limiter.acquire()

    assert waited_s == 0.0
    assert [(log["event"], log["component"]) for log in logs] == [
        ("fleet.redis_unavailable", "rate_limiter")]


def test_no_limit_set_asks_nothing_of_redis(keys: RedisKeys) -> None:
    down = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)

    with capture_logs() as logs:
        assert FleetRateLimiter(down, keys, 0).acquire() == 0.0

    assert logs == []
