"""The fault matrix: every misbehaviour of the test OpenAI server, aimed at each point of
a job where an LLM call happens, and the outcome and breaker effects the job must end in.

Points: the single map call of a span that fits one call; the second map call of a
two-chunk plan (a ``[[behave:...]]`` marker in the last message of the span); the merge
call of a two-chunk plan (the marker in the prior summary, which only the final merge
prompt embeds). A fault persists for every request of its call (SDK retries, the
truncation re-ask and the output-mode fallbacks included). The pipeline runs in-process
(``worker.job.pipeline.run``) on SQLite; one row set runs on PostgreSQL too.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

import pytest

from db import NewRevision, NewRun, Store, upgrade_database
from tests.support.chaos import (
    CaseRuntime,
    build_base_runtime,
    check_stored_session,
    generate_session,
    runtime_for_case,
)
from tests.support.databases import open_store, sqlite_url
from tests.support.openai_behaviours import GARBAGE, Behaviour
from tests.support.openai_server import OpenAIServer, RecordedRequest
from tests.support.store_jobs import swap_in
from worker.compaction.intake import IntakePolicy
from worker.compaction.messages import parse_message
from worker.compaction.schema import Summary, render_summary_block, summary_block_message
from worker.errors import Outcome
from worker.job import pipeline
from worker.job.values import JobRequest, JobResult
from worker.platform.ingest import ImportStatus, import_sessions
from worker.runtime import Runtime

pytestmark = pytest.mark.integration

NOW = datetime.now(UTC)
TURNS = 9  # about 3,800 tokens: over the 2,100-token trigger; two chunks in a 4,700 window
CHUNKED_WINDOW_TOKENS = 4_700
SINGLE_WINDOW_TOKENS = 128_000
SEED = 3  # with TURNS, checked to plan exactly two chunks at both chunked points
PRIOR_THROUGH_TURNS = 2  # the merge point's prior revision covers the first two turns
_ids = itertools.count()


class Point(StrEnum):
    SINGLE_MAP = "single_map"
    CHUNK_MAP = "chunk_map"
    MERGE = "merge"


@dataclass(frozen=True)
class Expected:
    """A job's end: its outcome and reason, the session breaker's failures and the
    provider breaker's failures after it, and whether the task would retry it."""

    outcome: Outcome
    reason: str
    session_failures: int
    provider_failures: int
    retryable: bool


COMPACTED = Expected(Outcome.COMPACTED, "over_trigger", 0, 0, False)


def provider_fault(reason: str) -> Expected:
    """Not the session's fault: the provider breaker counts it and the task retries."""
    return Expected(Outcome.FAILED, reason, 0, 1, True)


def session_fault(reason: str) -> Expected:
    """The reply is unusable for this session: its breaker counts it, no retry."""
    return Expected(Outcome.FAILED, reason, 1, 0, False)


# The model's summary contradicts the span's record: the deterministic summary is committed
# in its place, no breaker counts it, no retry.
REPLACED = Expected(Outcome.FALLBACK, "summary_contradicts_history", 0, 0, False)


def configuration_fault(reason: str) -> Expected:
    """The service is set up wrong (a refused key): no breaker counts it, no retry."""
    return Expected(Outcome.FAILED, reason, 0, 0, False)


