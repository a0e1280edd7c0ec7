"""Chunk-and-merge against a real OpenAI-protocol server whose window is far smaller than
the span: a 1,000,000-token session through a 32k window."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

import pytest

from tests.support.openai_server import OpenAIServer
from worker.compaction.grouping import group_messages
from worker.compaction.messages import StoredMessage, parse_message
from worker.compaction.prompts import prompt_overhead_tokens
from worker.compaction.schema import summary_text
from worker.compaction.tokens import TokenCounter
from worker.summarizers import SummaryWork
from worker.summarizers.llm import LLMSummarizer
from worker.summarizers.openai_client import LLMClient, LLMConfig
from worker.tokenizer.offline import load_encoding

WINDOW_TOKENS = 32_000
EXCHANGES = 64
RESULT_TOKENS = 16_000  # one tool exchange per chunk: a chunk holds about 24k tokens
WORDS = [
    "request",
    "latency",
    "cache",
    "shard",
    "replica",
    "queue",
    "worker",
    "retry",
    "upstream",
    "timeout",
    "payload",
    "schema",
    "index",
    "migration",
    "rollout",
    "config",
    "service",
    "handler",
    "batch",
    "window",
    "commit",
    "branch",
    "deploy",
    "metric",
    "alert",
    "quota",
    "region",
    "cluster",
    "node",
    "pool",
    "token",
]

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter(load_encoding("o200k_base"))


def ticket(index: int) -> str:
    return f"INC-{7000 + index}"


def log_text(rng: random.Random, counter: TokenCounter, tokens: int) -> str:
    """Plain prose-like log lines without identifiers, about ``tokens`` long."""
    line_words = [" ".join(rng.choices(WORDS, k=12)) for _ in range(64)]
    lines: list[str] = []
    while counter.count_text("\n".join(lines)) < tokens:
        lines.extend(rng.choice(line_words) for _ in range(200))
    return "\n".join(lines)


def session(counter: TokenCounter) -> Iterator[dict[str, object]]:
    rng = random.Random(7)
    body = log_text(rng, counter, RESULT_TOKENS)
    yield {"role": "system", "content": "You are an on-call agent."}
    for i in range(EXCHANGES):
        yield {"role": "user", "content": f"Investigate ticket {ticket(i)} please."}
        yield {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": "read_logs", "arguments": f'{{"ticket": "{ticket(i)}"}}'},
                }
            ],
        }
        yield {"role": "tool", "tool_call_id": f"call_{i}", "content": body}


def test_a_million_token_span_is_summarized_through_a_32k_window(
    counter: TokenCounter,
) -> None:
    stored = [
        StoredMessage(seq, parse_message(m), counter.count_message(parse_message(m)))
        for seq, m in enumerate(session(counter), start=1)
    ]
    span = tuple(g for g in group_messages(stored) if not g.is_instruction)
    span_tokens = sum(g.tokens for g in span)
    assert span_tokens >= 1_000_000

    with OpenAIServer(context_window=WINDOW_TOKENS, latency_ms=0) as server:
        client = LLMClient(
            LLMConfig(
                base_url=server.base_url,
                api_key=None,
                model="test-summarizer",
                connect_timeout_s=5,
                read_timeout_s=60,
                max_retries=0,
            ),
            counter,
        )
        summarizer = LLMSummarizer(
            client,
            counter,
            window_tokens=WINDOW_TOKENS,
            margin_ratio=0.10,
            pinned_output_tokens=None,
            concurrency=4,
            max_calls=500,
        )
        # No identifier list in the prompts: whatever reaches the summary came from a chunk.
        draft = summarizer.summarize(
            SummaryWork(
                span=span, prior=None, artifacts=(), outcomes=(), span_tokens=span_tokens,
                budget_tokens=4_096,
            )
        )
        requests = list(server.requests)

    usage = draft.usage
    assert usage.chunks >= EXCHANGES and usage.merge_rounds >= 2
    assert usage.llm_calls == len(requests)
    assert max(r.prompt_tokens for r in requests) <= WINDOW_TOKENS
    merges = [r for r in requests if "PART 1 OF" in str(r.body["messages"][-1]["content"])]
    assert len(requests) - len(merges) == usage.chunks
    # The prompt's fixed part, and the framing around a call's span or merged partials.
    overhead_tokens = (prompt_overhead_tokens(counter) + 100) * len(requests)
    assert sum(r.prompt_tokens for r in requests) <= 1.15 * span_tokens + overhead_tokens
    text = summary_text(draft.summary)
    missing = [ticket(i) for i in range(EXCHANGES) if not re.search(rf"\b{ticket(i)}\b", text)]
    assert missing == []
