"""The task ``compactor.compact_session``: a thin view over ``pipeline.run``.

It parses the message, counts the delivery, runs the pipeline, emits the one outcome
event, and maps a transient failure to a Celery retry (at most ``max_transient_retries``);
whatever ends the job clears the session's queue marker. Queue items that cannot even be
read (pickle, garbage, forged task names) never become a task: the transport
(``worker/transport.py``) and the consumer (``worker/consumer.py``) report them as a
``rejected`` event and dead-letter them.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import replace
from typing import Any

from celery import Task
from pydantic import ValidationError

from db import StoreError
from worker import pipeline
from worker.celery_app import app
from worker.contract import MAX_SESSION_ID_CHARS, TASK_NAME, JobMessage
from worker.errors import DeliveryCapExceeded, JobRejected
from worker.job import JobRequest, JobResult
from worker.logging import get_logger
from worker.outcome import emit_job_event
from worker.runtime import Runtime, get_runtime
from worker.settings import get_settings


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


def retry_countdown_s(retries: int, retry_after_s: float | None, max_s: int) -> float:
    """Exponential backoff with full jitter, never sooner than the server asked."""
    backoff_s = random.uniform(0, min(max_s, 2 ** (retries + 2)))
    return min(max_s, max(backoff_s, retry_after_s or 0.0))


@app.task(name=TASK_NAME, bind=True, typing=False)
def compact_session(self: Task, *args: Any, **kwargs: Any) -> str:
    settings = get_settings()
    runtime = get_runtime(settings)
    task_id, retries = str(self.request.id), int(self.request.retries)
    result = _run_delivery(runtime, args, kwargs, task_id, retries)
    will_retry = should_retry(result, retries, settings.max_transient_retries)
    emit_job_event(get_logger(), result, will_retry=will_retry)
    if will_retry:  # the retry keeps this task id, so the session's queue marker stays
        countdown = retry_countdown_s(retries, result.retry_after_s, settings.retry_backoff_max_s)
        # Passed explicitly: Celery's max_retries=None means its default of 3, not unbounded.
        raise self.retry(countdown=countdown, max_retries=settings.max_transient_retries)
    # Every terminal outcome frees the session: the next scan or trigger may enqueue it.
    _clear_queue_marker(runtime, result.session_id, task_id)
    return result.outcome.value


def should_retry(result: JobResult, retries: int, max_retries: int) -> bool:
    """True when a transient failure has retries left (``retries`` already made)."""
    return result.retryable and retries < max_retries


def _clear_queue_marker(runtime: Runtime, session_id: str, task_id: str) -> None:
    # On a store error the marker simply expires after enqueue_marker_ttl_s.
    with contextlib.suppress(StoreError):
        runtime.store.clear_queue_marker(session_id, task_id)


def _run_delivery(runtime: Runtime, args: tuple[Any, ...], kwargs: dict[str, Any], task_id: str,
                  retries: int) -> JobResult:
    session_id = str(kwargs.get("session_id", ""))[:MAX_SESSION_ID_CHARS]
    fallback_request = JobRequest(session_id, "invalid", task_id=task_id, attempt=retries + 1)
    try:
        request = parse_job(args, kwargs, task_id, retries + 1)
    except JobRejected as exc:
        return pipeline.record_failure(fallback_request, runtime.deps, runtime.policy, exc)
    counter = runtime.delivery_counter
    deliveries = counter.record_delivery(task_id, retries) if counter else 1
    if deliveries > runtime.settings.max_deliveries:
        cap = DeliveryCapExceeded(f"delivered {deliveries} times; its worker keeps dying",
                                  reason="delivery_cap")
        return pipeline.record_failure(request, runtime.deps, runtime.policy, cap)
    return pipeline.run(replace(request, redelivered=deliveries > 1), runtime.deps,
                        runtime.policy)
