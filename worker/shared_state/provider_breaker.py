"""The provider-wide breaker: the pure transitions of ``worker/compaction/breaker.py``
over state shared by every worker in Redis (one script per transition, so concurrent
workers never lose a failure or admit two trials), or kept in memory inline. The
half-open trial holds the breaker until it reports or its longest run has passed
(``trial_s``: one LLM call's timeouts times its attempts), never just a cooldown: a
slow trial does not let a second one in.

Like the rest of the fleet state it fails open while Redis is unreachable: a breaker
read as closed wrongs no session.
"""

from __future__ import annotations

import json
import threading
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
    breaker_after_stray_failure,
    breaker_after_success,
)
from worker.shared_state.deliveries import log_redis_unavailable
from worker.shared_state.keys import RedisKeys

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# The provider breaker's transitions (worker/compaction/breaker.py: admit,
# breaker_after_stray_failure), one script each so that concurrent workers never lose a
# count or admit two trials. ARGV carry the caller's clock: now_us (string), now_iso;
# then admit's cooldown and trial time (us), or the failure threshold.
_ADMIT = """
local raw = redis.call('GET', KEYS[1])
if not raw then return 'closed' end
local b = cjson.decode(raw)
if b.state == 'closed' then return 'closed' end
local wait = tonumber(ARGV[3])
if b.state == 'half_open' then wait = math.max(wait, tonumber(ARGV[4])) end
local opened = tonumber(b.opened_at_us)
if opened ~= nil and tonumber(ARGV[1]) - opened < wait then return 'refused' end
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
  if state == 'half_open' then
    b.failures = failures + 1
    redis.call('SET', KEYS[1], cjson.encode(b))
    return b.failures
  end
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


class ProviderAdmission(StrEnum):
    CLOSED = "closed"  # admitted: the breaker is closed
    TRIAL = "trial"  # admitted as the one half-open trial
    REFUSED = "refused"


class BreakerStateStore(Protocol):
    """Where the provider breaker lives; each call is one atomic transition."""

    def load(self) -> Breaker: ...
    def admit(self, now: datetime, cooldown_s: float, trial_s: float) -> ProviderAdmission: ...
    def record_success(self) -> None: ...
    def record_failure(self, now: datetime, threshold: int) -> None: ...
    def fail_trial(self, trial_at: datetime, now: datetime, threshold: int) -> bool:
        """Reopen the breaker if the trial admitted at ``trial_at`` is still out; False
        when it is not (then the caller's failure is a stray one)."""
        ...


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

    def admit(self, now: datetime, cooldown_s: float, trial_s: float) -> ProviderAdmission:
        try:
            answer = self._admit(keys=[self._key],
                                 args=[*_stamp(now), _micros(cooldown_s), _micros(trial_s)])
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

    def fail_trial(self, trial_at: datetime, now: datetime, threshold: int) -> bool:
        try:
            failed = self._fail_trial(keys=[self._key], args=[_stamp(trial_at)[0], *_stamp(now)])
        except redis.RedisError as exc:
            log_redis_unavailable("provider_breaker", exc)
            return True  # nothing more can be recorded
        return bool(failed)


class InMemoryBreakerState:
    """Provider breaker state for one process (``compactor compact --inline``)."""

    def __init__(self) -> None:
        self._breaker = Breaker(state=BreakerState.CLOSED, failures=0, opened_at=None)
        self._lock = threading.Lock()

    def load(self) -> Breaker:
        return self._breaker

    def admit(self, now: datetime, cooldown_s: float, trial_s: float) -> ProviderAdmission:
        with self._lock:
            admission = admit(self._breaker, now, cooldown_s, trial_s=trial_s)
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
            self._breaker = breaker_after_stray_failure(self._breaker, now, threshold)

    def fail_trial(self, trial_at: datetime, now: datetime, threshold: int) -> bool:
        with self._lock:
            if not is_trial_out(self._breaker, trial_at):
                return False
            self._breaker = breaker_after_failure(self._breaker, now, threshold)
            return True


def is_trial_out(breaker: Breaker, trial_at: datetime) -> bool:
    """True while the trial admitted at ``trial_at`` is the breaker's open trial."""
    return breaker.state is BreakerState.HALF_OPEN and breaker.opened_at == trial_at


class ProviderBreaker:
    """The provider breaker's policy over its shared state (Redis, or memory inline).

    It remembers the trial it admitted, so that the trial's end, whatever it is, ends its
    hold on the breaker: a success closes it; a provider failure, or anything but a
    provider answer (an invalid summary), reopens it. ``trial_s`` is the longest a trial
    can run (one LLM call's timeouts times its attempts): a trial that has not reported
    by then is taken for lost, and the next job becomes the trial.
    """

    def __init__(
        self,
        state: BreakerStateStore,
        *,
        threshold: int,
        cooldown_s: float,
        trial_s: float,
        clock: Callable[[], datetime],
    ) -> None:
        self._state = state
        self._threshold = threshold
        self._cooldown_s = cooldown_s
        self._trial_s = trial_s
        self._clock = clock
        self._trial_at: datetime | None = None

    def admit(self) -> bool:
        now = self._clock()
        admission = self._state.admit(now, self._cooldown_s, self._trial_s)
        self._trial_at = now if admission is ProviderAdmission.TRIAL else None
        return admission is not ProviderAdmission.REFUSED

    def record_success(self) -> None:
        self._trial_at = None
        self._state.record_success()

    def record_failure(self) -> None:
        """Count a provider failure: this process's trial's (which reopens the breaker), or
        a stray one, which leaves another process's trial its hold."""
        trial_at, self._trial_at = self._trial_at, None
        now = self._clock()
        if trial_at is None or not self._state.fail_trial(trial_at, now, self._threshold):
            self._state.record_failure(now, self._threshold)

    def reopens_in_s(self) -> float | None:
        """Seconds until the open breaker admits its trial (None: not open): the earliest
        a job it refused should be retried."""
        breaker = self._state.load()
        if breaker.state is not BreakerState.OPEN or breaker.opened_at is None:
            return None
        reopens_at = breaker.opened_at + timedelta(seconds=self._cooldown_s)
        return max(0.0, (reopens_at - self._clock()).total_seconds())

    def fail_trial(self) -> None:
        """Reopen the breaker if this process's trial is still out; else do nothing."""
        trial_at, self._trial_at = self._trial_at, None
        if trial_at is not None:
            self._state.fail_trial(trial_at, self._clock(), self._threshold)


def _micros(seconds: float) -> int:
    return round(seconds * 1_000_000)


def _stamp(moment: datetime) -> tuple[str, str]:
    """A moment as the scripts take it: exact epoch microseconds (a string), ISO text."""
    return str((moment - EPOCH) // timedelta(microseconds=1)), moment.astimezone(UTC).isoformat()
