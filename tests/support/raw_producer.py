"""A job producer that speaks the raw message contract (docs/TRIGGER.md) with plain
redis-py and no Celery client, and a reader of what a queue list holds."""

from __future__ import annotations

import base64
import json
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

import redis

# The contract's literal values, spelled out as a non-Python producer would.
TASK_NAME = "compactor.compact_session"
EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def build_raw_message(kwargs: Any, *, queue: str, task_id: str | None = None,
                      body: bytes | None = None) -> dict[str, Any]:
    """The JSON envelope of one task message; ``body`` overrides the encoded
    ``[args, kwargs, embed]`` (to send garbage on purpose)."""
    task_id = task_id or str(uuid.uuid4())
    if body is None:
        body = json.dumps([[], kwargs, EMBED]).encode()
    return {
        "body": base64.b64encode(body).decode("ascii"),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py", "task": TASK_NAME, "id": task_id, "shadow": None, "eta": None,
            "expires": None, "group": None, "group_index": None, "retries": 0,
            "timelimit": [None, None], "root_id": task_id, "parent_id": None,
            "argsrepr": "()", "kwargsrepr": repr(kwargs),
            "origin": f"raw-producer@{socket.gethostname()}:{os.getpid()}",
            "ignore_result": None, "replaced_task_nesting": 0, "stamped_headers": None,
            "stamps": {},
        },
        "properties": {
            "correlation_id": task_id, "reply_to": str(uuid.uuid4()), "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue}, "priority": 0,
            "body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
        },
    }


def push_raw_message(client: redis.Redis, key_prefix: str, queue: str,
                     message: dict[str, Any]) -> None:
    """LPUSH the envelope onto the queue's list (the worker pops from the right)."""
    client.lpush(f"{key_prefix}{queue}", json.dumps(message))


@dataclass(frozen=True)
class QueuedMessage:
    """The parts of a queued task message the tests look at."""

    task_id: str
    task_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    envelope: dict[str, Any]


def read_queue(client: redis.Redis, key_prefix: str, queue: str) -> list[QueuedMessage]:
    """Every message on the queue's list, oldest first, decoded; nothing is consumed."""
    messages = []
    for raw in reversed(client.lrange(f"{key_prefix}{queue}", 0, -1)):
        envelope = json.loads(raw)
        args, kwargs, _embed = json.loads(base64.b64decode(envelope["body"]))
        messages.append(QueuedMessage(envelope["headers"]["id"], envelope["headers"]["task"],
                                      args, kwargs, envelope))
    return messages
