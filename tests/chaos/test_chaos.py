"""The chaos suite's short form, for CI: 40 sessions, at least five SIGKILLs, and each
other fault once (a Redis restart, a PostgreSQL restart, a PostgreSQL hang, a round of
dropped PostgreSQL connections, a round of poison) under a real beat (whose gc erases
idle sessions while they are appended to), then every invariant checked (the full run
is ``python -m tests.chaos``; see docs/CHAOS.md). And a fault the full run meets only by
chance, made certain: jobs that finish while Redis is down."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from db import Store, create_db_engine
from tests.chaos.config import ChaosConfig
from tests.chaos.run import run_chaos
from tests.support.chaos import PrivateRedis
from tests.support.databases import truncate_store_tables
from tests.support.e2e import JobPublisher, build_job_env, import_records
from tests.support.generated import generated_session
from tests.support.openai_server import OpenAIServer
from tests.support.worker_process import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.integration]

RESTARTS = 3
TURNS = 40  # about 4,900 tokens: over the 4,200-token trigger of tests/support/e2e.py


def test_a_short_chaos_run_loses_nothing_and_settles_every_session(tmp_path: Path) -> None:
    # 65 s of chaos and as long again of quiet: the beat's every-minute scan fires at least
    # once. A scan may still end unfinished (its pool child killed, PostgreSQL hung) or
    # skipped (a killed scan's lock held): that it was sent and started is what counts.
    config = ChaosConfig(work_dir=tmp_path, sessions=40, kills=5, duration_s=65.0, workers=2,
                         redis_restarts=1, pg_drops=1, pg_restarts=1, pg_hangs=1,
                         pg_hang_s=8.0, poison_rounds=1, drain_timeout_s=90.0)

    report = run_chaos(config)

    print("\n".join(report.lines()))
    assert not report.verdict.violation_kinds, report.verdict.examples(per_kind=3)
    assert report.kills >= config.kills
    counts = report.counts
    assert counts["redis restarts"] == 1
    assert counts["pg connection drops"] == 1
    assert counts["pg restarts"] == 1
    assert counts["pg hangs"].startswith("1 x")
    assert counts["poison items pushed"] > 0
    assert counts["beat's compactor.scan started on a worker"] >= 1
    assert counts["appends leaving tool calls open"] > 0
    assert counts["beat's gc runs (lifecycle.gc events)"] >= 1
    assert counts["idle sessions erased by gc"] > 0


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not seen in {timeout_s}s")
        time.sleep(0.1)


def test_a_worker_keeps_serving_when_redis_restarts_under_running_jobs(
    migrated_postgres_url: str, tmp_path: Path
) -> None:
    truncate_store_tables(migrated_postgres_url)
    engine = create_db_engine(migrated_postgres_url)
    session_ids = [f"redis-restart-{n}" for n in range(2 * RESTARTS + 1)]
    with PrivateRedis(tmp_path) as private_redis, OpenAIServer(latency_ms=1_000) as server:
        server.set_behaviour("latency")
        env = build_job_env(migrated_postgres_url, server.base_url, redis_url=private_redis.url)
        import_records(Store(engine), [generated_session(s, TURNS) for s in session_ids])
        publisher = JobPublisher(env.settings)
        worker = WorkerProcess(env.env, tmp_path / "worker.log", concurrency=2,
                               queue=env.queue).start()
        try:
            for restart in range(RESTARTS):
                for session_id in session_ids[2 * restart: 2 * restart + 2]:
                    publisher.publish(session_id, reason=f"in-flight-{restart}")
                jobs = 2 * restart + 2
                wait_until(reaches(lambda: server.request_count, jobs), "the LLM calls")
                # Both jobs wait on the LLM; they finish, and try to ack, while Redis is down.
                private_redis.restart(down_s=3.0)
                wait_until(reaches(lambda: len(job_events(worker)), jobs), "the outcome events")
            last = publisher.publish(session_ids[-1], reason="after-the-restarts")
            wait_until(lambda: last in job_events(worker), "the last job's outcome event")
            assert worker.process is not None and worker.process.poll() is None
        finally:
            worker.stop()
            publisher.close()
            engine.dispose()
    assert "Unrecoverable error" not in worker.log_text()
    assert set(job_events(worker).values()) == {"compacted"}


def reaches(value: Callable[[], int], target: int) -> Callable[[], bool]:
    return lambda: value() >= target


def job_events(worker: WorkerProcess) -> dict[str, str]:
    """Each job's outcome by task id."""
    return {str(e["task_id"]): str(e["outcome"]) for e in worker.events("compaction.job")}
