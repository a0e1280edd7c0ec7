"""Deterministic strategies: valid output, instructions and pending calls kept, budgets met."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.chat_rules import find_chat_violations
from tests.support.strategy_steps import Step, compose_to_budget, default_steps
from tests.unit.session_strategies import sessions, shared_counter, to_stored
from worker.compaction.grouping import Group, GroupKind, group_messages
from worker.compaction.messages import ChatMessage, Role, StoredMessage
from worker.compaction.strategies import (
    SizeUnit,
    StrategyConfig,
    StrategyName,
    apply_strategy,
    collapse_tool_groups,
    drop_tool_groups,
    slide_window,
    truncate_groups,
)

PROPERTY = settings(max_examples=40, deadline=None)


@st.composite
def configs(draw: st.DrawFn) -> StrategyConfig:
    max_size = draw(st.integers(0, 50_000))
    return StrategyConfig(
        name=draw(st.sampled_from(StrategyName)),
        max_size=max_size,
        compact_to=draw(st.integers(0, max_size)),
        unit=draw(st.sampled_from(SizeUnit)),
        keep_last_groups=draw(st.integers(0, 8)),
        keep_last_tool_groups=draw(st.integers(0, 4)),
    )


def messages_of(groups: list[Group]) -> list[ChatMessage]:
    return [m.message for group in groups for m in group.messages]


def assert_safe(before: list[Group], after: list[Group]) -> None:
    """Valid for the chat API; instructions and a pending group untouched; order kept."""
    assert find_chat_violations(messages_of(after)) == []
    kept_ids = {id(group) for group in after}
    assert all(id(g) in kept_ids for g in before if g.is_instruction or g.pending)
    firsts = [group.first_seq for group in after]
    assert firsts == sorted(firsts) and len(set(firsts)) == len(firsts)


@PROPERTY
@given(sessions(), configs())
def test_every_strategy_keeps_the_session_valid(
    session: list[StoredMessage], config: StrategyConfig
) -> None:
    groups = group_messages(session)
    assert_safe(groups, apply_strategy(groups, config, shared_counter()))


@PROPERTY
@given(sessions(), st.integers(0, 60_000), st.integers(0, 3))
def test_composition_meets_the_budget_when_instructions_and_the_last_group_fit(
    session: list[StoredMessage], budget_tokens: int, keep_last_tool_groups: int
) -> None:
    groups = group_messages(session)
    steps = default_steps(shared_counter(), keep_last_tool_groups=keep_last_tool_groups)
    composed = compose_to_budget(groups, budget_tokens, steps)
    assert_safe(groups, composed)
    conversation = [g for g in groups if not g.is_instruction]
    floor = sum(g.tokens for g in groups if g.is_instruction) + sum(
        g.tokens for g in conversation[-1:])
    if floor <= budget_tokens:
        assert sum(group.tokens for group in composed) <= budget_tokens


@PROPERTY
@given(sessions())
def test_collapse_turns_old_exchanges_into_single_assistant_messages(
    session: list[StoredMessage],
) -> None:
    groups = group_messages(session)
    collapsed = collapse_tool_groups(groups, keep_last_tool_groups=1, counter=shared_counter())
    assert len(collapsed) == len(groups)
    settled = [i for i, g in enumerate(groups)
               if g.kind is GroupKind.TOOL_EXCHANGE and not g.pending]
    for index, (old, new) in enumerate(zip(groups, collapsed, strict=True)):
        if index in settled[:-1]:
            assert new.kind is GroupKind.ASSISTANT and len(new.messages) == 1
            assert "[Tool results: " in new.messages[0].message.text
            assert new.tokens == shared_counter().count_message(new.messages[0].message)
        else:
            assert new is old


def session_of(*messages: dict[str, Any]) -> list[Group]:
    return group_messages(to_stored(messages, shared_counter()))


def exchange(call_id: str, output: str) -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": "checking", "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "get_user_details", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]


SYSTEM = {"role": "system", "content": "rules"}
TURNS = [
    SYSTEM,
    {"role": "user", "content": "one"},
    *exchange("a", '{\n  "user_id": "mia_li_3668"\n}'),
    {"role": "user", "content": "two"},
    *exchange("b", "second output"),
    {"role": "assistant", "content": "done"},
]


def firsts(groups: list[Group]) -> list[int]:
    return [group.first_seq for group in groups]


def test_collapse_lists_each_result_after_the_assistant_text() -> None:
    collapsed = collapse_tool_groups(session_of(*TURNS), keep_last_tool_groups=1,
                                     counter=shared_counter())
    assert collapsed[2].messages[0].message.text == (
        'checking\n[Tool results: get_user_details: "user_id": "mia_li_3668"]'
    )
    assert collapsed[2].messages[0].message.role is Role.ASSISTANT


def test_drop_removes_old_exchanges_whole() -> None:
    groups = session_of(*TURNS)
    assert firsts(drop_tool_groups(groups, keep_last_tool_groups=1)) == [1, 2, 5, 6, 8]
    assert firsts(drop_tool_groups(groups, keep_last_tool_groups=0)) == [1, 2, 5, 8]


def test_sliding_window_keeps_instructions_and_the_last_groups() -> None:
    groups = session_of(*TURNS)
    assert firsts(slide_window(groups, keep_last_groups=2)) == [1, 6, 8]
    assert firsts(slide_window(groups, keep_last_groups=0)) == [1]


@pytest.mark.parametrize(
    ("max_size", "compact_to", "expected"),
    [(100, 100, [1, 2, 3, 5, 6, 8]), (5, 4, [1, 6, 8]), (5, 0, [1, 8])],
)
def test_truncation_by_messages_drops_oldest_groups_down_to_the_target(
    max_size: int, compact_to: int, expected: list[int]
) -> None:
    truncated = truncate_groups(session_of(*TURNS), max_size=max_size, compact_to=compact_to,
                                unit=SizeUnit.MESSAGES)
    assert firsts(truncated) == expected


def test_truncation_by_tokens_stops_once_under_the_target() -> None:
    groups = session_of(*TURNS)
    total = sum(g.tokens for g in groups)
    target = total - groups[1].tokens
    truncated = truncate_groups(groups, max_size=target, compact_to=target, unit=SizeUnit.TOKENS)
    assert firsts(truncated) == [1, 3, 5, 6, 8]


def test_truncation_refuses_a_target_above_its_trigger() -> None:
    with pytest.raises(ValueError):
        truncate_groups([], max_size=1, compact_to=2, unit=SizeUnit.TOKENS)
    with pytest.raises(ValueError):
        StrategyConfig(StrategyName.TRUNCATION, max_size=1, compact_to=2)


def test_a_strategy_config_refuses_negative_counts() -> None:
    with pytest.raises(ValueError):
        StrategyConfig(StrategyName.SLIDING_WINDOW, keep_last_groups=-1)


def test_a_pending_call_survives_every_strategy() -> None:
    pending = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "p", "type": "function", "function": {"name": "slow", "arguments": "{}"}}]}
    groups = session_of(*TURNS, pending)
    for name in StrategyName:
        config = StrategyConfig(name, max_size=0, compact_to=0, keep_last_groups=0,
                                keep_last_tool_groups=0)
        assert apply_strategy(groups, config, shared_counter())[-1] is groups[-1]


def test_composition_runs_cheapest_steps_first_and_stops_when_under_budget() -> None:
    calls: list[str] = []

    def recording(name: str, action: Callable[[list[Group]], list[Group] | None]) -> Step:
        def step(groups: list[Group]) -> list[Group] | None:
            calls.append(name)
            return action(groups)
        return step

    groups = session_of(*TURNS)
    steps = [recording("decline", lambda g: None), recording("drop-all", lambda g: g[:1]),
             recording("never", lambda g: [])]
    assert compose_to_budget(groups, groups[0].tokens, steps) == groups[:1]
    assert calls == ["decline", "drop-all"]


def test_composition_with_a_summarization_slot_uses_its_result() -> None:
    groups = session_of(*TURNS)
    summary = StoredMessage(2, ChatMessage(role=Role.USER, content="[summary]"), 5)

    def summarize(current: list[Group]) -> list[Group]:
        return [current[0], Group(GroupKind.USER, (summary,)), current[-1]]

    steps = default_steps(shared_counter(), keep_last_tool_groups=5, summarize=summarize)
    budget = groups[0].tokens + 5 + groups[-1].tokens
    assert compose_to_budget(groups, budget, steps) == summarize(groups)
