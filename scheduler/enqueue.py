"""Enqueue compaction jobs, at most one queued job per session: record the job on the
session row first (the conditional UPDATE behind ``Store.queue_markers`` is the guard),
then publish the messages; messages that cannot be published release their markers again.

A Redis message is only a wake-up call (it may be lost, duplicated or late): a marker
older than its TTL is taken for a lost message and the next scan sends a new one, and
the worker's lease and compare-and-swap make a duplicate harmless.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import islice
from typing import Protocol

from celery import Celery

from db import DueWhy, MarkResult, MarkStatus, QueueMarkers, Store
from scheduler.selection import Allowance, DueSession, ScanPolicy, StopReason, iter_due_sessions
from worker.broker.contract import TASK_NAME, JobKwargs, job_kwargs


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A job recorded on its session row, ready to publish under ``job_id``."""

    job_id: str
    kwargs: JobKwargs


class Publisher(Protocol):
    """Sends a batch of job messages; raises when the broker may not have taken them all."""

    def publish(self, jobs: Sequence[QueuedJob]) -> None: ...


@dataclass(frozen=True)
class CeleryPublisher:
    """Publishes through a Celery app to one queue, one ``send_task`` (one round trip)
    per job; the message id is the job id. ``scheduler.publisher.RedisPublisher`` writes
    the same messages a batch at a time."""

    app: Celery
    queue: str

    def publish(self, jobs: Sequence[QueuedJob]) -> None:
        for job in jobs:
            self.app.send_task(TASK_NAME, kwargs=dict(job.kwargs), task_id=job.job_id,
                               queue=self.queue)


@dataclass(frozen=True, slots=True)
class ScanReport:
    """What one scan did so far (after each page) or in all (``stopped`` set)."""

    due_seen: int = 0
    enqueued: int = 0
    over_trigger: int = 0
    dirty: int = 0
    lost_race: int = 0  # due, but another enqueuer marked it first
    estimated_tokens: int = 0
    stopped: StopReason | None = None


def new_job_id() -> str:
    return str(uuid.uuid4())


def trigger_sessions(
    store: Store, publisher: Publisher, session_ids: Sequence[str], *, reason: str,
    force: bool, now: datetime, marker_ttl_s: float,
    is_lost: Callable[[str, str], bool] | None = None,
) -> list[MarkResult]:
    """Enqueue one job per session unless one is already queued.

    ``force`` is carried to the job (it skips the trigger and anti-thrash checks) but
    does not bypass a fresh marker whose job is alive: the session already has a job
    coming, so the result is ``already_queued`` with that job's id. With ``force``, a
    marker whose job ``is_lost(session_id, job_id)`` (neither queued, delivered nor
    running) is replaced by the new job.
    """
    results = []
    for session_id in session_ids:
        job = QueuedJob(new_job_id(), job_kwargs(session_id, reason, force=force))
        with store.queue_markers() as markers:
            marked = markers.mark(session_id, job.job_id, now=now, marker_ttl_s=marker_ttl_s)
        if (force and is_lost is not None and marked.status is MarkStatus.ALREADY_QUEUED
                and marked.job_id is not None and is_lost(session_id, marked.job_id)):
            with store.queue_markers() as markers:
                if markers.replace(session_id, marked.job_id, job.job_id, now=now):
                    marked = MarkResult(session_id, MarkStatus.ENQUEUED, job.job_id)
        if marked.status is MarkStatus.ENQUEUED:
            publish_or_release(store, publisher, [job])
        results.append(marked)
    return results


