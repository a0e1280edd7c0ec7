"""The Batch API adapter (``worker/summarizers/openai_batch.py``) against the real HTTP
test server: a batch's replies read as the synchronous calls' (same text, same usage),
and each way a line goes unanswered comes back as the job error a call would raise."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator

import pytest

from tests.support.batch_api import BatchKnobs
from tests.support.generated import generated_turns
from tests.support.openai_server import OpenAIServer
from worker.compaction import build_summarize_messages, parse_summary, summary_json_schema
from worker.errors import CompactionError, ContextOverflow, ProviderError
from worker.summarizers.openai_batch import BatchRequest, BatchState, BatchStatus, LLMBatches
from worker.summarizers.openai_client import LLMClient, LLMConfig, LLMReply

MODEL = "summarizer-test"


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(model=MODEL) as running:
        yield running


@pytest.fixture
def client(server: OpenAIServer) -> Iterator[LLMClient]:
    config = LLMConfig(base_url=server.base_url, api_key=None, model=MODEL,
                       connect_timeout_s=2.0, read_timeout_s=10.0, max_retries=0)
    with LLMClient(config) as made:
        yield made


def summarizer_requests(seed: int, count: int) -> list[BatchRequest]:
    """Summarizer requests over generated spans, as the LLM summarizer builds them."""
    rng = random.Random(seed)
    schema = summary_json_schema()
    requests = []
    for index in range(count):
        turns = generated_turns(f"L{seed}x{index}", rng.randint(1, 5))
        text = "\n\n".join(json.dumps(message) for message in turns)
        messages = build_summarize_messages(text, prior=None, identifiers=[f"L{seed}x{index}R0"],
                                            budget_tokens=1024)
        requests.append(BatchRequest(f"s{seed}-{index}", messages, schema, 1024))
    return requests


def read_back(batches: LLMBatches, state: BatchState, requests: list[BatchRequest]
              ) -> tuple[dict[str, LLMReply], dict[str, CompactionError]]:
    """Each request's reply, or the error its line ended with."""
    lines = batches.lines(state, [request.custom_id for request in requests])
    read = {request.custom_id: batches.read_line(lines[request.custom_id], request.messages)
            for request in requests}
    return ({key: value for key, value in read.items() if isinstance(value, LLMReply)},
            {key: value for key, value in read.items() if isinstance(value, CompactionError)})


def finished(batches: LLMBatches, state: BatchState) -> BatchState:
    deadline = time.monotonic() + 20
    while not state.status.is_final:
        assert time.monotonic() < deadline, f"batch still {state.status}"
        time.sleep(0.05)
        state = batches.state(state.batch_id)
    return state


def test_a_batch_answers_every_request_as_the_synchronous_call_does(
        server: OpenAIServer, client: LLMClient) -> None:
    requests = summarizer_requests(seed=21, count=6)
    batches = LLMBatches(client)
    server.set_batch_knobs(BatchKnobs(in_progress_s=0.2))

    submitted = batches.submit(requests, metadata={"window": "night-1"})
    state = finished(batches, submitted)
    replies, errors = read_back(batches, state, requests)
    synchronous = {request.custom_id: client.complete_json(
        request.messages, schema=request.schema, max_output_tokens=request.max_output_tokens)
        for request in requests}

    assert submitted.status is BatchStatus.VALIDATING and submitted.total == 0
    assert (state.status, state.total, state.completed, state.failed) == (
        BatchStatus.COMPLETED, 6, 6, 0)
    assert errors == {}
    for custom_id, reply in synchronous.items():
        batched = replies[custom_id]
        assert parse_summary(batched.content) == parse_summary(reply.content)
        assert (batched.prompt_tokens, batched.completion_tokens) == (
            reply.prompt_tokens, reply.completion_tokens)
    batch_bodies = [r.body for r in server.requests if r.path == "/v1/batches"]
    sync_bodies = [r.body for r in server.requests if r.path != "/v1/batches"]
    assert batch_bodies == sync_bodies  # the same request, whichever way it is sent


def test_unanswered_lines_come_back_as_the_errors_a_call_would_raise(
        server: OpenAIServer, client: LLMClient) -> None:
    requests = summarizer_requests(seed=22, count=6)
    requests[1].messages[1]["content"] += " [[behave:context_length]]"
    server.set_batch_knobs(BatchKnobs(fail_every=4))
    batches = LLMBatches(client)

    replies, errors = read_back(batches, finished(batches, batches.submit(requests)), requests)

    assert isinstance(errors["s22-1"], ContextOverflow)
    assert isinstance(errors["s22-3"], ProviderError)
    assert errors["s22-3"].reason == "server_error"
    assert set(replies) == {"s22-0", "s22-2", "s22-4", "s22-5"}


@pytest.mark.parametrize(("knobs", "status", "reason", "answered"), [
    (BatchKnobs(expire=True, answered_before_expiry=2), BatchStatus.EXPIRED,
     "batch_expired", 2),
    (BatchKnobs(fail_validation=True), BatchStatus.FAILED, "batch_failed", 0),
])
def test_an_expired_or_failed_batch_names_each_request_it_left_unanswered(
        server: OpenAIServer, client: LLMClient, knobs: BatchKnobs, status: BatchStatus,
        reason: str, answered: int) -> None:
    requests = summarizer_requests(seed=23, count=4)
    server.set_batch_knobs(knobs)
    batches = LLMBatches(client)

    state = finished(batches, batches.submit(requests))
    replies, errors = read_back(batches, state, requests)

    assert state.status is status
    assert len(replies) == answered
    assert {error.reason for error in errors.values()} == {reason}
    assert len(errors) == len(requests) - answered
    assert all(isinstance(error, ProviderError) for error in errors.values())
    assert bool(state.errors) is (status is BatchStatus.FAILED)


def test_a_cancelled_batch_answers_nothing(server: OpenAIServer, client: LLMClient) -> None:
    requests = summarizer_requests(seed=24, count=3)
    server.set_batch_knobs(BatchKnobs(in_progress_s=3600))
    batches = LLMBatches(client)

    submitted = batches.submit(requests)
    client.sdk.batches.cancel(submitted.batch_id)  # an operator's cancel, not the service's
    state = finished(batches, batches.state(submitted.batch_id))
    replies, errors = read_back(batches, state, requests)

    assert state.status is BatchStatus.CANCELLED
    assert replies == {} and set(errors) == {r.custom_id for r in requests}
