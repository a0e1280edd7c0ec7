"""One chaos run: import sessions, start the workers; in the chaos phase keep appending
and scanning while workers are SIGKILLed (pool children, whole workers, and processes
caught inside a swap transaction), Redis is restarted and PostgreSQL connections are
dropped; in the quiet phase let the queue drain; then check every session."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis
from sqlalchemy import func, select

from db import Store, create_db_engine
from db.models import RevisionRow, RunRow, SessionRow
from scheduler.enqueue import CeleryPublisher
from scheduler.selection import ScanPolicy
from tests.chaos.config import ChaosConfig
from tests.chaos.fleet import WORKER_APP_NAME, Fleet
from tests.chaos.invariants import Verdict, check_all_sessions
from tests.chaos.monkey import Monkey
from tests.chaos.services import Services, admin_engine, start_services
from tests.chaos.traffic import Appender, Ledger, Scanner, import_run_sessions, scan_once
from tests.support.e2e import JobEnv, build_job_env
from worker.celery_app import create_app
from worker.compaction.tokens import TokenCounter, load_encoding

MODEL_CONTEXT_TOKENS = 4_000  # trigger 2,800 tokens; sessions start at 3,400-4,300
TAIL_BUDGET_TOKENS = 500
QUIET_MARKER_TTL_S = 2.0


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
        return lines + [f"  violation: {v}" for v in verdict.violations[:20]]


def job_env_for(services: Services) -> JobEnv:
    """The workers' settings: small windows, short leases and a private Redis."""
    return build_job_env(
        services.database_url_as(WORKER_APP_NAME), services.llm_base_url,
        redis_url=services.redis.url, model_context_tokens=MODEL_CONTEXT_TOKENS,
        tail_budget_tokens=TAIL_BUDGET_TOKENS, lease_ttl_s=15, max_transient_retries=3,
        max_deliveries=4)


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
        self.env = job_env_for(services)
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
        self.monkey = Monkey(config, self.fleet, services, sniper, admin)
        app = create_app(self.env.settings)
        stack.callback(app.close)
        self.publisher = CeleryPublisher(app, self.env.queue)
        self.redis = redis.Redis.from_url(services.redis.url, socket_timeout=5)
        stack.callback(self.redis.close)

    def execute(self) -> None:
        counter = TokenCounter(load_encoding("o200k_base"))
        failing = import_run_sessions(self.store, self.ledger, counter, self.config)
        self.fleet.start_all()
        began = time.monotonic()
        scanner = self.chaos_phase(counter)
        chaos_s = time.monotonic() - began
        rounds = self.quiet_phase()
        drain_s = time.monotonic() - began - chaos_s
        self.report.verdict = check_all_sessions(
            self.store, self.ledger, never_compacted=failing,
            trigger_tokens=self.env.settings.trigger_tokens)
        for log_path in self.fleet.crashes:
            self.report.verdict.add("worker_crashes", [f"a worker exited unkilled: {log_path}"])
        self.count(failing, scanner, rounds, chaos_s, drain_s)

    def chaos_phase(self, counter: TokenCounter) -> Scanner:
        stop = threading.Event()
        ids = self.ledger.session_ids()
        slots = self.config.workers * self.config.concurrency
        scanner = Scanner(self.store, self.publisher, scan_policy(self.env, marker_ttl_s=30),
                          stop, interval_s=1.0, queue_length=self.queue_length,
                          max_queued=2 * slots)
        appenders = [Appender(f"appender{n}", self.store, counter, self.ledger,
                              ids[n::self.config.appenders], stop,
                              pause_s=self.config.append_pause_s,
                              rng=random.Random(self.config.seed * 10 + n))
                     for n in range(self.config.appenders)]
        for thread in (scanner, *appenders):
            thread.start()
        try:
            self.monkey.run(time.monotonic())
        finally:
            stop.set()
            for thread in (scanner, *appenders):
                thread.join(30)
        return scanner

    def quiet_phase(self) -> int:
        """Scan, let what it enqueued run, and again, until two rounds in a row change
        nothing: the scan found nothing due, or every job it sent was skipped (a session
        whose instructions, summary and tail alone exceed the trigger is skipped with
        ``nothing_to_summarize`` each time). Returns the rounds it took."""
        self.fleet.restart_crashed()
        self.fleet.wait_all_alive()
        policy = scan_policy(self.env, marker_ttl_s=QUIET_MARKER_TTL_S)
        deadline = time.monotonic() + self.config.drain_timeout_s
        rounds = idle = 0
        progress = self.progress()
        while idle < 2 and time.monotonic() < deadline:
            rounds += 1
            enqueued = scan_once(self.store, self.publisher, policy)
            time.sleep(QUIET_MARKER_TTL_S + 0.5)
            while (self.queue_length() or self.leased_sessions()) and \
                    time.monotonic() < deadline:
                time.sleep(0.2)
            progress, before = self.progress(), progress
            idle = idle + 1 if enqueued == 0 or progress == before else 0
        return rounds

    def progress(self) -> tuple[int, int]:
        """Revisions, and runs that changed something (all but skips)."""
        with self.engine.connect() as conn:
            revisions = conn.execute(select(func.count()).select_from(RevisionRow)).scalar_one()
            runs = conn.execute(select(func.count()).select_from(RunRow)
                                .where(RunRow.outcome != "skipped")).scalar_one()
        return int(revisions), int(runs)

    def queue_length(self) -> int:
        return int(self.redis.llen(f"{self.env.prefix}{self.env.queue}"))

    def leased_sessions(self) -> int:
        now = datetime.now(UTC)
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(SessionRow)
                                    .where(SessionRow.lease_expires_at > now)).scalar_one())

    def count(self, failing: set[str], scanner: Scanner, rounds: int, chaos_s: float,
              drain_s: float) -> None:
        kills: Counter[str] = self.fleet.kills
        ledger, monkey = self.ledger, self.monkey
        self.report.counts = {
            "sessions": len(ledger.session_ids()),
            "sessions failing on purpose": len(failing),
            "appended messages": ledger.appended_messages,
            "append batches": ledger.appended_batches,
            "appends resolved by reading back": ledger.unsure_appends,
            "kills": sum(kills.values()),
            "kills by kind": dict(sorted(kills.items())),
            "worker crashes (exited unkilled)": len(self.fleet.crashes),
            "swap watches": monkey.swap_watches,
            "swap transactions killed, by their end": dict(sorted(monkey.swap_kills.items())),
            "redis restarts": self.services.redis.restarts,
            "pg connection drops": monkey.pg_drops,
            "pg backends terminated": monkey.backends_terminated,
            "jobs enqueued by scans (chaos phase)": scanner.enqueued,
            "scans failed during outages": scanner.errors,
            "quiet-phase scan rounds": rounds,
            "chaos phase s": round(chaos_s, 1),
            "quiet phase s": round(drain_s, 1),
        }
