"""kombu's Redis transport with every popped queue item inspected before kombu or Celery
reads it (``worker/broker/queue_items.py``): a refused item ends as a ``rejected``
``compaction.job`` event and moves to the dead-letter list; it is never delivered.

Inspecting here, before kombu's ``loads``, is what keeps any item from stopping a worker:
past this point a null body loops (Celery's ``TypeError`` reads as a lost connection),
and bad base64 or deep nesting raise where nothing catches them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from queue import Empty
from typing import Any

import redis
from celery import current_app
from kombu.transport import redis as kombu_redis

from worker.broker.queue_items import ItemLimits, ItemRejected, admit_item, item_limits
from worker.job.outcome import emit_rejected_message
from worker.logging import get_logger
from worker.settings.config import Settings
from worker.shared_state.dead_letters import DeadLetters, build_dead_letter
from worker.shared_state.keys import RedisKeys

# The transport option (``broker_transport_options``) that carries the ItemPolicy.
ITEM_POLICY_OPTION = "compactor_item_policy"


@dataclass(frozen=True)
class ItemPolicy:
    """What the transport admits, and where and how many refused items it keeps."""

    limits: ItemLimits
    key_prefix: str
    dead_letter_max_items: int


@functools.cache
def registered_task_names() -> frozenset[str]:
    """The tasks this worker's app registered, Celery's built-ins aside: the only ones its
    queue runs (the service's own; a benchmark's worker adds its no-op)."""
    return frozenset(name for name in current_app.tasks if not name.startswith("celery."))


def item_policy(settings: Settings) -> ItemPolicy:
    """What the worker's transport admits from its queue, and how many refusals it keeps."""
    return ItemPolicy(item_limits(settings), settings.redis_key_prefix,
                      settings.dead_letter_max_items)


class InspectingChannel(kombu_redis.Channel):
    """kombu's Redis channel, admitting each item it pops through ``admit_item``."""

    def _brpop_read(self, **options: Any) -> bool:
        # kombu 5.7's own, but for the delivery: the item is inspected before loads().
        try:
            try:
                dest__item = self.client.parse_response(self.client.connection, "BRPOP",
                                                        **options)
            except self.connection_errors:
                # Disconnected, the next poll reconnects (as kombu does).
                self.client.connection.disconnect()
                raise
            if not dest__item:
                raise Empty()
            dest, item = dest__item
            dest = (dest.decode() if isinstance(dest, bytes) else dest).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            envelope = self._admit(item if isinstance(item, bytes) else item.encode(), dest)
            if envelope is not None:
                self.connection._deliver(envelope, dest)
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]  # kombu's own reset, as it does
            self._flush_brpop_reauth()  # type: ignore[no-untyped-call]  # kombu's, unannotated

    def _admit(self, raw: bytes, queue: str) -> dict[str, Any] | None:
        limits = replace(self._item_policy().limits, task_names=registered_task_names())
        try:
            return admit_item(raw, limits, datetime.now(UTC))
        except ItemRejected as rejected:
            self.refuse_item(raw, queue, rejected)
            return None

    def refuse_item(self, raw: bytes, queue: str, rejected: ItemRejected) -> None:
        """Log the item's ``rejected`` event and move it to the dead-letter list."""
        emit_rejected_message(get_logger(), rejected.task_id, rejected.reason, "ItemRejected",
                              rejected.detail)
        policy = self._item_policy()
        letter = build_dead_letter(raw, queue, rejected, datetime.now(UTC))
        dead = DeadLetters(redis.Redis(connection_pool=self.pool),
                           RedisKeys(policy.key_prefix), policy.dead_letter_max_items)
        try:
            dead.add(letter)
        except redis.RedisError as exc:
            get_logger().error("broker.dead_letter_lost", entry_id=letter.entry_id,
                               failure_class=type(exc).__name__)
            return
        get_logger().warning("broker.dead_lettered", entry_id=letter.entry_id,
                             reason=letter.reason, queue=queue, task_id=letter.task_id)

    def _item_policy(self) -> ItemPolicy:
        policy: ItemPolicy = self.connection.client.transport_options[ITEM_POLICY_OPTION]
        return policy


class InspectingTransport(kombu_redis.Transport):
    """The Redis transport the app uses (``broker_transport``)."""

    Channel = InspectingChannel
