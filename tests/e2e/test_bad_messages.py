"""Oversized, malformed and forged queue items pushed raw into a real worker's queue, as
a broken or hostile producer would: each ends in one ``rejected`` ``compaction.job``
event (those the transport refuses also on the dead-letter list), the worker process
never dies or loops, a valid job afterwards completes, and nothing is written for them
but run records."""

from __future__ import annotations

import base64
import json
import pickle
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from db import Store
from tests.e2e.conftest import StartWorker
from tests.support.e2e import JobEnv, import_records, projection_violations
from tests.support.generated import generated_session
from tests.support.raw_producer import EMBED, build_raw_message, push_raw_message
from tests.support.worker_process import WorkerProcess
from worker.shared_state.dead_letters import MAX_KEPT_ITEM_BYTES, DeadLetters
from worker.shared_state.keys import RedisKeys

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SESSION_ID = "bad-messages-session"
TURNS = 40  # about 4,900 tokens: over the 4,200-token trigger of tests/support/e2e.py
MEGABYTE = 1_000_000
HUGE_ID = "i" * 200_000  # under the item limit, far over the id's
DROP = object()  # a header to delete
EVENT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class BadMessage:
    """One raw item for the queue list, and the reason of the rejected event it must end
    in (for task id ``key``, by default ``name``; "None" when it has no readable id)."""

    name: str
    raw: bytes
    reason: str
    key: str = ""


def envelope(name: str, kwargs: Any, queue: str, **changes: Any) -> dict[str, Any]:
    message = build_raw_message(kwargs, queue=queue, task_id=name)
    for key, value in changes.items():
        message[key] = value
    return message


