"""The job message contract other systems rely on: the task's kwargs and the Redis list
a message lands in. docs/TRIGGER.md describes the full raw envelope around them.
"""

from __future__ import annotations

from typing import TypedDict

from worker.celery_app import TASK_NAME

__all__ = ["TASK_NAME", "JobKwargs", "job_kwargs", "queue_list_key"]


class JobKwargs(TypedDict):
    """The task's keyword arguments; the worker rejects any other key."""

    session_id: str
    reason: str
    force: bool


def job_kwargs(session_id: str, reason: str, *, force: bool = False) -> JobKwargs:
    """Build the kwargs of one ``compactor.compact_session`` message."""
    return {"session_id": session_id, "reason": reason, "force": force}


def queue_list_key(redis_key_prefix: str, queue_name: str) -> str:
    """The Redis list the worker pops messages of priority 0 from (producers LPUSH)."""
    return f"{redis_key_prefix}{queue_name}"
