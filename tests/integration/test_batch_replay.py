"""The LLM summarizer through batches (``worker/summarizers/batch_replay.py``) against the
real HTTP test server: a chunk-and-merge span summarized one round per batch gives the
synchronous run's summary with its token counts at the Batch API's price; small reduce
rounds are called synchronously; lines a batch failed fall back as the setting says."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.batch_api import BatchKnobs
from tests.support.generated import generated_session
from tests.support.openai_server import OpenAIServer
from worker.compaction import (
    ModelPrice,
    StoredMessage,
    TokenCounter,
    group_messages,
    parse_message,
)
from worker.errors import ProviderError
from worker.summarizers import BatchLineFailed, BatchPending, SummaryDraft, SummaryWork
from worker.summarizers.batch_replay import BatchReplay, LineFallback, ReplayPolicy
from worker.summarizers.llm import LLMSummarizer
from worker.summarizers.openai_batch import LLMBatches
from worker.summarizers.openai_client import LLMClient, LLMConfig
from worker.tokenizer.offline import load_encoding

WINDOW_TOKENS = 12_000
PRICE = ModelPrice(input=2.0, cached_input=0.5, output=8.0, batch_discount=0.5)


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter(load_encoding("o200k_base"))


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(context_window=WINDOW_TOKENS, latency_ms=0) as running:
        yield running


def span_work(counter: TokenCounter, turns: int) -> SummaryWork:
    messages = generated_session(f"replay{turns}", turns)["messages"]
    stored = [StoredMessage(seq, parse_message(m), counter.count_message(parse_message(m)))
              for seq, m in enumerate(messages, start=1)]
    span = tuple(group for group in group_messages(stored) if not group.is_instruction)
    return SummaryWork(span=span, prior=None, artifacts=(), outcomes=(),
                       span_tokens=sum(group.tokens for group in span), budget_tokens=1_024)


def summarizer(server: OpenAIServer, counter: TokenCounter) -> tuple[LLMSummarizer, LLMClient]:
    client = LLMClient(LLMConfig(base_url=server.base_url, api_key=None,
                                 model="test-summarizer", connect_timeout_s=5,
                                 read_timeout_s=30, max_retries=0), counter)
    return LLMSummarizer(client, counter, window_tokens=WINDOW_TOKENS, margin_ratio=0.1,
                         pinned_output_tokens=1_024, concurrency=2, max_calls=50,
                         price=PRICE), client


def summarize_through_batches(summarizer: LLMSummarizer, client: LLMClient,
                              counter: TokenCounter, work: SummaryWork,
                              policy: ReplayPolicy) -> tuple[SummaryDraft, int]:
    """Run the job's summarizer, one batch per stop, until it gives its draft."""
    answers: dict[str, dict[str, Any]] = {}
    batches = LLMBatches(client)
    for sent in range(10):
        replay = BatchReplay(client, answers, policy, counter)
        try:
            return summarizer.with_client(replay).summarize(work), sent
        except BatchPending:
            state = batches.submit(replay.pending)
            while not state.status.is_final:
                time.sleep(0.05)
                state = batches.state(state.batch_id)
            answers.update(batches.lines(state, [r.custom_id for r in replay.pending]))
    raise AssertionError("the summary never came")


def test_chunk_and_merge_through_batches_gives_the_synchronous_summary_at_half_price(
        counter: TokenCounter) -> None:
    work = span_work(counter, turns=300)
    with OpenAIServer(context_window=WINDOW_TOKENS, latency_ms=0) as server:
        synchronous = summarizer(server, counter)[0].summarize(work)
    with OpenAIServer(context_window=WINDOW_TOKENS, latency_ms=0) as server:
        batched, sent = summarize_through_batches(
            *summarizer(server, counter), counter, work,
            ReplayPolicy(LineFallback.SYNC, sync_max_prompt_tokens=0))
        direct_calls = [r for r in server.requests if r.path != "/v1/batches"]

    usage, expected = batched.usage, synchronous.usage
    assert expected.chunks >= 3 and expected.merge_rounds >= 1
    assert sent == 1 + expected.merge_rounds and direct_calls == []
    assert batched.summary == synchronous.summary
    assert (usage.llm_calls, usage.prompt_tokens, usage.cached_tokens,
            usage.completion_tokens, usage.chunks, usage.merge_rounds) == (
        expected.llm_calls, expected.prompt_tokens, expected.cached_tokens,
        expected.completion_tokens, expected.chunks, expected.merge_rounds)
    assert expected.cost_usd is not None and usage.cost_usd is not None
    assert usage.cost_usd == pytest.approx(expected.cost_usd / 2, abs=1e-9)


def test_a_small_reduce_round_is_called_synchronously_after_the_batch(
        server: OpenAIServer, counter: TokenCounter) -> None:
    work = span_work(counter, turns=300)

    draft, sent = summarize_through_batches(
        *summarizer(server, counter), counter, work,
        ReplayPolicy(LineFallback.SYNC, sync_max_prompt_tokens=WINDOW_TOKENS))
    direct_calls = [r for r in server.requests if r.path != "/v1/batches"]

    assert sent == 1 and draft.usage.merge_rounds >= 1
    assert len(direct_calls) == draft.usage.llm_calls - draft.usage.chunks


def test_expired_lines_are_called_synchronously_or_end_the_llm_summary(
        server: OpenAIServer, counter: TokenCounter) -> None:
    work = span_work(counter, turns=30)
    server.set_batch_knobs(BatchKnobs(expire=True, answered_before_expiry=0))

    draft, sent = summarize_through_batches(
        *summarizer(server, counter), counter, work,
        ReplayPolicy(LineFallback.SYNC, sync_max_prompt_tokens=0))
    with pytest.raises(BatchLineFailed) as failed:
        summarize_through_batches(*summarizer(server, counter), counter, work,
                                  ReplayPolicy(LineFallback.DETERMINISTIC, 0))

    assert sent == 1 and draft.usage.llm_calls >= 1
    assert failed.value.reason == "batch_line_failed"
    assert isinstance(failed.value.error, ProviderError)
    assert failed.value.error.reason == "batch_expired"
