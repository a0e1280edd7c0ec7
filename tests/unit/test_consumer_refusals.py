"""What Celery's consumer still refuses after the transport admitted a message (content
it cannot decode, headers it cannot read) goes the way of the transport's refusals: one
``rejected`` reason per kind of defect, and the envelope onto the dead-letter list."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery.exceptions import InvalidTaskError
from kombu.exceptions import ContentDisallowed, DecodeError

from worker.broker.consumer import refuse_message
from worker.broker.queue_items import ItemRejected


@dataclass
class RecordingChannel:
    refused: list[tuple[bytes, str, ItemRejected]] = field(default_factory=list)

    def refuse_item(self, raw: bytes, queue: str, rejected: ItemRejected) -> None:
        self.refused.append((raw, queue, rejected))


@dataclass
class StubMessage:
    headers: Any
    content_type: str = "application/json"
    channel: RecordingChannel = field(default_factory=RecordingChannel)

    @property
    def _raw(self) -> dict[str, Any]:
        return {"headers": self.headers, "content-type": self.content_type}


@pytest.mark.parametrize(("exc", "reason"), [
    (ContentDisallowed("pickle"), "undecodable_message"),
    (DecodeError("broken"), "undecodable_message"),
    (InvalidTaskError("unreadable task headers"), "invalid_message"),
])
def test_a_message_the_consumer_refuses_is_dead_lettered_with_its_reason(
    exc: Exception, reason: str,
) -> None:
    message = StubMessage(headers={"id": "t-1", "task": "compactor.compact_session"})

    refuse_message(message, exc, "compaction")

    [(raw, queue, rejected)] = message.channel.refused
    assert (queue, rejected.reason, rejected.task_id) == ("compaction", reason, "t-1")
    assert json.loads(raw) == message._raw


def test_headers_that_are_no_object_give_no_task_id() -> None:
    message = StubMessage(headers=["not", "an", "object"])

    refuse_message(message, InvalidTaskError("bad"), "compaction")

    assert message.channel.refused[0][2].task_id is None