def encoded(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode()


def body_of(args: Any, kwargs: Any) -> str:
    return base64.b64encode(json.dumps([args, kwargs, EMBED]).encode()).decode()


def valid_kwargs(**changes: Any) -> dict[str, Any]:
    return {"session_id": SESSION_ID, "reason": "bad-messages", "force": True, **changes}


def bad_messages(queue: str) -> list[BadMessage]:
    """Every kind of broken message, in the order they are pushed."""
    def rejected(name: str, kwargs: Any, reason: str, key: str = "",
                 **changes: Any) -> BadMessage:
        return BadMessage(name, encoded(envelope(name, kwargs, queue, **changes)), reason, key)

    def with_headers(name: str, reason: str, key: str = "", **headers: Any) -> BadMessage:
        message = envelope(name, valid_kwargs(), queue)
        message["headers"].update(headers)
        for header in [h for h, value in headers.items() if value is DROP]:
            del message["headers"][header]
        return BadMessage(name, encoded(message), reason, key=key)

    def with_properties(name: str, reason: str, **properties: Any) -> BadMessage:
        message = envelope(name, valid_kwargs(), queue)
        message["properties"].update(properties)
        for key in [k for k, value in properties.items() if value is DROP]:
            del message["properties"][key]
        return BadMessage(name, encoded(message), reason)

    deep = "[" * 100_000 + "]" * 100_000
    pickled = base64.b64encode(pickle.dumps(((), valid_kwargs(), EMBED))).decode()
    return [
        # Refused by the transport before kombu or Celery reads them: dead-lettered.
        rejected("null-body", None, "bad_body", body=None),
        rejected("number-body", None, "bad_body", body=12),
        rejected("bad-base64", None, "bad_base64", body="!!! not base64 !!!"),
        rejected("body-a-string", None, "bad_body",
                 body=base64.b64encode(b'"compact everything"').decode()),
        rejected("body-not-json", None, "undecodable_message",
                 body=base64.b64encode(b"this is not JSON {").decode()),
        rejected("deep-body", None, "nested_too_deep",
                 body=base64.b64encode(deep.encode()).decode()),
        BadMessage("deep-item", deep.encode(), "nested_too_deep", key="None"),
        rejected("huge-session-id", valid_kwargs(session_id="s" * 20 * MEGABYTE),
                 "oversized_item", key="None"),
        rejected("huge-extra-kwarg", valid_kwargs(blob="x" * 20 * MEGABYTE), "oversized_item",
                 key="None"),
        rejected("headers-a-string", valid_kwargs(), "invalid_headers", key="None",
                 headers="compactor.compact_session"),
        rejected("headers-a-list", valid_kwargs(), "invalid_headers", key="None", headers=[]),
        rejected("pickle-content", None, "undecodable_message", body=pickled,
                 **{"content-type": "application/x-python-serialize",
                    "content-encoding": "binary"}),
        with_headers("retries-a-string", "invalid_headers", retries="0"),
        with_properties("no-delivery-tag", "invalid_properties", delivery_tag=DROP),
        with_properties("delivery-info-a-string", "invalid_properties", delivery_info="q"),
        with_headers("forged-accumulate", "unknown_task", task="celery.accumulate"),
        with_headers("unknown-task", "unknown_task", task="compactor.not_a_task"),
        with_headers("no-task-header", "unknown_task", task=DROP),
        with_headers("no-id-header", "invalid_headers", key="None", id=DROP),
        with_headers("huge-id", "oversized_header", key="None", id=HUGE_ID),
        with_headers("five-megabyte-id", "oversized_item", key="None", id="m" * 5 * MEGABYTE),
        with_headers("huge-origin", "oversized_header", origin="o" * 100_000),
        BadMessage("json-not-an-envelope", b'{"hello": "world"}', "not_an_envelope", key="None"),
        BadMessage("json-list", b"[1, 2, 3]", "not_an_envelope", key="None"),
        BadMessage("not-json-at-all", b"\x00\xffgarbage", "unreadable_item", key="None"),
        # Delivered, and rejected by the task with a run record.
        rejected("wrong-kwarg-types", {"session_id": 7, "reason": ["x"], "force": "yes"},
                 "malformed_message"),
        rejected("extra-kwargs", valid_kwargs(priority=9), "malformed_message"),
        rejected("control-character-id", valid_kwargs(session_id="abc\x1b[2J"),
                 "malformed_message"),
        rejected("args-not-kwargs", {}, "malformed_message",
                 body=body_of([SESSION_ID, "bad-messages", True], {})),
    ]


def wait_until(condition: Callable[[], bool], what: str,
               timeout_s: float = EVENT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not seen in {timeout_s}s")
        time.sleep(0.1)


def job_events(worker: WorkerProcess) -> dict[str, dict[str, Any]]:
    return {str(e.get("task_id")): e for e in worker.events("compaction.job")}


def rejections(worker: WorkerProcess) -> Counter[tuple[str, str]]:
    return Counter((str(e.get("task_id")), str(e["reason"]))
                   for e in worker.events("compaction.job") if e["outcome"] == "rejected")


def test_no_queue_item_stops_the_worker_and_refused_items_are_dead_lettered(
    pg_store: Store, job_env: JobEnv, redis_client: redis.Redis, start_worker: StartWorker,
) -> None:
    import_records(pg_store, [generated_session(SESSION_ID, TURNS)])
    history = pg_store.messages(SESSION_ID)
    worker = start_worker()  # one pool child, prefetch 1: messages are taken in push order
    messages = bad_messages(job_env.queue)
    valid_id = f"valid-{uuid.uuid4().hex[:8]}"

    for message in messages:
        redis_client.lpush(f"{job_env.prefix}{job_env.queue}", message.raw)
    push_raw_message(redis_client, job_env.prefix, job_env.queue,
                     build_raw_message(valid_kwargs(), queue=job_env.queue, task_id=valid_id))
    wait_until(lambda: valid_id in job_events(worker), "the valid job's outcome event")

    assert worker.process is not None and worker.process.poll() is None, "the worker died"
    assert job_events(worker)[valid_id]["outcome"] == "compacted"
    expected = Counter((m.key or m.name, m.reason) for m in messages)
    assert rejections(worker) == expected
    assert all(e["will_retry"] is False and e["failure_message"]
               for e in worker.events("compaction.job") if e["outcome"] == "rejected")
    assert redis_client.llen(f"{job_env.prefix}{job_env.queue}") == 0, "an item came back"
    assert_dead_lettered(redis_client, job_env, messages)
    assert "i" * 1_000 not in worker.log_text() and "m" * 1_000 not in worker.log_text()
    assert not [key for key in redis_client.scan_iter(match=f"{job_env.prefix}*")
                if len(key) > 1_000]
    assert_nothing_written_but_run_records(pg_store, history, valid_id)


def assert_dead_lettered(client: redis.Redis, job_env: JobEnv,
                         messages: list[BadMessage]) -> None:
    """Every item the transport refused is on the dead-letter list, capped; the ones the
    task rejected (with a run record) are not."""
    letters = DeadLetters(client, RedisKeys(job_env.prefix), max_items=100).list()
    refused = [m for m in messages if m.reason != "malformed_message"]
    assert sorted(e.reason for e in letters) == sorted(m.reason for m in refused)
    assert {e.queue for e in letters} == {job_env.queue}
    assert all(len(e.item.encode()) <= MAX_KEPT_ITEM_BYTES for e in letters)
    kept_whole = {e.item.encode() for e in letters if not e.truncated}
    assert {m.raw for m in refused if len(m.raw) <= MAX_KEPT_ITEM_BYTES
            and m.name != "not-json-at-all"} <= kept_whole


def assert_nothing_written_but_run_records(store: Store, history: list[Any],
                                           valid_id: str) -> None:
    assert [s.session_id for s in store.list_sessions()] == [SESSION_ID]
    assert store.messages(SESSION_ID) == history
    [revision] = store.revisions(SESSION_ID)
    runs = store.runs(limit=1_000)
    assert {r.outcome for r in runs if r.task_id != valid_id} <= {"rejected"}
    assert [r.revision_id for r in runs if r.revision_id is not None] == [revision.id]
    assert projection_violations(store, SESSION_ID) == []
