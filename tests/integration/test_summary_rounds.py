"""The LLM path over rounds of growth: the real LLM summarizer against the OpenAI-protocol
test server (a careful model: it follows the prompt's rules and no further), the job on
the in-memory store. The prompt, the merge and the re-attachment must hold the same
figures as the extractive path: within budget, each round's facts a round later, no
answered request still open."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from tests.support.job_harness import JobHarness
from tests.support.openai_server import OpenAIServer
from tests.support.shaped_sessions import Planted, coding_turns, service_turns
from tests.unit.test_rounds import (
    BUDGET_TOKENS,
    SESSION,
    Shape,
    compact,
    harness_for_rounds,
    share_visible,
    start,
)
from worker.compaction.intake import IntakePolicy
from worker.platform.ingest import append_messages
from worker.summarizers.llm import LLMSummarizer
from worker.summarizers.openai_client import LLMClient, LLMConfig

pytestmark = pytest.mark.integration
WINDOW_TOKENS = 128_000


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(context_window=WINDOW_TOKENS, latency_ms=0) as running:
        yield running


def llm_harness(server: OpenAIServer) -> JobHarness:
    harness = harness_for_rounds()
    client = LLMClient(LLMConfig(base_url=server.base_url, api_key=None,
                                 model="test-summarizer", connect_timeout_s=5,
                                 read_timeout_s=60, max_retries=0), harness.counter)
    summarizer = LLMSummarizer(client, harness.counter, window_tokens=WINDOW_TOKENS,
                               margin_ratio=0.10, pinned_output_tokens=None, concurrency=2,
                               max_calls=20)
    harness.deps = dataclasses.replace(harness.deps, summarizer=summarizer)
    return harness


@pytest.mark.parametrize("shape", [coding_turns, service_turns], ids=["coding", "service"])
def test_llm_path_rounds_keep_new_facts_close_requests_and_the_budget(
    server: OpenAIServer, shape: Shape
) -> None:
    harness, rounds, total_turns = llm_harness(server), [Planted()], 20
    start(harness, shape("A", 0, total_turns, rounds[0]))
    for round_index in range(10):
        text, summary, block_tokens = compact(harness)
        assert block_tokens <= BUDGET_TOKENS + 8
        if round_index:
            facts = rounds[round_index - 1]
            assert share_visible([*facts.said, *facts.errors], text) >= 0.9
        open_requests = [item for item in summary.pending if item.startswith("Unanswered")]
        answered_earlier = [ask for facts in rounds[:round_index] for ask in facts.answered]
        assert not any(ask in item for ask in answered_earlier for item in open_requests)
        added, growth = Planted(), max(1, total_turns // 5)
        append_messages(harness.store, harness.counter, IntakePolicy(), SESSION,
                        shape(chr(ord("B") + round_index), 0, growth, added), harness.clock())
        rounds.append(added)
        total_turns += growth
