"""No outage strands a session: a real worker and a real beat (its reconciler every few
seconds) against a private redis-server killed with jobs queued, and a private
PostgreSQL stopped for 45 s under running jobs; afterwards every due session is compacted
within about one reconciler period, with no manual action."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from db import Store, upgrade_database
from scheduler.beat import SCAN_ENTRY_NAME
from tests.support.chaos import PrivateRedis
from tests.support.cli import REPO_ROOT, Compactor
from tests.support.databases import open_store
from tests.support.e2e import (
    JobEnv,
    build_job_env,
    compacted_sessions,
    import_records,
    wait_until,
)
from tests.support.generated import generated_session
from tests.support.openai_server import OpenAIServer
from tests.support.private_postgres import PrivatePostgres
from tests.support.raw_producer import read_queue
from tests.support.worker_process import WorkerProcess, parse_log_lines
from worker.broker.contract import RECONCILE_TASK_NAME, SCAN_TASK_NAME

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SESSIONS = [f"due-{n}" for n in range(6)]
RECONCILE_INTERVAL_S = 5
# One reconciler period, beat's start and the jobs themselves (a few seconds each).
RECOVERY_S = 90.0


@dataclass(frozen=True)
class Outage:
    redis: PrivateRedis
    postgres: PrivatePostgres
    job_env: JobEnv
    store: Store
    tmp_path: Path
    server: OpenAIServer


@pytest.fixture
def outage(tmp_path: Path) -> Iterator[Outage]:
    with PrivateRedis(tmp_path) as private_redis, PrivatePostgres() as postgres, \
            OpenAIServer(behaviour="latency", latency_ms=8_000) as server:  # 8 s a call
        upgrade_database(postgres.url)
        job_env = build_job_env(
            postgres.url, server.base_url, redis_url=private_redis.url, quiet_period_s=0,
            reconcile_interval_s=RECONCILE_INTERVAL_S, reconcile_grace_s=2, lease_ttl_s=6,
            # Far beyond the recoveries measured: Redis redelivering a job explains none.
            broker_visibility_timeout_s=300,
            retry_backoff_max_s=20, retry_window_s=600, max_transient_retries=20,
            provider_breaker_threshold=100)
        with open_store(postgres.url) as store:
            import_records(store, [generated_session(s, 40) for s in SESSIONS])
            yield Outage(private_redis, postgres, job_env, store, tmp_path, server)


@pytest.fixture
def processes(outage: Outage) -> Iterator[list[Any]]:
    """The worker and beat processes a test starts; all stopped at teardown."""
    started: list[Any] = []
    try:
        yield started
    finally:
        for process in started:
            if isinstance(process, WorkerProcess):
                process.stop()
            else:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(30)


def start_worker(outage: Outage, processes: list[Any], name: str = "worker") -> WorkerProcess:
    worker = WorkerProcess(outage.job_env.env, outage.tmp_path / f"{name}.log",
                           concurrency=2, queue=outage.job_env.queue)
    processes.append(worker)
    return worker.start()


def start_beat(outage: Outage, processes: list[Any]) -> subprocess.Popen[bytes]:
    env = {**os.environ, **outage.job_env.env, "PYTHONPATH": str(REPO_ROOT),
           "COMPACTOR_DATA_DIR": str(outage.tmp_path / "beat")}
    with open(outage.tmp_path / "beat.log", "wb") as log:  # the child keeps its own copy
        beat = subprocess.Popen([sys.executable, "-m", "scheduler", "beat"], env=env,
                                cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=log,
                                start_new_session=True)
    processes.append(beat)
    return beat


def scan(outage: Outage) -> None:
    done = Compactor(outage.job_env.env).subprocess("scan", "--json")
    assert done.returncode == 0, done.stderr


def markers_left(store: Store) -> list[str]:
    return [s for s in SESSIONS if store.get_session(s).queued_job_id is not None]


def attempts(store: Store, events: list[dict[str, Any]]) -> tuple[Counter[Any], Counter[Any]]:
    """(task id, attempt, outcome) of the job events and of the run rows."""
    return (Counter((e["task_id"], e["attempt"], e["outcome"]) for e in events),
            Counter((r.task_id, r.attempt, r.outcome) for r in store.runs(limit=10_000)))


def every_attempt_has_one_run(store: Store, worker: WorkerProcess) -> bool:
    by_event, by_run = attempts(store, worker.events("compaction.job"))
    return by_event == by_run


def with_env(outage: Outage, tmp_path: Path, overrides: dict[str, str]) -> Outage:
    """The outage, its jobs' environment changed by ``overrides``."""
    env = {**outage.job_env.env, **overrides}
    return Outage(outage.redis, outage.postgres, JobEnv(outage.job_env.settings, env),
                  outage.store, tmp_path, outage.server)


