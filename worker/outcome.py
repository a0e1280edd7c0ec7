"""The ``compaction.job`` event: one per job attempt, the field set operators monitor.

Field names are a contract (documented in the README, "Outcome events"); message
contents and secrets never appear, only ids, counts and reasons.
"""

from __future__ import annotations

from typing import Any

from worker.job import JobResult
from worker.logging import JOB_EVENT

_FIGURES = ("tokens_before", "tokens_after", "span_tokens", "summary_tokens", "llm_calls",
            "prompt_tokens", "completion_tokens", "llm_retries", "chunks", "merge_rounds",
            "identifiers_reattached")


def job_event_fields(result: JobResult, *, will_retry: bool = False) -> dict[str, Any]:
    """Flatten a result into the event's fields (every documented key always present)."""
    fields: dict[str, Any] = {
        "session_id": result.session_id,
        "task_id": result.task_id,
        "attempt": result.attempt,
        "trigger": result.trigger,
        "outcome": result.outcome.value,
        "reason": result.reason,
        "summarizer": result.summarizer,
        "failure_class": result.failure_class,
        "failure_message": result.failure_message,
        "will_retry": will_retry,
        "revision_id": result.revision_id,
        "parent_revision_id": result.parent_revision_id,
        "breaker_state": result.breaker_state,
        "duration_ms": result.duration_ms,
        "durations_ms": result.durations_ms,
        "run_recorded": result.run_recorded,
    }
    for name in _FIGURES:
        fields[name] = result.figures.get(name)
    return fields


def rejected_message_fields(task_id: str | None, reason: str, failure_class: str,
                            failure_message: str) -> dict[str, Any]:
    """The event of a message that never became a job: every field, most of them null."""
    fields: dict[str, Any] = {
        "session_id": None, "task_id": task_id, "attempt": 1, "trigger": None,
        "outcome": "rejected", "reason": reason, "summarizer": None,
        "failure_class": failure_class, "failure_message": failure_message,
        "will_retry": False, "revision_id": None, "parent_revision_id": None,
        "breaker_state": None, "duration_ms": None, "durations_ms": {},
        "run_recorded": False,
    }
    return {**fields, **dict.fromkeys(_FIGURES)}


def emit_job_event(logger: Any, result: JobResult, *, will_retry: bool = False) -> None:
    """Log the one outcome event of this job attempt."""
    fields = job_event_fields(result, will_retry=will_retry)
    level = "error" if result.outcome.value == "failed" and not will_retry else "info"
    getattr(logger, level)(JOB_EVENT, **fields)
