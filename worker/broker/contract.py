"""The job message contract other systems rely on (docs/TRIGGER.md): the task names, the
task's kwargs and their limits, and the Redis list a message lands in.

Constants and plain types only: importing this module builds no app and reads no setting.
"""

from __future__ import annotations

from typing import TypedDict

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator

from worker.compaction import find_control_character

TASK_NAME = "compactor.compact_session"
SCAN_TASK_NAME = "compactor.scan"
GC_TASK_NAME = "compactor.gc"  # registered by scheduler/tasks.py, as the scan
RECONCILE_TASK_NAME = "compactor.reconcile"  # registered by scheduler/tasks.py
POLL_BATCHES_TASK_NAME = "compactor.poll_batches"  # registered by scheduler/tasks.py
# The only task names a worker runs from its queue: Celery's built-in tasks
# (``celery.accumulate``, ``celery.chord_unlock``...) are refused like any unknown name.
SERVICE_TASK_NAMES = frozenset({TASK_NAME, SCAN_TASK_NAME, GC_TASK_NAME, RECONCILE_TASK_NAME,
                                POLL_BATCHES_TASK_NAME})
MAX_TASK_ID_CHARS = 255
MAX_HEADERS_CHARS = 16_384  # the headers object as JSON: Celery's reprs stay near 1 KiB each
MAX_SESSION_ID_CHARS = 512
MAX_REASON_CHARS = 200


class JobKwargs(TypedDict):
    """The task's keyword arguments; the worker rejects any other key."""

    session_id: str
    reason: str
    force: bool


class JobMessage(BaseModel):
    """The kwargs as the worker validates them; anything else is rejected, never retried."""

    model_config = ConfigDict(extra="forbid")

    session_id: StrictStr = Field(min_length=1, max_length=MAX_SESSION_ID_CHARS)
    reason: StrictStr = Field("trigger", max_length=MAX_REASON_CHARS)
    force: StrictBool = False

    @field_validator("session_id")
    @classmethod
    def _refuse_control_characters(cls, session_id: str) -> str:
        problem = session_id_problem(session_id)
        if problem:
            raise ValueError(problem)
        return session_id


def session_id_problem(session_id: str) -> str | None:
    """Why ``session_id`` is no session id (its first control character: ids are printed
    in tables and logs), or None. The length limit is the field's, checked before."""
    return find_control_character("session_id", session_id)


def job_kwargs(session_id: str, reason: str, *, force: bool = False) -> JobKwargs:
    """Build the kwargs of one ``compactor.compact_session`` message."""
    return {"session_id": session_id, "reason": reason, "force": force}


def queue_list_key(redis_key_prefix: str, queue_name: str) -> str:
    """The Redis list the worker pops messages of priority 0 from (producers LPUSH)."""
    return f"{redis_key_prefix}{queue_name}"
