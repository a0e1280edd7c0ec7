"""The trigger decision and the boundary: what is summarized, what stays verbatim."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from tests.support.chat_rules import find_chat_violations
from tests.unit.session_strategies import session_messages, sessions, shared_counter, to_stored
from worker.compaction.grouping import Group, GroupKind, group_messages
from worker.compaction.messages import ChatMessage, Role
from worker.compaction.plan import (
    Boundary,
    DecisionReason,
    TriggerPolicy,
    decide_compaction,
    plan_boundary,
)

PROPERTY = settings(max_examples=50, deadline=None)
PLACEHOLDER = ChatMessage(role=Role.USER, content="[summary of earlier conversation]")


@st.composite
def policies(draw: st.DrawFn) -> TriggerPolicy:
    # Scales from tiny to roomy: plain integer draws cluster at the small end.
    trigger = draw(st.sampled_from([200, 2_000, 20_000, 200_000])) + draw(st.integers(0, 99))
    return TriggerPolicy(
        trigger_tokens=trigger,
        floor_tokens=max(1, int(trigger * draw(st.floats(0.01, 1.0)))),
        tail_budget_tokens=draw(st.sampled_from([0, 100, 1_000, 8_000, 100_000])),
        min_tail_user_turns=draw(st.integers(0, 3)),
    )


def policy(**overrides: int) -> TriggerPolicy:
    values = {"trigger_tokens": 1_000, "floor_tokens": 500, "tail_budget_tokens": 300,
              "min_tail_user_turns": 1} | overrides
    return TriggerPolicy(**values)


def projection(boundary: Boundary) -> list[ChatMessage]:
    """What a model would see: instructions, a summary placeholder, the tail."""
    kept = [m.message for group in boundary.instructions for m in group.messages]
    return [*kept, PLACEHOLDER, *(m.message for group in boundary.tail for m in group.messages)]


def seqs(groups: tuple[Group, ...]) -> list[int]:
    return [m.seq for group in groups for m in group.messages]


def conversation_tokens(groups: tuple[Group, ...]) -> int:
    return sum(group.tokens for group in groups if not group.is_instruction)


def required_tail_start(
    groups: list[Group], start: int, summary_tokens: int, rule: TriggerPolicy
) -> int:
    """The smallest tail the documented rule allows, computed the slow obvious way."""
    pending_at = next((i for i, g in enumerate(groups) if g.pending), len(groups))
    candidates = [i for i in range(start, pending_at + 1)
                  if sum(g.kind is GroupKind.USER for g in groups[i:]) >= rule.min_tail_user_turns]
    with_users = max(candidates) if candidates else start
    kept = sum(g.tokens for g in groups[:with_users] if g.is_instruction)
    if kept + summary_tokens + sum(g.tokens for g in groups[with_users:]) > rule.trigger_tokens:
        return pending_at
    return with_users


@st.composite
def planned(draw: st.DrawFn) -> tuple[list[Group], int, int, TriggerPolicy, Boundary | None]:
    """Groups of a session, a prior boundary from an earlier plan, and the new plan."""
    groups = group_messages(draw(sessions()))
    summary_tokens = draw(st.integers(0, 2_000))
    prior_through = 0
    earlier = plan_boundary(
        groups[: draw(st.integers(0, len(groups)))], prior_through_seq=0,
        summary_tokens=summary_tokens, policy=draw(policies()),
    )
    if earlier is not None and draw(st.booleans()):
        prior_through = earlier.through_seq
    rule = draw(policies())
    boundary = plan_boundary(
        groups, prior_through_seq=prior_through, summary_tokens=summary_tokens, policy=rule
    )
    return groups, prior_through, summary_tokens, rule, boundary


@PROPERTY
@given(planned())
def test_the_projection_is_valid_for_the_chat_api(
    case: tuple[list[Group], int, int, TriggerPolicy, Boundary | None],
) -> None:
    boundary = case[-1]
    if boundary is not None:
        assert find_chat_violations(projection(boundary)) == []


@PROPERTY
@given(planned())
def test_every_message_is_summarized_or_projected_exactly_once_in_order(
    case: tuple[list[Group], int, int, TriggerPolicy, Boundary | None],
) -> None:
    groups, prior_through, _, _, boundary = case
    if boundary is None:
        return
    earlier = [m.seq for g in groups if not g.is_instruction for m in g.messages
               if m.seq <= prior_through]
    summarized, projected = seqs(boundary.span), seqs(boundary.instructions + boundary.tail)
    assert summarized == sorted(summarized) and projected == sorted(projected)
    assert sorted(earlier + summarized + projected) == [m.seq for g in groups for m in g.messages]
    assert min(summarized) > prior_through
    assert max(summarized) <= boundary.through_seq < min(seqs(boundary.tail), default=10**9)


@PROPERTY
@given(planned())
def test_the_boundary_never_splits_a_group_nor_takes_a_pending_one(
    case: tuple[list[Group], int, int, TriggerPolicy, Boundary | None],
) -> None:
    groups, _, _, _, boundary = case
    if boundary is None:
        return
    planned_ids = {id(group) for group in boundary.span + boundary.tail + boundary.instructions}
    assert planned_ids <= {id(group) for group in groups}  # whole groups, never parts
    assert not any(group.pending for group in boundary.span)
    assert not any(group.is_instruction for group in boundary.span)
    tail_start = len(groups) - len(boundary.tail)
    assert groups[tail_start:] == list(boundary.tail)
    assert all(group.last_seq <= boundary.through_seq for group in groups[:tail_start])


@PROPERTY
@given(planned())
def test_the_tail_is_the_largest_that_the_budget_and_floor_allow(
    case: tuple[list[Group], int, int, TriggerPolicy, Boundary | None],
) -> None:
    groups, prior_through, summary_tokens, rule, boundary = case
    if boundary is None:
        return
    start = next(i for i, g in enumerate(groups) if g.last_seq > prior_through)
    tail_start = len(groups) - len(boundary.tail)
    required = required_tail_start(groups, start, summary_tokens, rule)
    assert tail_start <= required
    if any(not g.is_instruction for g in groups[tail_start:required]):  # grown: bounds hold
        assert conversation_tokens(boundary.tail) <= rule.tail_budget_tokens
        assert boundary.projected_tokens(summary_tokens) <= rule.floor_tokens
    blocker = groups[tail_start - 1]  # the span is not empty, so this exists
    assert not blocker.is_instruction
    assert (conversation_tokens(boundary.tail) + blocker.tokens > rule.tail_budget_tokens
            or boundary.projected_tokens(summary_tokens) + blocker.tokens > rule.floor_tokens
            or tail_start == required)


@PROPERTY
@given(planned())
def test_a_plan_is_none_only_when_nothing_new_can_be_summarized(
    case: tuple[list[Group], int, int, TriggerPolicy, Boundary | None],
) -> None:
    groups, prior_through, summary_tokens, rule, boundary = case
    if boundary is not None:
        return
    start = next((i for i, g in enumerate(groups) if g.last_seq > prior_through), len(groups))
    conversation = [i for i in range(start, len(groups)) if not groups[i].is_instruction]
    if not conversation or required_tail_start(groups, start, summary_tokens, rule) <= min(
        conversation
    ):
        event("none: nothing new, or all of it required in the tail")
        return
    event("none: the tail grew over everything new")
    whole = tuple(groups[start:])
    kept = sum(g.tokens for g in groups[:start] if g.is_instruction)
    assert conversation_tokens(whole) <= rule.tail_budget_tokens
    assert kept + summary_tokens + sum(g.tokens for g in whole) <= rule.floor_tokens


def test_a_second_plan_summarizes_only_what_came_after_the_first() -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "policy " * 50}]
    for turn in range(12):
        messages += [{"role": "user", "content": f"question {turn} " * 40},
                     {"role": "assistant", "content": f"answer {turn} " * 40}]
    groups = group_messages(to_stored(messages, shared_counter()))
    first = plan_boundary(groups, prior_through_seq=0, summary_tokens=100, policy=policy())
    assert first is not None
    second = plan_boundary(groups, prior_through_seq=first.through_seq, summary_tokens=100,
                           policy=policy(tail_budget_tokens=0, min_tail_user_turns=0))
    assert second is not None
    assert seqs(second.span) == seqs(first.tail)
    assert second.instructions == first.instructions


def test_min_user_turns_win_over_the_floor() -> None:
    messages = [{"role": "user", "content": f"turn {i} " * 200} for i in range(4)]
    groups = group_messages(to_stored(messages, shared_counter()))
    boundary = plan_boundary(groups, prior_through_seq=0, summary_tokens=0,
                             policy=policy(trigger_tokens=10_000, floor_tokens=10,
                                           tail_budget_tokens=10, min_tail_user_turns=2))
    assert boundary is not None
    assert boundary.tail == tuple(groups[2:])


def test_min_user_turns_yield_when_keeping_them_stays_above_the_trigger() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start the migration"}]
    for step in range(6):
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{step}", "type": "function",
                 "function": {"name": "run", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{step}", "content": "log line\n" * 300},
        ]
    groups = group_messages(to_stored(messages, shared_counter()))
    rule = policy(trigger_tokens=2_000, floor_tokens=1_000, tail_budget_tokens=1_000)
    boundary = plan_boundary(groups, prior_through_seq=0, summary_tokens=0, policy=rule)
    assert boundary is not None
    assert boundary.span[0].kind is GroupKind.USER
    assert 0 < boundary.tail_tokens <= 1_000


def test_instructions_stay_out_of_the_span_wherever_they_sit() -> None:
    messages = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "a " * 300},
        {"role": "developer", "content": "new rule"},
        {"role": "assistant", "content": "b " * 300},
        {"role": "user", "content": "last"},
    ]
    groups = group_messages(to_stored(messages, shared_counter()))
    boundary = plan_boundary(groups, prior_through_seq=0, summary_tokens=0, policy=policy())
    assert boundary is not None
    assert [g.kind for g in boundary.span] == [GroupKind.USER, GroupKind.ASSISTANT]
    assert [g.messages[0].seq for g in boundary.instructions] == [1, 3]
    assert seqs(boundary.tail) == [5]


@pytest.mark.parametrize(
    "messages",
    [
        pytest.param([], id="empty"),
        pytest.param([{"role": "system", "content": "only rules"}], id="system-only"),
        pytest.param([{"role": "system", "content": "rules"}, {"role": "user", "content": "hi"}],
                     id="all-in-tail"),
    ],
)
def test_nothing_to_summarize_gives_no_boundary(messages: list[dict[str, Any]]) -> None:
    groups = group_messages(to_stored(messages, shared_counter()))
    assert plan_boundary(groups, prior_through_seq=0, summary_tokens=0, policy=policy()) is None


def test_a_pending_call_and_what_precedes_it_up_to_the_last_user_turn_stay() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "old " * 400},
        {"role": "user", "content": "now"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "p", "type": "function", "function": {"name": "slow", "arguments": "{}"}}]},
    ]
    groups = group_messages(to_stored(messages, shared_counter()))
    boundary = plan_boundary(groups, prior_through_seq=0, summary_tokens=0,
                             policy=policy(tail_budget_tokens=0))
    assert boundary is not None
    assert [g.pending for g in boundary.tail] == [False, True]


@pytest.mark.parametrize(
    ("tokens", "savings", "force", "expected"),
    [
        (999, [], False, (False, DecisionReason.UNDER_TRIGGER)),
        (1_000, [], False, (False, DecisionReason.UNDER_TRIGGER)),
        (1_001, [], False, (True, DecisionReason.OVER_TRIGGER)),
        (10, [], True, (True, DecisionReason.FORCED)),
        (1_001, [0.05, 0.02], True, (True, DecisionReason.FORCED)),
        (1_001, [0.05, 0.02], False, (False, DecisionReason.ANTI_THRASH)),
        (1_500, [0.05, 0.02], False, (False, DecisionReason.ANTI_THRASH)),
        (1_501, [0.05, 0.02], False, (True, DecisionReason.THRASH_LIFTED)),
        (1_001, [0.05, 0.50], False, (True, DecisionReason.OVER_TRIGGER)),
        (1_001, [0.50, 0.05], False, (True, DecisionReason.OVER_TRIGGER)),
        (1_001, [0.05], False, (True, DecisionReason.OVER_TRIGGER)),
        (1_001, [0.05, 0.05, 0.9], False, (False, DecisionReason.ANTI_THRASH)),
        (1_001, [0.10, 0.05], False, (True, DecisionReason.OVER_TRIGGER)),
    ],
)
def test_the_trigger_decision_follows_the_policy_table(
    tokens: int, savings: list[float], force: bool, expected: tuple[bool, DecisionReason]
) -> None:
    decision = decide_compaction(tokens, savings, policy(), force)
    assert (decision.compact, decision.reason) == expected


def test_decision_reasons_are_stable_snake_case_strings() -> None:
    assert [reason.value for reason in DecisionReason] == [
        "forced", "over_trigger", "under_trigger", "anti_thrash", "thrash_lifted",
    ]


@pytest.mark.parametrize(
    "overrides",
    [{"floor_tokens": 0}, {"floor_tokens": 2_000}, {"tail_budget_tokens": -1},
     {"min_tail_user_turns": -1}],
)
def test_an_inconsistent_policy_is_refused(overrides: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        policy(**overrides)


POLICY_WORDS = ("the", "agent", "must", "never", "refund", "verify", "user", "id", "policy.")


@st.composite
def system_twins(draw: st.DrawFn) -> tuple[list[Group], TriggerPolicy, int]:
    """A chat session's groups opening with a system message of its own, and its policy
    and prior summary's size."""
    words = draw(st.lists(st.sampled_from(POLICY_WORDS), min_size=1, max_size=600))
    system = {"role": "system", "content": " ".join(words)}
    stored = to_stored([system, *draw(session_messages(max_turns=8))], shared_counter())
    groups = group_messages(stored)
    assume(groups[0].messages == (stored[0],))  # the system message is a group alone
    summary_tokens = draw(st.integers(0, 500))
    # Thresholds within the session's own size, where the system prompt moves the cut.
    total = summary_tokens + sum(group.tokens for group in groups)
    trigger = draw(st.integers(1, 2 * total))
    rule = TriggerPolicy(trigger_tokens=trigger, floor_tokens=draw(st.integers(1, trigger)),
                         tail_budget_tokens=draw(st.integers(0, total)),
                         min_tail_user_turns=draw(st.integers(0, 2)))
    return groups, rule, summary_tokens


@PROPERTY
@given(system_twins())
def test_a_system_prompt_outside_the_messages_cuts_where_the_same_system_message_would(
    case: tuple[list[Group], TriggerPolicy, int],
) -> None:
    groups, rule, summary_tokens = case
    system_group, rest = groups[0], groups[1:]

    as_message = plan_boundary(groups, prior_through_seq=0, summary_tokens=summary_tokens,
                               policy=rule)
    outside = plan_boundary(rest, prior_through_seq=0, summary_tokens=summary_tokens,
                            policy=rule, system_tokens=system_group.tokens)

    if as_message is None:
        assert outside is None
        return
    assert outside is not None
    event("compacted")
    assert (outside.through_seq, outside.span, outside.tail) == (
        as_message.through_seq, as_message.span, as_message.tail)
    assert outside.instructions == as_message.instructions[1:]
    assert outside.instruction_tokens == as_message.instruction_tokens
    assert (outside.projected_tokens(summary_tokens)
            == as_message.projected_tokens(summary_tokens))
