"""The session's and the provider's breakers through whole jobs on the in-memory store:
trip at the threshold, no summarizer call (nor message read) while open, the half-open
trial after the cooldown, success closes, failure reopens; the fallback policy commits the
extractive summary loudly, and a provider outage never counts on the session."""

from __future__ import annotations

import pytest

from db import BreakerUpdate
from tests.support.job_harness import (
    BREAKER_THRESHOLD,
    COOLDOWN_S,
    PROVIDER_THRESHOLD,
    JobHarness,
)
from tests.unit.session_strategies import shared_counter
from worker.compaction import BreakerState
from worker.compaction.errors import SummaryInvalid
from worker.errors import Outcome, ProviderError

SESSION = "s-b"
LONG_TURNS = 20
SHORT_TURNS = 8


@pytest.fixture
def harness() -> JobHarness:
    return JobHarness(shared_counter())


def open_the_breaker(harness: JobHarness) -> None:
    harness.summarizer.error = SummaryInvalid("no JSON object", reason="malformed_json")
    results = [harness.run(SESSION) for _ in range(BREAKER_THRESHOLD)]
    assert [r.breaker_state for r in results] == ["closed"] * (BREAKER_THRESHOLD - 1) + ["open"]


def breaker_of(harness: JobHarness) -> tuple[str, int]:
    session = harness.store.get_session(SESSION)
    return session.breaker_state, session.breaker_failures


def test_failures_trip_the_breaker_at_the_threshold_and_it_blocks_the_summarizer(
    harness: JobHarness,
) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    open_the_breaker(harness)
    calls = len(harness.summarizer.seen)

    blocked = harness.run(SESSION)

    assert (blocked.outcome, blocked.reason, blocked.breaker_state) == \
        (Outcome.BREAKER_OPEN, "breaker_open", "open")
    assert len(harness.summarizer.seen) == calls == BREAKER_THRESHOLD
    assert breaker_of(harness) == ("open", BREAKER_THRESHOLD)
    assert harness.store.revisions(SESSION) == []
    assert harness.store.runs(session_id=SESSION, limit=1)[0].outcome == "breaker_open"


def test_a_job_the_open_breaker_skips_reads_no_message(harness: JobHarness) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    open_the_breaker(harness)
    taken = harness.record_snapshots()

    assert harness.run(SESSION).outcome is Outcome.BREAKER_OPEN
    harness.clock.advance(COOLDOWN_S)
    harness.summarizer.error = None
    assert harness.run(SESSION).outcome is Outcome.COMPACTED

    refused, trial = taken
    assert refused is not None and refused.breaker_refused
    assert (refused.messages, refused.recent_revisions) == ([], ())
    assert trial is not None and not trial.breaker_refused and trial.messages


def test_a_cooldown_that_ends_between_the_lease_and_the_breaker_step_still_skips(
    harness: JobHarness,
) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    open_the_breaker(harness)
    harness.clock.advance(COOLDOWN_S - 1)
    taken = harness.record_snapshots(then_advance_s=1)
    calls = len(harness.summarizer.seen)

    skipped = harness.run(SESSION)

    assert (skipped.outcome, skipped.reason) == (Outcome.BREAKER_OPEN, "breaker_open")
    assert taken[0] is not None and taken[0].breaker_refused
    assert len(harness.summarizer.seen) == calls
    assert breaker_of(harness) == ("open", BREAKER_THRESHOLD)


def test_after_the_cooldown_a_successful_trial_closes_the_breaker(harness: JobHarness) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    open_the_breaker(harness)
    harness.summarizer.error = None

    harness.clock.advance(COOLDOWN_S - 1)
    assert harness.run(SESSION).outcome is Outcome.BREAKER_OPEN
    harness.clock.advance(1)
    trial = harness.run(SESSION)

    assert (trial.outcome, trial.breaker_state) == (Outcome.COMPACTED, "closed")
    assert breaker_of(harness) == ("closed", 0)


def test_a_failed_trial_reopens_the_breaker_for_another_cooldown(harness: JobHarness) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    open_the_breaker(harness)
    harness.clock.advance(COOLDOWN_S)

    trial = harness.run(SESSION)

    assert (trial.outcome, trial.breaker_state) == (Outcome.FAILED, "open")
    session = harness.store.get_session(SESSION)
    assert (session.breaker_state, session.breaker_failures, session.breaker_opened_at) == \
        ("open", BREAKER_THRESHOLD + 1, harness.clock())
    assert harness.run(SESSION).outcome is Outcome.BREAKER_OPEN


