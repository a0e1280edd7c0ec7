"""Celery's consumer, hardened: a message that passed the transport's inspection
(``worker/broker/transport.py``) but still never becomes a task (headers Celery cannot read)
ends as a ``rejected`` ``compaction.job`` event instead of a loop or a dead worker.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from celery.exceptions import InvalidTaskError
from celery.worker.consumer import Consumer
from kombu.exceptions import ContentDisallowed, DecodeError

from worker.broker.queue_items import ItemRejected
from worker.logging import get_logger

# Raised by Celery while it builds a request from a message whose headers are broken.
BAD_HEADER_ERRORS = (KeyError, ValueError, TypeError)
# Raised by kombu (5.7) when a channel of a connection lost while Redis was down is used
# after collect() detached its transport: to close it, or to ack a job that was in flight.
DETACHED_TRANSPORT_ERRORS = (AttributeError,)


class JobConsumer(Consumer):  # type: ignore[misc]  # Celery ships no type hints
    """Celery's consumer, reporting messages that never become a task as ``rejected``
    jobs before it drops them.

    The transport refuses what it can see from the item alone (it is never delivered);
    what is left fails while Celery builds the request, in the consumer, so no task or
    request hook ever sees it: a refused content type, a body that does not decode, and
    headers Celery cannot read (reported as ``invalid_message``).

    A Redis restart while a job runs trips kombu over its detached transport twice (see
    DETACHED_TRANSPORT_ERRORS); both would stop the worker. Counted as connection errors,
    the late ack fails loudly ("Couldn't ack") and the job is redelivered, or re-sent by
    the scan when the restart lost it. Nothing else is: a ``TypeError`` counted as a lost
    connection put a null-bodied message back on the queue for ever.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        kombu_errors: tuple[type[Exception], ...] = self.conninfo.connection_errors
        # Requests built later take this tuple as the errors their ack may log and skip.
        self.connection_errors = (*kombu_errors, *DETACHED_TRANSPORT_ERRORS)

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        handle = super().create_task_handler(*args, **kwargs)

        def on_task_received(message: Any) -> Any:
            try:
                return handle(message)
            except BAD_HEADER_ERRORS as exc:
                # A header Celery needs is missing or mistyped in a way the transport
                # does not check, and the request cannot be built. Left to Celery, a
                # KeyError reads as a lost connection, which puts the message back for
                # ever, and a ValueError stops the worker.
                invalid = InvalidTaskError(f"unreadable task headers ({exc!r})")
                return self.on_invalid_task(None, message, invalid)

        return on_task_received

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        try:
            super().on_connection_error_after_connected(exc)
        except DETACHED_TRANSPORT_ERRORS as close_error:
            # Closing the lost connection restores its unacked messages through the
            # detached transport. The connection is already dropped: reconnect anyway.
            get_logger().warning("broker.close_failed", failure_class="AttributeError",
                                 failure_message=str(close_error))

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        refuse_message(message, exc, self.app.conf.task_default_queue)
        super().on_decode_error(message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        refuse_message(message, exc, self.app.conf.task_default_queue)
        super().on_invalid_task(body, message, exc)


def refuse_message(message: Any, exc: Exception, queue: str) -> None:
    """Log the ``rejected`` outcome event of a message from ``queue`` that could not be
    read, and keep it on the dead-letter list."""
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
    rejected = ItemRejected(reason, detail, task_id if isinstance(task_id, str) else None)
    raw = json.dumps(message._raw).encode()  # the envelope as the transport delivered it
    message.channel.refuse_item(raw, queue, rejected)
