"""Grouping: atomic units that re-concatenate to the session, whatever its shape."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings

from tests.support.chat_rules import find_chat_violations
from tests.unit.session_strategies import sessions, shared_counter, to_stored
from worker.compaction.grouping import Group, GroupKind, group_messages
from worker.compaction.messages import Role, StoredMessage, parse_message

PROPERTY = settings(max_examples=60, deadline=None)


def call(call_id: str, name: str = "lookup") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def stored(*messages: dict[str, Any]) -> list[StoredMessage]:
    return to_stored(messages, shared_counter())


def shape(groups: list[Group]) -> list[tuple[str, int, bool]]:
    return [(group.kind.value, len(group.messages), group.pending) for group in groups]


SYSTEM = {"role": "system", "content": "be brief"}
USER = {"role": "user", "content": "hi"}
ANSWER = {"role": "assistant", "content": "hello"}


@PROPERTY
@given(sessions())
def test_groups_re_concatenate_to_the_session(session: list[StoredMessage]) -> None:
    groups = group_messages(session)
    assert [m for group in groups for m in group.messages] == session
    assert all(group.messages for group in groups)


@PROPERTY
@given(sessions())
def test_every_settled_exchange_holds_its_call_and_all_its_results(
    session: list[StoredMessage],
) -> None:
    for group in group_messages(session):
        if group.kind is GroupKind.TOOL_EXCHANGE:
            assert group.messages[0].message.role is Role.ASSISTANT
            assert all(m.message.role is Role.TOOL for m in group.messages[1:])
            assert (group.unanswered_call_ids == ()) is (not group.pending)
        else:
            assert len(group.messages) == 1


@PROPERTY
@given(sessions())
def test_only_the_last_group_can_be_pending(session: list[StoredMessage]) -> None:
    groups = group_messages(session)
    assert not any(group.pending for group in groups[:-1])


@PROPERTY
@given(sessions())
def test_generated_sessions_are_valid_for_the_chat_api(session: list[StoredMessage]) -> None:
    messages = [m.message for m in session]
    assert find_chat_violations(messages) == []


def test_parallel_results_in_any_order_join_their_call() -> None:
    session = stored(
        USER,
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b"), call("c")]},
        {"role": "tool", "tool_call_id": "c", "content": "3"},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
        ANSWER,
    )
    assert shape(group_messages(session)) == [
        ("user", 1, False), ("tool_exchange", 4, False), ("assistant", 1, False),
    ]


@pytest.mark.parametrize(
    ("results", "expected_pending"),
    [([], True), (["a"], True), (["a", "b"], False)],
)
def test_a_trailing_call_missing_results_is_pending(
    results: list[str], expected_pending: bool
) -> None:
    session = stored(
        USER,
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]},
        *({"role": "tool", "tool_call_id": cid, "content": "x"} for cid in results),
    )
    last = group_messages(session)[-1]
    assert (last.kind, last.pending) == (GroupKind.TOOL_EXCHANGE, expected_pending)


def test_a_call_missing_results_mid_session_is_closed_but_not_pending() -> None:
    session = stored(
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]},
        {"role": "tool", "tool_call_id": "a", "content": "x"},
        USER,
    )
    groups = group_messages(session)
    assert shape(groups) == [("tool_exchange", 2, False), ("user", 1, False)]
    assert groups[0].unanswered_call_ids == ("b",)


@pytest.mark.parametrize(
    "messages",
    [
        pytest.param([USER, {"role": "tool", "tool_call_id": "ghost", "content": "x"}],
                     id="orphan-after-user"),
        pytest.param([{"role": "tool", "tool_call_id": "ghost", "content": "x"}],
                     id="orphan-first"),
    ],
)
def test_an_orphan_tool_result_gets_its_own_settled_group(messages: list[dict[str, Any]]) -> None:
    groups = group_messages(stored(*messages))
    assert shape(groups)[-1] == ("tool_exchange", 1, False)


def test_a_duplicate_result_is_an_orphan_and_closes_the_exchange() -> None:
    session = stored(
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]},
        {"role": "tool", "tool_call_id": "a", "content": "x"},
        {"role": "tool", "tool_call_id": "a", "content": "again"},
        {"role": "tool", "tool_call_id": "b", "content": "late"},
    )
    assert shape(group_messages(session)) == [
        ("tool_exchange", 2, False), ("tool_exchange", 1, False), ("tool_exchange", 1, False),
    ]


def test_system_and_developer_messages_are_instruction_groups() -> None:
    session = stored(SYSTEM, USER, {"role": "developer", "content": "use tools"}, ANSWER)
    kinds = [group.kind for group in group_messages(session)]
    assert kinds == [GroupKind.SYSTEM, GroupKind.USER, GroupKind.SYSTEM, GroupKind.ASSISTANT]
    assert [group.is_instruction for group in group_messages(session)] == [
        True, False, True, False,
    ]


def test_reasoning_fields_ride_along_on_their_assistant_message() -> None:
    thinking = {"role": "assistant", "content": None, "tool_calls": [call("a")],
                "reasoning_content": "check the user first"}
    session = stored(USER, thinking, {"role": "tool", "tool_call_id": "a", "content": "x"})
    exchange = group_messages(session)[1]
    assert exchange.messages[0].message.model_extra == {
        "reasoning_content": "check the user first"
    }


def test_an_assistant_with_an_empty_call_list_is_plain_text() -> None:
    session = stored({"role": "assistant", "content": "done", "tool_calls": []})
    assert shape(group_messages(session)) == [("assistant", 1, False)]


def test_an_empty_session_has_no_groups() -> None:
    assert group_messages([]) == []


def test_group_figures_come_from_its_messages() -> None:
    session = stored(
        {"role": "assistant", "content": None, "tool_calls": [call("a")]},
        {"role": "tool", "tool_call_id": "a", "content": "result"},
    )
    group = group_messages(session)[0]
    assert (group.first_seq, group.last_seq) == (1, 2)
    assert group.tokens == session[0].tokens + session[1].tokens


@pytest.mark.parametrize(
    ("messages", "allow_pending", "problems"),
    [
        ([USER, ANSWER], True, 0),
        ([{"role": "tool", "tool_call_id": "x", "content": "?"}], True, 1),
        ([{"role": "assistant", "tool_calls": [call("a")]}, USER], True, 1),
        ([{"role": "assistant", "tool_calls": [call("a")]}], True, 0),
        ([{"role": "assistant", "tool_calls": [call("a")]}], False, 1),
        ([{"role": "assistant", "tool_calls": [call("a")]},
          {"role": "tool", "tool_call_id": "a", "content": "1"},
          {"role": "tool", "tool_call_id": "a", "content": "2"}], True, 1),
    ],
)
def test_chat_violations_name_each_broken_pairing(
    messages: list[dict[str, Any]], allow_pending: bool, problems: int
) -> None:
    parsed = [parse_message(m) for m in messages]
    assert len(find_chat_violations(parsed, allow_pending_tail=allow_pending)) == problems
