"""While the LLM summarizer waits on the model, the work the summary update and the swap would do
that no draft changes is done: the identifiers' lines are counted in the job's counter
and the artifacts' JSON is rendered. The real summarizer against the OpenAI-protocol test
server, counted on the real encoding (wrapped)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

import pytest

from tests.support.openai_server import OpenAIServer
from tests.unit.session_strategies import shared_counter
from tests.unit.test_counting_once import CountingEncoding
from worker.compaction import (
    StoredMessage,
    dump_artifacts_json,
    extract_identifiers,
    group_messages,
    parse_message,
)
from worker.compaction.budget import item_line_texts
from worker.compaction.tokens import TokenCounter
from worker.summarizers import SummaryWork
from worker.summarizers.llm import LLMSummarizer
from worker.summarizers.openai_client import LLMClient, LLMConfig

pytestmark = pytest.mark.integration
WINDOW_TOKENS = 32_000


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(context_window=WINDOW_TOKENS, latency_ms=50) as running:
        yield running


def span_work(counter: TokenCounter) -> SummaryWork:
    messages = []
    for n in range(1, 41, 2):
        ask = f"Please cancel reservation R{n:05d} and refund gift_card_{n:07d}."
        done = f"Cancelled R{n:05d}; refund sent to gift_card_{n:07d} (ticket TCK-{n:04d})."
        messages += [StoredMessage(n, parse_message({"role": "user", "content": ask}), 20),
                     StoredMessage(n + 1, parse_message({"role": "assistant",
                                                         "content": done}), 20)]
    return SummaryWork(span=tuple(group_messages(messages)), prior=None,
                       artifacts=tuple(extract_identifiers(messages)), outcomes=(),
                       span_tokens=800, budget_tokens=2_000, counter=counter)


def test_the_llm_summarizer_counts_the_identifier_lines_and_the_json_meanwhile(
        server: OpenAIServer) -> None:
    plain = shared_counter()
    encoding = CountingEncoding(plain.encoding)
    counter = TokenCounter(cast(Any, encoding)).for_job()
    work = span_work(counter)
    client = LLMClient(LLMConfig(base_url=server.base_url, api_key=None,
                                 model="test-summarizer", connect_timeout_s=5,
                                 read_timeout_s=30, max_retries=0), plain)
    summarizer = LLMSummarizer(client, plain, window_tokens=WINDOW_TOKENS, margin_ratio=0.1,
                               pinned_output_tokens=None, concurrency=2, max_calls=4)
    with client:
        draft = summarizer.summarize(work)

    assert draft.usage.llm_calls == 1
    assert len(work.identifiers) >= 60
    counted = len(encoding.texts)
    assert counter.count_lines(item_line_texts(work.identifiers))
    assert len(encoding.texts) == counted  # every line was counted already
    assert "artifacts_json" in vars(work)  # rendered, and as the store would have it
    assert json.loads(work.artifacts_json) == json.loads(dump_artifacts_json(work.artifacts))
