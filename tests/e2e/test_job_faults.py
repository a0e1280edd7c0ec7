"""The compaction job under faults, with a real worker process: its pool child killed
mid-summarize, malformed and pickled trigger messages, and a job past the redelivery
cap. Each ends in a clear outcome, and the worker keeps serving."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
import redis

from db import Store
from tests.e2e.conftest import StartWorker
from tests.support.e2e import (
    LONG_SESSION_ID,
    MEDIUM_SESSION_ID,
    JobEnv,
    JobPublisher,
    import_generated_sessions,
    projection_violations,
    wait_until,
)
from tests.support.openai_server import OpenAIServer
from tests.support.worker_process import WorkerProcess
from worker.shared_state.keys import RedisKeys

pytestmark = [pytest.mark.e2e, pytest.mark.integration]



def event_of(worker: WorkerProcess, task_id: str) -> dict[str, Any]:
    """Wait for the outcome event of ``task_id`` and return it."""
    wait_until(lambda: any(e.get("task_id") == task_id for e in worker.events("compaction.job")))
    [event] = [e for e in worker.events("compaction.job") if e.get("task_id") == task_id]
    return event


def queue_is_drained(client: redis.Redis, job_env: JobEnv) -> bool:
    """Nothing waits in the queue and nothing is delivered but unacknowledged."""
    waiting = client.llen(f"{job_env.prefix}{job_env.queue}")
    unacked = client.hlen(f"{job_env.prefix}unacked")
    return waiting == 0 and unacked == 0


def test_a_job_whose_worker_is_killed_mid_summarize_is_redelivered_and_completes_once(
    pg_store: Store, publisher: JobPublisher, start_worker: StartWorker, server: OpenAIServer,
    job_env: JobEnv, redis_client: redis.Redis,
) -> None:
    import_generated_sessions(pg_store, LONG_SESSION_ID)
    server.set_behaviour("hang")
    worker = start_worker()
    task_id = publisher.publish(LONG_SESSION_ID, reason="kill-mid-summarize")
    wait_until(lambda: server.request_count == 1)  # the child is waiting on the LLM
    server.set_behaviour("ok")  # for the redelivery; the hanging request stays hung

    [child] = worker.child_pids()
    os.kill(child, signal.SIGKILL)

    wait_until(lambda: len([e for e in worker.events("compaction.job")
                            if e.get("task_id") == task_id]) == 2)
    lost_event, event = [e for e in worker.events("compaction.job") if e["task_id"] == task_id]
    assert (lost_event["outcome"], lost_event["reason"]) == ("failed", "worker_lost")
    assert (event["outcome"], event["reason"]) == ("compacted", "over_trigger"), event
    assert child not in worker.child_pids()
    [revision] = pg_store.revisions(LONG_SESSION_ID)
    session = pg_store.get_session(LONG_SESSION_ID)
    assert session.active_revision_id == revision.id == event["revision_id"]
    assert session.lease_owner is None  # released by the job that finished
    # The killed delivery's attempt is recorded by the worker's main process.
    lost, run = pg_store.runs(session_id=LONG_SESSION_ID)[::-1]
    assert (lost.task_id, lost.attempt, lost.outcome) == (task_id, 1, "failed")
    assert (run.task_id, run.attempt, run.outcome) == (task_id, 2, "compacted")
    assert server.request_count == 2
    assert projection_violations(pg_store, LONG_SESSION_ID) == []
    wait_until(lambda: queue_is_drained(redis_client, job_env))


# (kwargs, positional args, what the rejection says)
MALFORMED_MESSAGES: list[tuple[dict[str, Any], tuple[Any, ...], str]] = [
    ({"session": MEDIUM_SESSION_ID, "reason": "x"}, (), "session_id: Field required"),
    ({"session_id": MEDIUM_SESSION_ID, "reason": "x", "force": False, "priority": 1}, (),
     "priority: Extra inputs are not permitted"),
    ({"session_id": MEDIUM_SESSION_ID, "reason": "x", "force": "yes"}, (),
     "force: Input should be a valid boolean"),
    ({"session_id": 42, "reason": "x"}, (), "session_id: Input should be a valid string"),
    ({}, (MEDIUM_SESSION_ID, "x"), "positional arguments are not accepted"),
]


def test_malformed_triggers_are_rejected_and_the_worker_keeps_serving(
    pg_store: Store, publisher: JobPublisher, start_worker: StartWorker, job_env: JobEnv,
    redis_client: redis.Redis,
) -> None:
    import_generated_sessions(pg_store, MEDIUM_SESSION_ID)
    worker = start_worker()

    bad = [publisher.publish_kwargs(kwargs, args=args) for kwargs, args, _ in MALFORMED_MESSAGES]
    good = publisher.publish(MEDIUM_SESSION_ID)

    for task_id, (_, _, problem) in zip(bad, MALFORMED_MESSAGES, strict=True):
        rejected = event_of(worker, task_id)
        assert (rejected["outcome"], rejected["reason"]) == ("rejected", "malformed_message")
        assert rejected["failure_class"] == "JobRejected" and rejected["will_retry"] is False
        assert problem in rejected["failure_message"], rejected["failure_message"]
    assert event_of(worker, good)["outcome"] == "compacted"
    assert pg_store.get_session(MEDIUM_SESSION_ID).breaker_failures == 0
    assert len(pg_store.revisions(MEDIUM_SESSION_ID)) == 1
    wait_until(lambda: queue_is_drained(redis_client, job_env))


def test_a_pickled_trigger_is_refused_with_an_event_and_the_worker_keeps_serving(
    pg_store: Store, publisher: JobPublisher, start_worker: StartWorker, job_env: JobEnv,
    redis_client: redis.Redis,
) -> None:
    import_generated_sessions(pg_store, MEDIUM_SESSION_ID)
    worker = start_worker()

    pickled = publisher.publish_kwargs({"session_id": MEDIUM_SESSION_ID, "reason": "pickle"},
                                       serializer="pickle")
    good = publisher.publish(MEDIUM_SESSION_ID)

    refused = event_of(worker, pickled)
    assert (refused["outcome"], refused["reason"]) == ("rejected", "undecodable_message")
    assert refused["failure_class"] == "ItemRejected"  # refused by the transport, unread
    assert "application/x-python-serialize" in refused["failure_message"]
    assert refused["session_id"] is None  # the body is never unpickled to find out
    assert event_of(worker, good)["outcome"] == "compacted"
    assert worker.process is not None and worker.process.poll() is None
    [run] = pg_store.runs(session_id=MEDIUM_SESSION_ID)
    assert run.reason == "e2e"  # the pickled message never reached the pipeline
    wait_until(lambda: queue_is_drained(redis_client, job_env))


def test_a_job_past_the_delivery_cap_fails_counts_on_the_breaker_and_is_acknowledged(
    pg_store: Store, publisher: JobPublisher, start_worker: StartWorker, job_env: JobEnv,
    redis_client: redis.Redis, server: OpenAIServer,
) -> None:
    import_generated_sessions(pg_store, MEDIUM_SESSION_ID)
    task_id = "capped-job"
    # Earlier deliveries of this task all died with their workers.
    key = RedisKeys(job_env.prefix).deliveries(task_id, 0)
    redis_client.set(key, job_env.settings.max_deliveries)
    worker = start_worker()

    publisher.publish(MEDIUM_SESSION_ID, task_id=task_id)

    event = event_of(worker, task_id)
    assert (event["outcome"], event["reason"]) == ("failed", "delivery_cap")
    assert event["failure_class"] == "DeliveryCapExceeded" and event["will_retry"] is False
    session = pg_store.get_session(MEDIUM_SESSION_ID)
    assert (session.breaker_state, session.breaker_failures) == ("closed", 1)
    assert event["breaker_state"] == "closed"
    assert pg_store.revisions(MEDIUM_SESSION_ID) == [] and server.request_count == 0
    [run] = pg_store.runs(session_id=MEDIUM_SESSION_ID)
    assert (run.outcome, run.failure_class) == ("failed", "DeliveryCapExceeded")
    assert int(redis_client.get(key) or 0) == job_env.settings.max_deliveries + 1
    wait_until(lambda: queue_is_drained(redis_client, job_env))
