"""The task ``compactor.compact_session``: a thin view over ``pipeline.run``.

It parses the message, counts the delivery, runs the pipeline, emits the one outcome
event, and maps a transient failure to a Celery retry. Messages that cannot even be
decoded (pickle, garbage) never become a task: :class:`JobConsumer` reports them as a
``rejected`` event.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from celery import Task
from celery.exceptions import InvalidTaskError
from celery.worker.consumer import Consumer
from kombu.exceptions import ContentDisallowed, DecodeError
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from db.errors import StoreError
from worker import pipeline
from worker.celery_app import TASK_NAME, app
from worker.errors import DeliveryCapExceeded, JobRejected
from worker.job import JobRequest, JobResult
from worker.logging import JOB_EVENT, get_logger
from worker.outcome import emit_job_event, rejected_message_fields
from worker.runtime import Runtime, get_runtime
from worker.settings import get_settings


class JobMessage(BaseModel):
    """The kwargs contract of the task; anything else is rejected, never retried."""

    model_config = ConfigDict(extra="forbid")

    session_id: StrictStr = Field(min_length=1, max_length=512)
    reason: StrictStr = Field("trigger", max_length=200)
    force: StrictBool = False


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


# Raised by kombu's Redis transport for a queue item that is not a JSON object.
UNREADABLE_ITEM_ERRORS = (json.JSONDecodeError, TypeError)
# Raised by Celery while it builds a request from a message whose headers are broken.
BAD_HEADER_ERRORS = (KeyError, ValueError, TypeError)
# Raised by kombu (5.7) when a channel of a connection lost while Redis was down is used
# after collect() detached its transport: to close it, or to ack a job that was in flight.
DETACHED_TRANSPORT_ERRORS = (AttributeError,)


class JobConsumer(Consumer):  # type: ignore[misc]  # Celery ships no type hints
    """Celery's consumer, reporting messages that never become a task (a body that is not
    JSON, a refused content type such as pickle) as ``rejected`` jobs before it drops them.

    Such a message fails while its request is built, in the consumer, so no task or
    request hook ever sees it.

    So does a message whose headers Celery cannot read (reported as ``invalid_message``).
    A queue item that is not even a JSON object fails earlier, in kombu's Redis transport
    (``loads`` of the item, then ``payload["properties"]``), which counts a JSONDecodeError
    or TypeError there as fatal: one stray item would make the worker exit. The item is
    already popped, so it is handled like kombu's own KeyError for an object without the
    envelope's fields: logged, then the consumer reconnects and goes on.

    A Redis restart while a job runs trips kombu over its detached transport twice (see
    DETACHED_TRANSPORT_ERRORS); both would stop the worker. Counted as connection errors,
    the late ack fails loudly ("Couldn't ack") and the job is redelivered, or re-sent by
    the scan when the restart lost it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        kombu_errors: tuple[type[Exception], ...] = self.conninfo.connection_errors
        # Requests built later take this tuple as the errors their ack may log and skip.
        self.connection_errors = (*kombu_errors, *UNREADABLE_ITEM_ERRORS,
                                  *DETACHED_TRANSPORT_ERRORS)

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        handle = super().create_task_handler(*args, **kwargs)

        def on_task_received(message: Any) -> Any:
            try:
                return handle(message)
            except BAD_HEADER_ERRORS as exc:
                # A header Celery needs is missing or mistyped (no ``id``, an ``eta`` or
                # ``timelimit`` it cannot read) and the request cannot be built. Left to
                # Celery, a KeyError reads as a lost connection, which puts the message
                # back for ever, and a ValueError stops the worker.
                invalid = InvalidTaskError(f"unreadable task headers ({exc!r})")
                return self.on_invalid_task(None, message, invalid)

        return on_task_received

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        if isinstance(exc, UNREADABLE_ITEM_ERRORS):
            get_logger().error("broker.unreadable_item", failure_class=type(exc).__name__,
                               failure_message="a queue item is not a task message; dropped")
        try:
            super().on_connection_error_after_connected(exc)
        except DETACHED_TRANSPORT_ERRORS as close_error:
            # Closing the lost connection restores its unacked messages through the
            # detached transport. The connection is already dropped: reconnect anyway.
            get_logger().warning("broker.close_failed", failure_class="AttributeError",
                                 failure_message=str(close_error))

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        report_unreadable_message(message, exc)
        super().on_decode_error(message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        report_unreadable_message(message, exc)
        super().on_invalid_task(body, message, exc)


def report_unreadable_message(message: Any, exc: Exception) -> None:
    """Log the ``rejected`` outcome event of a message that could not be read."""
    headers = message.headers if isinstance(message.headers, dict) else {}
    content_type = message.content_type
    reason = "undecodable_message"
    if isinstance(exc, ContentDisallowed):
        detail = f"refused {content_type!r} content: only JSON is accepted"
    elif isinstance(exc, DecodeError):
        detail = f"the {content_type!r} body does not decode"
    else:
        reason, detail = "invalid_message", f"not a valid task message: {exc}"
    task_id = headers.get("id")
    get_logger().error(JOB_EVENT, **rejected_message_fields(
        task_id if isinstance(task_id, str) else None, reason, type(exc).__name__, detail))


@app.task(name=TASK_NAME, bind=True, typing=False)
def compact_session(self: Task, *args: Any, **kwargs: Any) -> str:
    settings = get_settings()
    runtime = get_runtime(settings)
    task_id, retries = str(self.request.id), int(self.request.retries)
    result = _run_delivery(runtime, args, kwargs, task_id, retries)
    will_retry = result.retryable and retries < settings.max_transient_retries
    emit_job_event(get_logger(), result, will_retry=will_retry)
    if will_retry:  # the retry keeps this task id, so the session's queue marker stays
        countdown = retry_countdown_s(retries, result.retry_after_s, settings.retry_backoff_max_s)
        raise self.retry(countdown=countdown, max_retries=None)
    _clear_queue_marker(runtime, result.session_id, task_id)
    return result.outcome.value


def _clear_queue_marker(runtime: Runtime, session_id: str, task_id: str) -> None:
    # On a store error the marker simply expires after enqueue_marker_ttl_s.
    with contextlib.suppress(StoreError):
        runtime.store.clear_queue_marker(session_id, task_id)


def _run_delivery(runtime: Runtime, args: tuple[Any, ...], kwargs: dict[str, Any], task_id: str,
                  retries: int) -> JobResult:
    fallback_request = JobRequest(str(kwargs.get("session_id", ""))[:512], "invalid",
                                  task_id=task_id, attempt=retries + 1)
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
