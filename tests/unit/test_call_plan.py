"""A job plans its calls without encoding a span that fits by size: the same calls as
the exact plan, which the dry run keeps (``plan_summary_calls(exact=True)``)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from tests.support.generated import generated_turns
from tests.unit.session_strategies import shared_counter, to_stored
from tests.unit.test_counting_once import CountingEncoding
from worker.compaction.call_plan import plan_summary_calls, render_span_items
from worker.compaction.chunking import ChunkPlan
from worker.compaction.grouping import Group, group_messages
from worker.compaction.tokens import TokenCounter

OUTPUT_TOKENS = 1_024
MARGIN_RATIO = 0.10


def span_of(turns: int) -> list[Group]:
    return group_messages(to_stored(generated_turns("plan", turns), shared_counter()))


def planned(span: list[Group], window_tokens: int, counter: TokenCounter, *,
            exact: bool) -> ChunkPlan:
    return plan_summary_calls(span, prior=None, identifiers=["planR1"],
                              window_tokens=window_tokens, margin_ratio=MARGIN_RATIO,
                              output_tokens=OUTPUT_TOKENS, counter=counter, exact=exact)


def calls_of(plan: ChunkPlan) -> list[list[tuple[str, int, int]]]:
    return [[(item.text, item.first_seq, item.last_seq) for item in chunk.items]
            for chunk in plan.chunks]


def test_a_span_that_fits_by_bytes_is_one_call_and_no_item_is_encoded() -> None:
    span = span_of(20)
    encoding = CountingEncoding(shared_counter().encoding)
    fast = planned(span, 128_000, TokenCounter(cast(Any, encoding)), exact=False)
    exact = planned(span, 128_000, shared_counter(), exact=True)

    assert (calls_of(fast), fast.merge_rounds) == (calls_of(exact), exact.merge_rounds)
    assert fast.calls == 1
    rendered = {item.text for item in render_span_items(span, shared_counter())}
    assert rendered.isdisjoint(encoding.texts)
    # Each item's bytes bound its tokens.
    assert all(f.tokens >= e.tokens for f, e in
               zip(fast.chunks[0].items, exact.chunks[0].items, strict=True))


@pytest.mark.parametrize("turns", [20, 200])
def test_a_span_over_the_budget_by_bytes_is_planned_from_exact_counts(turns: int) -> None:
    span = span_of(turns)
    counter = shared_counter()
    tokens = sum(item.tokens for item in render_span_items(span, counter))
    # A window whose chunk budget holds the span's tokens (20 turns) or half of them
    # (200 turns), never its bytes.
    window_tokens = int((tokens * (1.1 if turns == 20 else 0.5) + OUTPUT_TOKENS + 3_000)
                        / (1 - MARGIN_RATIO))
    fast = planned(span, window_tokens, counter, exact=False)
    exact = planned(span, window_tokens, counter, exact=True)

    assert fast == exact
    assert (fast.calls == 1) == (turns == 20)
