"""The ``compaction.job`` event: one per job attempt, the field set operators monitor.

Field names are a contract: the README's "Outcome events" table is generated from
``RESULT_FIELDS`` and ``JobFigures`` (``python -m scheduler.cli.config_table write``).
Message contents and secrets never appear, only ids, counts and reasons. The metrics
(``worker/metrics.py``) are counted from the same fields as each event is emitted.
"""

from __future__ import annotations

from typing import Any

from worker.job.figures import JobFigures, figure_docs
from worker.job.values import JobResult
from worker.logging import JOB_EVENT
from worker.metrics import record_job_event
from worker.tracing.spans import AttributeValue

EVENT_TABLE_START = "<!-- event-table:start -->"
EVENT_TABLE_END = "<!-- event-table:end -->"

# The event's fields besides the figures, with what the README says of each.
RESULT_FIELDS: dict[str, str] = {
    "session_id": "the session's external id",
    "task_id": "the job's message id (the scan's or trigger's job id; `inline` for "
               "`compactor compact --inline`)",
    "attempt": "1 for the first delivery, +1 per retry",
    "trigger": "why the job was sent: `over_trigger` or `dirty` (scan), `trigger` or a "
               "caller's reason, `operator` (inline)",
    "outcome": "`compacted`, `fallback` (the deterministic summary was committed because "
               "the provider breaker is open, or in place of a model's summary that "
               "contradicts the span's record), `skipped` (nothing to do, e.g. `under_trigger`, "
               "`anti_thrash`, `lease_held`), `breaker_open` (the session's breaker is open), "
               "`conflict` (the active revision changed under the job; nothing written), "
               "`parked` (batch mode: its requests wait for a batch, reason "
               "`awaiting_batch`), `rejected` (malformed message, unknown session), `failed`",
    "reason": "the outcome's reason: the plan's decision (`over_trigger`, `forced`, "
              "`under_trigger`, `anti_thrash`, `thrash_lifted`, `nothing_to_summarize`) or "
              "the failure's (`timeout`, `rate_limited`, `server_error`, `connection`, "
              "`invalid_response` (the endpoint answered 2xx with no chat completion: HTML, "
              "undecodable or cut JSON, no choices; a provider failure), `auth_failed`, "
              "`schema_mismatch`, `not_smaller`, `truncated`, "
              "`summary_contradicts_history` (the summary states what the span's originals "
              "refute: `failure_message` lists each kind with its count and ids), "
              "`delivery_cap`, "
              "`store_unavailable`, `time_limit` (the soft time limit), `stored_message_invalid` "
              "(a stored message no longer parses: a row written around ingest), "
              "`worker_lost` (the worker died or was killed; recorded afterwards by its "
              "worker's main process when a pool child died, else by the reconciler), "
              "`internal_error`, ...)",
    "summarizer": "`llm`, `extractive` or `fallback`; null when no summary was made",
    "failure_class": "the error class (`ProviderError`, `SummaryInvalid`, `StaleSnapshot`, "
                     "...), null on success (a `fallback` that replaced a contradicting "
                     "summary names it)",
    "failure_message": "a short description of the failure (never message contents)",
    "will_retry": "true when the job is retried with backoff (transient failures with retries "
                  "left); false on the last attempt, whose `reason` is the final failure's",
    "revision_id": "the new active revision when compacted",
    "parent_revision_id": "the revision it replaced (null: the full history)",
    "breaker_state": "the session's breaker after the job: `closed`, `open`, `half_open`",
    "duration_ms": "the job's wall time (ms)",
    "durations_ms": "wall time per step: `lease` (taking the lease and reading the "
                    "snapshot: on PostgreSQL one statement), `breaker`, `plan`, "
                    "`summarize`, `merge`, `validate`, `swap` (ms)",
    "run_recorded": "false when the run record could not be written at the job's end "
                    "(the database was down): it is kept in Redis and the reconciler "
                    "writes it later",
}


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
    return {**fields, **result.figures.as_dict()}


# Left off the job's span: a failure's text may quote a provider; the steps are spans.
SPAN_FIELDS_LEFT_OUT = frozenset({"failure_message", "durations_ms", "will_retry"})


def job_span_attributes(result: JobResult) -> dict[str, AttributeValue]:
    """The job span's attributes: the event's ids, outcome, reason and figures, each
    under ``compaction.`` (none of a message's text)."""
    return {f"compaction.{name}": value for name, value in job_event_fields(result).items()
            if name not in SPAN_FIELDS_LEFT_OUT and isinstance(value, str | bool | int | float)}


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
    return {**fields, **JobFigures().as_dict()}


def event_field_docs() -> dict[str, str]:
    """Every field of the event with its meaning, in the order the README lists them."""
    return {**RESULT_FIELDS, **figure_docs()}


def render_event_table() -> str:
    """The README's table of event fields (without its markers)."""
    rows = [f"| `{name}` | {doc} |" for name, doc in event_field_docs().items()]
    return "\n".join(["| field | meaning |", "|---|---|", *rows]) + "\n"


def emit_job_event(logger: Any, result: JobResult, *, will_retry: bool = False) -> None:
    """Log the one outcome event of this job attempt, and count it in the metrics."""
    fields = job_event_fields(result, will_retry=will_retry)
    level = "error" if result.outcome.value == "failed" and not will_retry else "info"
    getattr(logger, level)(JOB_EVENT, **fields)
    record_job_event(fields)


def emit_rejected_message(logger: Any, task_id: str | None, reason: str, failure_class: str,
                          failure_message: str) -> None:
    """Log the event of a queue item that never became a job, and count it."""
    fields = rejected_message_fields(task_id, reason, failure_class, failure_message)
    logger.error(JOB_EVENT, **fields)
    record_job_event(fields)
