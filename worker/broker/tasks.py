"""The task ``compactor.compact_session``: a thin view over ``pipeline.run``.

It parses the message, counts the delivery, runs the pipeline, emits the one outcome
event, and maps a transient failure to a Celery retry (within ``retry_window_s`` of the
first attempt, at most ``max_transient_retries``; ``worker/job/retries.py``); whatever ends
the job clears the session's queue marker (when the database is down the reconciler
repairs it). A failed or rejected job then ends in Celery's FAILURE state
(``JobEndedInFailure``), so Flower and Celery's events count it. Queue items that cannot
even be read (pickle, garbage, forged task names) never become a task: the transport
(``worker/broker/transport.py``) and the consumer (``worker/broker/consumer.py``) report them as a
``rejected`` event and dead-letter them.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any

from celery import Task
from pydantic import ValidationError

from db import StoreError
from worker.broker.celery_app import app
from worker.broker.contract import MAX_SESSION_ID_CHARS, TASK_NAME, JobMessage
from worker.errors import DeliveryCapExceeded, JobRejected, Outcome
from worker.job import pipeline
from worker.job.outcome import emit_job_event
from worker.job.retries import RetryPolicy, backoff_max_for, next_retry_s
from worker.job.values import JobRequest, JobResult
from worker.logging import get_logger
from worker.runtime import Runtime, get_runtime
from worker.settings.config import get_settings

# Outcomes Celery records as failures; the others (compacted, skipped, ...) succeed.
FAILURE_OUTCOMES = frozenset({Outcome.FAILED, Outcome.REJECTED})


def parse_job(args: tuple[Any, ...], kwargs: dict[str, Any], task_id: str,
              attempt: int) -> JobRequest:
    """Validate a delivery's arguments; raise JobRejected with the reason."""
    if args:
        raise JobRejected("positional arguments are not accepted", reason="malformed_message")
    try:
        message = JobMessage.model_validate(kwargs)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                             for e in exc.errors(include_input=False))
        raise JobRejected(f"malformed job message: {problems}",
                          reason="malformed_message") from exc
    return JobRequest(message.session_id, message.reason, message.force, task_id, attempt)


class JobEndedInFailure(Exception):
    """Raised after a failed or rejected job's outcome event, so that Celery's own state
    and ``task-failed`` event (what Flower counts) say FAILURE. Listed in the task's
    ``throws``: Celery logs it at INFO without a traceback, and never retries it."""


# Its requests record the attempt of a pool child that dies running one (lost_delivery.py).
@app.task(name=TASK_NAME, bind=True, typing=False, throws=(JobEndedInFailure,),
          Request="worker.broker.lost_delivery:JobDelivery")
def compact_session(self: Task, *args: Any, **kwargs: Any) -> str:
    settings = get_settings()
    runtime = get_runtime(settings)
    task_id, retries = str(self.request.id), int(self.request.retries)
    journal = runtime.journal
    # A kill before the event leaves this entry to the reconciler. Opening it also counts
    # the delivery (one Redis round trip for both).
    opened = journal.open(task_id, str(kwargs.get("session_id", ""))[:MAX_SESSION_ID_CHARS],
                          retries + 1, runtime.deps.clock(), runtime.delivery_counter
                          ) if journal is not None else None
    if journal is not None:
        journal.write_owed(runtime.store)
    result = _run_delivery(runtime, args, kwargs, task_id,
                           attempt=opened.attempt if opened is not None else retries + 1,
                           deliveries=opened.deliveries if opened is not None else 1)
    if result.unrecorded_run is not None and journal is not None:
        journal.keep_unrecorded(result.unrecorded_run)
    countdown = _retry_countdown(runtime, result, task_id, retries)
    emit_job_event(get_logger(), result, will_retry=countdown is not None)
    if journal is not None and opened is not None:
        journal.close_unanswered(opened.entry)
    if countdown is not None:  # the retry keeps this task id, so the queue marker stays
        # Passed explicitly: Celery's max_retries=None means its default of 3, not unbounded.
        raise self.retry(countdown=countdown, max_retries=settings.max_transient_retries)
    # Every terminal outcome frees the session: the next scan or trigger may enqueue it
    # (the job's own last transaction usually did).
    if not result.queue_marker_cleared:
        _clear_queue_marker(runtime, result.session_id, task_id)
    if result.outcome in FAILURE_OUTCOMES:
        raise JobEndedInFailure(f"{result.outcome.value}: {result.reason}")
    return result.outcome.value


def _retry_countdown(runtime: Runtime, result: JobResult, task_id: str,
                     retries: int) -> float | None:
    """The countdown of a transient failure's next attempt; None when the job ends."""
    if not result.retryable:
        return None
    settings = runtime.settings
    counter = runtime.delivery_counter
    now = time.time()
    began = now - result.duration_ms / 1000
    first = counter.first_attempt_at(task_id, began, ttl_s=settings.retry_window_s * 2
                                     ) if counter else None
    elapsed_s = (now - first) if first is not None else None
    # The provider breaker's reopening is the earliest a retry can get past it.
    earliest = max(result.retry_after_s or 0.0,
                   runtime.deps.provider_breaker.reopens_in_s() or 0.0)
    policy = RetryPolicy(settings.max_transient_retries, settings.retry_window_s,
                         backoff_max_for(result.reason, settings.retry_backoff_max_s,
                                         settings.reconcile_interval_s))
    return next_retry_s(policy, retries=retries, elapsed_s=elapsed_s, retry_after_s=earliest)


def _clear_queue_marker(runtime: Runtime, session_id: str, task_id: str) -> None:
    # On a store error the marker simply expires after enqueue_marker_ttl_s.
    with contextlib.suppress(StoreError):
        runtime.store.clear_queue_marker(session_id, task_id)


def _run_delivery(runtime: Runtime, args: tuple[Any, ...], kwargs: dict[str, Any], task_id: str,
                  *, attempt: int, deliveries: int) -> JobResult:
    """Run the job of a delivery counted ``deliveries``-th of its attempt (0: uncounted)."""
    session_id = str(kwargs.get("session_id", ""))[:MAX_SESSION_ID_CHARS]
    fallback_request = JobRequest(session_id, "invalid", task_id=task_id, attempt=attempt)
    try:
        request = parse_job(args, kwargs, task_id, attempt)
    except JobRejected as exc:
        return pipeline.record_failure(fallback_request, runtime.deps, runtime.policy, exc)
    if deliveries > runtime.settings.max_deliveries:
        cap = DeliveryCapExceeded(f"delivered {deliveries} times; its worker keeps dying",
                                  reason="delivery_cap")
        return pipeline.record_failure(request, runtime.deps, runtime.policy, cap)
    return pipeline.run(replace(request, redelivered=deliveries > 1), runtime.deps,
                        runtime.policy)
