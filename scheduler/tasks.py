"""The scheduler's tasks as a worker registers them: the scan, the reconciler's sweep,
garbage collection and the batch poller, each run on a worker when beat sends it.

Every worker registers them (the Celery app's ``include``), but few pool children ever
run one: each task imports its module on its first run, so a child that only compacts
holds none of the scheduler's code (~1.2 MiB of every child's baseline otherwise).
"""

from __future__ import annotations

from typing import Any, NoReturn

import redis

from db import StoreUnavailable
from worker.broker.celery_app import app
from worker.broker.contract import (
    GC_TASK_NAME,
    POLL_BATCHES_TASK_NAME,
    RECONCILE_TASK_NAME,
    SCAN_TASK_NAME,
)

# A scan or gc that meets an outage of the database or Redis runs again soon, with the
# jobs' backoff (capped by retry_backoff_max_s), instead of waiting for its next schedule,
# a day away at the defaults; both resume where they stopped (markers dedup a scan, gc
# goes batch by batch).
OUTAGES = (StoreUnavailable, redis.ConnectionError, redis.TimeoutError)
OUTAGE_RETRIES = 6


def retry_after_outage(task: Any, error: Exception) -> NoReturn:
    """Send the task again after the jobs' backoff, or fail with ``error`` when it has
    tried ``OUTAGE_RETRIES`` times."""
    from worker.job.retries import backoff_s
    from worker.settings.config import get_settings

    countdown = backoff_s(task.request.retries, get_settings().retry_backoff_max_s)
    raise task.retry(exc=error, countdown=countdown, max_retries=OUTAGE_RETRIES)


@app.task(name=SCAN_TASK_NAME, ignore_result=True, bind=True)
def scan_due_sessions(self: Any) -> str:
    """``compactor.scan``: enqueue the due sessions (sent by beat)."""
    from scheduler.beat import scan_and_report

    try:
        return scan_and_report()
    except OUTAGES as error:
        retry_after_outage(self, error)


@app.task(name=RECONCILE_TASK_NAME, ignore_result=True)
def reconcile_sessions(leases_only: bool = False) -> str:
    """``compactor.reconcile``: one sweep (sent by beat every ``reconcile_interval_s``),
    or with ``leases_only`` the quick sweep of dead leases (every lease heartbeat)."""
    from scheduler.reconcile import reconcile_and_report

    return reconcile_and_report(leases_only=leases_only is True)


@app.task(name=GC_TASK_NAME, ignore_result=True, bind=True)
def collect_garbage(self: Any) -> str:
    """``compactor.gc``: remove superseded revisions and old runs (sent by beat when
    ``gc_cron`` is set)."""
    from scheduler.beat import collect_garbage_now

    try:
        return collect_garbage_now()
    except OUTAGES as error:
        retry_after_outage(self, error)


@app.task(name=POLL_BATCHES_TASK_NAME, ignore_result=True)
def poll_batches() -> str:
    """``compactor.poll_batches``: collect finished batches, send their jobs again, and
    submit the requests parked since (sent by beat every ``batch_poll_interval_s`` in
    batch mode)."""
    from scheduler.batches import poll_and_report

    return poll_and_report()
