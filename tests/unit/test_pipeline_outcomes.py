"""The outcomes of one job (``worker.job.pipeline.run``) on the in-memory store besides its
failures (``test_pipeline_failures.py``) and breakers (``test_pipeline_breakers.py``):
compacted, every skip, rejected, the conflicts of a compare-and-swap lost mid-job, the
update of the prior summary, and the event of each. Sessions are generated; the store's
contract is held to the real one in ``tests/integration/test_store_contract.py``."""

from __future__ import annotations

import dataclasses
import gc
from datetime import datetime

import pytest
from structlog.testing import capture_logs

from db import NewRevision, NewRun
from tests.support.generated import generated_turns
from tests.support.job_harness import LEASE_TTL_S, FakeClock, JobHarness
from tests.support.store_jobs import swap_in, take_lease
from tests.unit.session_strategies import shared_counter
from worker.compaction.history import GROUPED
from worker.compaction.intake import IntakePolicy
from worker.compaction.schema import Summary, empty_summary
from worker.errors import Outcome
from worker.job.outcome import emit_job_event, event_field_docs
from worker.logging import get_logger
from worker.platform.ingest import append_messages

SESSION = "s-1"
LONG_TURNS = 20  # about 2,400 tokens: over the 2,000-token trigger
SHORT_TURNS = 8


@pytest.fixture
def harness() -> JobHarness:
    return JobHarness(shared_counter())


def compacted_session(harness: JobHarness) -> str:
    harness.add_session(SESSION, LONG_TURNS)
    assert harness.run(SESSION).outcome is Outcome.COMPACTED
    append_messages(harness.store, shared_counter(), IntakePolicy(), SESSION,
                    generated_turns("NEW", 16), harness.clock())
    return SESSION


def test_a_session_over_the_trigger_is_compacted_into_its_run_and_a_smaller_projection(
    harness: JobHarness,
) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    history = harness.store.messages(SESSION)
    before = harness.store.get_session(SESSION)

    result = harness.run(SESSION)

    after = harness.store.get_session(SESSION)
    [revision] = harness.store.revisions(SESSION)
    assert (result.outcome, result.reason, result.summarizer) == \
        (Outcome.COMPACTED, "over_trigger", "llm")
    assert result.revision_id == after.active_revision_id == revision.id
    assert (result.parent_revision_id, result.breaker_state) == (None, "closed")
    figures = result.figures
    assert figures.tokens_before == before.projection_tokens == revision.projection_tokens_before
    assert figures.tokens_after == after.projection_tokens < harness.policy.trigger.trigger_tokens
    assert figures.summary_tokens == revision.summary_tokens == revision.block_tokens
    assert (figures.span_tokens, figures.llm_calls) == (revision.span_tokens, 1)
    out_of_block = [a["value"] for a in revision.artifacts
                    if a["kind"] != "tool" and a["value"] not in revision.block["content"]]
    assert figures.identifiers_recall_only == len(out_of_block)
    [run] = harness.store.runs(session_id=SESSION)
    assert (run.outcome, run.revision_id, run.figures["outcome_reason"]) == \
        ("compacted", revision.id, "over_trigger")
    assert run.figures["identifiers_recall_only"] == figures.identifiers_recall_only
    assert after.lease_owner is None and harness.store.messages(SESSION) == history


@pytest.mark.parametrize("enabled_before", [True, False])
def test_a_job_holds_the_garbage_collector_off_and_leaves_it_as_it_found_it(
    harness: JobHarness, monkeypatch: pytest.MonkeyPatch, enabled_before: bool
) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    enabled_during: list[bool] = []
    read_clock = FakeClock.__call__

    def recording_clock(clock: FakeClock) -> datetime:
        enabled_during.append(gc.isenabled())
        return read_clock(clock)

    monkeypatch.setattr(FakeClock, "__call__", recording_clock)
    if not enabled_before:
        gc.disable()
    try:
        assert harness.run(SESSION).outcome is Outcome.COMPACTED
        assert gc.isenabled() is enabled_before
    finally:
        gc.enable()
    assert enabled_during and not any(enabled_during)


