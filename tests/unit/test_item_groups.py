"""Atomic groups of Responses items and Anthropic messages: on generated sessions (seeded,
with reasoning or thinking, parallel calls and hosted tools), every boundary the planner
draws gives a projection the provider's API accepts, and the span the summarizer reads
holds no opaque part."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cli.demo_sessions import generate_sessions
from tests.support.provider_rules import anthropic_rejections, responses_rejections
from tests.support.wire_convert import chat_to_anthropic, chat_to_responses
from tests.support.wire_sessions import anthropic_messages, responses_items
from tests.unit.session_strategies import shared_counter
from worker.compaction import (
    SessionFormat,
    StoredItem,
    TriggerPolicy,
    count_view,
    group_items,
    plan_boundary,
    read_item,
)
from worker.compaction.grouping import GroupKind
from worker.compaction.schema import summary_block_message

Items = list[dict[str, Any]]
Rules = Callable[[Sequence[dict[str, Any]], Sequence[dict[str, Any]]], list[str]]
FORMATS: dict[SessionFormat, tuple[Callable[[int, int], Items], Rules]] = {
    SessionFormat.RESPONSES: (responses_items, responses_rejections),
    SessionFormat.ANTHROPIC: (anthropic_messages, anthropic_rejections),
}
INSTRUCTIONS = ("system", "developer")


def stored(session_format: SessionFormat, items: Items) -> list[StoredItem]:
    counter = shared_counter()
    read = [read_item(session_format, seq, 0, item) for seq, item in enumerate(items, 1)]
    return [read_item(session_format, s.seq, count_view(s.view, counter), item)
            for s, item in zip(read, items, strict=True)]


def project(session_format: SessionFormat, items: Items, through_seq: int) -> Items:
    """The store's projection rule: covered instructions, the block, the tail."""
    covered = [item for item in items[:through_seq] if item.get("role") in INSTRUCTIONS]
    block = summary_block_message("## Summary of earlier work", session_format.value)
    return [*covered, block, *items[through_seq:]]


@pytest.mark.parametrize("session_format", list(FORMATS))
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), turns=st.integers(2, 8),
       tail_tokens=st.integers(0, 3_000), min_turns=st.integers(0, 2))
def test_every_planned_boundary_gives_a_projection_the_provider_accepts(
    session_format: SessionFormat, seed: int, turns: int, tail_tokens: int, min_turns: int,
) -> None:
    generate, rejections = FORMATS[session_format]
    items = generate(seed, turns)
    policy = TriggerPolicy(trigger_tokens=10_000, floor_tokens=5_000,
                           tail_budget_tokens=tail_tokens, min_tail_user_turns=min_turns)
    groups = group_items(session_format, stored(session_format, items))

    boundary = plan_boundary(groups, prior_through_seq=0, summary_tokens=500, policy=policy)

    # The groups re-concatenate to the session, each item's messages in one group.
    seqs = [message.seq for group in groups for message in group.messages]
    assert sorted(set(seqs)) == list(range(1, len(items) + 1)) and seqs == sorted(seqs)
    assert all(a.last_seq < b.first_seq for a, b in itertools.pairwise(groups))
    if boundary is None:
        return
    assert rejections(project(session_format, items, boundary.through_seq), items) == []
    assert rejections(items, items) == []


def opaque_values(items: Items) -> list[str]:
    return [value for item in items for value in _walk(item)]


def _walk(value: object) -> list[str]:
    if isinstance(value, dict):
        found = [v for k, v in value.items()
                 if k in ("encrypted_content", "signature", "data") and isinstance(v, str)]
        return found + [x for inner in value.values() for x in _walk(inner)]
    if isinstance(value, list):
        return [x for inner in value for x in _walk(inner)]
    return []


@pytest.mark.parametrize("session_format", list(FORMATS))
def test_reasoning_and_thinking_stay_with_their_calls_and_never_reach_the_span_text(
    session_format: SessionFormat,
) -> None:
    generate, _ = FORMATS[session_format]
    items = generate(21, 6)
    groups = group_items(session_format, stored(session_format, items))

    text = "\n".join(m.message.model_dump_json() for g in groups for m in g.messages)
    assert not any(secret in text for secret in opaque_values(items))
    for group in groups:
        first = items[group.first_seq - 1]
        # No group starts with an output, nor ends with reasoning waiting for its item.
        assert first.get("type") not in ("function_call_output",)
        assert not (isinstance(first.get("content"), list) and
                    first["content"][0].get("type") == "tool_result")
        assert items[group.last_seq - 1].get("type") != "reasoning"


@pytest.mark.parametrize("session_format", list(FORMATS))
def test_the_rules_refuse_a_cut_inside_a_group(session_format: SessionFormat) -> None:
    """The property above can fail: cutting after the first item of any exchange (a
    call parted from its reasoning or its output) gives a projection the provider
    refuses. (A reasoning item before a message may lose its message's company: a cut
    drops the reasoning with the older items, which the provider accepts.)"""
    generate, rejections = FORMATS[session_format]
    items = generate(5, 6)
    groups = group_items(session_format, stored(session_format, items))
    inside = [g for g in groups if g.last_seq > g.first_seq
              and g.kind is GroupKind.TOOL_EXCHANGE]

    assert inside
    for group in inside:
        assert rejections(project(session_format, items, group.first_seq), items) != []


def test_a_call_waiting_for_its_output_at_the_end_is_pending() -> None:
    items = responses_items(2, 2)
    cut = max(i for i, item in enumerate(items) if item["type"] == "function_call") + 1
    while items[cut - 1]["type"] == "function_call_output":
        cut -= 1

    groups = group_items(SessionFormat.RESPONSES,
                         stored(SessionFormat.RESPONSES, items[:cut]))

    assert groups[-1].pending and not any(g.pending for g in groups[:-1])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(1, 10_000), tail_tokens=st.integers(0, 6_000))
def test_demo_sessions_rewritten_in_each_format_give_accepted_projections_at_every_cut(
    seed: int, tail_tokens: int,
) -> None:
    [record] = generate_sessions(1, seed)
    _, anthropic = chat_to_anthropic(record["messages"], seed=seed)
    cases = ((SessionFormat.RESPONSES, chat_to_responses(record["messages"], seed=seed)),
             (SessionFormat.ANTHROPIC, anthropic))
    policy = TriggerPolicy(trigger_tokens=50_000, floor_tokens=25_000,
                           tail_budget_tokens=tail_tokens, min_tail_user_turns=0)
    for session_format, items in cases:
        _, rejections = FORMATS[session_format]
        groups = group_items(session_format, stored(session_format, items))
        boundary = plan_boundary(groups, prior_through_seq=0, summary_tokens=500,
                                 policy=policy)
        if boundary is not None:
            projected = project(session_format, items, boundary.through_seq)
            assert rejections(projected, items) == [], session_format
