"""Oversized and malformed queue messages pushed raw into a real worker's queue, as a
broken producer would: each ends in a clear outcome (a ``rejected`` ``compaction.job``
event where Celery hands the message over; Celery's own log line where Celery itself
drops it), the worker process never dies, a valid job afterwards completes, and nothing
is written for them but run records."""

from __future__ import annotations

import base64
import json
import pickle
import time
import uuid
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

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SESSION_ID = "bad-messages-session"
TURNS = 40  # about 4,900 tokens: over the 4,200-token trigger of tests/support/e2e.py
MEGABYTE = 1_000_000
EVENT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class BadMessage:
    """One raw item for the queue list, and what must come of it: a rejected event with
    ``reason`` (for task id ``key``, by default ``name``), or (None) a worker log line
    containing ``logged``."""

    name: str
    raw: bytes
    reason: str | None
    logged: str = ""
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
    def rejected(name: str, kwargs: Any, reason: str, **changes: Any) -> BadMessage:
        return BadMessage(name, encoded(envelope(name, kwargs, queue, **changes)), reason)

    unknown = envelope("unknown-task", valid_kwargs(), queue)
    unknown["headers"]["task"] = "compactor.not_a_task"
    no_task = envelope("no-task-header", valid_kwargs(), queue)
    del no_task["headers"]["task"]
    no_id = envelope("no-id-header", valid_kwargs(), queue)
    del no_id["headers"]["id"]
    bad_eta = envelope("bad-eta", valid_kwargs(), queue)
    bad_eta["headers"]["eta"] = "not a date"
    bad_limits = envelope("bad-timelimit", valid_kwargs(), queue)
    bad_limits["headers"]["timelimit"] = "forever"
    pickled = base64.b64encode(pickle.dumps(((), valid_kwargs(), EMBED))).decode()
    return [
        rejected("huge-session-id", valid_kwargs(session_id="s" * 20 * MEGABYTE),
                 "malformed_message"),
        rejected("huge-extra-kwarg", valid_kwargs(blob="x" * 20 * MEGABYTE), "malformed_message"),
        rejected("wrong-kwarg-types", {"session_id": 7, "reason": ["x"], "force": "yes"},
                 "malformed_message"),
        rejected("extra-kwargs", valid_kwargs(priority=9), "malformed_message"),
        rejected("args-not-kwargs", {}, "malformed_message",
                 body=body_of([SESSION_ID, "bad-messages", True], {})),
        rejected("body-not-json", None, "undecodable_message",
                 body=base64.b64encode(b"this is not JSON {").decode()),
        rejected("pickle-content", None, "undecodable_message", body=pickled,
                 **{"content-type": "application/x-python-serialize",
                    "content-encoding": "binary"}),
        BadMessage("unknown-task", encoded(unknown), None, "Received unregistered task"),
        BadMessage("no-task-header", encoded(no_task), None, "unknown message"),
        BadMessage("no-id-header", encoded(no_id), "invalid_message", key="None"),
        BadMessage("bad-eta", encoded(bad_eta), "invalid_message"),
        BadMessage("bad-timelimit", encoded(bad_limits), "invalid_message"),
        # Items that are no envelope at all fail inside kombu's transport, before Celery
        # sees a message: the worker logs them and reconnects.
        BadMessage("json-not-an-envelope", b'{"hello": "world"}', None, "KeyError('properties')"),
        BadMessage("json-list", b"[1, 2, 3]", None, '"failure_class": "TypeError"'),
        BadMessage("not-json-at-all", b"\x00\xffgarbage", None,
                   '"failure_class": "JSONDecodeError"'),
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


def test_broken_messages_end_clearly_and_the_worker_keeps_serving(
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

    events = job_events(worker)
    assert worker.process is not None and worker.process.poll() is None, "the worker died"
    assert events[valid_id]["outcome"] == "compacted", events[valid_id]
    for message in messages:
        if message.reason is not None:
            event = events.get(message.key or message.name)
            assert event is not None, f"no rejected event for {message.name}"
            assert (event["outcome"], event["reason"]) == ("rejected", message.reason)
            assert event["will_retry"] is False and event["failure_message"]
        else:
            assert message.logged and message.logged in worker.log_text(), message.name
    assert_nothing_written_but_run_records(pg_store, history, valid_id)


def assert_nothing_written_but_run_records(store: Store, history: list[Any],
                                           valid_id: str) -> None:
    assert [s.session_id for s in store.list_sessions()] == [SESSION_ID]
    assert store.messages(SESSION_ID) == history
    [revision] = store.revisions(SESSION_ID)
    runs = store.runs(limit=1_000)
    assert {r.outcome for r in runs if r.task_id != valid_id} <= {"rejected"}
    assert [r.revision_id for r in runs if r.revision_id is not None] == [revision.id]
    assert projection_violations(store, SESSION_ID) == []