def test_a_session_under_the_trigger_is_skipped_without_a_summary(harness: JobHarness) -> None:
    harness.add_session(SESSION, SHORT_TURNS)
    before = harness.state(SESSION)
    taken = harness.record_snapshots()

    result = harness.run(SESSION)

    assert (result.outcome, result.reason, result.summarizer) == \
        (Outcome.SKIPPED, "under_trigger", None)
    assert harness.state(SESSION) == before and harness.summarizer.seen == []
    [run] = harness.store.runs(session_id=SESSION)
    assert (run.outcome, run.figures["outcome_reason"]) == ("skipped", "under_trigger")
    # Only the session row was read: its projection is the messages' sum the plan takes.
    [snapshot] = taken
    assert snapshot is not None and snapshot.under_trigger and snapshot.messages == []
    assert result.figures.tokens_before == harness.store.get_session(SESSION).projection_tokens \
        == sum(m.tokens for m in harness.store.messages(SESSION))


def test_a_forced_job_on_a_session_that_fits_its_tail_has_nothing_to_summarize(
    harness: JobHarness,
) -> None:
    harness.add_session(SESSION, 1)
    taken = harness.record_snapshots()

    result = harness.run(SESSION, force=True)

    assert (result.outcome, result.reason) == (Outcome.SKIPPED, "nothing_to_summarize")
    assert harness.store.revisions(SESSION) == [] and harness.summarizer.seen == []
    # Forced past the trigger, the job read the messages.
    [snapshot] = taken
    assert snapshot is not None and not snapshot.under_trigger and snapshot.messages


def test_two_compactions_that_saved_little_make_the_next_one_skip_as_anti_thrash(
    harness: JobHarness,
) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    for _ in range(2):  # each covers one more message and saves almost nothing
        swap_a_revision(harness, saving_tokens=1)

    result = harness.run(SESSION)

    assert (result.outcome, result.reason) == (Outcome.SKIPPED, "anti_thrash")
    assert harness.summarizer.seen == []


def swap_a_revision(harness: JobHarness, *, saving_tokens: int) -> int:
    """Swap in a revision whose block replaces one more message, as an earlier job did."""
    state, now = harness.store.get_session(SESSION), harness.clock()
    active = harness.store.revisions(SESSION)[:1]
    through_seq = active[0].through_seq + 1 if active else 2
    [message] = [m for m in harness.store.messages(SESSION) if m.seq == through_seq]
    block_tokens = message.tokens + (active[0].block_tokens if active else 0)
    revision = NewRevision(through_seq, state.head_seq, empty_summary().model_dump(),
                           {"role": "user", "content": "summary"}, block_tokens, "[]",
                           block_tokens, message.tokens,
                           state.projection_tokens + saving_tokens, None, None, "extractive")
    run = NewRun(SESSION, "earlier", 1, "test", "compacted", None, None, {}, None, now, now)
    return swap_in(harness.store, SESSION, expected_revision_id=state.active_revision_id,
                   revision=revision, run=run, now=now)


def test_a_session_whose_lease_another_job_holds_is_skipped(harness: JobHarness) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    take_lease(harness.store, SESSION, "other-host:9:task-x", LEASE_TTL_S, harness.clock())

    result = harness.run(SESSION)

    assert (result.outcome, result.reason) == (Outcome.SKIPPED, "lease_held")
    assert harness.store.get_session(SESSION).lease_owner == "other-host:9:task-x"


def test_a_redelivered_job_takes_over_the_lease_its_lost_delivery_left(
    harness: JobHarness,
) -> None:
    harness.add_session(SESSION, LONG_TURNS)
    take_lease(harness.store, SESSION, "dead-host:7:task-r", LEASE_TTL_S, harness.clock())

    result = harness.run(SESSION, task_id="task-r", redelivered=True)

    assert result.outcome is Outcome.COMPACTED
    assert harness.store.get_session(SESSION).lease_owner is None


def test_a_retry_takes_over_the_lease_its_attempt_left_when_the_database_was_down(
    harness: JobHarness,
) -> None:
    # Attempt 1 failed with store_unavailable and could not release its lease.
    harness.add_session(SESSION, LONG_TURNS)
    take_lease(harness.store, SESSION, "host:7:task-r", LEASE_TTL_S, harness.clock())

    other = harness.run(SESSION, task_id="task-s", attempt=2)
    result = harness.run(SESSION, task_id="task-r", attempt=2)

    assert (other.outcome, other.reason) == (Outcome.SKIPPED, "lease_held")
    assert result.outcome is Outcome.COMPACTED
    assert harness.store.get_session(SESSION).lease_owner is None


