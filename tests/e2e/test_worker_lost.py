"""Every attempt on record when its worker dies, with real worker processes: a pool
child SIGKILLed mid-job leaves its attempt's run row and ``compaction.job`` event
(``worker_lost``, written by the worker's main process), and its redelivery runs as the
next attempt; a whole worker SIGKILLed has its job running again on another worker
within a minute at the default lease and reconciler settings (docs/CHAOS.md)."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from db import Store
from tests.e2e.conftest import StartWorker
from tests.support.e2e import (
    JobEnv,
    JobPublisher,
    build_job_env,
    import_records,
    projection_violations,
    redis_under_prefix,
    wait_until,
)
from tests.support.generated import generated_session
from tests.support.openai_server import OpenAIServer
from tests.support.worker_process import REPO_ROOT, WorkerProcess
from worker.settings.config import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

CHILD_KILLS = 10


def job_events(worker: WorkerProcess, task_id: str) -> list[dict[str, Any]]:
    return [e for e in worker.events("compaction.job") if e.get("task_id") == task_id]


def ended(worker: WorkerProcess, task_id: str) -> bool:
    return any(e["outcome"] != "failed" for e in job_events(worker, task_id))


def start_hung_job(publisher: JobPublisher, server: OpenAIServer, session_id: str,
                   store: Store | None = None, *, behaviour: str = "hang") -> str:
    """Send the session's job (with ``store``, queue-marked as a trigger does) and return
    its task id once its LLM call hangs (or meets ``behaviour``); the server answers the
    calls that follow at once."""
    server.set_behaviour(behaviour)
    calls = server.request_count
    task_id = str(uuid.uuid4())
    if store is not None:
        with store.queue_markers() as markers:
            markers.mark(session_id, task_id, now=datetime.now(UTC), marker_ttl_s=7_200)
    publisher.publish(session_id, reason="kill", task_id=task_id)
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


WORKER_KILLS = 5
# Defaults under test: the lease, its heartbeat and the reconciler, as Settings has them.
DEFAULTS_UNDER_TEST = ("lease_ttl_s", "lease_heartbeat_s", "reconcile_interval_s",
                       "reconcile_grace_s", "broker_visibility_timeout_s")


@pytest.fixture
def fleet_env(postgres_url: str, server: OpenAIServer) -> JobEnv:
    """The jobs' settings with the lease and reconciler at their defaults; only what is
    not under test is shortened (imported sessions are due at once). The nightly scan is
    set twelve hours from now: at its default hour, a scan during the test would compact
    the sessions whose jobs the test is about to start and kill, and their jobs would be
    skipped."""
    defaults = {name: Settings.model_fields[name].default for name in DEFAULTS_UNDER_TEST}
    values = {name: value for name, value in defaults.items() if value is not None}
    scan_hour = (datetime.now(UTC).hour + 12) % 24
    return build_job_env(postgres_url, server.base_url, quiet_period_s=0,
                         scan_cron=f"0 {scan_hour} * * *", **values)


@pytest.fixture
def fleet(fleet_env: JobEnv, tmp_path: Path) -> Iterator[Fleet]:
    with redis_under_prefix(fleet_env.prefix):
        running = Fleet(fleet_env, tmp_path)
        try:
            yield running
        finally:
            running.stop()


class Fleet:
    """Worker processes and one beat on the test's queue, all stopped at the end."""

    def __init__(self, job_env: JobEnv, tmp_path: Path) -> None:
        self.job_env = job_env
        self.tmp_path = tmp_path
        self.workers: list[WorkerProcess] = []
        self.beat: subprocess.Popen[bytes] | None = None

    def start_worker(self) -> WorkerProcess:
        worker = WorkerProcess(self.job_env.env,
                               self.tmp_path / f"worker-{len(self.workers)}.log",
                               queue=self.job_env.queue)
        self.workers.append(worker)
        return worker.start()

    def start_beat(self) -> None:
        env = {**os.environ, **self.job_env.env, "PYTHONPATH": str(REPO_ROOT),
               "COMPACTOR_DATA_DIR": str(self.tmp_path / "beat")}
        with open(self.tmp_path / "beat.log", "wb") as log:  # the child keeps its copy
            self.beat = subprocess.Popen([sys.executable, "-m", "scheduler", "beat"],
                                         env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                                         stderr=log, start_new_session=True)

    def holder(self, store: Store, session_id: str) -> WorkerProcess | None:
        """The live worker whose pool child holds the session's lease."""
        owner = store.get_session(session_id).lease_owner
        pid = int(owner.split(":")[1]) if owner else None
        return next((w for w in self.live() if pid in w.child_pids()), None)

    def live(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.process is not None and w.process.poll() is None]

    def events(self, task_id: str) -> list[dict[str, Any]]:
        return [e for w in self.workers for e in w.events("compaction.job")
                if e.get("task_id") == task_id]

    def diagnosis(self, store: Store, session_id: str, task_id: str) -> str:
        """What a failed wait needs to be explained: the session's row and runs, the
        sweeps' repairs and the job's events on every worker, and beat's last lines."""
        lines = [f"task {task_id}: {store.get_session(session_id)}",
                 *(f"run {run}" for run in store.runs(session_id=session_id)),
                 f"live workers' children: {[w.child_pids() for w in self.live()]}"]
        for worker in self.workers:
            lines += [f"{worker.log_path.name}: {event}" for event in worker.events()
                      if event.get("session_id") == session_id
                      or str(event.get("event", "")).startswith("reconcile")]
        beat_log = self.tmp_path / "beat.log"
        if beat_log.exists():
            lines += beat_log.read_text(errors="replace").splitlines()[-20:]
        return "\n".join(lines)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        if self.beat is not None:
            os.killpg(self.beat.pid, signal.SIGTERM)
            self.beat.wait(30)


