"""State shared by every worker of the fleet, kept in Redis: the delivery counter behind
the redelivery cap, the fleet-wide LLM rate limit, and the provider-wide breaker.

Celery's own ``rate_limit`` is per worker, and Celery no longer caps the redeliveries of
a task whose worker died; both need a view across workers, which only Redis has here.
While Redis is unreachable (a restart) each of them fails open, loudly: an uncounted
delivery, an unspaced call or a breaker read as closed wrongs no session, whereas an
error there would end the job without its outcome event or blame the session.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import redis

from worker.compaction import (
    Breaker,
    BreakerState,
    admit,
    breaker_after_failure,
    breaker_after_success,
)
from worker.errors import ProviderError
from worker.keys import RedisKeys
from worker.logging import get_logger

# Reserve the next free slot on a fleet-wide schedule spaced `interval_us` apart, using
# Redis' clock so that workers on different hosts agree; returns how long to wait (us).
_RESERVE_SLOT = """
local now = redis.call('TIME')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
local next_us = tonumber(redis.call('GET', KEYS[1]) or '0')
local start_us = math.max(next_us, now_us)
local interval_us = tonumber(ARGV[1])
redis.call('SET', KEYS[1], tostring(start_us + interval_us), 'PX', tonumber(ARGV[2]))
return start_us - now_us
"""


class DeliveryCounter:
    """Counts deliveries of each task attempt, across workers and worker deaths."""

    def __init__(self, client: redis.Redis, keys: RedisKeys, ttl_s: int) -> None:
        self._client = client
        self._keys = keys
        self._ttl_s = ttl_s

    def record_delivery(self, task_id: str, retries: int) -> int:
        """Count this delivery and return how many there have been (1 on the first; 0
        when Redis is unreachable and it could not be counted)."""
        key = self._keys.deliveries(task_id, retries)
        try:
            with self._client.pipeline() as pipe:
                pipe.incr(key)
                pipe.expire(key, self._ttl_s)
                count, _ = pipe.execute()
        except redis.RedisError as exc:
            log_redis_unavailable("delivery_counter", exc)
            return 0
        return int(count)


class FleetRateLimiter:
    """Spaces LLM calls of the whole fleet at most ``calls_per_s`` apart (0: no limit)."""

    def __init__(
        self,
        client: redis.Redis,
        keys: RedisKeys,
        calls_per_s: float,
        *,
        max_wait_s: float = 300.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._client = client
        self._key = keys.rate_window(0)
        self._calls_per_s = calls_per_s
        self._max_wait_s = max_wait_s
        self._sleep = sleep
        self._reserve = client.register_script(_RESERVE_SLOT)

    def acquire(self) -> float:
        """Wait for this worker's turn; return the seconds waited."""
        if self._calls_per_s <= 0:
            return 0.0
        interval_us = int(1_000_000 / self._calls_per_s)
        ttl_ms = int(self._max_wait_s * 1000) + interval_us // 1000 + 1000
        try:
            wait_s = int(self._reserve(keys=[self._key], args=[interval_us, ttl_ms])) / 1e6
        except redis.RedisError as exc:
            log_redis_unavailable("rate_limiter", exc)
            return 0.0
        if wait_s > self._max_wait_s:
            raise ProviderError(
                f"fleet LLM rate limit backlog is {wait_s:.0f}s", reason="rate_limit_backlog"
            )
        if wait_s > 0:
            self._sleep(wait_s)
        return wait_s


class ProviderBreakerStore:
    """The provider-wide breaker, shared by every worker through one Redis key."""

    def __init__(self, client: redis.Redis, keys: RedisKeys) -> None:
        self._client = client
        self._key = keys.provider_breaker()

    def load(self) -> Breaker:
        try:
            raw = self._client.get(self._key)
        except redis.RedisError as exc:
            log_redis_unavailable("provider_breaker", exc)
            raw = None  # read as closed
        if raw is None:
            return Breaker(state=BreakerState.CLOSED, failures=0, opened_at=None)
        data: dict[str, Any] = json.loads(raw)
        opened_at = data.get("opened_at")
        return Breaker(
            state=BreakerState(data["state"]),
            failures=int(data["failures"]),
            opened_at=datetime.fromisoformat(opened_at) if opened_at else None,
        )

    def save(self, breaker: Breaker) -> None:
        opened_at = breaker.opened_at.astimezone(UTC).isoformat() if breaker.opened_at else None
        payload = {"state": breaker.state.value, "failures": breaker.failures,
                   "opened_at": opened_at}
        try:
            self._client.set(self._key, json.dumps(payload))
        except redis.RedisError as exc:
            log_redis_unavailable("provider_breaker", exc)


class ProviderBreaker:
    """The provider breaker's policy over its shared state (Redis, or memory inline)."""

    def __init__(
        self,
        state: ProviderBreakerStore | InMemoryBreakerState,
        *,
        threshold: int,
        cooldown_s: int,
        clock: Callable[[], datetime],
    ) -> None:
        self._state = state
        self._threshold = threshold
        self._cooldown_s = cooldown_s
        self._clock = clock

    def admit(self) -> bool:
        breaker = self._state.load()
        admission = admit(breaker, self._clock(), self._cooldown_s)
        if admission.breaker != breaker:
            self._state.save(admission.breaker)
        return admission.allowed

    def record_success(self) -> None:
        breaker = self._state.load()
        if breaker.state is not BreakerState.CLOSED or breaker.failures:
            self._state.save(breaker_after_success(breaker))

    def record_failure(self) -> None:
        breaker = self._state.load()
        self._state.save(breaker_after_failure(breaker, self._clock(), self._threshold))


class InMemoryBreakerState:
    """Provider breaker state for one process (``compactor compact --inline``)."""

    def __init__(self) -> None:
        self._breaker = Breaker(state=BreakerState.CLOSED, failures=0, opened_at=None)

    def load(self) -> Breaker:
        return self._breaker

    def save(self, breaker: Breaker) -> None:
        self._breaker = breaker


def log_redis_unavailable(component: str, exc: redis.RedisError) -> None:
    get_logger().warning("fleet.redis_unavailable", component=component,
                         failure_class=type(exc).__name__)
