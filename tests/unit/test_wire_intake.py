"""Intake of Responses items and Anthropic messages: generated sessions pass untouched and
their views keep opaque parts out of every chat message; each way a session breaks a
provider's rules, or mixes formats, is refused naming the field."""

from __future__ import annotations

import copy
import json
import typing
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cli.demo_sessions import generate_sessions
from tests.support.provider_rules import anthropic_rejections, responses_rejections
from tests.support.wire_convert import chat_to_anthropic, chat_to_responses
from tests.support.wire_sessions import anthropic_messages, responses_items
from worker.compaction import (
    Action,
    IntakePolicy,
    ProblemKind,
    check_anthropic_messages,
    check_responses_items,
    find_foreign_chat_fields,
)
from worker.compaction.formats import RESPONSES_CALLS, RESPONSES_OUTPUTS, RESPONSES_TYPES

POLICY = IntakePolicy.lenient()  # nothing of these formats is repaired, even so
Items = list[dict[str, Any]]


def opaque_parts(items: Items) -> list[str]:
    keys = ("encrypted_content", "signature", "data")
    found: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, dict):
            found.extend(v for k, v in value.items() if k in keys and isinstance(v, str))
            for inner in value.values():
                walk(inner)
        elif isinstance(value, list):
            for inner in value:
                walk(inner)

    walk(items)
    return found


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), turns=st.integers(1, 6))
def test_generated_sessions_pass_untouched_and_no_opaque_part_reaches_a_chat_message(
    seed: int, turns: int,
) -> None:
    for items, check in ((responses_items(seed, turns), check_responses_items),
                         (anthropic_messages(seed, turns), check_anthropic_messages)):
        given_items = copy.deepcopy(items)
        checked = check(items, POLICY)
        assert (checked.problems, checked.rejected) == ((), False)
        assert list(checked.items) == given_items
        chat = json.dumps([m.model_dump() for v in checked.views for m in v.chat_messages()])
        assert not any(secret in chat for secret in opaque_parts(items))


def test_the_generators_give_reasoning_and_thinking_with_opaque_parts() -> None:
    assert len(opaque_parts(responses_items(1, 4))) >= 2
    assert len(opaque_parts(anthropic_messages(1, 4))) >= 2


def responses_case(change: Callable[[Items], object]) -> Items:
    items = responses_items(7, 2)
    change(items)
    return items


def first(items: Items, kind: str) -> int:
    return next(i for i, item in enumerate(items) if item.get("type") == kind)


def drop_call(items: Items) -> None:
    del items[first(items, "function_call")]


def output_first(items: Items) -> None:
    items.insert(first(items, "function_call"), items.pop(first(items, "function_call_output")))


def chat_tool(items: Items) -> None:
    items[1] = {"role": "tool", "tool_call_id": "c", "content": "ok"}


def anthropic_block(items: Items) -> None:
    items[1]["content"] = [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]


def reused_id(items: Items) -> None:
    calls = [i for i, item in enumerate(items) if item.get("type") == "function_call"]
    items[calls[-1]]["call_id"] = items[calls[0]]["call_id"]


@pytest.mark.parametrize(("change", "kind", "field"), [
    (drop_call, ProblemKind.ORPHAN_TOOL_RESULT, ".call_id"),
    (output_first, ProblemKind.ORPHAN_TOOL_RESULT, ".call_id"),
    (chat_tool, ProblemKind.FORMAT_MISMATCH, "items[1] is a chat message"),
    (anthropic_block, ProblemKind.FORMAT_MISMATCH, "items[1].content[0].type 'tool_use'"),
    (reused_id, ProblemKind.DUPLICATE_TOOL_CALL_ID, ".call_id"),
    (lambda items: items.append({"type": "shell_magic"}), ProblemKind.MALFORMED_MESSAGE,
     "type 'shell_magic'"),
])
def test_a_broken_responses_session_is_rejected_naming_the_field(
    change: Callable[[Items], object], kind: ProblemKind, field: str,
) -> None:
    checked = check_responses_items(responses_case(change), POLICY)

    assert checked.rejected and checked.items == ()
    assert kind in {p.kind for p in checked.problems}
    assert any(field in p.detail for p in checked.problems if p.kind is kind)
    assert all(p.action is Action.REJECT for p in checked.problems)


