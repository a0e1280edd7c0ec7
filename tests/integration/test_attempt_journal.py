"""The attempt journal's entry is removed once its event is out without the job waiting
for Redis's answer: the removal is sent, and its answer read when the process's next
attempt opens; a removal that never reached Redis is sent again then."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import redis

from tests.support.e2e import REDIS_URL
from worker.shared_state.attempt_journal import AttemptJournal
from worker.shared_state.keys import RedisKeys

pytestmark = pytest.mark.integration

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=5)
    yield client
    client.close()


@pytest.fixture
def prefix() -> str:
    return f"test-journal-{uuid.uuid4().hex[:8]}:"


@pytest.fixture
def journal(client: redis.Redis, prefix: str) -> Iterator[AttemptJournal]:
    # Its connections carry the prefix as their name: a test kills only those.
    yield AttemptJournal(redis.Redis.from_url(REDIS_URL, socket_timeout=5, client_name=prefix),
                         RedisKeys(prefix))
    keys = list(client.scan_iter(match=f"{prefix}*"))
    if keys:
        client.delete(*keys)


def test_an_unanswered_close_has_removed_the_entry_when_the_next_attempt_opens(
    journal: AttemptJournal,
) -> None:
    first = journal.open("task-1", "s-1", 1, NOW)
    journal.close_unanswered(first.entry)

    second = journal.open("task-2", "s-2", 1, NOW)

    assert not journal.is_open(first.entry)
    assert journal.is_open(second.entry)


def test_a_removal_lost_with_its_connection_is_sent_again_before_the_next_attempt(
    journal: AttemptJournal, client: redis.Redis, prefix: str,
) -> None:
    first = journal.open("task-1", "s-1", 1, NOW)
    # Redis holds writes while paused: the removal waits in its connection, and dies
    # with it, unanswered and never carried out.
    client.client_pause(5_000, all=False)
    try:
        journal.close_unanswered(first.entry)
        kill_connections_named(client, prefix)
    finally:
        client.client_unpause()
    assert journal.is_open(first.entry)

    journal.open("task-2", "s-2", 1, NOW)

    assert not journal.is_open(first.entry)


def kill_connections_named(client: redis.Redis, name: str) -> None:
    for connection in client.client_list():
        if connection["name"] == name:
            client.client_kill_filter(_id=connection["id"])
