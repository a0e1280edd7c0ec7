"""The fleet-state gauges of the metrics endpoint: sessions' breakers (one grouped count in
the database), the provider breaker and the queue depth (one Redis round trip). Read by
the worker's main process when scraped, at most once per ``STATE_TTL_S``, so frequent
scrapes cost nothing more; a source that cannot be read leaves its gauges out."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import redis
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from db import Store, StoreError
from worker.logging import get_logger
from worker.settings.config import Settings
from worker.shared_state.connection import connect_redis
from worker.shared_state.keys import RedisKeys

STATE_TTL_S = 5.0
BREAKER_STATES = ("closed", "open", "half_open")
# kombu's Redis transport keeps a queue's messages in one list per priority step.
KOMBU_PRIORITY_SEP = "\x06\x16"
KOMBU_PRIORITY_STEPS = (0, 3, 6, 9)


@dataclass(frozen=True)
class FleetState:
    """What the gauges report; ``None`` where the source could not be read."""

    session_breakers: dict[str, int] | None
    provider_breaker: str | None
    queue_depth: int | None
    parked_jobs: dict[str, int] | None = None  # per state (batch mode)
    open_batches: int | None = None


class FleetStateCollector(Collector):
    """Yields the fleet-state gauges from a reading at most ``ttl_s`` old."""

    def __init__(self, read_state: Callable[[], FleetState], queue: str,
                 ttl_s: float = STATE_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read_state, self._queue, self._ttl_s, self._clock = read_state, queue, ttl_s, clock
        self._lock = threading.Lock()
        self._cached: tuple[float, FleetState] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = self._state()
        if state.session_breakers is not None:
            sessions = GaugeMetricFamily("compactor_session_breakers", "Sessions whose "
                                         "breaker is open or half-open.", labels=["state"])
            for name in BREAKER_STATES[1:]:
                sessions.add_metric([name], state.session_breakers.get(name, 0))
            yield sessions
        if state.provider_breaker is not None:
            provider = GaugeMetricFamily("compactor_provider_breaker", "The provider "
                                         "breaker's state (1 for the current one).",
                                         labels=["state"])
            for name in BREAKER_STATES:
                provider.add_metric([name], float(name == state.provider_breaker))
            yield provider
        if state.queue_depth is not None:
            depth = GaugeMetricFamily("compactor_queue_depth", "Job messages waiting in "
                                      "the queue.", labels=["queue"])
            depth.add_metric([self._queue], state.queue_depth)
            yield depth

        if state.parked_jobs is not None:
            parked = GaugeMetricFamily("compactor_parked_jobs", "Jobs parked on the Batch "
                                       "API, by state (open: not sent yet).", labels=["state"])
            for name, count in state.parked_jobs.items():
                parked.add_metric([name], count)
            yield parked
        if state.open_batches is not None:
            yield GaugeMetricFamily("compactor_open_batches", "Batch API batches parked "
                                    "jobs wait on.", value=state.open_batches)

    def _state(self) -> FleetState:
        with self._lock:  # concurrent scrapes share one reading
            now = self._clock()
            if self._cached is None or now - self._cached[0] >= self._ttl_s:
                self._cached = (now, self._read_state())
            return self._cached[1]


class FleetStateReader:
    """Reads the fleet state; the store opens on the first scrape, in the serving process."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._store: Store | None = None
        self._redis = connect_redis(settings, timeout_s=2)
        self._keys = RedisKeys(settings.redis_key_prefix)

    def __call__(self) -> FleetState:
        provider, depth = self._read_redis()
        breakers, parked, batches = self._read_database()
        return FleetState(breakers, provider, depth, parked, batches)

    def _read_database(self) -> tuple[dict[str, int] | None, dict[str, int] | None,
                                      int | None]:
        """Sessions per breaker state, parked jobs per state and their open batches."""
        try:
            if self._store is None:
                self._store = Store.from_url(self._settings.effective_database_url)
            parked, batches = self._store.count_parked_jobs()
            return self._store.count_breakers(), parked, batches
        except StoreError as exc:
            get_logger().warning("metrics.state_unreadable", source="database",
                                 error_class=type(exc).__name__)
            return None, None, None

    def _read_redis(self) -> tuple[str | None, int | None]:
        queue = f"{self._settings.redis_key_prefix}{self._settings.queue_name}"
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(self._keys.provider_breaker())
        for step in KOMBU_PRIORITY_STEPS:
            pipe.llen(f"{queue}{KOMBU_PRIORITY_SEP}{step}" if step else queue)
        try:
            breaker, *lengths = pipe.execute()
        except redis.RedisError as exc:
            get_logger().warning("metrics.state_unreadable", source="redis",
                                 error_class=type(exc).__name__)
            return None, None
        return _breaker_state(breaker), sum(int(n) for n in lengths)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
        self._redis.close()


def _breaker_state(raw: Any) -> str:
    """The provider breaker's state; no key means it never opened."""
    return str(json.loads(raw)["state"]) if raw else "closed"
