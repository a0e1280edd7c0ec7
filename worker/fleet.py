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
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

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

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

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


# The provider breaker's transitions (worker/compaction/breaker.py: admit,
# breaker_after_failure), one script each so that concurrent workers never lose a count
# or admit two trials. ARGV carry the caller's clock: now_us (string), now_iso.
_ADMIT = """
local raw = redis.call('GET', KEYS[1])
if not raw then return 'closed' end
local b = cjson.decode(raw)
if b.state == 'closed' then return 'closed' end
local opened = tonumber(b.opened_at_us)
if opened ~= nil and tonumber(ARGV[1]) - opened < tonumber(ARGV[3]) then return 'refused' end
b.state = 'half_open'
b.opened_at = ARGV[2]
b.opened_at_us = ARGV[1]
redis.call('SET', KEYS[1], cjson.encode(b))
return 'trial'
"""
_RECORD_FAILURE = """
local raw = redis.call('GET', KEYS[1])
local state, failures = 'closed', 0
if raw then
  local b = cjson.decode(raw)
  state, failures = b.state, tonumber(b.failures) or 0
end
failures = failures + 1
local b = {state = 'closed', failures = failures, opened_at = cjson.null, opened_at_us = cjson.null}
if state ~= 'closed' or failures >= tonumber(ARGV[3]) then
  b.state, b.opened_at, b.opened_at_us = 'open', ARGV[2], ARGV[1]
end
redis.call('SET', KEYS[1], cjson.encode(b))
return failures
"""
# ARGV: the trial's stamp (us), now_us, now_iso: reopen only if that trial is still out.
_FAIL_TRIAL = """
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local b = cjson.decode(raw)
if b.state ~= 'half_open' or b.opened_at_us ~= ARGV[1] then return 0 end
b.state, b.failures = 'open', (tonumber(b.failures) or 0) + 1
b.opened_at, b.opened_at_us = ARGV[3], ARGV[2]
redis.call('SET', KEYS[1], cjson.encode(b))
return 1
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


class ProviderAdmission(StrEnum):
    CLOSED = "closed"  # admitted: the breaker is closed
    TRIAL = "trial"  # admitted as the one half-open trial
    REFUSED = "refused"


class BreakerStateStore(Protocol):
    """Where the provider breaker lives; each call is one atomic transition."""

    def load(self) -> Breaker: ...
    def admit(self, now: datetime, cooldown_s: int) -> ProviderAdmission: ...
    def record_success(self) -> None: ...
    def record_failure(self, now: datetime, threshold: int) -> None: ...
    def fail_trial(self, trial_at: datetime, now: datetime, threshold: int) -> None: ...


class ProviderBreakerStore:
    """The provider-wide breaker, shared by every worker through one Redis key: JSON
    ``{"state", "failures", "opened_at"}`` plus ``opened_at_us`` (epoch microseconds, a
    string) for the scripts, which run each transition of ``worker/compaction/breaker.py``
    atomically (``tests/integration/test_provider_breaker.py`` holds the two to agreement).
    """

    def __init__(self, client: redis.Redis, keys: RedisKeys) -> None:
        self._client = client
        self._key = keys.provider_breaker()
        self._admit = client.register_script(_ADMIT)
        self._fail = client.register_script(_RECORD_FAILURE)
        self._fail_trial = client.register_script(_FAIL_TRIAL)

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

    def admit(self, now: datetime, cooldown_s: int) -> ProviderAdmission:
        try:
            answer = self._admit(keys=[self._key], args=[*_stamp(now), cooldown_s * 1_000_000])
        except redis.RedisError as exc:
            log_redis_unavailable("provider_breaker", exc)
            return ProviderAdmission.CLOSED
        return ProviderAdmission(answer.decode() if isinstance(answer, bytes) else answer)

    def record_success(self) -> None:
        try:
            self._client.delete(self._key)
        except redis.RedisError as exc:
            log_redis_unavailable("provider_breaker", exc)

    def record_failure(self, now: datetime, threshold: int) -> None:
        try:
            self._fail(keys=[self._key], args=[*_stamp(now), threshold])
        except redis.RedisError as exc:
            log_redis_unavailable("provider_breaker", exc)

    def fail_trial(self, trial_at: datetime, now: datetime, threshold: int) -> None:
        try:
            self._fail_trial(keys=[self._key], args=[_stamp(trial_at)[0], *_stamp(now)])
        except redis.RedisError as exc:
            log_redis_unavailable("provider_breaker", exc)


class InMemoryBreakerState:
    """Provider breaker state for one process (``compactor compact --inline``)."""

    def __init__(self) -> None:
        self._breaker = Breaker(state=BreakerState.CLOSED, failures=0, opened_at=None)
        self._lock = threading.Lock()

    def load(self) -> Breaker:
        return self._breaker

    def admit(self, now: datetime, cooldown_s: int) -> ProviderAdmission:
        with self._lock:
            admission = admit(self._breaker, now, cooldown_s)
            trial = admission.breaker != self._breaker
            self._breaker = admission.breaker
        if not admission.allowed:
            return ProviderAdmission.REFUSED
        return ProviderAdmission.TRIAL if trial else ProviderAdmission.CLOSED

    def record_success(self) -> None:
        with self._lock:
            self._breaker = breaker_after_success(self._breaker)

    def record_failure(self, now: datetime, threshold: int) -> None:
        with self._lock:
            self._breaker = breaker_after_failure(self._breaker, now, threshold)

    def fail_trial(self, trial_at: datetime, now: datetime, threshold: int) -> None:
        with self._lock:
            if is_trial_out(self._breaker, trial_at):
                self._breaker = breaker_after_failure(self._breaker, now, threshold)


def is_trial_out(breaker: Breaker, trial_at: datetime) -> bool:
    """True while the trial admitted at ``trial_at`` is the breaker's open trial."""
    return breaker.state is BreakerState.HALF_OPEN and breaker.opened_at == trial_at


class ProviderBreaker:
    """The provider breaker's policy over its shared state (Redis, or memory inline).

    It remembers the trial it admitted, so that a job whose trial ended in anything but
    a provider answer or failure (an invalid summary) closes that trial as failed.
    """

    def __init__(
        self,
        state: BreakerStateStore,
        *,
        threshold: int,
        cooldown_s: int,
        clock: Callable[[], datetime],
    ) -> None:
        self._state = state
        self._threshold = threshold
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._trial_at: datetime | None = None

    def admit(self) -> bool:
        now = self._clock()
        admission = self._state.admit(now, self._cooldown_s)
        self._trial_at = now if admission is ProviderAdmission.TRIAL else None
        return admission is not ProviderAdmission.REFUSED

    def record_success(self) -> None:
        self._trial_at = None
        self._state.record_success()

    def record_failure(self) -> None:
        self._trial_at = None
        self._state.record_failure(self._clock(), self._threshold)

    def fail_trial(self) -> None:
        """Reopen the breaker if this process's trial is still out; else do nothing."""
        trial_at, self._trial_at = self._trial_at, None
        if trial_at is not None:
            self._state.fail_trial(trial_at, self._clock(), self._threshold)


def _stamp(moment: datetime) -> tuple[str, str]:
    """A moment as the scripts take it: exact epoch microseconds (a string), ISO text."""
    return str((moment - EPOCH) // timedelta(microseconds=1)), moment.astimezone(UTC).isoformat()


def log_redis_unavailable(component: str, exc: redis.RedisError) -> None:
    get_logger().warning("fleet.redis_unavailable", component=component,
                         failure_class=type(exc).__name__)
