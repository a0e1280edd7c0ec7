"""The fleet's delivery counts, kept in Redis: the count behind the redelivery cap and
each task's first-attempt time (the retry window).

Celery no longer caps the redeliveries of a task whose worker died, and a worker sees only
its own deliveries; Redis holds the view across workers. While Redis is unreachable (a
restart) each fails open, loudly: an uncounted delivery wrongs no session, whereas an
error there would end the job without its outcome event or blame the session.
"""

from __future__ import annotations

import redis

from worker.logging import get_logger
from worker.shared_state.keys import RedisKeys


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

def log_redis_unavailable(component: str, exc: redis.RedisError) -> None:
    """The ``fleet.redis_unavailable`` warning of a shared-state call let through."""
    get_logger().warning("fleet.redis_unavailable", component=component,
                         failure_class=type(exc).__name__)
