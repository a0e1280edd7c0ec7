"""Poison pushed into the live queue during the chaos phase, as a broken or hostile
producer would: items the transport must refuse and dead-letter (null body, bad base64,
absurd nesting, a forged ``celery.*`` task, hostile headers), and valid jobs for real
sessions whose producer headers (``eta``, ``timelimit``, ``expires``) must be ignored."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from tests.e2e.test_bad_messages import bad_messages
from tests.support.raw_producer import build_raw_message

# Refused before a task runs: each is one ``rejected`` event and one dead letter.
REFUSED = ("null-body", "bad-base64", "deep-body", "forged-accumulate", "unknown-task",
           "retries-a-string", "huge-origin", "headers-a-list")


def hostile_headers() -> dict[str, dict[str, Any]]:
    """Producer scheduling headers a worker must ignore (the job runs now, in full)."""
    now = datetime.now(UTC)
    return {"far-eta": {"eta": (now + timedelta(days=1)).isoformat()},
            "expired": {"expires": (now - timedelta(hours=1)).isoformat()},
            "one-second-limit": {"timelimit": [1, 1]}}


@dataclass
class Poisoner:
    """Pushes rounds of poison into ``queue_key``; remembers what it pushed. RPUSH, at
    the end workers pop from: the poison is taken next, ahead of any backlog, and not
    lost in a later Redis restart (which loses everything queued) before a worker met
    it."""

    client: redis.Redis
    queue: str
    queue_key: str
    refused: Counter[str] = field(default_factory=Counter)  # name -> items pushed
    hostile_jobs: dict[str, str] = field(default_factory=dict)  # task id -> header kind

    def push_round(self, session_ids: list[str]) -> None:
        """One of each refused item, and one hostile-header job per session given (a real
        session: it must compact as if the headers were not there)."""
        wanted = {m.name: m for m in bad_messages(self.queue) if m.name in REFUSED}
        for name in REFUSED:
            self.client.rpush(self.queue_key, wanted[name].raw)
            self.refused[name] += 1
        for session_id, (kind, headers) in zip(session_ids, hostile_headers().items(),
                                               strict=False):
            task_id = f"hostile-{kind}-{uuid.uuid4().hex[:8]}"
            kwargs = {"session_id": session_id, "reason": "hostile-producer", "force": False}
            message = build_raw_message(kwargs, queue=self.queue, task_id=task_id)
            message["headers"].update(headers)
            self.client.rpush(self.queue_key, json.dumps(message).encode())
            self.hostile_jobs[task_id] = kind

    @property
    def items(self) -> int:
        return sum(self.refused.values()) + len(self.hostile_jobs)
