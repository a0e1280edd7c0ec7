"""``python -m tests.chaos.outage --service redis|postgres --minutes 10``: one long outage,
measured. A real worker and a real beat (its reconciler every ``--reconcile-interval-s``)
with production retry and lease settings, against a private redis-server or PostgreSQL
taken down for ``--minutes`` while jobs run (and, for Redis, while others are queued: it
restarts empty, as a broker without persistence does). After recovery nothing is done by
hand; the run measures the time until every due session is compacted, in reconciler
periods, then checks that no marker, lease or broker message is left, that every attempt
has one run and one event, and that no session ends breaker-open. Exits 1 on any
violation, or when the sessions waited longer than one reconciler period (and a
reconnect) beyond the backlog's own work.

The 45-second version of each outage is a test (``tests/e2e/test_outages.py``); ten
minutes of one is not.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from db import Store, create_db_engine, upgrade_database
from tests.chaos import endstate
from tests.chaos.beat import BeatProcess
from tests.chaos.invariants import Verdict
from tests.support.chaos import PrivateRedis
from tests.support.cli import Compactor
from tests.support.e2e import JobEnv, build_job_env, compacted_sessions, import_records
from tests.support.generated import generated_session
from tests.support.openai_server import OpenAIServer
from tests.support.private_postgres import PrivatePostgres
from tests.support.worker_process import WorkerProcess

RECONCILE_GRACE_S = 60
# Production values where they decide how an outage is lived through (worker/settings/config.py
# defaults): the retry window and backoff, the lease TTL, the visibility timeout, the
# job time limits, the reconciler's grace and the breakers' thresholds. Only the LLM
# side stays the tests' (a small window, short LLM timeouts: JOB_DEFAULTS).
PRODUCTION_LIKE: dict[str, Any] = {
    "retry_window_s": 3_600,
    "retry_backoff_max_s": 600,
    "max_transient_retries": 20,
    "max_deliveries": 5,
    "lease_ttl_s": 90,
    "broker_visibility_timeout_s": 3_600,
    "task_soft_time_limit_s": 1_800,
    "task_hard_time_limit_s": 1_860,
    "reconcile_grace_s": RECONCILE_GRACE_S,
    "breaker_threshold": 3,
    "provider_breaker_threshold": 5,
    "quiet_period_s": 0,  # the sessions were just imported
}
CONCURRENCY = 2
TURNS = 40  # over the trigger of the tests' 6,000-token window
# Recovery is the backlog's own work (its jobs' durations over the pool) and the wait
# for it to start: at most one reconciler period, and the worker's and beat's reconnect
# (kombu retries a lost broker every 2 s more, up to 10 s apart here).
RECONNECT_ALLOWANCE_S = 10.0
JOB_ALLOWANCE_CALLS = 4  # llm_max_calls_per_job of the tests' settings


@dataclass(frozen=True)
class OutageConfig:
    service: str
    minutes: float
    reconcile_interval_s: int
    sessions: int
    llm_latency_ms: int
    work_dir: Path


@dataclass
class OutageReport:
    config: OutageConfig
    outage_s: float = 0.0
    running_at_start: int = 0
    queued_at_start: int = 0
    compacted_at_start: int = 0
    failed_during: Counter[str] = field(default_factory=Counter)
    recovery_s: float | None = None
    backlog_work_s: float = 0.0  # the jobs run after recovery, over the worker's pool
    repairs: Counter[str] = field(default_factory=Counter)
    runs_written_later: int = 0  # attempts' runs the reconciler wrote once PostgreSQL was back
    job_outcomes: Counter[str] = field(default_factory=Counter)
    worker_restarts: int = 0
    beat_restarts: int = 0
    load: list[tuple[float, float, float]] = field(default_factory=list)
    verdict: Verdict = field(default_factory=Verdict)

    @property
    def waiting_s(self) -> float | None:
        """Recovery less the backlog's own work: what the reconciler and the retries
        made the sessions wait."""
        return None if self.recovery_s is None else self.recovery_s - self.backlog_work_s

    @property
    def allowed_waiting_s(self) -> float:
        """One reconciler period and a reconnect; in a run shorter than the reconciler's
        grace also what is left of the grace (the markers are as old as the outage)."""
        grace_left = max(0.0, RECONCILE_GRACE_S - self.outage_s)
        return self.config.reconcile_interval_s + RECONNECT_ALLOWANCE_S + grace_left

    @property
    def ok(self) -> bool:
        return (not self.verdict.violations and self.waiting_s is not None
                and self.waiting_s <= self.allowed_waiting_s)

    def lines(self) -> list[str]:
        period = self.config.reconcile_interval_s
        recovery = ("not within the wait" if self.recovery_s is None else
                    f"{self.recovery_s:.1f} s = {self.recovery_s / period:.2f} reconciler "
                    f"periods")
        return [
            f"outage: {self.config.service} down {self.outage_s:.1f} s with "
            f"{self.running_at_start} jobs running, {self.queued_at_start} queued, "
            f"{self.compacted_at_start}/{self.config.sessions} sessions compacted before",
            f"failed attempts during it: {sum(self.failed_during.values())} "
            f"({dict(self.failed_during) or 'none'})",
            f"recovery (service back -> every due session compacted): {recovery}",
            f"of which the backlog's own work: {self.backlog_work_s:.1f} s (job durations / "
            f"{CONCURRENCY} pool processes); waiting: "
            + ("-" if self.waiting_s is None else
               f"{self.waiting_s:.1f} s = {self.waiting_s / period:.2f} periods"),
            f"reconciler period: {period} s (waiting allowed: "
            f"{self.allowed_waiting_s:.0f} s, one period, a reconnect and any grace left; "
            f"reconcile grace {RECONCILE_GRACE_S} s)",
            f"repairs by kind: {dict(self.repairs) or 'none'}; runs written later by the "
            f"reconciler: {self.runs_written_later}",
            f"job outcomes: {dict(self.job_outcomes)}",
            f"worker restarts: {self.worker_restarts}, beat restarts: {self.beat_restarts}",
            "load (1, 5, 15 min) at start, recovery, end: "
            + "; ".join(" ".join(f"{x:.2f}" for x in load) for load in self.load),
            f"violations: {sum(self.verdict.violation_kinds.values())} "
            f"{dict(self.verdict.violation_kinds) or ''}",
            *self.verdict.examples(per_kind=3),
        ]


class Processes:
    """The worker (started again if it exits: a supervisor's restart, not a person's)
    and the beat of one run."""

    def __init__(self, env: JobEnv, work_dir: Path) -> None:
        self.env = env
        self.work_dir = work_dir
        self.worker: WorkerProcess | None = None
        self.workers_started = 0
        self.beat = BeatProcess({**env.env, "COMPACTOR_DATA_DIR": str(work_dir / "beat")},
                                work_dir / "beat.log")

    def start_worker(self) -> None:
        self.workers_started += 1
        self.worker = WorkerProcess(self.env.env,
                                    self.work_dir / f"worker-{self.workers_started}.log",
                                    concurrency=CONCURRENCY, queue=self.env.queue)
        # A worker that starts while a service is still down may take long to be ready.
        self.worker.start(timeout_s=900)

    def restart_crashed(self) -> None:
        self.beat.restart_crashed()
        if self.worker is not None and self.worker.process is not None \
                and self.worker.process.poll() is not None:
            self.start_worker()

    def job_events(self) -> list[dict[str, Any]]:
        return endstate.read_worker_logs(self.work_dir).job_events

    def stop(self) -> None:
        self.beat.stop()
        if self.worker is not None:
            self.worker.stop(timeout_s=60)


def wait_for(condition: Any, timeout_s: float, processes: Processes) -> bool:
    """Poll ``condition`` until it holds, restarting a crashed worker or beat meanwhile;
    False after ``timeout_s``. An error counts as False (the service may still be coming
    back); each kind is printed once."""
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    while time.monotonic() < deadline:
        processes.restart_crashed()
        try:
            if condition():
                return True
        except Exception as exc:
            kind = f"{type(exc).__name__}: {str(exc)[:200]}"
            if kind not in seen:
                seen.add(kind)
                print(f"while waiting: {kind}", file=sys.stderr, flush=True)
        time.sleep(0.5)
    return False


def sleep_through(seconds: float, processes: Processes) -> None:
    wait_for(lambda: False, seconds, processes)


def run_outage(config: OutageConfig) -> OutageReport:
    report = OutageReport(config, load=[os.getloadavg()])
    with contextlib.ExitStack() as stack:
        private_redis = stack.enter_context(PrivateRedis(config.work_dir))
        postgres = stack.enter_context(PrivatePostgres())
        server = stack.enter_context(OpenAIServer(behaviour="latency",
                                                 latency_ms=config.llm_latency_ms))
        upgrade_database(postgres.url)
        env = build_job_env(postgres.url, server.base_url, redis_url=private_redis.url,
                            reconcile_interval_s=config.reconcile_interval_s,
                            **PRODUCTION_LIKE)
        engine = create_db_engine(postgres.url)
        stack.callback(engine.dispose)
        store = Store(engine)
        session_ids = [f"due-{n}" for n in range(config.sessions)]
        import_records(store, [generated_session(s, TURNS) for s in session_ids])
        processes = Processes(env, config.work_dir)
        stack.callback(processes.stop)
        processes.start_worker()
        processes.beat.start()
        scanned = Compactor(env.env).subprocess("scan", "--json")
        if scanned.returncode != 0:
            raise RuntimeError(f"scan failed: {scanned.stderr}")

        def leases() -> int:
            return sum(store.get_session(s).lease_owner is not None for s in session_ids)

        with redis.Redis.from_url(private_redis.url) as client:
            queue_key = f"{env.prefix}{env.queue}"
            if not wait_for(lambda: leases() == CONCURRENCY and client.llen(queue_key) > 0,
                            120, processes):
                raise RuntimeError("never saw jobs running with others queued")
            report.running_at_start = leases()
            report.queued_at_start = int(client.llen(queue_key))
        report.compacted_at_start = len(compacted_sessions(store))
        events_before = len(processes.job_events())

        began = time.monotonic()
        (private_redis.stop if config.service == "redis" else postgres.stop)()
        sleep_through(config.minutes * 60, processes)
        (private_redis.start if config.service == "redis" else postgres.start)()
        recovered = time.monotonic()
        report.outage_s = recovered - began
        during = processes.job_events()[events_before:]
        events_at_recovery = len(processes.job_events())
        report.failed_during = Counter(str(e.get("reason")) for e in during
                                       if e["outcome"] == "failed")

        # Three periods and the whole backlog run one job at a time: far beyond a pass.
        wait_s = 3 * config.reconcile_interval_s + config.sessions * (
            JOB_ALLOWANCE_CALLS * config.llm_latency_ms / 1000)
        if wait_for(lambda: compacted_sessions(store) >= set(session_ids), wait_s, processes):
            report.recovery_s = time.monotonic() - recovered
        report.backlog_work_s = sum(
            float(e.get("duration_ms") or 0) for e in processes.job_events()[events_at_recovery:]
        ) / 1000 / CONCURRENCY
        report.load.append(os.getloadavg())

        def settled() -> bool:
            sessions = [store.get_session(s) for s in session_ids]
            verdict = Verdict()
            endstate.check_attempts(verdict, processes.job_events(), endstate.all_runs(engine),
                                    set())
            return verdict.violations == [] and all(
                s.queued_job_id is None and s.lease_owner is None for s in sessions)

        wait_for(settled, 2 * config.reconcile_interval_s + 60, processes)
        processes.stop()
        report.worker_restarts = processes.workers_started - 1
        report.beat_restarts = processes.beat.crashes
        check_end_state(report, store, engine, private_redis, env, session_ids)
        report.load.append(os.getloadavg())
    return report


def check_end_state(report: OutageReport, store: Store, engine: Any,
                    private_redis: PrivateRedis, env: JobEnv, session_ids: list[str]) -> None:
    logs = endstate.read_worker_logs(report.config.work_dir)
    report.repairs = logs.repairs
    report.runs_written_later = sum(int(e.get("runs_written", 0)) for e in worker_log_events(
        report.config.work_dir, "reconcile.attempts_recorded"))
    report.job_outcomes = Counter(str(e["outcome"]) for e in logs.job_events)
    verdict = report.verdict
    with redis.Redis.from_url(private_redis.url) as client:
        endstate.check_stranded(verdict, engine, client, env.prefix, env.queue)
    endstate.check_attempts(verdict, logs.job_events, endstate.all_runs(engine), set())
    states = {s: store.get_session(s) for s in session_ids}
    verdict.add("breaker_open", [f"{s}: breaker {state.breaker_state}"
                                 for s, state in states.items()
                                 if state.breaker_state != "closed"])
    verdict.add("not_compacted", sorted(set(session_ids) - compacted_sessions(store)))
    verdict.add("torn_log_lines", [f"{logs.torn} torn worker log lines"] if logs.torn else [])


def worker_log_events(work_dir: Path, name: str) -> list[dict[str, Any]]:
    """The events called ``name`` in every worker's log (a torn line is skipped)."""
    found = []
    for path in sorted(work_dir.glob("worker-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("event") == name:
                    found.append(event)
    return found


def parse_config(argv: list[str] | None) -> OutageConfig:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.outage", description=__doc__)
    parser.add_argument("--service", choices=("redis", "postgres"), required=True)
    parser.add_argument("--minutes", type=float, default=10.0, help="outage length (min)")
    parser.add_argument("--reconcile-interval-s", type=int, default=60,
                        help="the beat's reconciler period (production: 300 s)")
    parser.add_argument("--sessions", type=int, default=12, help="due sessions")
    parser.add_argument("--llm-latency-ms", type=int, default=8_000,
                        help="each LLM call's latency: keeps jobs running at the outage")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="keeps the worker and beat logs (default: a temporary directory)")
    args = parser.parse_args(argv)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="outage-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    return OutageConfig(args.service, args.minutes, args.reconcile_interval_s, args.sessions,
                        args.llm_latency_ms, work_dir)


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    print(f"outage run: {' '.join(sys.argv)}", flush=True)
    print(f"machine: {platform.node()}, python {platform.python_version()}, logs in "
          f"{config.work_dir}", flush=True)
    report = run_outage(config)
    print("\n".join(report.lines()))
    print("RESULT:", "PASS" if report.ok else "FAIL")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
