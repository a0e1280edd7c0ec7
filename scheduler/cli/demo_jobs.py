"""The demo's jobs: enqueue the due sessions with the scheduler's own scan, follow them in
the runs table while a real worker runs them, and free the unfinished ones afterwards."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from db import RunRecord, Store
from scheduler.beat import run_locked_scan, scan_lock, scan_policy
from scheduler.cli.common import stdout_console
from scheduler.cli.demo_services import DemoServiceError, WorkerProcess
from scheduler.enqueue import CeleryPublisher, Publisher, QueuedJob
from worker.broker.celery_app import create_app
from worker.errors import TransientError
from worker.settings.config import Settings
from worker.shared_state.connection import connect_redis
from worker.shared_state.keys import RedisKeys

POLL_INTERVAL_S = 0.5


@dataclass
class RecordingPublisher:
    """Publishes through ``inner`` and remembers what it sent (the jobs to follow)."""

    inner: Publisher
    sent: list[QueuedJob] = field(default_factory=list)

    def publish(self, jobs: Sequence[QueuedJob]) -> None:
        self.inner.publish(jobs)
        self.sent.extend(jobs)


def session_of(job: QueuedJob) -> str:
    return job.kwargs["session_id"]


def scan_and_enqueue(settings: Settings, now: datetime) -> list[QueuedJob] | None:
    """Run one scan under the scan lock, as beat does; None when the lock is held."""
    store = Store.from_url(settings.effective_database_url,
                           sqlite_busy_timeout_ms=settings.sqlite_busy_timeout_ms)
    client = connect_redis(settings)
    app = create_app(settings)
    publisher = RecordingPublisher(CeleryPublisher(app, settings.queue_name))
    try:
        store.check_schema()
        lock = scan_lock(client, RedisKeys(settings.redis_key_prefix))
        report = run_locked_scan(store, publisher, scan_policy(settings), now, lock)
    finally:
        app.close()
        client.close()
        store.close()
    return None if report is None else publisher.sent


def _transient_failures() -> frozenset[str]:
    found, pending = set(), [TransientError]
    while pending:
        cls = pending.pop()
        found.add(cls.__name__)
        pending.extend(cls.__subclasses__())
    return frozenset(found)


def final_run(store: Store, job: QueuedJob, max_transient_retries: int, *,
              batched: bool = False) -> RunRecord | None:
    """The run that ended ``job``; None while it has not ended (or will be retried).
    ``batched``: a job that parked ends with the session's newest run that did not (the
    poller sent it again under another id)."""
    every = store.runs(session_id=session_of(job), limit=50)
    runs = [run for run in every if run.task_id == job.job_id]
    if not runs:
        return None
    newest = every[0] if batched else runs[0]
    if newest.outcome == "parked" or (batched and newest.reason == "awaiting_batch"):
        return None
    retrying = (newest.outcome == "failed" and newest.failure_class in _transient_failures()
                and len(runs) <= max_transient_retries)
    return None if retrying else newest


def wait_for_jobs(store: Store, jobs: list[QueuedJob], worker: WorkerProcess, timeout_s: float,
                  max_transient_retries: int, poll_batches: Callable[[], None] | None = None
                  ) -> dict[str, RunRecord]:
    """Show a progress bar until every job has its final run; return them by session.
    ``poll_batches`` (batch mode): run between looks, as beat would, until jobs end."""
    done: dict[str, RunRecord] = {}
    deadline = time.monotonic() + timeout_s
    with _progress(len(jobs)) as advance:
        while len(done) < len(jobs):
            if poll_batches is not None:
                poll_batches()
            for job in _pending(jobs, done):
                run = final_run(store, job, max_transient_retries,
                                batched=poll_batches is not None)
                if run is not None:
                    done[session_of(job)] = run
                    advance()
            if len(done) == len(jobs):
                break
            if not worker.is_running():
                raise DemoServiceError(f"the worker exited:\n{worker.log_tail()}")
            if time.monotonic() > deadline:
                raise DemoServiceError(
                    f"{len(jobs) - len(done)} of {len(jobs)} jobs unfinished after "
                    f"{timeout_s:.0f}s; see the worker log {worker.log_path}")
            time.sleep(POLL_INTERVAL_S)
    return done


def _pending(jobs: Iterable[QueuedJob], done: dict[str, RunRecord]) -> list[QueuedJob]:
    return [job for job in jobs if session_of(job) not in done]


@contextmanager
def _progress(total: int) -> Iterator[Callable[[], None]]:
    """A rich progress bar of finished jobs on stdout; yields ``advance()``."""
    columns = (TextColumn("compacting"), BarColumn(), MofNCompleteColumn(), TextColumn("jobs"),
               TimeElapsedColumn())
    with Progress(*columns, console=stdout_console()) as progress:
        task = progress.add_task("jobs", total=total)
        yield lambda: progress.advance(task)


def release_unfinished(settings: Settings, jobs: list[QueuedJob], finished: set[str]) -> int:
    """Clear the queue markers of jobs that did not end, so the next scan takes them."""
    store = Store.from_url(settings.effective_database_url,
                           sqlite_busy_timeout_ms=settings.sqlite_busy_timeout_ms)
    try:
        with store.queue_markers() as markers:
            return sum(markers.clear(session_of(job), job.job_id)
                       for job in jobs if job.job_id not in finished)
    finally:
        store.close()
