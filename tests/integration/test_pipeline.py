"""One compaction job in process (``worker.pipeline.run``) on both databases, with the
real LLM summarizer against the OpenAI-protocol test server: every outcome, what a
failure may write, the outcome event, the session and provider breakers, the fallback
policy, incremental summaries and identifiers kept."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from structlog.testing import capture_logs

from db import BreakerUpdate, NewRevision, NewRun, Store, create_db_engine
from tests.support.e2e import (
    LONG_SESSION_ID,
    SHORT_SESSION_ID,
    append_turns,
    build_job_env,
    generated_session,
    generated_turns,
    import_corpus_sessions,
    import_records,
    projection_violations,
    token_counter,
)
from tests.support.openai_server import OpenAIServer
from worker import pipeline
from worker.compaction.prompts import render_prior_json
from worker.compaction.schema import Summary
from worker.errors import Outcome
from worker.fleet import InMemoryBreakerState, ProviderBreaker
from worker.job import JobDeps, JobPolicy, JobRequest, JobResult
from worker.keys import RedisKeys
from worker.logging import JOB_EVENT, get_logger
from worker.outcome import emit_job_event
from worker.runtime import build_summarizer, job_policy
from worker.settings import Settings
from worker.summarizers import ExtractiveSummarizer, Summarizer, SummaryDraft, SummaryWork

pytestmark = [pytest.mark.integration, pytest.mark.corpus]

COOLDOWN_S = 600
# What ``compaction.job`` always carries (README, "Outcome events").
EVENT_FIELDS = (
    "session_id", "task_id", "attempt", "outcome", "reason", "tokens_before", "tokens_after",
    "span_tokens", "summary_tokens", "llm_calls", "prompt_tokens", "completion_tokens",
    "chunks", "merge_rounds", "durations_ms", "revision_id", "parent_revision_id",
    "breaker_state", "failure_class", "failure_message",
)
RESERVATION_ID = re.compile(r'"reservation_id\\*"\s*:\s*\\*"([A-Z0-9]{6})\\*"')
TRANSCRIPT_SEQ = re.compile(r"^\[seq (\d+)\]", re.MULTILINE)


class FakeClock:
    """The jobs' clock, moved by the test (breaker cooldowns without sleeping)."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclasses.dataclass
class Harness:
    """A store, the job's dependencies and policy as one worker process builds them."""

    store: Store
    deps: JobDeps
    policy: JobPolicy
    clock: FakeClock
    settings: Settings
    jobs: int = 0

    def run(self, session_id: str, *, force: bool = False, deps: JobDeps | None = None
            ) -> JobResult:
        self.jobs += 1
        request = JobRequest(session_id, "test", force, task_id=f"task-{self.jobs}")
        return pipeline.run(request, deps or self.deps, self.policy)

    def state(self, session_id: str) -> tuple[Any, ...]:
        """Everything a failed job must leave alone: history, revisions, projection."""
        return (self.store.messages(session_id), self.store.revisions(session_id),
                self.store.projection(session_id),
                self.store.get_session(session_id).active_revision_id)


MakeHarness = Callable[..., Harness]


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(latency_ms=50) as running:
        yield running


@pytest.fixture
def make_harness(store: Store, database_url: str, server: OpenAIServer) -> MakeHarness:
    def make(**overrides: Any) -> Harness:
        settings = build_job_env(database_url, server.base_url, **{
            "breaker_cooldown_s": COOLDOWN_S, **overrides}).settings
        clock = FakeClock()
        return Harness(store, build_deps(settings, store, clock), job_policy(settings), clock,
                       settings)

    return make


def build_deps(settings: Settings, store: Store, clock: FakeClock) -> JobDeps:
    """The job's dependencies as ``build_runtime(settings, use_redis=False)`` wires them,
    with the fixture's store, a movable clock and the encoding loaded once per run."""
    counter = token_counter()
    provider_breaker = ProviderBreaker(InMemoryBreakerState(),
                                       threshold=settings.provider_breaker_threshold,
                                       cooldown_s=settings.provider_breaker_cooldown_s,
                                       clock=clock)
    summarizer = build_summarizer(settings, counter, None, RedisKeys(settings.redis_key_prefix))
    return JobDeps(store=store, summarizer=summarizer,
                   fallback=ExtractiveSummarizer(counter, kind="fallback"), counter=counter,
                   provider_breaker=provider_breaker, clock=clock)


