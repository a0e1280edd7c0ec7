"""The record of an attempt that died without writing its own (its pool child was killed,
its worker died): the run row and ``compaction.job`` event (``failed``,
``worker_lost``) written by whoever saw it die, the worker's main process or the
reconciler."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from db import NewRun, Store
from worker.errors import CompactionError, Outcome
from worker.job.outcome import emit_job_event
from worker.job.values import JobRequest, JobResult, JobTrace
from worker.logging import get_logger

WORKER_LOST = "worker_lost"


class AttemptLost(CompactionError):
    """An attempt that ended without a record: its worker died or was killed (a hard
    time limit, OOM, SIGKILL) while running it."""


@dataclass(frozen=True, slots=True)
class LostAttempt:
    """What the finder knows of a dead attempt: ``started_at`` is when it began, or the
    latest time it is known to have been alive."""

    session_id: str
    task_id: str
    attempt: int
    started_at: datetime
    found_by: str  # says who saw it die, in the failure message


def lost_attempt_run_and_result(lost: LostAttempt, now: datetime) -> tuple[NewRun, JobResult]:
    """The run row and the event's result of ``lost``."""
    trace = JobTrace(JobRequest(lost.session_id, "unknown", task_id=lost.task_id,
                                attempt=lost.attempt), started_at=lost.started_at)
    error = AttemptLost(f"the attempt's worker died or was killed; recorded by "
                        f"{lost.found_by}", reason=WORKER_LOST)
    result = replace(trace.result(Outcome.FAILED, error.reason, error),
                     duration_ms=round((now - lost.started_at).total_seconds() * 1000, 3))
    return trace.new_run(Outcome.FAILED, error.reason, error, now), result


def record_lost_attempt(store: Store, lost: LostAttempt, now: datetime, *,
                        will_retry: bool = False) -> bool:
    """Write the run row and emit the event of ``lost``; False (nothing written) when a
    run of its task finished since it began: it recorded itself before dying."""
    run, result = lost_attempt_run_and_result(lost, now)
    if not store.record_lost_run(run, since=lost.started_at):
        return False
    emit_job_event(get_logger(), result, will_retry=will_retry)
    return True