MATRIX: dict[Behaviour, Expected] = {
    Behaviour.OK: COMPACTED,
    Behaviour.LATENCY: COMPACTED,
    Behaviour.HANG: provider_fault("timeout"),
    Behaviour.ERROR_500: provider_fault("server_error"),
    Behaviour.RATE_LIMIT_429: provider_fault("rate_limited"),
    Behaviour.UNAUTHORIZED_401: configuration_fault("auth_failed"),
    Behaviour.FORBIDDEN_403: configuration_fault("auth_failed"),
    Behaviour.ECHO_KEY_401: configuration_fault("auth_failed"),
    Behaviour.MALFORMED_JSON: session_fault("malformed_json"),
    Behaviour.WRONG_SCHEMA: session_fault("schema_mismatch"),
    Behaviour.EMPTY_SECTIONS: session_fault("empty_sections"),
    Behaviour.TRUNCATED: session_fault("truncated"),
    Behaviour.CONTEXT_LENGTH: session_fault("context_length_exceeded"),
    Behaviour.JSON_MODE_ONLY: COMPACTED,
    Behaviour.PLAIN_TEXT_FENCED: COMPACTED,
    # A 200 that is no chat completion is the provider's fault, never the session's.
    **{garbage: provider_fault("invalid_response") for garbage in GARBAGE},
    # A connection closed mid-body is no reply, nor is a body whose encoding lies: the
    # SDK retries both as connection errors (the HTTP client raises them while reading).
    Behaviour.CUT_CONNECTION: provider_fault("connection"),
    Behaviour.BAD_ENCODING: provider_fault("connection"),
    Behaviour.LYING: REPLACED,
}
# Where the point changes the outcome.
EXCEPTIONS: dict[tuple[Behaviour, Point], Expected] = {
    # An empty partial summary is not a failure: only the final summary is held to "a
    # long span needs a goal and progress", and the merge fills it from the other part.
    (Behaviour.EMPTY_SECTIONS, Point.CHUNK_MAP): COMPACTED,
    # The re-plan after a context-length error shrinks the window to 60%: a 4,700-token
    # window then cannot hold two partials to merge, which the planner says up front.
    (Behaviour.CONTEXT_LENGTH, Point.CHUNK_MAP): session_fault("merge_window_too_small"),
    (Behaviour.CONTEXT_LENGTH, Point.MERGE): session_fault("merge_window_too_small"),
}
CASES = [(behaviour, point) for point in Point for behaviour in Behaviour]


def expected_for(behaviour: Behaviour, point: Point) -> Expected:
    return EXCEPTIONS.get((behaviour, point), MATRIX[behaviour])


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """One SQLite database for the module; each case has sessions of its own."""
    url = sqlite_url(tmp_path_factory.mktemp("fault-matrix") / "store.db")
    upgrade_database(url)
    with open_store(url) as store:
        yield store


@pytest.fixture
def postgres_store(migrated_postgres_url: str) -> Iterator[Store]:
    with open_store(migrated_postgres_url) as store:
        yield store


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    # Latency well under the read timeout; a hang is cut by that timeout.
    with OpenAIServer(latency_ms=100) as running:
        yield running


@pytest.fixture(scope="module")
def base_runtime() -> Runtime:
    return build_base_runtime(
        llm_context_tokens=SINGLE_WINDOW_TOKENS, llm_max_output_tokens=800,
        llm_read_timeout_s=0.5, llm_connect_timeout_s=1.0, llm_max_retries=0,
        llm_concurrency=1, model_context_tokens=3_000, tail_budget_tokens=300,
        audit_mode=True)


def build_job(base: Runtime, store: Store, server: OpenAIServer, point: Point, *,
              llm_max_retries: int = 0) -> CaseRuntime:
    window_tokens = SINGLE_WINDOW_TOKENS if point is Point.SINGLE_MAP else CHUNKED_WINDOW_TOKENS
    return runtime_for_case(base, store, server.base_url, llm_context_tokens=window_tokens,
                            llm_max_retries=llm_max_retries)


def marker(behaviour: Behaviour) -> str:
    return f"[[behave:{behaviour.value}]]"


def import_session(runtime: Runtime, session_id: str, messages: list[dict[str, Any]]) -> None:
    [report] = import_sessions([{"session_id": session_id, "messages": messages}],
                               store=runtime.store, counter=runtime.deps.counter,
                               policy=IntakePolicy(), now=NOW - timedelta(days=1))
    assert report.status is ImportStatus.IMPORTED