def test_a_session_over_the_trigger_is_compacted_into_a_smaller_valid_projection(
    make_harness: MakeHarness, server: OpenAIServer,
) -> None:
    harness = make_harness()
    import_corpus_sessions(harness.store, LONG_SESSION_ID)
    history = harness.store.messages(LONG_SESSION_ID)
    before = harness.store.get_session(LONG_SESSION_ID)

    result = harness.run(LONG_SESSION_ID)

    after = harness.store.get_session(LONG_SESSION_ID)
    [revision] = harness.store.revisions(LONG_SESSION_ID)
    assert (result.outcome, result.reason) == (Outcome.COMPACTED, "over_trigger")
    assert result.revision_id == after.active_revision_id == revision.id
    assert revision.summarizer == "llm" and revision.parent_revision_id is None
    assert after.projection_tokens == result.figures["tokens_after"]
    assert after.projection_tokens < harness.settings.trigger_tokens < before.projection_tokens
    assert result.figures["llm_calls"] == server.request_count == 1
    assert projection_violations(harness.store, LONG_SESSION_ID) == []
    assert harness.store.messages(LONG_SESSION_ID) == history  # nothing is ever deleted


def test_the_llm_summary_keeps_every_reservation_id_of_the_span(
    make_harness: MakeHarness,
) -> None:
    harness = make_harness()
    import_corpus_sessions(harness.store, LONG_SESSION_ID)

    result = harness.run(LONG_SESSION_ID)

    [revision] = harness.store.revisions(LONG_SESSION_ID)
    span = [m for m in harness.store.messages(LONG_SESSION_ID)
            if m.seq <= revision.through_seq and m.role != "system"]
    reservation_ids = set(RESERVATION_ID.findall(json.dumps([m.body for m in span])))
    assert result.outcome is Outcome.COMPACTED
    assert len(reservation_ids) >= 3, "the corpus session should look up reservations"
    # In the summary itself (what the model reads), not only in the artifact index.
    summary = json.dumps(revision.summary)
    assert {r for r in reservation_ids if r not in summary} == set()


def test_a_session_under_the_trigger_is_skipped_without_calling_the_llm(
    make_harness: MakeHarness, server: OpenAIServer,
) -> None:
    harness = make_harness()
    import_corpus_sessions(harness.store, SHORT_SESSION_ID)
    before = harness.state(SHORT_SESSION_ID)

    result = harness.run(SHORT_SESSION_ID)

    assert (result.outcome, result.reason) == (Outcome.SKIPPED, "under_trigger")
    assert harness.state(SHORT_SESSION_ID) == before and server.request_count == 0
    [run] = harness.store.runs(session_id=SHORT_SESSION_ID)
    assert (run.outcome, run.figures["outcome_reason"]) == ("skipped", "under_trigger")


def test_a_forced_job_on_a_session_that_fits_its_tail_has_nothing_to_summarize(
    make_harness: MakeHarness, server: OpenAIServer,
) -> None:
    harness = make_harness()
    [session_id] = import_records(harness.store, [generated_session("tiny", turns=1)])
    before = harness.state(session_id)

    result = harness.run(session_id, force=True)

    assert (result.outcome, result.reason) == (Outcome.SKIPPED, "nothing_to_summarize")
    assert harness.state(session_id) == before and server.request_count == 0


def test_an_unknown_session_is_rejected_with_its_run_recorded(
    make_harness: MakeHarness,
) -> None:
    harness = make_harness()

    result = harness.run("no-such-session")

    assert (result.outcome, result.reason) == (Outcome.REJECTED, "unknown_session")
    assert result.failure_class == "JobRejected" and not result.retryable
    [run] = harness.store.runs(session_id="no-such-session")
    assert run.outcome == "rejected"


