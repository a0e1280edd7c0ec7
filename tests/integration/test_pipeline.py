"""One compaction job in process (``worker.job.pipeline.run``) against the real services: the
store on both databases and the real LLM summarizer against the OpenAI-protocol test
server. The job's logic (every outcome, the breakers, merge) is tested on the in-memory
store in ``tests/unit/test_pipeline_*.py``; these check what only the real parts show:
the swap and its figures in SQL, the compare-and-swap lost to a real competitor, the
prompt a second compaction sends, and a database without its tables."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from structlog.testing import capture_logs

from db import NewRevision, NewRun, Store, create_db_engine
from tests.support.corpus import load_corpus
from tests.support.e2e import (
    append_turns,
    build_job_env,
    import_records,
    projection_violations,
    token_counter,
)
from tests.support.generated import generated_session, generated_turns
from tests.support.job_harness import FakeClock
from tests.support.openai_server import OpenAIServer
from tests.support.provider_rules import anthropic_rejections, responses_rejections
from tests.support.store_jobs import swap_in
from tests.support.wire_sessions import (
    anthropic_record,
    responses_record,
    system_prompt,
    text_twins,
)
from worker.compaction.messages import parse_message
from worker.compaction.prompts import render_prior_json
from worker.compaction.schema import Summary
from worker.compaction.tokens import TokenCounter
from worker.errors import Outcome
from worker.job import pipeline
from worker.job.outcome import emit_job_event, event_field_docs
from worker.job.values import JobDeps, JobPolicy, JobRequest, JobResult
from worker.logging import JOB_EVENT, get_logger
from worker.platform.export_views import ExportView
from worker.platform.ingest import export_session
from worker.runtime import build_summarizer, job_policy
from worker.settings.config import Settings
from worker.shared_state.keys import RedisKeys
from worker.shared_state.provider_breaker import InMemoryBreakerState, ProviderBreaker
from worker.summarizers import ExtractiveSummarizer, Summarizer, SummaryDraft, SummaryWork
from worker.tokenizer.offline import load_encoding

pytestmark = pytest.mark.integration

# 40 generated exchanges: about 4,800 tokens, over the 4,200-token trigger of the job env.
SESSION = "generated-long"
TURNS = 40
RESERVATION_ID = re.compile(r'"reservation_id\\*"\s*:\s*\\*"([A-Z0-9]{6})\\*"')
TRANSCRIPT_SEQ = re.compile(r"^\[seq (\d+)\]", re.MULTILINE)


@dataclasses.dataclass
class Harness:
    """A store, the job's dependencies and policy as one worker process builds them."""

    store: Store
    deps: JobDeps
    policy: JobPolicy
    clock: FakeClock
    settings: Settings
    jobs: int = 0

    def run(self, session_id: str, *, deps: JobDeps | None = None) -> JobResult:
        self.jobs += 1
        request = JobRequest(session_id, "test", task_id=f"task-{self.jobs}")
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
        settings = build_job_env(database_url, server.base_url, **overrides).settings
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
                                       trial_s=settings.worst_case_llm_call_s, clock=clock)
    summarizer = build_summarizer(settings, counter, None, RedisKeys(settings.redis_key_prefix))
    return JobDeps(store=store, summarizer=summarizer,
                   fallback=ExtractiveSummarizer(counter, kind="fallback"), counter=counter,
                   provider_breaker=provider_breaker, clock=clock)


def add_session(harness: Harness) -> str:
    [session_id] = import_records(harness.store, [generated_session(SESSION, TURNS)])
    return session_id


def test_a_session_over_the_trigger_is_compacted_and_its_event_matches_the_stored_revision(
    make_harness: MakeHarness, server: OpenAIServer,
) -> None:
    harness = make_harness()
    session_id = add_session(harness)
    history = harness.store.messages(session_id)
    before = harness.store.get_session(session_id)

    result = harness.run(session_id)
    with capture_logs() as logs:
        emit_job_event(get_logger(), result)

    after = harness.store.get_session(session_id)
    [revision] = harness.store.revisions(session_id)
    assert (result.outcome, result.reason) == (Outcome.COMPACTED, "over_trigger")
    assert after.projection_tokens < harness.settings.trigger_tokens < before.projection_tokens
    assert projection_violations(harness.store, session_id) == []
    assert harness.store.messages(session_id) == history  # nothing is ever deleted
    [event] = logs
    assert event["event"] == JOB_EVENT and set(event_field_docs()) <= set(event)
    expected = {
        "revision_id": revision.id, "parent_revision_id": None, "summarizer": "llm",
        "breaker_state": "closed", "span_tokens": revision.span_tokens,
        "summary_tokens": revision.summary_tokens,
        "tokens_before": before.projection_tokens, "tokens_after": after.projection_tokens,
        "llm_calls": server.request_count,
        "chunks": 1, "merge_rounds": 0, "prompt_tokens": server.requests[0].prompt_tokens,
    }
    assert {name: event[name] for name in expected} == expected
    assert revision.projection_tokens_before == before.projection_tokens
    [run] = harness.store.runs(session_id=session_id)
    assert (run.outcome, run.revision_id) == ("compacted", revision.id)
    assert run.figures["tokens_after"] == after.projection_tokens


