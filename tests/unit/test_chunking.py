"""The chunk-and-merge plan: exact cover, every chunk within budget, a tree that ends."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.session_strategies import (
    huge_texts,
    render_plain,
    sessions,
    shared_counter,
    texts,
)
from worker.compaction.chunking import (
    MIN_CHUNK_TOKENS,
    ChunkPlan,
    SpanItem,
    chunk_budget_tokens,
    merge_fan_in,
    output_budget_tokens,
    plan_chunks,
    plan_merge_tree,
    split_text,
)
from worker.compaction.grouping import group_messages
from worker.compaction.messages import StoredMessage
from worker.errors import ContextOverflow

PROPERTY = settings(max_examples=40, deadline=None)


def item(text: str, seq: int) -> SpanItem:
    return SpanItem(text, shared_counter().count_text(text), seq, seq)


def items_of(session: list[StoredMessage]) -> list[SpanItem]:
    return [
        SpanItem(text, shared_counter().count_text(text), group.first_seq, group.last_seq)
        for group in group_messages(session) for text in [render_plain(group)]
    ]


def unmarked(part: SpanItem) -> str:
    """A part's own text: parts of a cut item open with a one-line marker."""
    return part.text.split("\n", 1)[1] if part.parts > 1 else part.text


def assert_plan_covers(plan: ChunkPlan, items: list[SpanItem], budget_tokens: int) -> None:
    planned = [part for chunk in plan.chunks for part in chunk.items]
    rebuilt: list[str] = []
    for part in planned:
        if part.part == 1:
            rebuilt.append("")
        rebuilt[-1] += unmarked(part)
        assert part.tokens == shared_counter().count_text(part.text) or part.parts == 1
    assert rebuilt == [original.text for original in items]
    assert [p.first_seq for p in planned if p.part == 1] == [i.first_seq for i in items]
    assert all(chunk.tokens <= budget_tokens for chunk in plan.chunks)
    assert all(chunk.items for chunk in plan.chunks)


@PROPERTY
@given(sessions(), st.integers(MIN_CHUNK_TOKENS, 20_000), st.integers(2, 12))
def test_chunks_cover_the_span_exactly_once_in_order_and_each_fits(
    session: list[StoredMessage], budget_tokens: int, fan_in: int
) -> None:
    items = items_of(session)
    plan = plan_chunks(items, budget_tokens=budget_tokens, counter=shared_counter(),
                       fan_in=fan_in)
    assert_plan_covers(plan, items, budget_tokens)


@PROPERTY
@given(st.lists(st.one_of(texts(True), huge_texts()), min_size=1, max_size=6),
       st.integers(MIN_CHUNK_TOKENS, 4_000))
def test_huge_single_messages_are_cut_into_marked_parts_that_fit(
    bodies: list[str], budget_tokens: int
) -> None:
    items = [item(body, seq) for seq, body in enumerate(bodies, start=800)]
    plan = plan_chunks(items, budget_tokens=budget_tokens, counter=shared_counter(), fan_in=4)
    assert_plan_covers(plan, items, budget_tokens)
    for part in (p for chunk in plan.chunks for p in chunk.items if p.parts > 1):
        assert part.text.startswith(
            f"[part {part.part}/{part.parts} of a long message, seq {part.first_seq}]\n"
        )


def test_an_unbroken_run_is_cut_between_characters() -> None:
    run = "QUJD" * 5_000
    parts = split_text(run, 300, shared_counter())
    assert "".join(parts) == run and len(parts) > 1
    assert all(shared_counter().count_text(p) <= 300 for p in parts)


def test_cuts_prefer_line_breaks() -> None:
    text = "".join(f"line {i} of the log\n" for i in range(2_000))
    parts = split_text(text, 500, shared_counter())
    assert "".join(parts) == text
    assert all(part.endswith("\n") for part in parts)


def test_a_span_that_fits_is_one_chunk_and_one_call() -> None:
    items = [item("short one", 1), item("short two", 2)]
    plan = plan_chunks(items, budget_tokens=1_000, counter=shared_counter(), fan_in=2)
    assert [chunk.items for chunk in plan.chunks] == [tuple(items)]
    assert (plan.merge_rounds, plan.calls) == ((), 1)