class InterferingSummarizer:
    """Summarizes with the real summarizer after ``interfere`` moved the active revision,
    as a competing job or an operator's rollback would mid-job."""

    def __init__(self, inner: Summarizer, interfere: Callable[[], None]) -> None:
        self._inner, self._interfere = inner, interfere
        self.kind, self.uses_provider = inner.kind, inner.uses_provider

    def summarize(self, work: SummaryWork) -> SummaryDraft:
        self._interfere()
        return self._inner.summarize(work)


def compete_with_a_swap(store: Store, session_id: str, now: datetime) -> None:
    """Swap in a copy of the active revision, as a job that finished first would."""
    active = store.revisions(session_id)[0]
    fields = {f.name: getattr(active, f.name) for f in dataclasses.fields(NewRevision)}
    fields["snapshot_head_seq"] = store.get_session(session_id).head_seq
    run = NewRun(session_id, "competitor", 1, "competitor", "compacted", None, None, {}, None,
                 now, now)
    store.swap_revision(session_id, expected_revision_id=active.id, lease_owner=None,
                        revision=NewRevision(**fields), run=run, now=now)


@pytest.mark.parametrize("interference", ["rollback", "competing_swap"])
def test_a_job_whose_active_revision_changed_mid_summarize_ends_in_conflict_writing_nothing(
    make_harness: MakeHarness, interference: str,
) -> None:
    harness = make_harness()
    import_corpus_sessions(harness.store, LONG_SESSION_ID)
    assert harness.run(LONG_SESSION_ID).outcome is Outcome.COMPACTED
    append_turns(harness.store, LONG_SESSION_ID, generated_turns("MORE", 16))
    seen: list[tuple[Any, ...]] = []

    def interfere() -> None:
        if interference == "rollback":
            harness.store.rollback(LONG_SESSION_ID)
        else:
            compete_with_a_swap(harness.store, LONG_SESSION_ID, harness.clock())
        seen.append(harness.state(LONG_SESSION_ID))

    deps = dataclasses.replace(harness.deps, summarizer=InterferingSummarizer(
        harness.deps.summarizer, interfere))
    result = harness.run(LONG_SESSION_ID, deps=deps)

    assert (result.outcome, result.reason) == (Outcome.CONFLICT, "active_revision_changed")
    assert result.revision_id is None and not result.retryable
    assert harness.state(LONG_SESSION_ID) == seen[0]  # the job itself wrote nothing
    session = harness.store.get_session(LONG_SESSION_ID)
    assert (session.breaker_state, session.breaker_failures, session.lease_owner) == \
        ("closed", 0, None)
    assert harness.store.runs(session_id=LONG_SESSION_ID, limit=1)[0].outcome == "conflict"


def test_a_failed_job_writes_nothing_but_its_run_and_the_breaker(
    make_harness: MakeHarness, server: OpenAIServer,
) -> None:
    harness = make_harness()
    import_corpus_sessions(harness.store, LONG_SESSION_ID)
    before = harness.state(LONG_SESSION_ID)
    server.set_behaviour("malformed_json")

    result = harness.run(LONG_SESSION_ID)

    assert (result.outcome, result.failure_class) == (Outcome.FAILED, "SummaryInvalid")
    assert not result.retryable and result.revision_id is None
    assert harness.state(LONG_SESSION_ID) == before
    session = harness.store.get_session(LONG_SESSION_ID)
    assert (session.breaker_state, session.breaker_failures, session.lease_owner) == \
        ("closed", 1, None)
    [run] = harness.store.runs(session_id=LONG_SESSION_ID)
    assert (run.outcome, run.failure_class, run.revision_id) == \
        ("failed", "SummaryInvalid", None)