def test_a_call_left_waiting_is_allowed_only_at_the_end() -> None:
    items = responses_items(8, 1)
    end = first(items, "function_call_output")

    assert not check_responses_items(items[:end], POLICY).rejected
    stalled = [*items[:end], {"type": "message", "role": "user", "content": "hello?"}]
    checked = check_responses_items(stalled, POLICY)
    assert [p.kind for p in checked.problems] == [ProblemKind.MISSING_TOOL_RESULT]


def anthropic_case(change: Callable[[Items], object]) -> Items:
    messages = anthropic_messages(9, 2)
    change(messages)
    return messages


@pytest.mark.parametrize(("change", "kind", "field"), [
    (lambda m: m.pop(2), ProblemKind.MISSING_TOOL_RESULT, "messages[2] does not answer"),
    (lambda m: m.pop(1), ProblemKind.ORPHAN_TOOL_RESULT, "messages[1]: tool_result"),
    (lambda m: m.insert(0, {"role": "system", "content": "x"}), ProblemKind.FORMAT_MISMATCH,
     "messages[0].role 'system'"),
    (lambda m: m[1]["content"].append({"type": "input_text", "text": "x"}),
     ProblemKind.FORMAT_MISMATCH, "type 'input_text' is not an Anthropic content block"),
    (lambda m: m[0].update(content=[{"type": "thinking", "thinking": "t", "signature": "s"}]),
     ProblemKind.MALFORMED_MESSAGE, "a thinking block in a user message"),
])
def test_a_broken_anthropic_session_is_rejected_naming_the_field(
    change: Callable[[Items], object], kind: ProblemKind, field: str,
) -> None:
    checked = check_anthropic_messages(anthropic_case(change), POLICY)

    assert checked.rejected
    assert any(p.kind is kind and field in p.detail for p in checked.problems), checked.problems


def test_chat_messages_holding_another_formats_parts_are_named() -> None:
    anthropic = anthropic_messages(4, 1)
    responses = responses_items(4, 1)

    blocks = find_foreign_chat_fields(anthropic)
    items = find_foreign_chat_fields(responses)

    assert blocks is not None and blocks.detail.startswith("messages[1].content[0].type")
    assert items is not None and "is a Responses item" in items.detail
    assert find_foreign_chat_fields([{"role": "user", "content": [
        {"type": "text", "text": "hi"}]}]) is None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_demo_sessions_rewritten_in_each_format_pass_intake_and_the_provider_rules(
    seed: int,
) -> None:
    for record in generate_sessions(4, seed):
        items = chat_to_responses(record["messages"], seed=seed)
        system, messages = chat_to_anthropic(record["messages"], seed=seed)

        assert check_responses_items(items, POLICY).problems == ()
        assert check_anthropic_messages(messages, POLICY).problems == ()
        assert responses_rejections(items, items) == []
        assert anthropic_rejections(messages, messages) == []
        assert system and len(items) >= len(record["messages"]) > len(messages)


def sdk_input_item_types() -> dict[str, frozenset[str]]:
    """Every input item type the installed OpenAI SDK defines, with its fields."""
    from openai.types.responses.response_input_item_param import ResponseInputItemParam

    found: dict[str, frozenset[str]] = {}
    for shape in typing.get_args(ResponseInputItemParam):
        hints = typing.get_type_hints(shape)
        literal = hints.get("type")
        kinds = [kind for arg in typing.get_args(literal) for kind in typing.get_args(arg)
                 or (arg,) if isinstance(kind, str)] if literal is not None else []
        for kind in kinds or ["message"]:
            found[kind] = found.get(kind, frozenset()) | frozenset(hints)
    return found


def test_every_item_type_the_sdk_defines_is_stored_and_every_call_id_pairs() -> None:
    """Nothing the SDK can send is refused for its type, and an item that carries a call
    id is a call or an output the groups pair (read from the SDK, not from a list)."""
    sdk_types = sdk_input_item_types()

    assert len(sdk_types) > 20
    assert set(sdk_types) <= RESPONSES_TYPES, set(sdk_types) - RESPONSES_TYPES
    paired = {kind for kind, fields in sdk_types.items() if "call_id" in fields}
    assert paired <= set(RESPONSES_CALLS) | set(RESPONSES_OUTPUTS), paired
    for call, output in RESPONSES_CALLS.items():
        assert {call, output} <= set(sdk_types), (call, output)