# A corpus session over the job env's trigger (about 7,800 tokens) that looks up reservations.
CORPUS_SESSION_ID = "taubench-airline-gpt4o-3"


@pytest.mark.corpus
def test_the_llm_summary_keeps_every_reservation_id_of_a_corpus_span(
    make_harness: MakeHarness,
) -> None:
    harness = make_harness()
    import_records(harness.store, [r for r in load_corpus("dev")
                                   if r["session_id"] == CORPUS_SESSION_ID])

    result = harness.run(CORPUS_SESSION_ID)

    [revision] = harness.store.revisions(CORPUS_SESSION_ID)
    span = [m for m in harness.store.messages(CORPUS_SESSION_ID)
            if m.seq <= revision.through_seq and m.role != "system"]
    reservation_ids = set(RESERVATION_ID.findall(json.dumps([m.body for m in span])))
    assert result.outcome is Outcome.COMPACTED
    assert len(reservation_ids) >= 3, "the corpus session should look up reservations"
    # In the summary itself (what the model reads), not only in the artifact index.
    summary = json.dumps(revision.summary)
    assert {r for r in reservation_ids if r not in summary} == set()


def test_a_lying_models_summary_is_rejected_and_the_deterministic_one_committed(
    make_harness: MakeHarness, server: OpenAIServer,
) -> None:
    harness = make_harness()
    session_id = add_session(harness)
    server.set_behaviour("lying")

    result = harness.run(session_id)

    [revision] = harness.store.revisions(session_id)
    [run] = harness.store.runs(session_id=session_id)
    assert (result.outcome, result.reason) == (Outcome.FALLBACK, "summary_contradicts_history")
    assert (revision.summarizer, run.outcome, run.revision_id) == ("fallback", "fallback",
                                                                   revision.id)
    assert run.figures["outcome_reason"] == "summary_contradicts_history"
    # What was refuted, by kind with counts and ids: the model's words stay out.
    message = run.failure_message or ""
    assert run.failure_class == "SummaryInvalid"
    for kind in ("false_outcome", "reopened_request", "invented_identifier"):
        assert kind in message
    assert "INV-740213" in message and "Please check" not in message
    assert "INV-740213" not in json.dumps(revision.summary)
    assert projection_violations(harness.store, session_id) == []


@pytest.mark.corpus
def test_a_truthful_and_a_lying_model_on_a_corpus_session(
    make_harness: MakeHarness, server: OpenAIServer,
) -> None:
    records = [r for r in load_corpus("dev") if r["session_id"] == CORPUS_SESSION_ID]
    outcomes = []
    for behaviour in ("ok", "lying"):
        harness = make_harness()
        session_id = f"{CORPUS_SESSION_ID}-{behaviour}"
        import_records(harness.store, [{**records[0], "session_id": session_id}])
        server.set_behaviour(behaviour)
        result = harness.run(session_id)
        outcomes.append((result.outcome, result.reason))
    assert outcomes == [(Outcome.COMPACTED, "over_trigger"),
                        (Outcome.FALLBACK, "summary_contradicts_history")]


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
    """Swap in a copy of the active revision, as a redelivery of the job on another worker
    would: it takes the lease over and finishes first."""
    active = store.revisions(session_id)[0]
    fields = {f.name: getattr(active, f.name) for f in dataclasses.fields(NewRevision)
              if f.name != "artifacts_json"}
    fields["artifacts_json"] = json.dumps(active.artifacts)
    fields["snapshot_head_seq"] = store.get_session(session_id).head_seq
    run = NewRun(session_id, "competitor", 1, "competitor", "compacted", None, None, {}, None,
                 now, now)
    task_id = str(store.get_session(session_id).lease_owner).rsplit(":", 1)[-1]
    owner = f"other-host:2:{task_id}"
    assert store.start_job(session_id, owner, 60, now, take_over=task_id) is not None
    swap_in(store, session_id, expected_revision_id=active.id, owner=owner,
            revision=NewRevision(**fields), run=run, now=now)


# What the job's swap finds: the revision rolled back under its lease, or its lease taken
# over by the competitor (no job swaps without the lease).
@pytest.mark.parametrize(("interference", "reason"), [
    ("rollback", "active_revision_changed"), ("competing_swap", "lease_lost")])
