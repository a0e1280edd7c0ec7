"""`compactor dead list|show|retry|purge` against real Redis: entries newest first, one
shown whole, a valid item re-queued on its queue (and a still-broken one refused), and
purge empties the list."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from tests.support.cli import Compactor
from tests.support.e2e import REDIS_URL, redis_under_prefix
from tests.support.raw_producer import build_raw_message
from worker.broker.contract import job_kwargs, queue_list_key
from worker.broker.queue_items import ItemRejected
from worker.shared_state.dead_letters import DeadLetter, DeadLetters, build_dead_letter
from worker.shared_state.keys import RedisKeys

pytestmark = pytest.mark.integration

QUEUE = "compaction"


@pytest.fixture
def prefix() -> str:
    return f"test-dead-{uuid.uuid4().hex[:10]}:"


@pytest.fixture
def client(prefix: str) -> Iterator[redis.Redis]:
    with redis_under_prefix(prefix) as running:
        yield running


@pytest.fixture
def compactor(prefix: str, tmp_path: Path) -> Compactor:
    return Compactor({"COMPACTOR_REDIS_URL": REDIS_URL, "COMPACTOR_REDIS_KEY_PREFIX": prefix,
                      "COMPACTOR_QUEUE_NAME": QUEUE, "COMPACTOR_DATA_DIR": str(tmp_path)})


def dead_letter(client: redis.Redis, prefix: str, raw: bytes, reason: str) -> DeadLetter:
    letter = build_dead_letter(raw, QUEUE, ItemRejected(reason, f"test: {reason}"),
                               datetime.now(UTC))
    DeadLetters(client, RedisKeys(prefix), max_items=10).add(letter)
    return letter


def valid_item(task_id: str) -> bytes:
    message = build_raw_message(job_kwargs("s-1", "retried"), queue=QUEUE, task_id=task_id)
    return json.dumps(message).encode()


def test_list_shows_entries_newest_first_and_show_gives_one_whole(
    compactor: Compactor, client: redis.Redis, prefix: str,
) -> None:
    older = dead_letter(client, prefix, b"[1, 2, 3]", "not_an_envelope")
    newer = dead_letter(client, prefix, b"\x00garbage", "unreadable_item")

    listed = compactor.json("dead", "list")
    shown = compactor.json("dead", "show", older.entry_id)

    assert [e["entry_id"] for e in listed] == [newer.entry_id, older.entry_id]
    assert [e["reason"] for e in listed] == ["unreadable_item", "not_an_envelope"]
    assert "item" not in listed[0]
    assert (shown["item"], shown["queue"], shown["truncated"]) == ("[1, 2, 3]", QUEUE, False)
    assert compactor("dead", "show", "no-such-entry").exit_code == 3


def test_retry_requeues_a_valid_item_and_refuses_one_that_would_be_refused_again(
    compactor: Compactor, client: redis.Redis, prefix: str,
) -> None:
    item = valid_item("retried-job")
    valid = dead_letter(client, prefix, item, "unknown_task")
    broken = dead_letter(client, prefix, b'{"hello": "world"}', "not_an_envelope")

    retried = compactor("dead", "retry", valid.entry_id)
    refused = compactor("dead", "retry", broken.entry_id)

    assert retried.exit_code == 0, retried.output
    assert client.lrange(queue_list_key(prefix, QUEUE), 0, -1) == [item]
    assert refused.exit_code == 4 and "not_an_envelope" in refused.output
    assert [e["entry_id"] for e in compactor.json("dead", "list")] == [broken.entry_id]
    assert compactor("dead", "retry", valid.entry_id).exit_code == 3


def test_purge_empties_the_list(compactor: Compactor, client: redis.Redis,
                                prefix: str) -> None:
    for n in range(3):
        dead_letter(client, prefix, f"item {n}".encode(), "unreadable_item")

    assert compactor.json("dead", "purge") == {"purged": 3}
    assert compactor.json("dead", "list") == []


def test_the_list_keeps_only_the_newest_entries(client: redis.Redis, prefix: str) -> None:
    letters = [dead_letter(client, prefix, f"item {n}".encode(), "unreadable_item")
               for n in range(15)]

    kept = DeadLetters(client, RedisKeys(prefix), max_items=10).list()

    assert [e.entry_id for e in kept] == [e.entry_id for e in reversed(letters)][:10]
