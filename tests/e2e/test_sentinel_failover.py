"""Redis with Sentinel: a real worker, beat, the scan and every piece of fleet state on a
``sentinel://`` URL (the sentinels behind a password), while the primary is killed in the
middle of the run and the sentinels promote its replica. No job is lost (each ends in its
``compaction.job`` event and run row) and no session is stranded (none keeps a queue
marker or a lease)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from db import Store
from tests.support.cli import REPO_ROOT, Compactor
from tests.support.e2e import (
    JobEnv,
    build_job_env,
    compacted_sessions,
    import_records,
    wait_until,
)
from tests.support.generated import generated_session
from tests.support.openai_server import OpenAIServer
from tests.support.sentinel import MASTER_NAME, PrivateSentinel
from tests.support.worker_process import WorkerProcess
from worker.shared_state.connection import connect_redis
from worker.shared_state.keys import RedisKeys

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SESSIONS = [f"failover-{n}" for n in range(10)]
JOBS_BEFORE_FAILOVER = 3
# Every job, each a couple of LLM calls of 1.5 s on two pool children, and the failover.
RUN_TIMEOUT_S = 90.0
SENTINEL_PASSWORD = "sentinel-s3cret"  # the sentinels require it; the Redis nodes do not
# Beat's reconciler re-sends a job the failover lost (popped from the old master, but its
# unacked entry never replicated): every few seconds here, every 300 s by default.
RECONCILE_INTERVAL_S = 5


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[PrivateSentinel]:
    with PrivateSentinel(tmp_path, password=SENTINEL_PASSWORD) as running:
        yield running


@pytest.fixture
def failover_env(postgres_url: str, sentinel: PrivateSentinel) -> Iterator[JobEnv]:
    with OpenAIServer(behaviour="latency", latency_ms=1_500) as server:
        yield build_job_env(postgres_url, server.base_url, redis_url=sentinel.url,
                            redis_sentinel_master=MASTER_NAME,
                            redis_sentinel_password=SENTINEL_PASSWORD, quiet_period_s=0,
                            reconcile_interval_s=RECONCILE_INTERVAL_S, reconcile_grace_s=2)


@contextmanager
def running_beat(env: dict[str, str], tmp_path: Path) -> Iterator[None]:
    """``compactor beat`` (its reconciler on the worker), stopped afterwards."""
    with open(tmp_path / "beat.log", "wb") as log:  # the child keeps its own copy
        beat = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "beat"], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
            stderr=log, start_new_session=True,
            env={**os.environ, **env, "PYTHONPATH": str(REPO_ROOT),
                 "COMPACTOR_DATA_DIR": str(tmp_path / "beat")})
    try:
        yield
    finally:
        os.killpg(beat.pid, signal.SIGTERM)
        beat.wait(30)


def held_sessions(store: Store) -> list[str]:
    """Sessions still holding a queue marker or a lease."""
    sessions = [store.get_session(s) for s in SESSIONS]
    return [s.session_id for s in sessions
            if s.queued_job_id is not None or s.lease_owner is not None]


def test_a_sentinel_failover_mid_run_loses_no_job_and_strands_no_session(
    failover_env: JobEnv, sentinel: PrivateSentinel, pg_store: Store, tmp_path: Path
) -> None:
    import_records(pg_store, [generated_session(s, 40) for s in SESSIONS])
    first_master = sentinel.master_port()
    scanned = Compactor(failover_env.env).subprocess("scan", "--json")
    assert scanned.returncode == 0, scanned.stderr
    worker = WorkerProcess(failover_env.env, tmp_path / "worker.log", concurrency=2,
                           queue=failover_env.queue)
    with worker, running_beat(failover_env.env, tmp_path), \
            connect_redis(failover_env.settings) as client:
        worker.wait_for_events("compaction.job", JOBS_BEFORE_FAILOVER, timeout_s=RUN_TIMEOUT_S)
        started = time.monotonic()
        new_master = sentinel.kill_master()
        failover_s = time.monotonic() - started
        wait_until(lambda: compacted_sessions(pg_store) == set(SESSIONS),
                   timeout_s=RUN_TIMEOUT_S)
        run_s = time.monotonic() - started
        # The worker reads its queue through the inspecting transport after the failover too.
        client.lpush(f"{failover_env.prefix}{failover_env.queue}", b"not a message")
        rejected = worker.wait_for_events("compaction.job", len(SESSIONS) + 1)[-1]
        dead_letters = client.llen(RedisKeys(failover_env.prefix).dead_letters())
        master_port = client.connection_pool.get_master_address()[1]
        unacked = client.hlen(f"{failover_env.prefix}unacked")
        events = worker.events("compaction.job")
        repairs = worker.events("compaction.reconcile")

    assert (new_master, master_port) == (master_port, new_master) != (first_master, first_master)
    assert (rejected["outcome"], rejected["reason"], dead_letters) == (
        "rejected", "unreadable_item", 1)
    jobs = [e for e in events if e["outcome"] != "rejected"]
    assert sorted(e["session_id"] for e in jobs if e["outcome"] == "compacted") == SESSIONS
    runs = pg_store.runs(limit=10_000)
    assert sorted((r.task_id, r.outcome) for r in runs) == sorted(
        (e["task_id"], e["outcome"]) for e in jobs)
    assert held_sessions(pg_store) == []
    assert {(e["problem"], e["action"]) for e in repairs} <= {("lost_job", "requeued")}
    print(f"sentinel failover after {JOBS_BEFORE_FAILOVER} of {len(SESSIONS)} jobs: "
          f"{failover_s:.1f} s until the replica was master, all {len(SESSIONS)} compacted "
          f"{run_s:.1f} s after the kill; {len(jobs)} job events, {len(runs)} run rows, "
          f"{len(repairs)} lost by Redis and re-sent by the reconciler, "
          f"0 sessions held, {unacked} unacked entries left for redelivery")