# A frozen server fails the jobs' store calls well inside their soft time limit.
SHORT_CALL_DEADLINE = {"COMPACTOR_DB_STATEMENT_TIMEOUT_S": "3",
                       "COMPACTOR_DB_CALL_TIMEOUT_S": "5"}


def leased_sessions(outage: Outage) -> set[str]:
    return {s for s in SESSIONS if outage.store.get_session(s).lease_owner is not None}


def wait_for_two_running_jobs(outage: Outage) -> None:
    """Until two jobs hold their sessions' leases (in their 8-second LLM call)."""
    wait_until(lambda: len(leased_sessions(outage)) == 2, timeout_s=60)


def start_on_short_call_deadline(outage: Outage, processes: list[Any], tmp_path: Path
                                 ) -> tuple[Outage, WorkerProcess]:
    """A scan, a worker and a beat on ``SHORT_CALL_DEADLINE``, once two jobs run."""
    outage = with_env(outage, tmp_path, SHORT_CALL_DEADLINE)
    scan(outage)
    worker = start_worker(outage, processes)
    start_beat(outage, processes)
    wait_for_two_running_jobs(outage)
    return outage, worker


def test_after_redis_lost_its_queued_jobs_every_due_session_is_compacted(
    outage: Outage, processes: list[Any]
) -> None:
    scan(outage)
    with redis.Redis.from_url(outage.redis.url) as client:
        assert client.llen(f"{outage.job_env.prefix}{outage.job_env.queue}") == len(SESSIONS)
    outage.redis.restart()  # a crash without persistence: every queued job is gone
    assert markers_left(outage.store) == SESSIONS
    started = time.monotonic()
    worker = start_worker(outage, processes)
    start_beat(outage, processes)

    wait_until(lambda: compacted_sessions(outage.store) == set(SESSIONS), timeout_s=RECOVERY_S)

    recovered_s = time.monotonic() - started
    repairs = worker.events("compaction.reconcile")
    assert {(e["session_id"], e["problem"], e["action"]) for e in repairs} == {
        (s, "lost_job", "requeued") for s in SESSIONS}
    wait_until(lambda: not markers_left(outage.store))
    print(f"redis lost {len(SESSIONS)} queued jobs: all compacted {recovered_s:.1f} s after "
          f"the worker and beat started")


def test_a_45_second_postgresql_stop_strands_no_session(
    outage: Outage, processes: list[Any]
) -> None:
    scan(outage)
    worker = start_worker(outage, processes)  # the worker checks the database as it starts
    start_beat(outage, processes)
    outage.postgres.stop()
    wait_until(lambda: len(worker.events("compaction.job")) >= 2, timeout_s=60)
    time.sleep(45)
    outage.postgres.start()
    restarted = time.monotonic()

    wait_until(lambda: compacted_sessions(outage.store) == set(SESSIONS), timeout_s=RECOVERY_S)

    recovered_s = time.monotonic() - restarted
    events = worker.events("compaction.job")
    during = [e for e in events if e["outcome"] == "failed"]
    assert during and all(e["reason"] == "store_unavailable" for e in during)
    # Retried, not exhausted: no attempt during the outage was the last.
    assert all(e["will_retry"] for e in during)
    wait_until(lambda: not markers_left(outage.store))
    # Every attempt leaves a run row: those the database refused were kept in Redis and
    # written by the reconciler once it was back.
    assert any(not e["run_recorded"] for e in during)
    wait_until(lambda: every_attempt_has_one_run(outage.store, worker),
               timeout_s=RECOVERY_S)
    print(f"postgresql down 45 s: {len(during)} failed attempts, all retried; every session "
          f"compacted {recovered_s:.1f} s after the restart")