def test_the_outcome_event_carries_every_documented_field(
    make_harness: MakeHarness, server: OpenAIServer,
) -> None:
    harness = make_harness()
    import_corpus_sessions(harness.store, LONG_SESSION_ID)
    result = harness.run(LONG_SESSION_ID)

    with capture_logs() as logs:
        emit_job_event(get_logger(), result)

    [event] = logs
    assert event["event"] == JOB_EVENT and event["log_level"] == "info"
    assert set(EVENT_FIELDS) <= set(event)
    [revision] = harness.store.revisions(LONG_SESSION_ID)
    expected = {
        "session_id": LONG_SESSION_ID, "task_id": "task-1", "attempt": 1,
        "outcome": "compacted", "reason": "over_trigger", "revision_id": revision.id,
        "parent_revision_id": None, "breaker_state": "closed", "failure_class": None,
        "failure_message": None, "span_tokens": revision.span_tokens,
        "summary_tokens": revision.block_tokens, "llm_calls": 1, "chunks": 1,
        "merge_rounds": 0, "tokens_before": revision.projection_tokens_before,
        "tokens_after": revision.projection_tokens_after,
        "prompt_tokens": server.requests[0].prompt_tokens,
    }
    assert {name: event[name] for name in expected} == expected
    assert event["completion_tokens"] > 0
    assert {"lease", "snapshot", "summarize", "swap"} <= set(event["durations_ms"])


def test_a_failed_job_event_names_its_failure_at_error_level(
    make_harness: MakeHarness, server: OpenAIServer,
) -> None:
    harness = make_harness()
    import_corpus_sessions(harness.store, LONG_SESSION_ID)
    server.set_behaviour("malformed_json")
    result = harness.run(LONG_SESSION_ID)

    with capture_logs() as logs:
        emit_job_event(get_logger(), result)

    [event] = logs
    assert (event["log_level"], event["outcome"], event["failure_class"]) == \
        ("error", "failed", "SummaryInvalid")
    assert event["failure_message"] and event["revision_id"] is None
    assert event["breaker_state"] == "closed" and event["will_retry"] is False


def test_three_session_failures_open_its_breaker_until_a_trial_after_the_cooldown(
    make_harness: MakeHarness, server: OpenAIServer,
) -> None:
    harness = make_harness()
    import_corpus_sessions(harness.store, LONG_SESSION_ID)
    server.set_behaviour("malformed_json")

    failures = [harness.run(LONG_SESSION_ID) for _ in range(3)]
    calls_when_opened = server.request_count
    blocked = harness.run(LONG_SESSION_ID)

    assert [r.outcome for r in failures] == [Outcome.FAILED] * 3
    assert [r.breaker_state for r in failures] == ["closed", "closed", "open"]
    session = harness.store.get_session(LONG_SESSION_ID)
    assert (session.breaker_state, session.breaker_failures) == ("open", 3)
    assert (blocked.outcome, blocked.reason) == (Outcome.BREAKER_OPEN, "breaker_open")
    assert server.request_count == calls_when_opened == 3  # no LLM call while open
    assert harness.store.revisions(LONG_SESSION_ID) == []

    server.set_behaviour("ok")
    harness.clock.advance(COOLDOWN_S - 1)
    assert harness.run(LONG_SESSION_ID).outcome is Outcome.BREAKER_OPEN
    harness.clock.advance(1)
    trial = harness.run(LONG_SESSION_ID)

    assert trial.outcome is Outcome.COMPACTED and server.request_count == 4
    session = harness.store.get_session(LONG_SESSION_ID)
    assert (session.breaker_state, session.breaker_failures) == ("closed", 0)


def test_a_provider_outage_counts_on_the_provider_breaker_only(
    make_harness: MakeHarness, server: OpenAIServer,
) -> None:
    harness = make_harness(provider_breaker_threshold=5)
    import_corpus_sessions(harness.store, LONG_SESSION_ID)
    server.set_behaviour("error_500")

    results = [harness.run(LONG_SESSION_ID) for _ in range(6)]

    assert [(r.outcome, r.failure_class, r.retryable) for r in results] == \
        [(Outcome.FAILED, "ProviderError", True)] * 5 + \
        [(Outcome.FAILED, "ProviderBreakerOpen", True)]
    # Five calls opened the provider breaker; the sixth job did not call at all.
    assert server.request_count == 5 and results[-1].reason == "provider_breaker_open"
    session = harness.store.get_session(LONG_SESSION_ID)
    assert (session.breaker_state, session.breaker_failures) == ("closed", 0)
    assert {r.breaker_state for r in results} == {"closed"}