def run_scan(
    store: Store, publisher: Publisher, policy: ScanPolicy, now: datetime, *,
    limit: int | None = None, on_progress: Callable[[ScanReport], None] | None = None,
) -> ScanReport:
    """Enqueue the due sessions in gain order, within the job cap and token budget.

    Each page's markers are written in one transaction (bulk conditional UPDATEs), then
    that page's messages are published in one batch. Safe to run concurrently with other scans and
    triggers: each session is marked by exactly one of them.
    """
    allowance = Allowance.of(policy, limit)
    job_id_prefix = f"scan-{uuid.uuid4().hex[:12]}-"
    report = ScanReport()
    for page in _pages(iter_due_sessions(store, policy, now), policy.batch_size):
        with store.queue_markers() as markers:
            marking = _mark_page(markers, page, allowance, job_id_prefix, policy, now)
        publish_or_release(store, publisher, [job for job, _ in marking.marked])
        report = _tally(report, marking)
        if on_progress is not None:
            on_progress(report)
        if marking.stopped is not None:
            return replace(report, stopped=marking.stopped)
        if allowance.jobs >= allowance.max_jobs:
            # The cap is spent at the page's end: the next page would only be refused.
            return replace(report, stopped=StopReason.MAX_JOBS)
    return replace(report, stopped=StopReason.EXHAUSTED)


def publish_or_release(store: Store, publisher: Publisher, jobs: Sequence[QueuedJob]) -> None:
    """Publish the jobs; when that fails, clear all their markers and re-raise.

    Unpublished jobs must not block their sessions until the marker TTL. A job that did
    get through loses its marker too: the next scan may send it again, a duplicate that
    the lease and the compare-and-swap make harmless.
    """
    try:
        publisher.publish(jobs)
    except Exception:
        with store.queue_markers() as markers:
            for unsent in jobs:
                markers.clear(unsent.kwargs["session_id"], unsent.job_id)
        raise


@dataclass(frozen=True, slots=True)
class _PageMarking:
    marked: list[tuple[QueuedJob, DueSession]]
    lost: int  # due, but another enqueuer marked it first
    stopped: StopReason | None


def _mark_page(
    markers: QueueMarkers, page: list[DueSession], allowance: Allowance, job_id_prefix: str,
    policy: ScanPolicy, now: datetime,
) -> _PageMarking:
    """Mark as many of the page as the allowance takes; a session lost to another
    enqueuer gives its share back, so the next candidates may use it."""
    marked: list[tuple[QueuedJob, DueSession]] = []
    lost, rest = 0, page
    while rest:
        chosen, stopped = allowance.take(rest)
        rest = rest[len(chosen):]
        job_ids = markers.mark_many([due.session_id for due in chosen], job_id_prefix,
                                    now=now, marker_ttl_s=policy.marker_ttl_s)
        losers = [due for due in chosen if due.session_id not in job_ids]
        for due in losers:
            allowance.refund(due)
        lost += len(losers)
        marked += [(QueuedJob(job_ids[due.session_id], _scan_kwargs(due)), due)
                   for due in chosen if due.session_id in job_ids]
        if stopped is not None and not losers:
            return _PageMarking(marked, lost, stopped)
    return _PageMarking(marked, lost, None)


def _scan_kwargs(due: DueSession) -> JobKwargs:
    # A dirty session is under the trigger, so the job must be forced to compact it.
    return job_kwargs(due.session_id, due.why.value, force=due.why is DueWhy.DIRTY)


def _tally(report: ScanReport, marking: _PageMarking) -> ScanReport:
    dues = [due for _, due in marking.marked]
    over = sum(due.why is DueWhy.OVER_TRIGGER for due in dues)
    return replace(
        report,
        due_seen=report.due_seen + len(dues) + marking.lost,
        enqueued=report.enqueued + len(dues),
        over_trigger=report.over_trigger + over,
        dirty=report.dirty + len(dues) - over,
        lost_race=report.lost_race + marking.lost,
        estimated_tokens=report.estimated_tokens + sum(due.estimated_tokens for due in dues),
    )


def _pages(items: Iterable[DueSession], size: int) -> Iterator[list[DueSession]]:
    iterator = iter(items)
    while page := list(islice(iterator, size)):
        yield page
