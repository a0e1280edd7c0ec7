"""kombu's Redis transport with every item popped from the service's own queues inspected
before kombu or Celery reads it (``worker/broker/queue_items.py``): a refused item ends as
a ``rejected`` ``compaction.job`` event and moves to the dead-letter list; it is never
delivered. Celery's own lists (the replies of ``celery inspect``, Flower's and the probes'
pings) pass untouched.

The hook is redis-py's response callback for ``BRPOP`` on the channel's client
(``Redis.set_response_callback``, public API): it sees the popped item before kombu's
``loads``. Any later hook (a consumer step, a task strategy) is too late: bytes that are
not JSON, bad base64 or deep nesting raise inside kombu, in the worker's event loop, where
nothing catches them and the worker stops; and a null body loops (Celery's ``TypeError``
reads as a lost connection).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

import redis
from celery import current_app
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis

from worker.broker.queue_items import ItemLimits, ItemRejected, admit_item_bytes
from worker.job.outcome import emit_rejected_message
from worker.logging import get_logger
from worker.settings.config import Settings
from worker.shared_state.dead_letters import DeadLetters, build_dead_letter
from worker.shared_state.keys import RedisKeys

# The transport option (``broker_transport_options``) that carries the ItemPolicy's values.
ITEM_POLICY_OPTION = "compactor_item_policy"


@dataclass(frozen=True)
class ItemPolicy:
    """Which queues the transport inspects, what it admits from them, and where and how
    many refused items it keeps."""

    queues: tuple[str, ...]
    max_item_bytes: int
    max_eta_s: int
    key_prefix: str
    dead_letter_max_items: int

    @property
    def limits(self) -> ItemLimits:
        return ItemLimits(self.max_item_bytes, self.max_eta_s)


@functools.cache
def registered_task_names() -> frozenset[str]:
    """The tasks this worker's app registered, Celery's built-ins aside: the only ones its
    queue runs (the service's own; a benchmark's worker adds its no-op)."""
    return frozenset(name for name in current_app.tasks if not name.startswith("celery."))


def item_policy_option(settings: Settings) -> dict[str, Any]:
    """The worker's ``ITEM_POLICY_OPTION``, as JSON values: Celery reports its
    configuration as JSON (``celery inspect conf``, Flower's Config tab)."""
    policy = asdict(ItemPolicy(
        queues=(settings.queue_name,), max_item_bytes=settings.max_queue_item_bytes,
        max_eta_s=settings.retry_backoff_max_s, key_prefix=settings.redis_key_prefix,
        dead_letter_max_items=settings.dead_letter_max_items))
    return {**policy, "queues": list(policy["queues"])}


def read_item_policy(option: dict[str, Any]) -> ItemPolicy:
    """The ItemPolicy an ``item_policy_option`` holds."""
    return ItemPolicy(**{**option, "queues": tuple(option["queues"])})


class InspectingChannel(kombu_redis.Channel):
    """kombu's Redis channel, admitting each item popped from the service's queues through
    ``admit_item_bytes``. Mixed first into kombu's ``SentinelChannel`` as well: its ``BRPOP``
    runs on the same client, on the master Sentinel names."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]  # kombu: unannotated
        self._policy = read_item_policy(self.connection.client.transport_options[
            ITEM_POLICY_OPTION])
        self.client.set_response_callback("BRPOP", self._admit_popped)

    def _admit_popped(self, response: list[bytes] | None, **_: Any) -> tuple[bytes, bytes] | None:
        """Answer kombu's ``BRPOP`` with the admitted item, or with nothing (kombu then
        reads an empty poll) when the item was refused."""
        if not response:
            return None
        key, item = response
        queue = self._service_queue(key)
        if queue is None:
            return key, item
        admitted = self._admit(item, queue)
        return None if admitted is None else (key, admitted)

    def _service_queue(self, key: bytes) -> str | None:
        """The service queue ``key`` (a list of one of its priorities) belongs to, if any."""
        name = key.decode(errors="replace").removeprefix(self._policy.key_prefix)
        queue = name.rsplit(self.sep, 1)[0]
        return queue if queue in self._policy.queues else None

    @functools.cached_property
    def _limits(self) -> ItemLimits:
        """The policy's limits with the tasks the app registered (read at the first item,
        once Celery has imported every task module)."""
        return replace(self._policy.limits, task_names=registered_task_names())

    def _admit(self, raw: bytes, queue: str) -> bytes | None:
        try:
            return admit_item_bytes(raw, self._limits, datetime.now(UTC))
        except ItemRejected as rejected:
            self.refuse_item(raw, queue, rejected)
            return None

    def refuse_item(self, raw: bytes, queue: str, rejected: ItemRejected) -> None:
        """Log the item's ``rejected`` event and move it to the dead-letter list."""
        emit_rejected_message(get_logger(), rejected.task_id, rejected.reason, "ItemRejected",
                              rejected.detail)
        letter = build_dead_letter(raw, queue, rejected, datetime.now(UTC))
        dead = DeadLetters(redis.Redis(connection_pool=self.pool),
                           RedisKeys(self._policy.key_prefix),
                           self._policy.dead_letter_max_items)
        try:
            dead.add(letter)
        except redis.RedisError as exc:
            get_logger().error("broker.dead_letter_lost", entry_id=letter.entry_id,
                               failure_class=type(exc).__name__)
            return
        get_logger().warning("broker.dead_lettered", entry_id=letter.entry_id,
                             reason=letter.reason, queue=queue, task_id=letter.task_id)


class InspectingTransport(kombu_redis.Transport):
    """The Redis transport the app uses (``broker_transport``)."""

    Channel = InspectingChannel


class InspectingSentinelChannel(InspectingChannel, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel (its pool follows the master the sentinels name), admitting
    items as ``InspectingChannel`` does."""


class InspectingSentinelTransport(kombu_redis.SentinelTransport):
    """The transport the app uses with ``sentinel://`` URLs (``broker_transport``)."""

    Channel = InspectingSentinelChannel


# On a lost connection kombu moves to the next URL of the list (``Connection.switch``) and
# takes that URL's scheme as the transport, dropping ``broker_transport``: the scheme must
# name the inspecting one, or the worker reads its queue uninspected after a failover.
TRANSPORT_ALIASES["sentinel"] = f"{__name__}:{InspectingSentinelTransport.__name__}"