def test_jobs_that_end_while_postgresql_is_down_are_repaired_by_the_reconciler(
    outage: Outage, processes: list[Any], tmp_path: Path
) -> None:
    # No retries: each job's one attempt ends for good during the outage, and the
    # marker clear that follows fails with the database.
    outage = with_env(outage, tmp_path, {"COMPACTOR_MAX_TRANSIENT_RETRIES": "0"})
    scan(outage)
    # The worker checks the database as it starts; its first jobs are then in their
    # 8-second LLM call when the database goes.
    worker = start_worker(outage, processes)
    outage.postgres.stop()
    wait_until(lambda: len(worker.events("compaction.job")) >= len(SESSIONS), timeout_s=90)
    ended = worker.events("compaction.job")
    assert {e["reason"] for e in ended} == {"store_unavailable"}
    assert not any(e["will_retry"] or e["run_recorded"] for e in ended)
    outage.postgres.start()
    assert markers_left(outage.store) == SESSIONS  # stranded, until the reconciler runs
    start_beat(outage, processes)

    wait_until(lambda: compacted_sessions(outage.store) == set(SESSIONS), timeout_s=RECOVERY_S)

    assert {e["session_id"] for e in worker.events("compaction.reconcile")} == set(SESSIONS)
    assert parse_log_lines((tmp_path / "beat.log").read_text())
    wait_until(lambda: every_attempt_has_one_run(outage.store, worker), timeout_s=30)
    unrecorded = [r for r in outage.store.runs(limit=1_000)
                  if r.figures.get("outcome_reason") == "store_unavailable"]
    assert sorted(r.session_id for r in unrecorded) == SESSIONS
    # Written by the reconciler, or by the worker process that kept them, once each.
    written = [*worker.events("reconcile.attempts_recorded"),
               *worker.events("worker.owed_runs_written")]
    assert sum(e["runs_written"] for e in written) == len(SESSIONS)


def test_a_frozen_postgresql_ends_running_jobs_as_store_unavailable_not_time_limit(
    outage: Outage, processes: list[Any], tmp_path: Path
) -> None:
    # The server is frozen (SIGSTOP) past the jobs' 50 s soft time limit: without the
    # client-side call deadline every job blocked on it would end as time_limit, counted
    # on its session's breaker.
    # Two jobs in their 8-second LLM call when the server freezes: their swap hangs.
    outage, worker = start_on_short_call_deadline(outage, processes, tmp_path)
    soft_limit_s = outage.job_env.settings.task_soft_time_limit_s
    outage.postgres.hang()
    try:
        time.sleep(soft_limit_s + 5)
        during = worker.events("compaction.job")
    finally:
        outage.postgres.resume()
    resumed = time.monotonic()

    wait_until(lambda: compacted_sessions(outage.store) == set(SESSIONS), timeout_s=RECOVERY_S)

    recovered_s = time.monotonic() - resumed
    assert during, "no attempt ended while the server was frozen"
    assert {(e["outcome"], e["reason"]) for e in during} == {("failed", "store_unavailable")}
    assert all(e["will_retry"] for e in during)
    ended = worker.events("compaction.job")
    assert not [e for e in ended if e["reason"] == "time_limit"]
    assert all(outage.store.get_session(s).breaker_failures == 0 for s in SESSIONS)
    wait_until(lambda: not markers_left(outage.store))
    wait_until(lambda: every_attempt_has_one_run(outage.store, worker), timeout_s=RECOVERY_S)
    longest_s = max(e["duration_ms"] for e in during) / 1000
    print(f"postgresql frozen {soft_limit_s + 5} s: {len(during)} attempts failed as "
          f"store_unavailable (longest {longest_s:.1f} s), all retried; every session "
          f"compacted {recovered_s:.1f} s after the resume")


