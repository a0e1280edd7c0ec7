"""The dead-letter list: queue items the worker refused, kept in Redis for an operator
(``compactor dead list|show|retry|purge``), newest first and bounded.

Each entry keeps the raw item (its first ``MAX_KEPT_ITEM_BYTES``), the reason, the queue
it came from and the time; an item kept whole can be re-queued once it would be admitted.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime

import redis

from worker.broker.contract import queue_list_key
from worker.broker.queue_items import ItemLimits, ItemRejected, admit_item
from worker.shared_state.keys import RedisKeys

MAX_KEPT_ITEM_BYTES = 65_536


@dataclass(frozen=True)
class DeadLetter:
    """One refused queue item; ``item`` is its text (undecodable bytes replaced), cut at
    ``MAX_KEPT_ITEM_BYTES`` when ``truncated``."""

    entry_id: str
    at: str  # ISO 8601, UTC
    queue: str
    reason: str
    detail: str
    task_id: str | None
    item_bytes: int
    item: str
    truncated: bool


class RetryRefused(Exception):
    """Raised when a dead letter cannot go back on its queue (cut short, or still refused)."""


def build_dead_letter(raw: bytes, queue: str, rejected: ItemRejected,
                      now: datetime) -> DeadLetter:
    """The entry of one refused item, its kept text capped."""
    kept = raw[:MAX_KEPT_ITEM_BYTES]
    return DeadLetter(entry_id=uuid.uuid4().hex[:12], at=now.isoformat(), queue=queue,
                      reason=rejected.reason, detail=rejected.detail,
                      task_id=rejected.task_id, item_bytes=len(raw),
                      item=kept.decode("utf-8", errors="replace"),
                      truncated=len(raw) > MAX_KEPT_ITEM_BYTES)


class DeadLetters:
    """The deployment's dead-letter list (one Redis list, newest at the head)."""

    def __init__(self, client: redis.Redis, keys: RedisKeys, max_items: int) -> None:
        self._client = client
        self._keys = keys
        self._key = keys.dead_letters()
        self._max_items = max_items

    def add(self, letter: DeadLetter) -> None:
        """Keep ``letter``; the oldest entries past ``max_items`` are dropped."""
        with self._client.pipeline() as pipe:
            pipe.lpush(self._key, json.dumps(asdict(letter)))
            pipe.ltrim(self._key, 0, self._max_items - 1)
            pipe.execute()

    def list(self, limit: int | None = None) -> list[DeadLetter]:
        """The entries, newest first (at most ``limit``)."""
        stop = -1 if limit is None else limit - 1
        return [DeadLetter(**json.loads(raw)) for raw in self._client.lrange(self._key, 0, stop)]

    def get(self, entry_id: str) -> DeadLetter | None:
        return next((e for e in self.list() if e.entry_id == entry_id), None)

    def retry(self, entry_id: str, limits: ItemLimits, now: datetime) -> DeadLetter | None:
        """Put an entry's item back on its queue and drop the entry, in one transaction;
        None when there is no such entry.

        Raises:
            RetryRefused: the item was kept cut short, or would be refused again.
        """
        letter = self.get(entry_id)
        if letter is None:
            return None
        if letter.truncated:
            raise RetryRefused(f"only the first {MAX_KEPT_ITEM_BYTES} of {letter.item_bytes} "
                               "bytes were kept")
        try:
            admit_item(letter.item.encode(), limits, now)
        except ItemRejected as exc:
            raise RetryRefused(f"it would be refused again: {exc.reason} ({exc.detail})") from exc
        with self._client.pipeline() as pipe:
            pipe.lrem(self._key, 1, json.dumps(asdict(letter)))
            pipe.lpush(queue_list_key(self._keys.prefix, letter.queue), letter.item)
            pipe.execute()
        return letter

    def purge(self) -> int:
        """Drop every entry; return how many there were."""
        with self._client.pipeline() as pipe:
            pipe.llen(self._key)
            pipe.delete(self._key)
            count, _ = pipe.execute()
        return int(count)