def prepare_session(runtime: Runtime, server: OpenAIServer, behaviour: Behaviour,
                    point: Point) -> str:
    """Store a session over the trigger with the fault aimed at ``point``."""
    session_id = f"{behaviour.value}-{point.value}-{next(_ids)}"
    messages = generate_session(SEED, TURNS)
    if point is Point.SINGLE_MAP:
        server.set_behaviour(behaviour)
    elif point is Point.CHUNK_MAP:
        # The last assistant reply before the verbatim tail (the last turn) ends the span.
        last_turn_start = max(i for i, m in enumerate(messages) if m["role"] == "user")
        messages[last_turn_start - 1]["content"] += f" {marker(behaviour)}"
    import_session(runtime, session_id, messages)
    if point is Point.MERGE:
        store_prior_revision(runtime, session_id, behaviour)
    return session_id


def store_prior_revision(runtime: Runtime, session_id: str, behaviour: Behaviour) -> None:
    """Swap in a first summary covering the first turns; it carries the marker."""
    history = runtime.store.messages(session_id)
    user_seqs = [m.seq for m in history if m.role == "user"]
    through_seq = user_seqs[PRIOR_THROUGH_TURNS] - 1
    summary = Summary.model_validate({
        "goal": "Fix the retry policies of the failing services.",
        "constraints_and_preferences": ["Do not touch the public API."],
        "completed_actions": ["Fixed the first two handlers."],
        "key_decisions": [f"Cap retries before merging {marker(behaviour)}"],
        "resolved": [], "pending": [], "relevant_artifacts": [], "remaining_work": []})
    block = summary_block_message(render_summary_block(summary))
    block_tokens = runtime.deps.counter.count_message(parse_message(block))
    revision = NewRevision(
        through_seq=through_seq, snapshot_head_seq=through_seq,
        summary=summary.model_dump(mode="json"), block=block, block_tokens=block_tokens,
        artifacts_json="[]", summary_tokens=block_tokens, span_tokens=0, projection_tokens_before=0,
        model="seed", prompt_version="seed", summarizer="extractive")
    run = NewRun(session_id=session_id, task_id="seed", attempt=1, reason="seed",
                 outcome="compacted", failure_class=None, failure_message=None, figures={},
                 revision_id=None, started_at=NOW, finished_at=NOW)
    swap_in(runtime.store, session_id, expected_revision_id=None, revision=revision, run=run,
            now=NOW)


def is_merge_request(request: RecordedRequest) -> bool:
    return "\nTask: merge the partial summaries" in str(request.body["messages"][-1]["content"])


def assert_fault_hit_its_point(requests: list[RecordedRequest], behaviour: Behaviour,
                               point: Point) -> None:
    """The aim was right: the first request at the point misbehaved, none before it."""
    first_hit = {Point.SINGLE_MAP: 0, Point.CHUNK_MAP: 1, Point.MERGE: 2}[point]
    assert len(requests) > first_hit
    assert [r.behaviour for r in requests[:first_hit]] == [Behaviour.OK] * first_hit
    assert requests[first_hit].behaviour is behaviour
    assert is_merge_request(requests[first_hit]) is (point is Point.MERGE)
    if point is Point.CHUNK_MAP:
        merges = [r for r in requests if is_merge_request(r)]
        assert all(r.behaviour is Behaviour.OK for r in merges), "the marker leaked to a merge"


def run_job(job: CaseRuntime, session_id: str) -> JobResult:
    runtime = job.runtime
    return pipeline.run(JobRequest(session_id, "fault-matrix"), runtime.deps, runtime.policy)


def assert_job_ended_as_expected(job: CaseRuntime, session_id: str, result: JobResult,
                                 expected: Expected, revisions_before: int) -> None:
    store = job.store
    session = store.get_session(session_id)
    ended = Expected(result.outcome, result.reason, session.breaker_failures,
                     job.provider_state.load().failures, result.retryable)
    assert ended == expected, result.failure_message
    revisions = store.revisions(session_id)
    [run] = [r for r in store.runs(session_id=session_id) if r.task_id != "seed"]
    assert run.outcome == expected.outcome.value
    if expected.outcome in (Outcome.COMPACTED, Outcome.FALLBACK):
        assert len(revisions) == revisions_before + 1
        assert session.active_revision_id == revisions[0].id == run.revision_id
    else:
        assert len(revisions) == revisions_before, "a failed job wrote a revision"
        assert run.revision_id is None and run.failure_class is not None
    assert check_stored_session(store, session_id, None).violations == []