def rerun_started(store: Store, session_id: str, task_id: str) -> list[datetime]:
    """The start of another job of the session than ``task_id`` (none yet: empty): now,
    while it holds the lease, or its run's start once it ended (a quick rerun can begin
    and end between two looks at the lease)."""
    owner = store.get_session(session_id).lease_owner
    if owner is not None and not owner.endswith(f":{task_id}"):
        return [datetime.now(UTC)]
    return [run.started_at for run in store.runs(session_id=session_id)
            if run.task_id != task_id]


def kill_worker_mid_job(fleet: Fleet, store: Store, publisher: JobPublisher,
                        server: OpenAIServer, session_id: str) -> tuple[float, float]:
    """SIGKILL the main process of the worker running the session's job; the seconds
    until the job runs again on another worker, and until the session is compacted."""
    task_id = start_hung_job(publisher, server, session_id, store)
    doomed = fleet.holder(store, session_id)
    assert doomed is not None and doomed.process is not None
    os.kill(doomed.process.pid, signal.SIGKILL)  # its pool child dies with it (pdeathsig)
    killed = datetime.now(UTC)
    reruns: list[datetime] = []

    def rerun_seen() -> bool:
        reruns.extend(rerun_started(store, session_id, task_id))
        return bool(reruns)

    try:
        wait_until(rerun_seen, timeout_s=120)
    except TimeoutError as exc:
        raise AssertionError(fleet.diagnosis(store, session_id, task_id)) from exc
    rerun_s = (min(reruns) - killed).total_seconds()
    wait_until(lambda: bool(store.revisions(session_id)), timeout_s=60)
    compacted_s = (datetime.now(UTC) - killed).total_seconds()
    assert doomed.process.poll() is not None
    fleet.start_worker()  # two workers again for the next kill
    return rerun_s, compacted_s


@pytest.mark.timeout(900)
def test_a_killed_worker_s_job_runs_again_on_another_within_a_minute_at_the_defaults(
    pg_store: Store, fleet: Fleet, server: OpenAIServer, fleet_env: JobEnv,
) -> None:
    sessions = [f"worker-kill-{n}" for n in range(WORKER_KILLS)]
    import_records(pg_store, [generated_session(s, 40) for s in sessions])
    publisher = JobPublisher(fleet_env.settings)
    fleet.start_worker()
    fleet.start_worker()
    fleet.start_beat()

    timings = [kill_worker_mid_job(fleet, pg_store, publisher, server, session_id)
               for session_id in sessions]
    rerun_s = [rerun for rerun, _ in timings]
    compacted_s = [compacted for _, compacted in timings]

    publisher.close()
    for session_id in sessions:
        runs = pg_store.runs(session_id=session_id)
        assert sorted((r.outcome, r.figures["outcome_reason"]) for r in runs) == [
            ("compacted", "over_trigger"), ("failed", "worker_lost")], runs
        assert len(pg_store.revisions(session_id)) == 1
        assert projection_violations(pg_store, session_id) == []
    median_s = statistics.median(rerun_s)
    assert median_s <= 60, rerun_s
    print(f"{WORKER_KILLS} workers SIGKILLed mid-job (lease TTL "
          f"{fleet_env.settings.lease_ttl_s} s, heartbeat and quick sweep every "
          f"{fleet_env.settings.effective_lease_heartbeat_s:.0f} s): job running again on "
          f"another worker after {', '.join(f'{s:.1f}' for s in rerun_s)} s (median "
          f"{median_s:.1f} s, max {max(rerun_s):.1f} s); compacted after median "
          f"{statistics.median(compacted_s):.1f} s")


@pytest.mark.timeout(600)
def test_a_stalled_worker_whose_job_ran_again_elsewhere_cannot_swap_when_it_resumes(
    pg_store: Store, fleet: Fleet, server: OpenAIServer, fleet_env: JobEnv,
) -> None:
    session_id = "stalled"
    import_records(pg_store, [generated_session(session_id, 40)])
    publisher = JobPublisher(fleet_env.settings)
    fleet.start_worker()
    fleet.start_worker()
    fleet.start_beat()
    task_id = start_hung_job(publisher, server, session_id, pg_store, behaviour="latency")
    publisher.close()
    stalled = fleet.holder(pg_store, session_id)
    assert stalled is not None and stalled.process is not None
    # Stopped mid-call, its reply due in 3 s: it swaps as soon as it resumes, unless its
    # lease is gone (no heartbeat renews it meanwhile).
    os.killpg(stalled.process.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: bool(pg_store.revisions(session_id)), timeout_s=120)
    finally:
        os.killpg(stalled.process.pid, signal.SIGCONT)

    wait_until(lambda: any(e["task_id"] == task_id for e in stalled.events("compaction.job")))
    [own] = [e for e in stalled.events("compaction.job") if e["task_id"] == task_id]
    assert (own["outcome"], own["reason"]) == ("conflict", "lease_lost"), own
    [revision] = pg_store.revisions(session_id)
    assert pg_store.get_session(session_id).active_revision_id == revision.id
    runs = sorted((r.task_id == task_id, r.outcome, r.figures["outcome_reason"])
                  for r in pg_store.runs(session_id=session_id))
    assert runs == [(False, "compacted", "over_trigger"), (True, "conflict", "lease_lost"),
                    (True, "failed", "worker_lost")]
    assert projection_violations(pg_store, session_id) == []
