"""The exact conversion between Agents SDK session items and stored chat messages: both
round trips, the documented normalizations, and a typed refusal for what has no
counterpart (never a silent drop)."""

from __future__ import annotations

from typing import Any

import pytest

from worker.platform.agents_items import UnsupportedItem, items_to_messages, messages_to_items


def call(call_id: str, name: str = "look_up", arguments: str = '{"id": "R1"}') -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are an airline agent."},
    {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": "Check R1 and R2."},
    {"role": "assistant", "content": "Looking both up.", "tool_calls": [call("c1"), call("c2")]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"status": "ok"}'},
    {"role": "tool", "tool_call_id": "c2", "content": "not found"},
    {"role": "assistant", "content": None, "tool_calls": [call("c3", "cancel", "{}")]},
    {"role": "tool", "tool_call_id": "c3", "content": "cancelled"},
    {"role": "assistant", "content": "R1 is fine; R2 does not exist."},
    {"role": "assistant", "content": [{"type": "text", "text": "One."},
                                      {"type": "text", "text": "Two."}]},
    {"role": "user", "content": [{"type": "text", "text": "Thanks"},
                                 {"type": "text", "text": "bye"}]},
]

# What the SDK hands to add_items for one turn through a chat-completions model.
SDK_TURN: list[dict[str, Any]] = [
    {"content": "Check R1", "role": "user"},
    {"id": "__fake_id__", "type": "message", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "On it.", "annotations": [],
                  "logprobs": []}]},
    {"arguments": '{"id": "R1"}', "call_id": "c9", "name": "look_up", "type": "function_call",
     "id": "__fake_id__", "provider_data": {"model": "m", "response_id": "chatcmpl-1"}},
    {"call_id": "c9", "output": "ok", "type": "function_call_output"},
]


def test_messages_read_back_exactly_after_a_trip_through_items() -> None:
    assert items_to_messages(messages_to_items(CHAT)) == CHAT


def test_an_assistant_message_with_tool_calls_becomes_its_text_then_one_call_each() -> None:
    items = messages_to_items(CHAT[3:6])
    assert items == [
        {"role": "assistant", "content": "Looking both up."},
        {"type": "function_call", "call_id": "c1", "name": "look_up",
         "arguments": '{"id": "R1"}'},
        {"type": "function_call", "call_id": "c2", "name": "look_up",
         "arguments": '{"id": "R1"}'},
        {"type": "function_call_output", "call_id": "c1", "output": '{"status": "ok"}'},
        {"type": "function_call_output", "call_id": "c2", "output": "not found"},
    ]


def test_sdk_items_are_stored_as_one_model_reply_with_its_tool_results() -> None:
    assert items_to_messages(SDK_TURN) == [
        {"role": "user", "content": "Check R1"},
        {"role": "assistant", "content": "On it.", "tool_calls": [call("c9")]},
        {"role": "tool", "tool_call_id": "c9", "content": "ok"},
    ]


def test_items_read_back_without_bookkeeping_and_then_stay_fixed() -> None:
    normalized = messages_to_items(items_to_messages(SDK_TURN))
    assert normalized == [
        {"role": "user", "content": "Check R1"},
        {"role": "assistant", "content": "On it."},
        {"type": "function_call", "call_id": "c9", "name": "look_up",
         "arguments": '{"id": "R1"}'},
        {"type": "function_call_output", "call_id": "c9", "output": "ok"},
    ]
    assert messages_to_items(items_to_messages(normalized)) == normalized


def test_a_call_with_no_text_before_it_is_an_assistant_message_without_content() -> None:
    [message] = items_to_messages(SDK_TURN[2:3])
    assert message == {"role": "assistant", "content": None, "tool_calls": [call("c9")]}


@pytest.mark.parametrize("item", [
    {"type": "reasoning", "id": "rs_1", "summary": []},
    {"type": "web_search_call", "id": "ws_1", "status": "completed"},
    {"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]},
    {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
    {"role": "assistant", "content": [{"type": "output_text", "text": "see [1]",
                                       "annotations": [{"type": "url_citation"}]}]},
    {"role": "user", "content": "hi", "phase": "commentary"},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}",
     "provider_data": {"model": "m", "thought_signature": "abc"}},
    {"type": "function_call_output", "call_id": "c1",
     "output": [{"type": "input_text", "text": "structured"}]},
    {"role": "user", "content": "hi", "name": "ann"},
])
def test_an_item_without_an_exact_chat_form_is_refused(item: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedItem):
        items_to_messages([item])


@pytest.mark.parametrize("message", [
    {"role": "user", "content": "hi", "name": "ann"},
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
    {"role": "assistant", "content": None},
    {"role": "assistant", "content": "x", "refusal": None},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "custom", "custom": {"name": "f", "input": "x"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "x"}]},
    {"role": "function", "name": "f", "content": "legacy"},
])
def test_a_stored_message_without_an_exact_item_form_is_refused(
    message: dict[str, Any],
) -> None:
    with pytest.raises(UnsupportedItem):
        messages_to_items([message])
