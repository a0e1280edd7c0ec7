"""The scan's publisher: a page of job messages written to Redis in one round trip, each
one the envelope Celery's client would write for it (docs/TRIGGER.md).

``send_task`` costs a Redis round trip and Celery's message building per job; a scan
publishes whole pages, so it writes the documented envelopes itself, in one command.
kombu's ``Producer.batch`` saves the round trips but not the building (docs/BENCHMARKS.md
section 6), and its pipeline, unlike one LPUSH, can be applied in part.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any

import redis
from celery.utils.nodenames import anon_nodename

from worker.broker.contract import TASK_NAME, JobKwargs, queue_list_key

if TYPE_CHECKING:
    from scheduler.enqueue import QueuedJob

EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
# The envelope's per-message strings, as placeholders in a publisher's template.
_SLOTS = ("body", "id", "kwargsrepr", "delivery_tag")
_SLOT_PATTERN = re.compile('"@(' + "|".join(_SLOTS) + ')@"')


def task_envelope(job_id: str, *, body: str, kwargsrepr: str, queue: str, origin: str,
                  reply_to: str, delivery_tag: str) -> dict[str, Any]:
    """What Celery (protocol 2, JSON) and kombu's Redis transport store for
    ``send_task(TASK_NAME, kwargs=kwargs, task_id=job_id, queue=queue)``, in their key
    order: ``body`` is the base64 of ``[[], kwargs, EMBED]`` as JSON, and ``kwargsrepr``
    Celery's ``saferepr`` of the kwargs (their ``repr``: the kwargs' limits keep it under
    saferepr's 1,024 characters)."""
    return {
        "body": body,
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py", "task": TASK_NAME, "id": job_id, "shadow": None, "eta": None,
            "expires": None, "group": None, "group_index": None, "retries": 0,
            "timelimit": [None, None], "root_id": job_id, "parent_id": None,
            "argsrepr": "()", "kwargsrepr": kwargsrepr, "origin": origin,
            "ignore_result": None, "replaced_task_nesting": 0, "stamped_headers": None,
            "stamps": {},
        },
        "properties": {
            "correlation_id": job_id, "reply_to": reply_to, "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue}, "priority": 0,
            "body_encoding": "base64", "delivery_tag": delivery_tag,
        },
    }


@dataclass(frozen=True)
class EnvelopeTemplate:
    """One sender's envelope as JSON text cut around its per-message strings, so that a
    message costs four string encodings (``json.dumps``'s own string encoder) instead of
    a whole ``json.dumps``."""

    parts: tuple[str, ...]
    slots: tuple[str, ...]

    @classmethod
    def of(cls, queue: str, origin: str, reply_to: str) -> EnvelopeTemplate:
        marks = {slot: f"@{slot}@" for slot in _SLOTS}
        text = json.dumps(task_envelope(
            marks["id"], body=marks["body"], kwargsrepr=marks["kwargsrepr"], queue=queue,
            origin=origin, reply_to=reply_to, delivery_tag=marks["delivery_tag"]))
        pieces = _SLOT_PATTERN.split(text)
        return cls(tuple(pieces[0::2]), tuple(pieces[1::2]))

    def render(self, job_id: str, kwargs: JobKwargs) -> str:
        """The message of one job: json.dumps of its ``task_envelope``, byte for byte."""
        body = base64.b64encode(json.dumps([[], kwargs, EMBED]).encode()).decode("ascii")
        values = {"body": body, "id": job_id, "kwargsrepr": repr(kwargs),
                  "delivery_tag": str(uuid.uuid4())}
        out = [self.parts[0]]
        for slot, part in zip(self.slots, self.parts[1:], strict=True):
            out += (encode_basestring_ascii(values[slot]), part)
        return "".join(out)


@dataclass(frozen=True)
class RedisPublisher:
    """Pushes each job's envelope onto the queue's list at priority 0, as kombu's
    ``_put`` does for a queue without ``x-expires``: a whole batch in one variadic LPUSH,
    which Redis applies at once (all of the batch or none) and which leaves the list as
    one LPUSH per message, in order, would."""

    client: redis.Redis
    key_prefix: str
    queue: str
    # One sender, as Celery's own: its node name, and one reply-to id per producer.
    origin: str = field(default_factory=anon_nodename)
    reply_to: str = field(default_factory=lambda: str(uuid.uuid4()))

    def publish(self, jobs: Sequence[QueuedJob]) -> None:
        """Write the jobs' messages in one round trip; the first job is consumed first."""
        if not jobs:
            return
        template = EnvelopeTemplate.of(self.queue, self.origin, self.reply_to)
        self.client.lpush(queue_list_key(self.key_prefix, self.queue),
                          *(template.render(job.job_id, job.kwargs) for job in jobs))
