"""One chaos run: import sessions, start the workers and a real beat (scanning and
collecting garbage every minute); in the chaos phase keep appending (to idle sessions
the gc may erase, too) while workers are SIGKILLed (pool children, whole workers, and
processes caught inside a swap transaction), Redis and PostgreSQL are restarted,
PostgreSQL is hung and its connections dropped, and poison is pushed into the queue; in
the quiet phase let the queue drain; then check every session and the end state of the
whole system."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import redis
from sqlalchemy import func, or_, select

from db import Store, create_db_engine
from db.models import RevisionRow, RunRow, SessionRow
from scheduler.enqueue import CeleryPublisher
from scheduler.selection import ScanPolicy
from tests.chaos import endstate
from tests.chaos.beat import BeatProcess
from tests.chaos.config import ChaosConfig
from tests.chaos.fleet import WORKER_APP_NAME, Fleet
from tests.chaos.invariants import Verdict, check_all_sessions
from tests.chaos.monkey import Monkey
from tests.chaos.poison import Poisoner
from tests.chaos.retention import (
    GC_BATCH_SIZE,
    SESSION_RETENTION_S,
    RetentionLedger,
    count_gc_runs,
    count_idle_left,
    find_erased_appends,
    import_idle_sessions,
    start_idle_traffic,
    wait_for_gc,
)
from tests.chaos.services import Services, admin_engine, start_services
from tests.chaos.traffic import Appender, Ledger, import_run_sessions, scan_once
from tests.support.e2e import JobEnv, build_job_env
from worker.broker.celery_app import create_app
from worker.compaction.tokens import TokenCounter
from worker.shared_state.keys import RedisKeys
from worker.tokenizer.offline import load_encoding

MODEL_CONTEXT_TOKENS = 4_000  # trigger 2,800 tokens; sessions start at 3,400-4,300
TAIL_BUDGET_TOKENS = 500
RETRY_WINDOW_S = 120  # retries outlast any one outage of the run (a 20 s hang, a restart)
GC_WAIT_S = 150.0  # after the quiet phase, for the beat's gc to meet the idle appenders


@dataclass
class ChaosReport:
    """The counts of a run and the verdict of its checks."""

    config: ChaosConfig
    counts: dict[str, Any] = field(default_factory=dict)
    verdict: Verdict = field(default_factory=Verdict)

    @property
    def kills(self) -> int:
        return int(self.counts.get("kills", 0))

    @property
    def ok(self) -> bool:
        return not self.verdict.violations and self.kills >= self.config.kills

    def lines(self) -> list[str]:
        verdict = self.verdict
        rows = [*self.counts.items(),
                ("revisions", verdict.revisions),
                ("runs by outcome", dict(sorted(verdict.runs.items()))),
                ("sessions by ending", dict(sorted(verdict.endings.items()))),
                ("sessions over the trigger at the end", verdict.over_trigger_at_end),
                ("violations by kind", dict(verdict.violation_kinds) or "none"),
                ("violations", len(verdict.violations))]
        lines = [f"{name:<40} {value}" for name, value in rows]
        return lines + [f"  violation: {v}" for v in verdict.examples(per_kind=3)]


def job_env_for(services: Services, config: ChaosConfig) -> JobEnv:
    """The workers' and beat's settings: small windows, short leases, database calls
    cut off after 8 s (a PostgreSQL hang fails them), retries spread over two minutes, a
    private Redis and PostgreSQL, a scan every minute that skips no recently appended
    session, the reconciler every ``reconcile_interval_s``, gc every minute with a
    session retention (``tests/chaos/retention.py``), and the production queue-marker
    TTL (a lost job's marker strands its session unless the reconciler repairs it)."""
    return build_job_env(
        services.database_url_as(WORKER_APP_NAME), services.llm_base_url,
        redis_url=services.redis.url, model_context_tokens=MODEL_CONTEXT_TOKENS,
        tail_budget_tokens=TAIL_BUDGET_TOKENS, lease_ttl_s=15, max_transient_retries=20,
        retry_window_s=RETRY_WINDOW_S, retry_backoff_max_s=5, max_deliveries=4,
        db_statement_timeout_s=5, db_call_timeout_s=8,
        quiet_period_s=0, scan_cron=config.scan_cron,
        reconcile_interval_s=config.reconcile_interval_s,
        reconcile_grace_s=config.reconcile_grace_s, gc_cron=config.scan_cron,
        gc_session_retention_s=SESSION_RETENTION_S, gc_batch_size=GC_BATCH_SIZE,
        data_dir=config.work_dir / "beat")


def scan_policy(env: JobEnv, *, marker_ttl_s: float) -> ScanPolicy:
    settings = env.settings
    return ScanPolicy(trigger_tokens=settings.trigger_tokens, dirty_ratio=settings.dirty_ratio,
                      tail_budget_tokens=settings.tail_budget_tokens, quiet_period_s=0,
                      breaker_cooldown_s=settings.breaker_cooldown_s,
                      marker_ttl_s=marker_ttl_s, batch_size=100, max_jobs=24)


def run_chaos(config: ChaosConfig) -> ChaosReport:
    """Run the whole chaos suite once and return its report."""
    report = ChaosReport(config)
    with ExitStack() as stack:
        services = stack.enter_context(start_services(config.work_dir,
                                                      llm_latency_ms=config.llm_latency_ms))
        run = ChaosRun(config, services, report, stack)
        run.execute()
    return report


class ChaosRun:
    """The state of one run between its phases."""

    def __init__(self, config: ChaosConfig, services: Services, report: ChaosReport,
                 stack: ExitStack) -> None:
        self.config, self.services, self.report = config, services, report
        self.logs = endstate.WorkerLogs([], 0, Counter(), 0, Counter())
        self.not_rerun = 0
        self.env = job_env_for(services, config)
        engines = [create_db_engine(services.database_url_as(name))
                   for name in ("chaos-driver", "chaos-sniper")]
        admin = admin_engine(services.database_url_as("chaos-admin"))
        for engine in (*engines, admin):
            stack.callback(engine.dispose)
        self.engine, sniper = engines
        self.store = Store(self.engine)
        self.ledger = Ledger()
        self.fleet = Fleet(self.env.env, config.work_dir, workers=config.workers,
                           concurrency=config.concurrency, rng=random.Random(config.seed + 2))
        stack.callback(self.fleet.stop)
        app = create_app(self.env.settings)
        stack.callback(app.close)
        self.publisher = CeleryPublisher(app, self.env.queue)
        self.redis = redis.Redis.from_url(services.redis.url, socket_timeout=5)
        stack.callback(self.redis.close)
        self.poisoner = Poisoner(self.redis, self.env.queue,
                                 f"{self.env.prefix}{self.env.queue}")
        self.beat = BeatProcess(self.env.env, config.work_dir / "beat.log")
        stack.callback(self.beat.stop)
        self.failing: set[str] = set()  # sessions whose every summary is malformed
        self.idle_ids: list[str] = []  # sessions the beat's gc may erase
        self.retention = RetentionLedger()
        self.monkey = Monkey(config, self.fleet, services, sniper, admin, self.poisoner,
                             self.healthy_sessions)

    def execute(self) -> None:
        counter = TokenCounter(load_encoding("o200k_base"))
        failing = self.failing = import_run_sessions(self.store, self.ledger, counter,
                                                     self.config)
        self.idle_ids = import_idle_sessions(self.store, self.config.idle_sessions)
        self.fleet.start_all()
        self.beat.start()  # its first scan is at the next minute: start with one now
        scan_once(self.store, self.publisher, scan_policy(
            self.env, marker_ttl_s=self.env.settings.enqueue_marker_ttl_s))
        began = time.monotonic()
        idle_stop = threading.Event()
        watch, idle_traffic = start_idle_traffic(
            self.store, self.engine, self.idle_ids, self.retention, idle_stop,
            appenders=self.config.idle_appenders, seed=self.config.seed)
        try:
            self.chaos_phase(counter)
            chaos_s = time.monotonic() - began
            rounds = self.quiet_phase()
            drain_s = time.monotonic() - began - chaos_s
            # The beat's gc waits behind the jobs queued before it: it may come late.
            wait_for_gc(watch, GC_WAIT_S)
        finally:
            idle_stop.set()
            for thread in idle_traffic:
                thread.join(120)
        self.beat.stop()
        verdict = self.report.verdict = check_all_sessions(
            self.store, self.ledger, never_compacted=failing,
            trigger_tokens=self.env.settings.trigger_tokens)
        for log_path in self.fleet.crashes:
            verdict.add("worker_crashes", [f"a worker exited unkilled: {log_path}"])
        verdict.add("beat_crashes", [f"the beat exited unkilled: {self.beat.log_path}"]
                    * self.beat.crashes)
        verdict.add("acknowledged_appends_erased",
                    find_erased_appends(self.store, self.retention))
        delays = self.check_end_state(counter, failing)
        self.count(failing, rounds, chaos_s, drain_s, delays)
        (self.config.work_dir / "violations.txt").write_text(
            "".join(f"{v}\n" for v in verdict.violations))

    def check_end_state(self, counter: TokenCounter, failing: set[str]) -> list[float]:
        """The whole-system checks (``endstate.py``); returns each killed job's wait."""
        verdict, settings = self.report.verdict, self.env.settings
        endstate.check_stranded(verdict, self.engine, self.redis, self.env.prefix,
                                self.env.queue)
        logs = self.logs = endstate.read_worker_logs(self.config.work_dir)
        events = logs.job_events
        runs = endstate.all_runs(self.engine)
        poison_ids = endstate.check_poison(verdict, events, self.poisoner, self.env.queue,
                                           runs)
        endstate.check_attempts(verdict, events, runs, poison_ids)
        endstate.check_healthy_compacted(verdict, verdict.session_endings, failing)
        endstate.check_token_counts(verdict, self.store, counter, self.ledger.session_ids())
        endstate.check_llm_calls(verdict, runs, settings.llm_max_calls_per_job)
        delays, self.not_rerun = endstate.rerun_delays(self.monkey.killed_jobs, runs)
        return delays

    def chaos_phase(self, counter: TokenCounter) -> None:
        stop = threading.Event()
        ids = self.ledger.session_ids()
        appenders = [Appender(f"appender{n}", self.store, counter, self.ledger,
                              ids[n::self.config.appenders], stop,
                              pause_s=self.config.append_pause_s,
                              rng=random.Random(self.config.seed * 10 + n))
                     for n in range(self.config.appenders)]
        for thread in appenders:
            thread.start()
        try:
            self.monkey.run(time.monotonic(), on_wait=self.beat.restart_crashed)
        finally:
            stop.set()
            for thread in appenders:
                thread.join(120)

    def quiet_phase(self) -> int:
        """Scan (as the beat does, with the production marker TTL), let what it enqueued
        run, and again, until two rounds in a row change nothing: the scan found nothing
        due, or every job it sent was skipped (a session whose instructions, summary and
        tail alone exceed the trigger is skipped with ``nothing_to_summarize`` each
        time). Returns the rounds it took."""
        self.fleet.restart_crashed()
        self.fleet.wait_all_alive()
        settings = self.env.settings
        policy = scan_policy(self.env, marker_ttl_s=settings.enqueue_marker_ttl_s)
        deadline = time.monotonic() + self.config.drain_timeout_s
        rounds = idle = 0
        progress = self.progress()
        while idle < 2 and time.monotonic() < deadline:
            rounds += 1
            try:
                enqueued = scan_once(self.store, self.publisher, policy)
            except Exception:  # a store or broker still recovering: the next round retries
                enqueued = -1
            time.sleep(2.0)
            while self.busy() and time.monotonic() < deadline:
                time.sleep(0.5)
            progress, before = self.progress(), progress
            idle = idle + 1 if enqueued == 0 or progress == before else 0
        return rounds

    def healthy_sessions(self) -> list[str]:
        return [sid for sid in self.ledger.session_ids() if sid not in self.failing]

    def progress(self) -> tuple[int, int]:
        """Revisions, and runs that changed something (all but skips)."""
        with self.engine.connect() as conn:
            revisions = conn.execute(select(func.count()).select_from(RevisionRow)).scalar_one()
            runs = conn.execute(select(func.count()).select_from(RunRow)
                                .where(RunRow.outcome != "skipped")).scalar_one()
        return int(revisions), int(runs)

    def queue_length(self) -> int:
        return int(self.redis.llen(f"{self.env.prefix}{self.env.queue}"))

    def busy(self) -> bool:
        """Work is queued, running, or owed: a message is queued or unacknowledged (a
        killed delivery whose job the reconciler re-sent stays there until the visibility
        timeout restores it and it runs), a queue marker or a lease is held (one a lost
        job left is the reconciler's to repair), or an attempt's run or event is owed
        (``worker/shared_state/attempt_journal.py``: the reconciler writes or reports it). The run
        waits, up to the drain timeout."""
        keys = RedisKeys(self.env.prefix)
        if (self.queue_length() or self.redis.hlen(f"{self.env.prefix}unacked")
                or self.redis.llen(keys.unrecorded_runs())
                or self.redis.hlen(keys.pending_events())):
            return True
        with self.engine.connect() as conn:
            held = conn.execute(select(func.count()).select_from(SessionRow).where(
                or_(SessionRow.queued_job_id.is_not(None),
                    SessionRow.lease_owner.is_not(None)))).scalar_one()
        return bool(held)

    def count(self, failing: set[str], rounds: int, chaos_s: float, drain_s: float,
              delays: list[float]) -> None:
        kills: Counter[str] = self.fleet.kills
        ledger, monkey = self.ledger, self.monkey
        self.report.counts = {
            "sessions": len(ledger.session_ids()),
            "sessions failing on purpose": len(failing),
            "appended messages": ledger.appended_messages,
            "append batches": ledger.appended_batches,
            "appends resolved by reading back": ledger.unsure_appends,
            "appends leaving tool calls open": ledger.open_call_batches,
            "racing answers (lost, refused)": f"{ledger.races} ({ledger.races_lost})",
            "kills": sum(kills.values()),
            "kills by kind": dict(sorted(kills.items())),
            "worker crashes (exited unkilled)": len(self.fleet.crashes),
            "swap watches": monkey.swap_watches,
            "swap transactions killed, by their end": dict(sorted(monkey.swap_kills.items())),
            "killed jobs (a lease named the process)": len(monkey.killed_jobs),
            "death to running again": endstate.delay_summary(delays),
            "killed jobs not run again (work done)": self.not_rerun,
            "redis restarts": self.services.redis.restarts,
            "pg restarts": self.services.postgres.restarts,
            "pg hangs": f"{self.services.postgres.hangs} x {self.config.pg_hang_s:.0f} s",
            "pg connection drops": monkey.pg_drops,
            "pg backends terminated": monkey.backends_terminated,
            "poison items pushed": self.poisoner.items,
            "beat restarts (exited unkilled)": self.beat.crashes,
            "beat's compactor.scan started on a worker": self.logs.scans_started,
            "beat's scans by ending": dict(sorted(self.logs.scan_endings.items())) or "none",
            "reconciler repairs": dict(sorted(self.logs.repairs.items())) or "none",
            "torn log lines (killed mid-write)": self.logs.torn,
            "beat's gc runs (lifecycle.gc events)": count_gc_runs(self.config.work_dir),
            "idle sessions erased by gc": len(self.idle_ids) - count_idle_left(self.engine),
            "appends to idle sessions (acknowledged, during gc, refused, unsure)":
                f"{len(self.retention.acknowledged)} ({self.retention.during_gc}, "
                f"{self.retention.refused}, {self.retention.unsure})",
            "quiet-phase scan rounds": rounds,
            "chaos phase s": round(chaos_s, 1),
            "quiet phase s": round(drain_s, 1),
        }
