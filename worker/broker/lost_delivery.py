"""The attempt of a pool child that died running a job (SIGKILL, the OOM killer, a
crash), recorded by the worker's main process: Celery itself only logs its
``WorkerLostError`` and requeues the message (``task_reject_on_worker_lost``).

The compaction task's requests are ``JobDelivery``: when one fails with
``WorkerLostError``, its attempt gets its run row and ``compaction.job`` event
(``failed``, ``worker_lost``, ``will_retry``) with its task and session, before the
message is requeued. Its attempt number and start are the ones the child entered in the
attempt journal; its redelivery opens the next number.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import redis
from billiard.einfo import ExceptionInfo, ExceptionWithTraceback
from celery.exceptions import WorkerLostError
from celery.worker.request import Request

from db import Store, StoreError
from worker.broker.contract import MAX_SESSION_ID_CHARS
from worker.job.lost_attempt import LostAttempt, lost_attempt_run_and_result, record_lost_attempt
from worker.job.outcome import emit_job_event
from worker.logging import get_logger
from worker.settings.config import Settings, get_settings
from worker.shared_state.attempt_journal import AttemptJournal, PendingAttempt
from worker.shared_state.keys import RedisKeys

FOUND_BY = "the worker's main process (its pool child died)"


class JobDelivery(Request):  # type: ignore[misc]  # Celery ships no type hints
    """A ``compactor.compact_session`` request in the worker's main process."""

    def on_failure(self, exc_info: ExceptionInfo, send_failed_event: bool = True,
                   return_ok: bool = False) -> None:
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if isinstance(exc, WorkerLostError):
            # Before the requeue: no later delivery of the task has begun yet.
            record_lost_delivery(get_settings(), self.id, self.kwargs,
                                 retries=int(self.request_dict.get("retries") or 0),
                                 accepted_at=self.time_start)
        super().on_failure(exc_info, send_failed_event=send_failed_event,
                           return_ok=return_ok)


def record_lost_delivery(settings: Settings, task_id: str, kwargs: Any, *, retries: int,
                         accepted_at: float | None) -> None:
    """Record the attempt of a delivery whose pool child died; never raises (Celery's
    own handling of the loss, the requeue, must follow)."""
    session_id = kwargs.get("session_id") if isinstance(kwargs, dict) else None
    if not isinstance(session_id, str) or not session_id:
        return  # a malformed message: nothing began, no session to record it on
    now = datetime.now(UTC)
    client = redis.Redis.from_url(settings.redis_url,
                                  socket_timeout=settings.redis_socket_timeout_s,
                                  socket_connect_timeout=settings.redis_socket_timeout_s)
    journal = AttemptJournal(client, RedisKeys(settings.redis_key_prefix))
    try:
        entry = _open_entry(journal, task_id)
        accepted = datetime.fromtimestamp(accepted_at, UTC) if accepted_at else now
        lost = LostAttempt(session_id[:MAX_SESSION_ID_CHARS], task_id,
                           entry.attempt if entry else retries + 1,
                           entry.opened_at if entry else accepted, found_by=FOUND_BY)
        # An attempt that recorded itself keeps its entry: the reconciler reports its
        # event from its run.
        if _record(settings, journal, lost, now) and entry is not None:
            journal.close(entry.entry, tries=1)
    except Exception as exc:  # the requeue must follow whatever failed here
        get_logger().error("worker.lost_attempt_unrecorded", task_id=task_id,
                           session_id=session_id, error_class=type(exc).__name__,
                           error=str(exc)[:500])
    finally:
        client.close()


def _open_entry(journal: AttemptJournal, task_id: str) -> PendingAttempt | None:
    """The task's newest journal entry not superseded: the dead child's attempt (None
    when it died before entering it, or Redis is unreachable)."""
    try:
        entries = [p for p in journal.pending()
                   if p.task_id == task_id and p.superseded_at is None]
    except redis.RedisError:
        return None
    return max(entries, key=lambda p: p.opened_at, default=None)


def _record(settings: Settings, journal: AttemptJournal, lost: LostAttempt,
            now: datetime) -> bool:
    """Write the run and emit the event; while the database is down, keep the run for the
    reconciler (``AttemptJournal.keep_unrecorded``) and emit the event at once. False
    when the attempt had recorded itself."""
    store = Store.from_url(settings.effective_database_url,
                           sqlite_busy_timeout_ms=settings.sqlite_busy_timeout_ms,
                           call_timeout_s=settings.db_call_timeout_s)
    try:
        return record_lost_attempt(store, lost, now, will_retry=True)
    except StoreError:
        run, result = lost_attempt_run_and_result(lost, now)
        journal.keep_unrecorded(run)
        emit_job_event(get_logger(), replace(result, run_recorded=False), will_retry=True)
        return True
    finally:
        store.close()
