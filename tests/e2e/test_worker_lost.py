"""Every attempt on record when its worker dies, with real worker processes: a pool
child SIGKILLed mid-job leaves its attempt's run row and ``compaction.job`` event
(``worker_lost``, written by the worker's main process), and its redelivery runs as the
next attempt (docs/CHAOS.md)."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
import redis

from db import Store
from tests.e2e.conftest import StartWorker
from tests.support.e2e import (
    JobEnv,
    JobPublisher,
    import_records,
    projection_violations,
    wait_until,
)
from tests.support.generated import generated_session
from tests.support.openai_server import OpenAIServer
from tests.support.worker_process import WorkerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

CHILD_KILLS = 10


def job_events(worker: WorkerProcess, task_id: str) -> list[dict[str, Any]]:
    return [e for e in worker.events("compaction.job") if e.get("task_id") == task_id]


def ended(worker: WorkerProcess, task_id: str) -> bool:
    return any(e["outcome"] != "failed" for e in job_events(worker, task_id))


def start_hung_job(publisher: JobPublisher, server: OpenAIServer, session_id: str) -> str:
    """Send the session's job and return its task id once its LLM call hangs; the
    server answers the calls that follow at once."""
    server.set_behaviour("hang")
    calls = server.request_count
    task_id = publisher.publish(session_id, reason="kill")
    wait_until(lambda: server.request_count > calls)
    server.set_behaviour("ok")  # the hanging call stays hung
    return task_id


def kill_child_mid_job(worker: WorkerProcess, publisher: JobPublisher, server: OpenAIServer,
                       session_id: str) -> str:
    """SIGKILL the pool child running the session's job; the task id, once it ended."""
    task_id = start_hung_job(publisher, server, session_id)
    [child] = worker.child_pids()
    os.kill(child, signal.SIGKILL)
    wait_until(lambda: ended(worker, task_id))
    return task_id


@pytest.mark.timeout(600)
def test_every_pool_child_killed_mid_job_leaves_a_worker_lost_run_and_event(
    pg_store: Store, publisher: JobPublisher, start_worker: StartWorker, server: OpenAIServer,
    job_env: JobEnv, redis_client: redis.Redis,
) -> None:
    sessions = [f"child-kill-{n}" for n in range(CHILD_KILLS)]
    import_records(pg_store, [generated_session(s, 40) for s in sessions])
    worker = start_worker()
    kills = [(session_id, kill_child_mid_job(worker, publisher, server, session_id))
             for session_id in sessions]

    for session_id, task_id in kills:
        lost, done = job_events(worker, task_id)
        assert (lost["outcome"], lost["reason"], lost["session_id"]) == (
            "failed", "worker_lost", session_id), lost
        assert (lost["attempt"], lost["will_retry"], lost["failure_class"]) == (
            1, True, "AttemptLost")
        assert lost["run_recorded"] is True and lost["duration_ms"] > 0
        assert (done["outcome"], done["attempt"]) == ("compacted", 2), done
        runs = sorted(pg_store.runs(session_id=session_id), key=lambda r: r.attempt)
        assert [(r.task_id, r.attempt, r.outcome, r.figures["outcome_reason"])
                for r in runs] == [(task_id, 1, "failed", "worker_lost"),
                                   (task_id, 2, "compacted", "over_trigger")]
        assert runs[0].finished_at is not None
        assert runs[0].started_at <= runs[0].finished_at <= runs[1].started_at
        [revision] = pg_store.revisions(session_id)
        assert pg_store.get_session(session_id).active_revision_id == revision.id
        assert projection_violations(pg_store, session_id) == []
    # Celery's own line stays, now beside an event that names the task and session.
    assert sum("WorkerLostError" in str(e.get("event")) for e in worker.events()) >= CHILD_KILLS
    assert not redis_client.hlen(f"{job_env.prefix}pending-events")
    durations = [job_events(worker, t)[0]["duration_ms"] / 1000 for _, t in kills]
    print(f"{CHILD_KILLS} pool children SIGKILLed mid-job: {CHILD_KILLS} worker_lost runs "
          f"and events from the main process (each attempt lost after "
          f"{min(durations):.1f}-{max(durations):.1f} s), every redelivery compacted as "
          f"attempt 2")