def test_the_trial_is_recorded_half_open_before_the_job_goes_on(harness: JobHarness) -> None:
    harness.add_session(SESSION, SHORT_TURNS)
    harness.store.set_breaker(SESSION, BreakerUpdate("open", 3, harness.clock()))
    harness.clock.advance(COOLDOWN_S)

    result = harness.run(SESSION)  # admitted as the trial, then under the trigger

    assert (result.outcome, result.reason, result.breaker_state) == \
        (Outcome.SKIPPED, "under_trigger", "half_open")
    assert breaker_of(harness) == ("half_open", 3)


def test_an_open_breaker_with_the_fallback_policy_commits_the_extractive_summary_and_stays_open(
    harness: JobHarness,
) -> None:
    harness.with_policy(fallback_when_open=True).add_session(SESSION, LONG_TURNS)
    harness.store.set_breaker(SESSION, BreakerUpdate("open", 3, harness.clock()))

    result = harness.run(SESSION)

    assert (result.outcome, result.summarizer, result.breaker_state) == \
        (Outcome.BREAKER_OPEN, "fallback", "open")
    [revision] = harness.store.revisions(SESSION)
    assert result.revision_id == revision.id and revision.summarizer == "fallback"
    assert harness.summarizer.seen == []
    # A fallback is no proof the LLM path works again: the breaker stays open.
    assert breaker_of(harness) == ("open", 3)


def test_a_provider_outage_counts_on_the_provider_breaker_and_never_on_the_session(
    harness: JobHarness,
) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    harness.summarizer.error = ProviderError("HTTP 500", reason="server_error")

    results = [harness.run(SESSION) for _ in range(PROVIDER_THRESHOLD + 1)]

    assert [(r.outcome, r.failure_class, r.retryable) for r in results] == \
        [(Outcome.FAILED, "ProviderError", True)] * PROVIDER_THRESHOLD + \
        [(Outcome.FAILED, "ProviderBreakerOpen", True)]
    assert results[-1].reason == "provider_breaker_open"
    assert len(harness.summarizer.seen) == PROVIDER_THRESHOLD  # the last job did not call
    assert breaker_of(harness) == ("closed", 0)


def test_with_the_provider_breaker_open_the_fallback_policy_commits_as_fallback(
    harness: JobHarness,
) -> None:
    harness.with_policy(fallback_when_open=True).add_session(SESSION, LONG_TURNS)
    for _ in range(PROVIDER_THRESHOLD):
        harness.provider.record_failure()

    result = harness.run(SESSION)

    assert (result.outcome, result.reason, result.summarizer, result.breaker_state) == \
        (Outcome.FALLBACK, "over_trigger", "fallback", "closed")
    assert harness.store.revisions(SESSION)[0].summarizer == "fallback"
    assert harness.summarizer.seen == []


def test_a_success_through_the_provider_closes_its_breaker(harness: JobHarness) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    harness.provider.record_failure()

    assert harness.run(SESSION).outcome is Outcome.COMPACTED

    for _ in range(PROVIDER_THRESHOLD - 1):
        harness.provider.record_failure()
    assert harness.provider.admit()  # the success reset the count


def test_a_provider_trial_ending_in_an_invalid_summary_reopens_both_breakers(
    harness: JobHarness,
) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    open_the_breaker(harness)
    for _ in range(PROVIDER_THRESHOLD):
        harness.provider.record_failure()
    harness.clock.advance(COOLDOWN_S)

    trial = harness.run(SESSION)  # the trial of both breakers, and an invalid summary

    assert (trial.outcome, trial.reason, trial.breaker_state) == \
        (Outcome.FAILED, "malformed_json", "open")
    assert breaker_of(harness) == ("open", BREAKER_THRESHOLD + 1)
    provider = harness.provider_state.load()
    assert (provider.state, provider.failures, provider.opened_at) == \
        (BreakerState.OPEN, PROVIDER_THRESHOLD + 1, harness.clock())
    assert not harness.provider.admit()


def test_a_job_the_plan_skips_leaves_the_provider_trial_to_one_that_calls_it(
    harness: JobHarness,
) -> None:
    short = harness.add_session("s-short", SHORT_TURNS)
    harness.add_session(SESSION, LONG_TURNS)
    for _ in range(PROVIDER_THRESHOLD):
        harness.provider.record_failure()
    harness.clock.advance(COOLDOWN_S)

    skipped = harness.run(short)  # under the trigger: no LLM call to try the provider with

    assert (skipped.outcome, skipped.reason) == (Outcome.SKIPPED, "under_trigger")
    assert harness.provider_state.load().state is BreakerState.OPEN
    assert harness.run(SESSION).outcome is Outcome.COMPACTED  # the trial, which closes it
    assert harness.provider_state.load().state is BreakerState.CLOSED
