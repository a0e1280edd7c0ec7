"""The fleet-wide LLM rate limit, kept in Redis: the calls of every worker spaced at least
``1 / calls_per_s`` apart, each caller sleeping until the slot it reserved.

Celery's ``rate_limit`` is per worker, and no library reserves slots: ``limits``' Redis
windows admit whole-second bursts by each host's clock and answer only yes or no.
While Redis is unreachable (a restart) the limiter fails open, loudly: an unspaced call
wrongs no session, whereas an error would end the job without its outcome event.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from worker.errors import ProviderError
from worker.shared_state.deliveries import log_redis_unavailable
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