def test_an_unknown_session_is_rejected_with_its_run_recorded(harness: JobHarness) -> None:
    result = harness.run("no-such-session")

    assert (result.outcome, result.reason, result.failure_class) == \
        (Outcome.REJECTED, "unknown_session", "JobRejected")
    assert not result.retryable and result.run_recorded
    [run] = harness.store.runs(session_id="no-such-session")
    assert run.outcome == "rejected"


def test_a_revision_changed_mid_job_ends_in_conflict_and_the_job_writes_nothing(
    harness: JobHarness,
) -> None:
    compacted_session(harness)
    seen = []

    def roll_back() -> None:
        harness.store.rollback(SESSION)
        seen.append(harness.state(SESSION))

    harness.summarizer.before = roll_back
    result = harness.run(SESSION)

    assert (result.outcome, result.reason, result.failure_class) == \
        (Outcome.CONFLICT, "active_revision_changed", "StaleSnapshot")
    assert result.revision_id is None and not result.retryable
    assert harness.state(SESSION) == seen[0]
    session = harness.store.get_session(SESSION)
    assert (session.breaker_state, session.breaker_failures, session.lease_owner) == \
        ("closed", 0, None)
    assert harness.store.runs(session_id=SESSION, limit=1)[0].outcome == "conflict"


def test_a_lease_lost_mid_job_ends_in_conflict_and_leaves_the_new_holder_alone(
    harness: JobHarness,
) -> None:
    harness.add_session(SESSION, LONG_TURNS)

    def lose_the_lease() -> None:
        harness.clock.advance(LEASE_TTL_S + 1)
        assert take_lease(harness.store, SESSION, "other:1:t", LEASE_TTL_S, harness.clock())

    harness.summarizer.before = lose_the_lease
    result = harness.run(SESSION)

    assert (result.outcome, result.reason) == (Outcome.CONFLICT, "lease_lost")
    assert harness.store.revisions(SESSION) == []
    assert harness.store.get_session(SESSION).lease_owner == "other:1:t"


def test_the_prior_summary_is_context_to_the_summarizer_and_updated_once_after_it(
    harness: JobHarness,
) -> None:
    compacted_session(harness)
    [first] = harness.store.revisions(SESSION)

    result = harness.run(SESSION)

    second, _ = harness.store.revisions(SESSION)
    work = harness.summarizer.seen[-1]
    assert result.outcome is Outcome.COMPACTED and second.parent_revision_id == first.id
    assert work.prior == Summary.model_validate(first.summary)
    assert min(m.seq for g in work.span for m in g.messages) == first.through_seq + 1
    prior, updated = work.prior, Summary.model_validate(second.summary)
    assert prior is not None
    # Prior items first, each once (word for word, or folded into grouped count lines
    # when the update does not fit its budget: facts before history); the new span's own
    # items after them; the goal stands (the span continues the conversation).
    actions = updated.completed_actions
    earlier = len(prior.completed_actions)
    if actions[:earlier] != prior.completed_actions:
        earlier = sum(1 for item in actions if item.startswith(GROUPED)) + 1
        assert actions[0] == prior.completed_actions[0]  # the compacted seq range
        assert all(item.startswith(GROUPED) for item in actions[1:earlier])
    assert len(actions) == len(set(actions)) > earlier
    assert not set(actions[earlier:]) & set(prior.completed_actions)
    assert updated.goal == prior.goal and "s-1R0" in updated.goal
    # The new span's identifiers are listed first, newest first, ahead of the prior's:
    # its newest exchange's reservation and flight lead.
    newest = max((a for a in work.artifacts if a.value.startswith("NEWR")),
                 key=lambda a: a.last_seq)
    flight = f"HAT{100 + int(newest.value.removeprefix('NEWR'))}"
    assert set(updated.relevant_artifacts[:2]) == {newest.value, flight}


@pytest.mark.parametrize("turns", [LONG_TURNS, SHORT_TURNS, 0])
def test_every_job_event_carries_every_documented_field(
    harness: JobHarness, turns: int,
) -> None:
    session_id = harness.add_session(SESSION, turns) if turns else "unknown"
    result = harness.run(session_id)

    with capture_logs() as logs:
        emit_job_event(get_logger(), result)

    [event] = logs
    assert set(event) - {"event", "log_level"} == set(event_field_docs())
    figures = dataclasses.asdict(result.figures)
    assert {name: event[name] for name in figures} == figures
