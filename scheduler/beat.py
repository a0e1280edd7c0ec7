"""The nightly scan: the ``compactor.scan`` task, its beat schedule, and the Redis lock
that keeps two beat processes (started by mistake) from scanning at the same time.

The lock only saves a second pass over the sessions; the conditional UPDATE of each
session's queue marker is what enqueues every due session once. The tasks that run it on
a worker are registered by ``scheduler/tasks.py``, which imports this module on a task's
first run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from celery import Celery
from celery.schedules import crontab
from redis.exceptions import LockNotOwnedError
from redis.lock import Lock

from db import Store
from scheduler.enqueue import Publisher, ScanReport, run_scan
from scheduler.publisher import RedisPublisher
from scheduler.selection import ScanPolicy
from worker.broker.contract import (
    GC_TASK_NAME,
    POLL_BATCHES_TASK_NAME,
    RECONCILE_TASK_NAME,
    SCAN_TASK_NAME,
)
from worker.logging import get_logger
from worker.platform.lifecycle import collect_garbage, gc_policy
from worker.settings.config import Settings, get_settings
from worker.settings.core import LLMMode
from worker.shared_state.connection import connect_redis
from worker.shared_state.keys import RedisKeys

SCAN_ENTRY_NAME = "compactor-nightly-scan"
GC_ENTRY_NAME = "compactor-gc"
RECONCILE_ENTRY_NAME = "compactor-reconcile"
POLL_BATCHES_ENTRY_NAME = "compactor-poll-batches"
LEASE_SWEEP_ENTRY_NAME = "compactor-lease-sweep"
BEAT_SCHEDULE_FILENAME = "beat-schedule"
# Refreshed after every page, so it only has to outlast one page; a scanner that dies
# frees the lock within this time.
SCAN_LOCK_TTL_S = 600
# Each lock command is one round trip: a Redis that does not answer in this is down.
REDIS_TIMEOUT_S = 10.0


def scan_policy(settings: Settings) -> ScanPolicy:
    """The plain scan values of the settings."""
    return ScanPolicy(
        trigger_tokens=settings.trigger_tokens,
        dirty_ratio=settings.dirty_ratio,
        tail_budget_tokens=settings.tail_budget_tokens,
        quiet_period_s=settings.quiet_period_s,
        breaker_cooldown_s=settings.breaker_cooldown_s,
        marker_ttl_s=settings.enqueue_marker_ttl_s,
        batch_size=settings.scan_batch_size,
        max_jobs=settings.scan_max_jobs,
        token_budget=settings.scan_token_budget,
    )


def scan_crontab(expression: str, setting: str = "scan_cron") -> crontab:
    """Parse a five-field cron expression (UTC); ValueError names the setting and the bad
    expression."""
    try:
        return crontab.from_string(expression)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"invalid {setting} {expression!r}: {exc}") from exc


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """The beat schedule: one scan at ``scan_cron``, the reconciler every
    ``reconcile_interval_s`` and its quick sweep of dead leases every lease heartbeat
    (both while the reconciler is on), the batch poller every ``batch_poll_interval_s`` in
    batch mode, and garbage collection at ``gc_cron`` when set,
    all on the jobs' queue."""
    schedule = {
        SCAN_ENTRY_NAME: {
            "task": SCAN_TASK_NAME,
            "schedule": scan_crontab(settings.scan_cron),
            "options": {"queue": settings.queue_name},
        }
    }
    if settings.reconcile_interval_s:
        schedule[RECONCILE_ENTRY_NAME] = {
            "task": RECONCILE_TASK_NAME,
            "schedule": timedelta(seconds=settings.reconcile_interval_s),
            "options": {"queue": settings.queue_name},
        }
        schedule[LEASE_SWEEP_ENTRY_NAME] = {
            "task": RECONCILE_TASK_NAME,
            "schedule": timedelta(seconds=settings.effective_lease_heartbeat_s),
            "kwargs": {"leases_only": True},
            "options": {"queue": settings.queue_name},
        }
    if settings.llm_mode is LLMMode.BATCH:
        schedule[POLL_BATCHES_ENTRY_NAME] = {
            "task": POLL_BATCHES_TASK_NAME,
            "schedule": timedelta(seconds=settings.batch_poll_interval_s),
            "options": {"queue": settings.queue_name},
        }
    if settings.gc_cron:
        schedule[GC_ENTRY_NAME] = {
            "task": GC_TASK_NAME,
            "schedule": scan_crontab(settings.gc_cron, "gc_cron"),
            "options": {"queue": settings.queue_name},
        }
    return schedule


