"""The outcome event has one field set, whether a job ran or its message was unreadable."""

from __future__ import annotations

import dataclasses

from structlog.testing import capture_logs

from worker.errors import Outcome
from worker.job.figures import JobFigures
from worker.job.outcome import emit_job_event, job_event_fields, rejected_message_fields
from worker.job.values import JobResult
from worker.logging import get_logger


def a_result() -> JobResult:
    return JobResult(
        session_id="s-1", task_id="t-1", attempt=1, trigger="scan", outcome=Outcome.COMPACTED,
        reason="over_trigger", summarizer="extractive", failure_class=None,
        failure_message=None, retryable=False, retry_after_s=None, revision_id=7,
        parent_revision_id=None, breaker_state="closed",
        figures=JobFigures(tokens_before=9_000, tokens_after=3_000), durations_ms={"swap": 1.0},
        duration_ms=12.5,
    )


def test_an_unreadable_message_event_carries_every_field_of_a_job_event() -> None:
    rejected = rejected_message_fields("t-2", "undecodable_message", "ContentDisallowed", "x")
    assert rejected.keys() == job_event_fields(a_result()).keys()
    assert (rejected["outcome"], rejected["reason"], rejected["task_id"]) == \
        ("rejected", "undecodable_message", "t-2")


def test_a_job_event_reports_figures_and_leaves_missing_ones_null() -> None:
    fields = job_event_fields(a_result(), will_retry=False)
    assert (fields["tokens_before"], fields["tokens_after"]) == (9_000, 3_000)
    assert fields["llm_calls"] is None and fields["revision_id"] == 7


def test_a_final_failure_is_logged_at_error_level_and_a_retried_one_at_info() -> None:
    failed = dataclasses.replace(a_result(), outcome=Outcome.FAILED, reason="malformed_json",
                                 failure_class="SummaryInvalid", failure_message="no JSON")
    with capture_logs() as logs:
        emit_job_event(get_logger(), failed)
        emit_job_event(get_logger(), failed, will_retry=True)
    assert [(e["log_level"], e["will_retry"]) for e in logs] == [("error", False), ("info", True)]
    assert logs[0]["failure_class"] == "SummaryInvalid"