def test_a_job_whose_active_revision_changed_mid_summarize_ends_in_conflict_writing_nothing(
    make_harness: MakeHarness, interference: str, reason: str,
) -> None:
    harness = make_harness()
    session_id = add_session(harness)
    assert harness.run(session_id).outcome is Outcome.COMPACTED
    append_turns(harness.store, session_id, generated_turns("MORE", 24))
    seen: list[tuple[Any, ...]] = []

    def interfere() -> None:
        if interference == "rollback":
            harness.store.rollback(session_id)
        else:
            compete_with_a_swap(harness.store, session_id, harness.clock())
        seen.append(harness.state(session_id))

    deps = dataclasses.replace(harness.deps, summarizer=InterferingSummarizer(
        harness.deps.summarizer, interfere))
    result = harness.run(session_id, deps=deps)

    assert (result.outcome, result.reason) == (Outcome.CONFLICT, reason)
    assert harness.state(session_id) == seen[0]  # the job itself wrote nothing
    session = harness.store.get_session(session_id)
    assert (session.breaker_state, session.breaker_failures, session.lease_owner) == \
        ("closed", 0, None)
    assert harness.store.runs(session_id=session_id, limit=1)[0].outcome == "conflict"


def test_a_reply_that_is_no_json_fails_the_job_writing_only_its_run_and_the_breaker(
    make_harness: MakeHarness, server: OpenAIServer,
) -> None:
    harness = make_harness()
    session_id = add_session(harness)
    before = harness.state(session_id)
    server.set_behaviour("malformed_json")

    result = harness.run(session_id)

    assert (result.outcome, result.reason, result.failure_class) == \
        (Outcome.FAILED, "malformed_json", "SummaryInvalid")
    assert harness.state(session_id) == before
    session = harness.store.get_session(session_id)
    assert (session.breaker_state, session.breaker_failures, session.lease_owner) == \
        ("closed", 1, None)
    [run] = harness.store.runs(session_id=session_id)
    assert (run.outcome, run.failure_class, run.revision_id) == \
        ("failed", "SummaryInvalid", None)


def test_a_second_compaction_sends_only_the_new_span_with_the_prior_as_context(
    make_harness: MakeHarness, server: OpenAIServer,
) -> None:
    harness = make_harness()
    session_id = add_session(harness)
    assert harness.run(session_id).outcome is Outcome.COMPACTED
    [first] = harness.store.revisions(session_id)
    append_turns(harness.store, session_id, generated_turns("NEW", 24))

    result = harness.run(session_id)

    second, _ = harness.store.revisions(session_id)
    assert result.outcome is Outcome.COMPACTED and second.parent_revision_id == first.id
    prompt = server.requests[-1].body["messages"][-1]["content"]
    expected_seqs = {m.seq for m in harness.store.messages(session_id,
                                                           after_seq=first.through_seq)
                     if m.seq <= second.through_seq}
    assert set(map(int, TRANSCRIPT_SEQ.findall(prompt))) == expected_seqs
    assert render_prior_json(Summary.model_validate(first.summary)) in prompt
    assert result.figures.prompt_tokens == server.requests[-1].prompt_tokens
    # The merge step kept the prior's identifiers next to the new span's.
    artifacts = Summary.model_validate(second.summary).relevant_artifacts
    assert {f"{SESSION}R0", "NEWR0"} <= set(artifacts)


def test_a_server_that_omits_usage_is_counted_with_the_workers_encoding(
    store: Store, database_url: str,
) -> None:
    # The summarizer's client is handed the worker's counter: its fallback counts with the
    # configured encoding, and a pool child builds no second encoding of its own for it.
    counter = TokenCounter(load_encoding("cl100k_base"))
    with OpenAIServer(include_usage=False) as bare:
        settings = build_job_env(database_url, bare.base_url,
                                 tokenizer_encoding="cl100k_base").settings
        summarizer = build_summarizer(settings, counter, None,
                                      RedisKeys(settings.redis_key_prefix))
        clock = FakeClock()
        deps = dataclasses.replace(build_deps(settings, store, clock), summarizer=summarizer)
        harness = Harness(store, deps, job_policy(settings), clock, settings)

        result = harness.run(add_session(harness))

        [request] = bare.requests
    sent = [parse_message(message) for message in request.body["messages"]]
    assert result.outcome is Outcome.COMPACTED
    assert result.figures.prompt_tokens == counter.count_messages(sent)
    assert result.figures.prompt_tokens != request.prompt_tokens  # the server's o200k count


def test_a_job_on_a_database_without_its_tables_still_ends_in_one_outcome(
    empty_database_url: str, server: OpenAIServer,
) -> None:
    settings = build_job_env(empty_database_url, server.base_url).settings
    engine = create_db_engine(empty_database_url)
    try:
        store, clock = Store(engine), FakeClock()
        harness = Harness(store, build_deps(settings, store, clock), job_policy(settings), clock,
                          settings)
        result = harness.run(SESSION)  # returns, never raises
    finally:
        engine.dispose()

    assert result.outcome is Outcome.FAILED and result.failure_class is not None
    assert result.run_recorded is False and result.record_error
    assert server.request_count == 0