def test_an_empty_span_plans_no_call() -> None:
    plan = plan_chunks([], budget_tokens=1_000, counter=shared_counter(), fan_in=2)
    assert (plan.chunks, plan.calls) == ((), 0)


def test_whole_items_are_packed_greedily() -> None:
    items = [item("word " * 200, seq) for seq in range(1, 7)]  # about 200 tokens each
    plan = plan_chunks(items, budget_tokens=450, counter=shared_counter(), fan_in=2)
    assert [len(chunk.items) for chunk in plan.chunks] == [2, 2, 2]
    assert plan.merge_rounds == (((0, 1), (2,)), ((0, 1),))
    assert plan.calls == 3 + 2


def test_a_budget_below_the_minimum_is_a_context_overflow() -> None:
    with pytest.raises(ContextOverflow):
        plan_chunks([item("x", 1)], budget_tokens=MIN_CHUNK_TOKENS - 1,
                    counter=shared_counter(), fan_in=2)


@given(st.integers(0, 5_000), st.integers(2, 64))
def test_the_merge_tree_ends_in_one_output_for_any_size(n_partials: int, fan_in: int) -> None:
    rounds = plan_merge_tree(n_partials, fan_in)
    width = n_partials
    for batches in rounds:
        assert [i for batch in batches for i in batch] == list(range(width))
        assert all(1 <= len(batch) <= fan_in for batch in batches)
        assert max(map(len, batches)) - min(map(len, batches)) <= 1
        width = len(batches)
    assert width == min(n_partials, 1)


@pytest.mark.parametrize(
    ("n_partials", "fan_in", "rounds"),
    [
        (0, 2, ()),
        (1, 2, ()),
        (2, 2, (((0, 1),),)),
        (5, 4, (((0, 1, 2), (3, 4)), ((0, 1),))),
        (9, 3, (((0, 1, 2), (3, 4, 5), (6, 7, 8)), ((0, 1, 2),))),
    ],
)
def test_merge_rounds_are_balanced_consecutive_batches(
    n_partials: int, fan_in: int, rounds: tuple[tuple[tuple[int, ...], ...], ...]
) -> None:
    assert plan_merge_tree(n_partials, fan_in) == rounds


def test_a_fan_in_below_two_is_refused() -> None:
    with pytest.raises(ValueError):
        plan_merge_tree(3, 1)


@pytest.mark.parametrize(
    ("span_tokens", "pinned", "expected"),
    [(0, None, 1_024), (6_826, None, 1_024), (10_000, None, 1_500),
     (27_307, None, 4_096), (1_000_000, None, 4_096), (1_000_000, 777, 777)],
)
def test_the_output_budget_is_a_clamped_share_of_the_span(
    span_tokens: int, pinned: int | None, expected: int
) -> None:
    assert output_budget_tokens(span_tokens, pinned) == expected


def test_the_chunk_budget_is_the_window_less_margin_and_fixed_parts() -> None:
    assert chunk_budget_tokens(128_000, 0.10, 4_096, 3_500) == 115_200 - 7_596


def test_a_window_too_small_for_the_fixed_parts_is_a_context_overflow() -> None:
    with pytest.raises(ContextOverflow) as raised:
        chunk_budget_tokens(8_000, 0.10, 4_096, 3_500)
    assert raised.value.reason == "window_too_small"


@pytest.mark.parametrize(
    ("budget_tokens", "output_tokens", "fan_in"),
    [(100_000, 4_096, 24), (8_192, 4_096, 2), (20_000, 1_024, 19)],
)
def test_the_fan_in_is_how_many_partials_fit_a_merge_call(
    budget_tokens: int, output_tokens: int, fan_in: int
) -> None:
    assert merge_fan_in(budget_tokens, output_tokens) == fan_in


def test_a_merge_call_that_cannot_hold_two_partials_is_a_context_overflow() -> None:
    with pytest.raises(ContextOverflow):
        merge_fan_in(8_191, 4_096)
