"""State shared by every worker of the fleet, kept in Redis: the delivery counter behind
the redelivery cap and the fleet-wide LLM rate limit (the provider-wide breaker has its
own module, ``worker/shared_state/provider_breaker.py``).

Celery's own ``rate_limit`` is per worker, and Celery no longer caps the redeliveries of
a task whose worker died; both need a view across workers, which only Redis has here.
While Redis is unreachable (a restart) each of them fails open, loudly: an uncounted
delivery or an unspaced call wrongs no session, whereas an
error there would end the job without its outcome event or blame the session.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from worker.errors import ProviderError
from worker.logging import get_logger
from worker.shared_state.keys import RedisKeys

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
    """Counts deliveries of each task attempt, and of each task, across workers and
    worker deaths (``AttemptJournal.open`` counts them)."""

    def __init__(self, client: redis.Redis, keys: RedisKeys, ttl_s: int) -> None:
        self._client = client
        self._keys = keys
        self._ttl_s = ttl_s

    @property
    def ttl_s(self) -> int:
        return self._ttl_s

    def keys_of(self, task_id: str, retries: int) -> tuple[str, str]:
        """The counters one delivery increments: its attempt's deliveries (the redelivery
        cap) and the task's deliveries (the delivery's attempt number)."""
        return self._keys.deliveries(task_id, retries), self._keys.attempts(task_id)

    def first_attempt_at(self, task_id: str, began: float, *, ttl_s: int) -> float | None:
        """When the task's first attempt began (epoch seconds): ``began`` unless an
        earlier attempt recorded its own. None when Redis is unreachable."""
        key = self._keys.first_attempt(task_id)
        try:
            with self._client.pipeline() as pipe:
                pipe.set(key, repr(began), nx=True, ex=max(1, ttl_s))
                pipe.get(key)
                _, stored = pipe.execute()
        except redis.RedisError as exc:
            log_redis_unavailable("retry_window", exc)
            return None
        return float(stored) if stored is not None else began


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


def log_redis_unavailable(component: str, exc: redis.RedisError) -> None:
    get_logger().warning("fleet.redis_unavailable", component=component,
                         failure_class=type(exc).__name__)