def test_runs_kept_during_a_postgresql_hang_survive_a_redis_restart_without_its_data(
    outage: Outage, processes: list[Any], tmp_path: Path
) -> None:
    # The full chaos run's sequence: jobs fail on a frozen server, their runs are kept,
    # and Redis restarts empty before any sweep could write them (docs/CHAOS.md).
    outage, worker = start_on_short_call_deadline(outage, processes, tmp_path)
    outage.postgres.hang()
    try:
        wait_until(lambda: sum(not e["run_recorded"] for e in worker.events("compaction.job"))
                   >= 2, timeout_s=60)
        # Once their retries are sent: a child caught publishing one by the restart may
        # block until its hard time limit (docs/CHAOS.md, open findings), not this test's
        # subject.
        wait_until(lambda: sum(" retry: " in str(e.get("event"))
                               for e in worker.events()) >= 2, timeout_s=30)
        outage.redis.restart()  # the kept runs' list is gone with the rest
    finally:
        outage.postgres.resume()
    kept = sum(not e["run_recorded"] for e in worker.events("compaction.job"))

    wait_until(lambda: compacted_sessions(outage.store) == set(SESSIONS), timeout_s=RECOVERY_S)

    wait_until(lambda: every_attempt_has_one_run(outage.store, worker), timeout_s=RECOVERY_S)
    written_by_worker = sum(e["runs_written"] for e in worker.events("worker.owed_runs_written"))
    assert written_by_worker >= 2
    print(f"{kept} runs kept during the hang, Redis restarted without them: "
          f"{written_by_worker} written by the workers that kept them, every attempt has its run")


def test_the_jobs_of_a_killed_worker_run_again_within_about_a_minute(
    outage: Outage, processes: list[Any]
) -> None:
    scan(outage)
    doomed = start_worker(outage, processes, "doomed")
    wait_for_two_running_jobs(outage)
    leased = leased_sessions(outage)
    assert doomed.process is not None
    for pid in [*doomed.child_pids(), doomed.process.pid]:
        os.kill(pid, signal.SIGKILL)  # the whole worker, as the OOM killer or a node loss
    killed = time.monotonic()
    outage.server.set_behaviour("ok")
    worker = start_worker(outage, processes)
    start_beat(outage, processes)

    wait_until(lambda: compacted_sessions(outage.store) >= leased, timeout_s=RECOVERY_S)

    recovered_s = time.monotonic() - killed
    assert recovered_s < outage.job_env.settings.broker_visibility_timeout_s  # not Redis's
    lost = [e for e in worker.events("compaction.job") if e["reason"] == "worker_lost"]
    assert {e["session_id"] for e in lost} == leased
    runs = {r.session_id for r in outage.store.runs(outcome="failed", limit=100)
            if r.figures.get("outcome_reason") == "worker_lost"}
    assert runs == leased
    wait_until(lambda: compacted_sessions(outage.store) == set(SESSIONS), timeout_s=RECOVERY_S)
    print(f"worker killed with {len(leased)} jobs running: both compacted again "
          f"{recovered_s:.1f} s later (lease TTL 6 s, reconciler every "
          f"{RECONCILE_INTERVAL_S} s, visibility timeout 300 s)")


def beat_events(outage: Outage, event: str) -> list[dict[str, Any]]:
    lines = parse_log_lines((outage.tmp_path / "beat.log").read_text())
    return [line for line in lines if line.get("event") == event]


def test_beat_across_a_redis_outage_logs_one_json_line_and_catches_up_the_missed_scan(
    outage: Outage, processes: list[Any], tmp_path: Path
) -> None:
    outage = with_env(outage, tmp_path, {"COMPACTOR_SCAN_CRON": "* * * * *"})
    start_beat(outage, processes)  # its scan every minute, its reconciler every 5 s

    def queued_tasks() -> set[str]:
        with redis.Redis.from_url(outage.redis.url) as client:
            return {m.task_name for m in read_queue(client, outage.job_env.prefix,
                                               outage.job_env.queue)}

    wait_until(lambda: RECONCILE_TASK_NAME in queued_tasks(), timeout_s=30)  # beat is up
    outage.redis.stop()
    wait_until(lambda: any(e["entry"] == SCAN_ENTRY_NAME
                           for e in beat_events(outage, "beat.send_failed")), timeout_s=75)
    outage.redis.start()  # empty: whatever is queued now was sent after the outage

    wait_until(lambda: SCAN_TASK_NAME in queued_tasks(), timeout_s=30)

    assert SCAN_ENTRY_NAME in {e["entry"] for e in beat_events(outage, "beat.caught_up")}
    failed = beat_events(outage, "beat.send_failed")
    assert all(e["level"] == "error" and e["will_catch_up"] for e in failed)
    log = (outage.tmp_path / "beat.log").read_text()
    assert "Traceback" not in log
    assert parse_log_lines(log)  # every line of it is JSON
