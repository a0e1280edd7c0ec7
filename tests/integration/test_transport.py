"""The transport against real Redis: an item popped from the service's queue is inspected
(a refused one is dead-lettered, never delivered), while an item on any other list, such
as the reply a `celery inspect ping` waits for, is kombu's and arrives untouched. And the
app's configuration is plain JSON, as ``celery inspect conf`` and Flower report it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from queue import Empty

import pytest
import redis

from tests.support.e2e import REDIS_URL, redis_under_prefix
from worker.broker.celery_app import celery_config, create_app
from worker.broker.transport import ITEM_POLICY_OPTION, read_item_policy
from worker.settings.config import Settings
from worker.shared_state.dead_letters import DeadLetters
from worker.shared_state.keys import RedisKeys

pytestmark = pytest.mark.integration

REPLY = {"celery@probe-host": {"ok": "pong"}}


@pytest.fixture
def settings() -> Settings:
    tag = uuid.uuid4().hex[:10]
    return Settings(redis_url=REDIS_URL, redis_key_prefix=f"test-transport-{tag}:",
                    queue_name=f"compaction-{tag}")


@pytest.fixture
def client(settings: Settings) -> Iterator[redis.Redis]:
    with redis_under_prefix(settings.redis_key_prefix) as running:
        yield running


def test_a_reply_on_another_list_arrives_untouched_and_nothing_is_dead_lettered(
    settings: Settings, client: redis.Redis,
) -> None:
    with create_app(settings).connection_for_read() as connection:
        replies = connection.SimpleQueue(f"{uuid.uuid4()}.reply.celery.pidbox")
        # As Celery's mailbox replies: a ticket and a clock, no task headers.
        replies.put(REPLY, headers={"ticket": str(uuid.uuid4()), "clock": 1})
        reply = replies.get(timeout=5)
        reply.ack()
        replies.close()

    assert reply.payload == REPLY
    assert DeadLetters(client, RedisKeys(settings.redis_key_prefix), 10).list() == []


def test_an_unreadable_item_on_the_service_queue_is_dead_lettered_not_delivered(
    settings: Settings, client: redis.Redis,
) -> None:
    with create_app(settings).connection_for_read() as connection:
        jobs = connection.SimpleQueue(settings.queue_name)
        client.lpush(f"{settings.redis_key_prefix}{settings.queue_name}", b"\x00\xffgarbage")
        with pytest.raises(Empty):
            jobs.get(timeout=2)
        jobs.close()

    [letter] = DeadLetters(client, RedisKeys(settings.redis_key_prefix), 10).list()
    assert (letter.reason, letter.queue) == ("unreadable_item", settings.queue_name)
    assert client.llen(f"{settings.redis_key_prefix}{settings.queue_name}") == 0


def test_the_apps_configuration_is_json_and_names_the_inspected_queue(
    settings: Settings,
) -> None:
    config = json.loads(json.dumps(celery_config(settings)))

    policy = read_item_policy(config["broker_transport_options"][ITEM_POLICY_OPTION])
    assert policy.queues == (settings.queue_name,)
    assert policy.key_prefix == settings.redis_key_prefix
