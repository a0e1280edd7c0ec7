"""The reconciler's part in "every attempt leaves a run row and an event": it writes the
run rows jobs kept in Redis while the database was down, and reports the event of an
attempt whose worker was killed after its last transaction committed
(``worker/shared_state/attempt_journal.py`` keeps both records)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta

from db import RunRecord, SessionNotFound, Store
from worker.errors import Outcome
from worker.job.figures import JobFigures
from worker.job.outcome import emit_job_event
from worker.job.values import JobResult
from worker.logging import get_logger
from worker.shared_state.attempt_journal import AttemptJournal, PendingAttempt, write_kept_run

# An entry whose attempt never wrote a run is dropped after this long at the latest.
PENDING_MAX_AGE = timedelta(days=1)
# The entry and its run's start are read from one worker's clock, the entry first.
_CLOCK_SKEW = timedelta(seconds=1)
_DROPPED = "reconcile.unrecorded_run_dropped"  # a kept run that can never be written


@dataclass(frozen=True, slots=True)
class JournalReplay:
    """What one replay of the attempt journal wrote: runs kept in Redis, events of killed
    attempts."""

    runs_written: int = 0
    events_reported: int = 0


def write_unrecorded_runs(store: Store, journal: AttemptJournal) -> int:
    """Write the kept run rows, oldest first, until the list is empty or the database
    fails again. Each stays on the list until written, and is written at most once: a
    sweep killed mid-write, or a job whose commit went through unanswered, leaves no
    duplicate and loses nothing. An item that can never be written (unreadable, or
    refused by the database for its content) is dropped with a warning."""
    written = 0
    while (kept := journal.oldest_unrecorded()) is not None:
        raw, run = kept
        if run is None:
            get_logger().error(_DROPPED, error_class="unreadable", error=str(raw)[:500])
        else:
            stored = write_kept_run(store, run, _DROPPED)
            if stored is None:
                break  # the database is still down: the next sweep tries again
            written += stored
        journal.drop_unrecorded(raw)
    return written


def report_missing_events(store: Store, journal: AttemptJournal, now: datetime,
                          grace_s: float) -> int:
    """Emit the ``compaction.job`` event of every journalled attempt whose run row a sweep
    found at least ``grace_s`` ago while the entry stayed open (its worker died between
    its commit and its event). The wait counts from that first sighting, not from the
    run's own times: a job stalled in its commit by a hung database writes a
    ``finished_at`` older than the commit itself."""
    reported = 0
    settled_before = now - timedelta(seconds=grace_s)
    entries = journal.pending()
    journal.forget_seen({entry.entry for entry in entries})
    for entry in entries:
        if entry.opened_at > settled_before:
            continue  # running, or its worker is emitting the event now
        run = _run_of(store, entry)
        if run is None:
            if now - entry.opened_at > PENDING_MAX_AGE or not _holds_lease(store, entry):
                # Died before its lease (or its dead lease was recorded): no run, no event.
                journal.close(entry.entry, tries=1)
            continue
        if journal.run_seen_at(entry.entry, now) > settled_before:
            continue
        if not journal.is_open(entry.entry):
            continue  # its worker emitted the event meanwhile
        emit_job_event(get_logger(), result_of_run(run))
        journal.close(entry.entry, tries=1)
        reported += 1
    return reported


def _run_of(store: Store, entry: PendingAttempt) -> RunRecord | None:
    """The attempt's run: the earliest of its task and attempt begun after its entry and
    before a redelivery of the same attempt superseded it (that one's runs are its own)."""
    until = entry.superseded_at
    runs = [run for run in store.runs(session_id=entry.session_id, limit=50)
            if run.task_id == entry.task_id and run.attempt == entry.attempt
            and run.started_at >= entry.opened_at - _CLOCK_SKEW
            and (until is None or run.started_at < until)]
    return min(runs, key=lambda run: (run.started_at, run.id)) if runs else None


def _holds_lease(store: Store, entry: PendingAttempt) -> bool:
    try:
        owner = store.get_session(entry.session_id).lease_owner
    except SessionNotFound:
        return False
    return owner is not None and owner.endswith(f":{entry.task_id}")


def result_of_run(run: RunRecord) -> JobResult:
    """The event of a recorded run, as its job would have reported it."""
    figures = dict(run.figures)
    known = {f.name for f in dataclasses.fields(JobFigures)}
    durations = figures.get("durations_ms") or {}
    return JobResult(
        session_id=run.session_id, task_id=str(run.task_id), attempt=run.attempt,
        trigger=run.reason, outcome=Outcome(run.outcome),
        reason=str(figures.get("outcome_reason") or run.outcome), summarizer=None,
        failure_class=run.failure_class, failure_message=run.failure_message,
        retryable=False, retry_after_s=None, revision_id=run.revision_id,
        parent_revision_id=None, breaker_state=None,
        figures=JobFigures(**{k: v for k, v in figures.items() if k in known}),
        durations_ms={str(k): float(v) for k, v in durations.items()},
        duration_ms=round(((run.finished_at or run.started_at) - run.started_at)
                          .total_seconds() * 1000, 3),
    )
