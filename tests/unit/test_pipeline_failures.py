"""How one job fails on the in-memory store, and what a failure may write (its run and
the breaker, nothing else): invalid summaries by typed reason, a summarizer's own error,
an unexpected error, an unavailable store, a run that cannot be recorded, and a job
that must not run at all."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from db import StoreError, StoreUnavailable
from tests.support.job_harness import JobHarness
from tests.unit.session_strategies import shared_counter
from worker.compaction.errors import SummaryInvalid
from worker.compaction.schema import Summary, empty_summary
from worker.errors import DeliveryCapExceeded, Outcome
from worker.job import pipeline
from worker.job.values import JobRequest

SESSION = "s-f"
LONG_TURNS = 20  # about 2,400 tokens: over the 2,000-token trigger
SHORT_TURNS = 8


@pytest.fixture
def harness() -> JobHarness:
    return JobHarness(shared_counter())


def over_budget_summary() -> Summary:
    return empty_summary().model_copy(update={
        "goal": "g", "completed_actions": [f"step {i} of a long list" for i in range(400)]})


@pytest.mark.parametrize(("draft", "reason"), [
    (empty_summary, "empty_sections"),
    (over_budget_summary, "over_budget"),
])
def test_an_invalid_summary_fails_the_job_and_counts_on_the_session_breaker(
    harness: JobHarness, draft: Callable[[], Summary], reason: str,
) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    before = harness.state(SESSION)
    harness.summarizer.summary = draft()

    result = harness.run(SESSION)

    assert (result.outcome, result.reason, result.failure_class) == \
        (Outcome.FAILED, reason, "SummaryInvalid")
    assert not result.retryable and harness.state(SESSION) == before
    session = harness.store.get_session(SESSION)
    assert (session.breaker_state, session.breaker_failures, session.lease_owner) == \
        ("closed", 1, None)
    [run] = harness.store.runs(session_id=SESSION)
    assert (run.outcome, run.failure_class, run.revision_id) == ("failed", "SummaryInvalid", None)


def test_a_summary_no_smaller_than_what_it_replaces_fails_as_not_smaller(
    harness: JobHarness,
) -> None:
    harness.with_policy(summary_budget_tokens=8_000).add_session(SESSION, LONG_TURNS)
    harness.summarizer.summary = empty_summary().model_copy(update={
        "goal": "g", "completed_actions": [f"step {i} of a long list" for i in range(400)]})

    result = harness.run(SESSION)

    assert (result.outcome, result.reason) == (Outcome.FAILED, "not_smaller")
    assert harness.store.revisions(SESSION) == []


def test_a_job_that_must_not_run_records_its_failure_and_counts_it_on_the_session(
    harness: JobHarness,
) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    cap = DeliveryCapExceeded("delivered 4 times", reason="delivery_cap")

    result = pipeline.record_failure(JobRequest(SESSION, "test", task_id="t-cap"),
                                     harness.deps, harness.policy, cap)

    assert (result.outcome, result.reason, result.failure_class) == \
        (Outcome.FAILED, "delivery_cap", "DeliveryCapExceeded")
    assert harness.store.get_session(SESSION).breaker_failures == 1
    assert harness.store.runs(session_id=SESSION)[0].task_id == "t-cap"
    assert harness.summarizer.seen == []


def test_a_summarizer_error_is_failed_with_its_typed_reason(harness: JobHarness) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    harness.summarizer.error = SummaryInvalid("no JSON object", reason="malformed_json")

    result = harness.run(SESSION)

    assert (result.outcome, result.reason, result.breaker_state) == \
        (Outcome.FAILED, "malformed_json", "closed")
    assert harness.store.get_session(SESSION).breaker_failures == 1


def test_an_unexpected_error_is_an_internal_failure_counted_on_the_session(
    harness: JobHarness,
) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    harness.summarizer.error = RuntimeError("a message body that must not be logged")

    result = harness.run(SESSION)

    assert (result.outcome, result.reason, result.failure_class) == \
        (Outcome.FAILED, "internal_error", "InternalError")
    assert result.failure_message == "unexpected RuntimeError"
    assert harness.store.get_session(SESSION).breaker_failures == 1


def test_an_unavailable_store_is_a_transient_failure_that_spares_the_breaker(
    harness: JobHarness,
) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    harness.store.fail_with("job_snapshot", StoreUnavailable("OperationalError: gone"))

    result = harness.run(SESSION)

    assert (result.outcome, result.reason, result.retryable) == \
        (Outcome.FAILED, "store_unavailable", True)
    assert result.run_recorded and harness.store.get_session(SESSION).breaker_failures == 0


def test_a_run_that_cannot_be_recorded_still_ends_in_one_result_naming_it(
    harness: JobHarness,
) -> None:
    harness.add_session(SESSION, SHORT_TURNS)
    harness.store.fail_with("record_run", StoreError("ProgrammingError: no table runs"))

    result = harness.run(SESSION)

    assert (result.outcome, result.run_recorded) == (Outcome.SKIPPED, False)
    assert result.record_error == "ProgrammingError: no table runs"