def start_beat(celery_app: Celery, settings: Settings) -> None:
    """Run the beat process in the foreground (its schedule file under ``data_dir``)."""
    celery_app.conf.beat_schedule = beat_schedule(settings)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    schedule_path = settings.data_dir / BEAT_SCHEDULE_FILENAME
    # quiet: Celery's banner is printed, not logged; logs are JSON lines only.
    # CatchUpScheduler: a send that fails while Redis is down is retried until it goes out.
    celery_app.Beat(schedule=str(schedule_path), loglevel=settings.log_level, quiet=True,
                    scheduler="scheduler.catch_up:CatchUpScheduler").run()


def scan_lock(client: redis.Redis, keys: RedisKeys, ttl_s: float = SCAN_LOCK_TTL_S) -> Lock:
    """The scan's lock: redis-py's token lock (SET NX PX, freed and extended only by its
    owner), taken without waiting, and expiring ``ttl_s`` after its last refresh."""
    return Lock(client, keys.scan_lock(), timeout=ttl_s, blocking=False)


def run_locked_scan(
    store: Store, publisher: Publisher, policy: ScanPolicy, now: datetime, lock: Lock,
    *, limit: int | None = None, on_progress: Callable[[ScanReport], None] | None = None,
) -> ScanReport | None:
    """Run one scan under ``lock``; None when another scan holds it."""
    if not lock.acquire():
        get_logger().info("scan.skipped", reason="scan_lock_held", lock_key=lock.name)
        return None

    def after_page(report: ScanReport) -> None:
        try:
            lock.reacquire()
        except LockNotOwnedError:
            # The markers still dedup; a second scanner now only repeats reads.
            get_logger().warning("scan.lock_lost", lock_key=lock.name)
        if on_progress is not None:
            on_progress(report)

    try:
        return run_scan(store, publisher, policy, now, limit=limit, on_progress=after_page)
    finally:
        # A lock lost mid-scan is another scanner's now (or nobody's): leave it.
        with contextlib.suppress(LockNotOwnedError):
            lock.release()


def run_scheduled_scan(
    settings: Settings, now: datetime, *, limit: int | None = None,
    on_progress: Callable[[ScanReport], None] | None = None,
) -> ScanReport | None:
    """Scan under the lock with connections made from ``settings``, publishing each page
    in one pipelined write; None when another scan holds the lock. The entrypoint of the
    beat task and of ``compactor scan``."""
    store = Store.from_url(settings.effective_database_url,
                           sqlite_busy_timeout_ms=settings.sqlite_busy_timeout_ms,
                           call_timeout_s=settings.db_call_timeout_s)
    client = connect_redis(settings, timeout_s=REDIS_TIMEOUT_S)
    try:
        store.check_schema()
        lock = scan_lock(client, RedisKeys(settings.redis_key_prefix))
        publisher = RedisPublisher(client, settings.redis_key_prefix, settings.queue_name)
        return run_locked_scan(store, publisher, scan_policy(settings), now, lock,
                               limit=limit, on_progress=on_progress)
    finally:
        client.close()
        store.close()


def scan_and_report() -> str:
    """Enqueue the due sessions and log the scan's figures (the ``compactor.scan`` task).
    ``scan.started`` comes first: a scan whose process died or whose database hung leaves
    it without an ending."""
    get_logger().info("scan.started")
    report = run_scheduled_scan(get_settings(), datetime.now(UTC))
    if report is None:
        return "skipped"
    get_logger().info("scan.finished", enqueued=report.enqueued,
                      over_trigger=report.over_trigger, dirty=report.dirty,
                      lost_race=report.lost_race, estimated_tokens=report.estimated_tokens,
                      stopped=report.stopped)
    return "scanned"


def collect_garbage_now() -> str:
    """Remove superseded revisions and old runs (the ``compactor.gc`` task; logs
    ``lifecycle.gc``)."""
    settings = get_settings()
    store = Store.from_url(settings.effective_database_url,
                           sqlite_busy_timeout_ms=settings.sqlite_busy_timeout_ms,
                           call_timeout_s=settings.db_call_timeout_s)
    try:
        store.check_schema()
        collect_garbage(store, gc_policy(settings), datetime.now(UTC))
    finally:
        store.close()
    return "collected"