# Without the stream closed, PostgreSQL's rollback waited on the stream's lock for ever.
@pytest.mark.timeout(60)
def test_a_stored_message_that_no_longer_parses_fails_the_job_and_releases_its_lease(
    make_harness: MakeHarness, database_url: str,
) -> None:
    # A row written around ingest (a hand edit, a faulty migration): the lease is taken
    # (on PostgreSQL in the snapshot's statement) before the row fails to parse.
    harness = make_harness()
    session_id = add_session(harness)
    engine = create_db_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql(
                "UPDATE messages SET body = '{\"role\": \"robot\"}' WHERE seq = 3")
    finally:
        engine.dispose()

    result = harness.run(session_id)

    assert (result.outcome, result.reason, result.failure_class) == \
        (Outcome.FAILED, "stored_message_invalid", "StoredMessageInvalid")
    assert "robot" not in (result.failure_message or "")
    session = harness.store.get_session(session_id)
    assert (session.lease_owner, session.active_revision_id) == (None, None)
    assert (session.breaker_state, session.breaker_failures) == ("closed", 1)
    [run] = harness.store.runs(session_id=session_id)
    assert (run.outcome, run.failure_class) == ("failed", "StoredMessageInvalid")
    # The connection is whole again: the next job reads the same row and fails the same way.
    assert harness.run(session_id).reason == "stored_message_invalid"


@pytest.mark.parametrize(("make_record", "rejections"), [
    (responses_record, responses_rejections), (anthropic_record, anthropic_rejections)])
def test_a_responses_or_anthropic_session_is_compacted_into_a_projection_of_its_format(
    make_harness: MakeHarness, make_record: Callable[[str, int, int], dict[str, Any]],
    rejections: Callable[[list[dict[str, Any]], list[dict[str, Any]]], list[str]],
) -> None:
    harness = make_harness()
    record = make_record("wire", 5, 60)
    [session_id] = import_records(harness.store, [record])
    items = record.get("items") or record["messages"]

    result = harness.run(session_id)

    assert result.outcome is Outcome.COMPACTED, result
    projection = harness.store.projection(session_id)
    [revision] = harness.store.revisions(session_id)
    block = projection[projection.index(revision.block)]
    assert block["role"] == "user" and block["content"][0]["type"] in ("input_text", "text")
    assert (block.get("type") == "message") is ("items" in record)
    assert projection[projection.index(block) + 1:] == items[revision.through_seq:]
    assert rejections(projection, items) == []
    secrets = [item.get("encrypted_content") for item in items if item.get("encrypted_content")]
    secrets += [b.get("signature") or b.get("data") for m in items
                for b in (m.get("content") if isinstance(m.get("content"), list) else ())
                if b.get("type") in ("thinking", "redacted_thinking")]
    assert secrets and not any(secret in json.dumps(revision.summary) for secret in secrets)
    assert revision.summary["relevant_artifacts"]


def test_an_anthropic_session_its_system_prompt_takes_over_the_trigger_compacts_as_its_twin(
    make_harness: MakeHarness,
) -> None:
    """Its messages alone are under the trigger; with its ``system`` counted it is over it,
    as its chat twin with the same text as a system message is, and both cut alike."""
    harness = make_harness()
    store = harness.store
    anthropic, chat = text_twins("sys", 7, 40, system_prompt(7, 120))
    outside_id, inside_id = import_records(store, [anthropic, chat])
    before = store.get_session(outside_id)
    assert before.projection_tokens - before.system_tokens <= harness.settings.trigger_tokens \
        < before.projection_tokens == store.get_session(inside_id).projection_tokens

    results = [harness.run(outside_id), harness.run(inside_id)]

    assert [(r.outcome, r.reason) for r in results] == [(Outcome.COMPACTED, "over_trigger")] * 2
    [revision], [twin_revision] = store.revisions(outside_id), store.revisions(inside_id)
    assert twin_revision.through_seq == revision.through_seq + 1  # its system message is seq 1
    assert revision.projection_tokens_before == before.projection_tokens \
        == twin_revision.projection_tokens_before
    after = store.get_session(outside_id)
    tail_tokens = sum(m.tokens for m in store.messages(outside_id, after_seq=revision.through_seq))
    assert after.projection_tokens == revision.projection_tokens_after \
        == before.system_tokens + revision.block_tokens + tail_tokens
    [run] = store.runs(session_id=outside_id)
    assert run.figures["tokens_after"] == after.projection_tokens
    exported = export_session(store, outside_id, ExportView.PROJECTION)
    assert exported["system"] == anthropic["system"]
    assert exported["messages"] == store.projection(outside_id)
