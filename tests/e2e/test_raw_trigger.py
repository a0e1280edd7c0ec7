"""The raw trigger contract (docs/TRIGGER.md): a message pushed with plain redis-py, no
Celery client, is consumed by a real worker process and compacts its session; garbage is
rejected with a ``compaction.job`` event and the worker keeps serving."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from db import Store, upgrade_database
from scheduler.enqueue import CeleryPublisher, QueuedJob
from scheduler.publisher import RedisPublisher
from tests.support.databases import create_postgres_database, drop_postgres_database, open_store
from tests.support.raw_producer import (
    EMBED,
    build_raw_message,
    push_raw_message,
    read_queue,
)
from tests.support.raw_producer import TASK_NAME as RAW_TASK_NAME
from tests.support.scheduling import Broker, isolated_broker
from tests.support.worker_process import WorkerProcess
from worker.broker.contract import (
    MAX_REASON_CHARS,
    MAX_SESSION_ID_CHARS,
    TASK_NAME,
    JobKwargs,
    job_kwargs,
    queue_list_key,
)
from worker.compaction.messages import parse_message
from worker.compaction.tokens import TokenCounter
from worker.platform.ingest import count_messages
from worker.tokenizer.offline import load_encoding

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SESSION_ID = "raw-trigger-session"
# trigger = 0.7 x 3,000 = 2,100 tokens; the session below holds about 4,000.
CONTEXT_TOKENS = 3_000
TAIL_TOKENS = 300


@pytest.fixture
def postgres_url() -> Iterator[str]:
    url = create_postgres_database()
    try:
        upgrade_database(url)
        yield url
    finally:
        drop_postgres_database(url)


@pytest.fixture
def broker(postgres_url: str) -> Iterator[Broker]:
    with isolated_broker(postgres_url) as broker:
        yield broker


def agent_turn(turn: int) -> list[dict[str, Any]]:
    """One user request, the agent's tool call and its result, and the agent's reply."""
    path, call_id = f"config/app-{turn}.yaml", f"call_{turn}"
    arguments = json.dumps({"path": path, "retry_limit": turn + 3})
    return [
        {"role": "user", "content": f"Step {turn}: raise the retry limit in {path} and "
         "explain the change in detail. " * 3},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": "edit_file", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": f"wrote {path}: ok"},
        {"role": "assistant", "content": f"Updated {path}; the retry limit is now "
         f"{turn + 3} and the timeout {turn * 10} s. " * 3},
    ]


@pytest.fixture
def store(postgres_url: str) -> Iterator[Store]:
    with open_store(postgres_url) as store:
        yield store


def import_long_session(store: Store) -> None:
    messages = [{"role": "system", "content": "You are a careful release engineer."}]
    for turn in range(20):
        messages.extend(agent_turn(turn))
    counter = TokenCounter(load_encoding("o200k_base", None))
    rows = count_messages([parse_message(m) for m in messages], counter)
    store.import_session(SESSION_ID, {}, rows, datetime.now(UTC) - timedelta(days=1))


def wait_for_job_event(worker: WorkerProcess, task_id: str,
                       timeout_s: float = 60.0) -> dict[str, dict[str, Any]]:
    """Wait for ``task_id``'s outcome event; return every job event by task id."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = {e["task_id"]: e for e in worker.events("compaction.job") if "task_id" in e}
        if task_id in events:
            return events
        time.sleep(0.2)
    raise TimeoutError(f"no compaction.job event for {task_id}:\n{worker.log_text()[-4000:]}")


def test_the_raw_envelope_has_every_field_celery_itself_sends(broker: Broker) -> None:
    kwargs = job_kwargs("s-1", "ops", force=True)
    CeleryPublisher(broker.app, broker.queue).publish([QueuedJob("job-celery", kwargs)])
    push_raw_message(broker.client, broker.prefix, broker.queue,
                     build_raw_message(kwargs, queue=broker.queue, task_id="job-raw"))

    celery_sent, raw = read_queue(broker.client, broker.prefix, broker.queue)

    assert broker.client.llen(queue_list_key(broker.prefix, broker.queue)) == 2
    assert RAW_TASK_NAME == TASK_NAME == celery_sent.task_name == raw.task_name
    for part in ("headers", "properties"):
        assert set(raw.envelope[part]) == set(celery_sent.envelope[part])
    for key in ("content-type", "content-encoding"):
        assert raw.envelope[key] == celery_sent.envelope[key]
    assert raw.envelope["properties"]["delivery_info"] == \
        celery_sent.envelope["properties"]["delivery_info"]
    decoded = json.loads(base64.b64decode(celery_sent.envelope["body"]))
    assert decoded == [[], kwargs, EMBED]
    assert (raw.args, raw.kwargs) == (celery_sent.args, celery_sent.kwargs)