def test_an_open_breaker_with_the_fallback_policy_commits_the_deterministic_summary(
    make_harness: MakeHarness, server: OpenAIServer,
) -> None:
    harness = make_harness(breaker_open_policy="fallback")
    import_corpus_sessions(harness.store, LONG_SESSION_ID)
    harness.store.set_breaker(LONG_SESSION_ID, BreakerUpdate("open", 3, harness.clock()))

    result = harness.run(LONG_SESSION_ID)

    assert (result.outcome, result.summarizer) == (Outcome.BREAKER_OPEN, "fallback")
    assert server.request_count == 0
    [revision] = harness.store.revisions(LONG_SESSION_ID)
    assert result.revision_id == revision.id == \
        harness.store.get_session(LONG_SESSION_ID).active_revision_id
    assert revision.summarizer == "fallback"
    assert revision.projection_tokens_after < harness.settings.trigger_tokens
    assert projection_violations(harness.store, LONG_SESSION_ID) == []
    assert harness.store.runs(session_id=LONG_SESSION_ID)[0].outcome == "breaker_open"
    # A fallback is no proof the LLM path works again: the breaker stays open.
    session = harness.store.get_session(LONG_SESSION_ID)
    assert (session.breaker_state, session.breaker_failures) == ("open", 3)
    assert result.breaker_state == "open"


def test_the_trial_after_the_cooldown_is_recorded_as_half_open(
    make_harness: MakeHarness, server: OpenAIServer,
) -> None:
    harness = make_harness()
    import_corpus_sessions(harness.store, SHORT_SESSION_ID)
    harness.store.set_breaker(SHORT_SESSION_ID, BreakerUpdate("open", 3, harness.clock()))
    harness.clock.advance(COOLDOWN_S)

    result = harness.run(SHORT_SESSION_ID)  # admitted as the trial, then under the trigger

    assert (result.outcome, result.reason) == (Outcome.SKIPPED, "under_trigger")
    session = harness.store.get_session(SHORT_SESSION_ID)
    assert (session.breaker_state, session.breaker_failures) == ("half_open", 3)
    assert result.breaker_state == "half_open" and server.request_count == 0


def test_a_second_compaction_summarizes_only_the_new_span_with_the_prior_summary(
    make_harness: MakeHarness, server: OpenAIServer,
) -> None:
    harness = make_harness()
    import_corpus_sessions(harness.store, LONG_SESSION_ID)
    assert harness.run(LONG_SESSION_ID).outcome is Outcome.COMPACTED
    [first] = harness.store.revisions(LONG_SESSION_ID)
    append_turns(harness.store, LONG_SESSION_ID, generated_turns("NEW", 16))

    result = harness.run(LONG_SESSION_ID)

    second, _ = harness.store.revisions(LONG_SESSION_ID)
    assert result.outcome is Outcome.COMPACTED and second.parent_revision_id == first.id
    request = server.requests[-1]
    prompt = request.body["messages"][-1]["content"]
    expected_seqs = {m.seq for m in harness.store.messages(LONG_SESSION_ID, after_seq=first.
                                                            through_seq)
                     if m.seq <= second.through_seq}
    assert set(map(int, TRANSCRIPT_SEQ.findall(prompt))) == expected_seqs
    prior = render_prior_json(Summary.model_validate(first.summary))
    assert prior in prompt
    # The server saw the new span and the prior summary, not the first span again.
    assert second.span_tokens < request.prompt_tokens < second.span_tokens + first.span_tokens
    assert result.figures["prompt_tokens"] == request.prompt_tokens


def test_a_job_on_a_database_without_its_tables_still_ends_in_one_outcome(
    empty_database_url: str, server: OpenAIServer,
) -> None:
    settings = build_job_env(empty_database_url, server.base_url).settings
    engine = create_db_engine(empty_database_url)
    try:
        store, clock = Store(engine), FakeClock()
        harness = Harness(store, build_deps(settings, store, clock), job_policy(settings), clock,
                          settings)
        result = harness.run(LONG_SESSION_ID)  # returns, never raises
    finally:
        engine.dispose()

    assert result.outcome is Outcome.FAILED and result.failure_class is not None
    assert result.run_recorded is False and result.record_error
    assert server.request_count == 0