@pytest.mark.parametrize(("behaviour", "point"), CASES,
                         ids=[f"{b.value}-at-{p.value}" for b, p in CASES])
def test_each_fault_at_each_call_ends_in_its_outcome_and_breaker_effect(
    base_runtime: Runtime, sqlite_store: Store, server: OpenAIServer, behaviour: Behaviour,
    point: Point,
) -> None:
    job = build_job(base_runtime, sqlite_store, server, point)
    session_id = prepare_session(job.runtime, server, behaviour, point)
    revisions_before = len(job.store.revisions(session_id))

    result = run_job(job, session_id)

    assert_fault_hit_its_point(server.requests, behaviour, point)
    if expected_for(behaviour, point) == COMPACTED:  # as the README's event table says
        one_call = point is Point.SINGLE_MAP
        assert (result.figures.chunks, result.figures.merge_rounds) == \
            ((1, 0) if one_call else (2, 1))
    assert_job_ended_as_expected(job, session_id, result, expected_for(behaviour, point),
                                 revisions_before)


@pytest.mark.parametrize("behaviour", list(Behaviour), ids=[b.value for b in Behaviour])
def test_the_single_call_row_set_holds_on_postgresql(
    base_runtime: Runtime, postgres_store: Store, server: OpenAIServer, behaviour: Behaviour
) -> None:
    job = build_job(base_runtime, postgres_store, server, Point.SINGLE_MAP)
    session_id = prepare_session(job.runtime, server, behaviour, Point.SINGLE_MAP)

    result = run_job(job, session_id)

    assert_job_ended_as_expected(job, session_id, result,
                                 expected_for(behaviour, Point.SINGLE_MAP), 0)


@pytest.mark.parametrize("fault", ["error_500:1", "hang:1", "rate_limit_429:1"])
def test_a_provider_fault_that_clears_within_the_sdk_retries_still_compacts(
    base_runtime: Runtime, sqlite_store: Store, server: OpenAIServer, fault: str
) -> None:
    job = build_job(base_runtime, sqlite_store, server, Point.SINGLE_MAP, llm_max_retries=1)
    session_id = prepare_session(job.runtime, server, Behaviour.OK, Point.SINGLE_MAP)
    server.set_behaviour(fault)

    result = run_job(job, session_id)

    assert (result.outcome, result.figures.llm_retries) == (Outcome.COMPACTED, 1)
    assert [r.behaviour for r in server.requests] == [Behaviour(fault.split(":")[0]),
                                                      Behaviour.OK]
    assert job.provider_state.load().failures == 0


@pytest.mark.parametrize("point", [Point.SINGLE_MAP, Point.CHUNK_MAP],
                         ids=[Point.SINGLE_MAP.value, Point.CHUNK_MAP.value])
def test_a_job_whose_summary_fails_validation_reports_what_its_calls_cost(
    base_runtime: Runtime, sqlite_store: Store, server: OpenAIServer, point: Point
) -> None:
    job = build_job(base_runtime, sqlite_store, server, point)
    session_id = prepare_session(job.runtime, server, Behaviour.WRONG_SCHEMA, point)

    result = run_job(job, session_id)

    assert (result.outcome, result.reason) == (Outcome.FAILED, "schema_mismatch")
    requests = server.requests
    expected = {"llm_calls": len(requests),
                "prompt_tokens": sum(r.prompt_tokens for r in requests)}
    figures = result.figures
    assert {"llm_calls": figures.llm_calls, "prompt_tokens": figures.prompt_tokens} == expected
    assert figures.completion_tokens and figures.completion_tokens > 0
    [run] = job.store.runs(session_id=session_id)
    assert {name: run.figures[name] for name in expected} == expected
    assert run.figures["completion_tokens"] == figures.completion_tokens