@pytest.mark.parametrize("kwargs", [
    job_kwargs("s-1", "ops", force=True),
    job_kwargs("sess-\u00e9t\u00e9 \"quoted\" 'both'", "dirty"),
    job_kwargs("x" * MAX_SESSION_ID_CHARS, "r" * MAX_REASON_CHARS),
])
def test_the_pipelined_publisher_stores_the_very_bytes_send_task_stores(
    broker: Broker, kwargs: JobKwargs
) -> None:
    key = queue_list_key(broker.prefix, broker.queue)
    CeleryPublisher(broker.app, broker.queue).publish([QueuedJob("job-1", kwargs)])
    [celery_bytes] = broker.client.lrange(key, 0, -1)
    broker.client.delete(key)
    celery_sent = json.loads(celery_bytes)
    publisher = RedisPublisher(broker.client, broker.prefix, broker.queue,
                               origin=celery_sent["headers"]["origin"],
                               reply_to=celery_sent["properties"]["reply_to"])

    publisher.publish([QueuedJob("job-1", kwargs), QueuedJob("job-2", kwargs)])

    first, second = broker.client.lrange(key, 0, -1)[::-1]  # LPUSH: the oldest is last
    # Only the delivery tag is fresh per message, in Celery's message as in ours.
    our_tag = json.loads(first)["properties"]["delivery_tag"]
    assert our_tag != celery_sent["properties"]["delivery_tag"]
    assert first.replace(our_tag.encode(),
                         celery_sent["properties"]["delivery_tag"].encode()) == celery_bytes
    assert json.loads(second)["headers"]["id"] == "job-2"


def test_a_raw_message_is_compacted_by_a_real_worker_and_garbage_is_rejected(
    postgres_url: str, store: Store, broker: Broker, tmp_path: Path
) -> None:
    import_long_session(store)
    assert store.get_session(SESSION_ID).projection_tokens > CONTEXT_TOKENS
    env = {"COMPACTOR_DATABASE_URL": postgres_url,
           "COMPACTOR_REDIS_KEY_PREFIX": broker.prefix,
           "COMPACTOR_QUEUE_NAME": broker.queue,
           "COMPACTOR_SUMMARIZER": "extractive",
           "COMPACTOR_MODEL_CONTEXT_TOKENS": str(CONTEXT_TOKENS),
           "COMPACTOR_TAIL_BUDGET_TOKENS": str(TAIL_TOKENS)}
    garbage = build_raw_message(None, queue=broker.queue, task_id="garbage-body",
                                body=b"this is not JSON {")
    wrong = build_raw_message({"session": SESSION_ID, "force": "yes"}, queue=broker.queue,
                              task_id="wrong-kwargs")
    valid = build_raw_message(job_kwargs(SESSION_ID, "raw-trigger"), queue=broker.queue,
                              task_id="raw-job")
    with WorkerProcess(env, tmp_path / "worker.log", queue=broker.queue) as worker:
        # One worker child, prefetch 1: the messages are handled in the order pushed.
        for message in (garbage, wrong, valid):
            push_raw_message(broker.client, broker.prefix, broker.queue, message)
        events = wait_for_job_event(worker, "raw-job")
        assert worker.process is not None and worker.process.poll() is None

    assert events["raw-job"]["outcome"] == "compacted", events["raw-job"]
    [revision] = store.revisions(SESSION_ID)
    session = store.get_session(SESSION_ID)
    assert session.active_revision_id == revision.id
    assert session.projection_tokens < CONTEXT_TOKENS
    assert events["wrong-kwargs"]["outcome"] == "rejected"
    assert events["wrong-kwargs"]["reason"] == "malformed_message"
    assert events.get("garbage-body", {}).get("outcome") == "rejected", \
        "an undecodable body must end in a rejected compaction.job event"
