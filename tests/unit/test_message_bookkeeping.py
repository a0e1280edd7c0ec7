"""Parsed messages share pydantic's per-instance bookkeeping (the set of given fields,
empty extras) and still behave as models of their own: equal, dumped, copied and frozen
exactly as before."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from tests.unit.session_strategies import shared_counter
from worker.compaction.grouping import group_messages
from worker.compaction.messages import (
    ChatMessage,
    StoredMessage,
    dump_message,
    parse_message_json,
)
from worker.compaction.pruning import DIGEST_MARKER, prune_groups

CALL: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "grep", "arguments": "{}"}}]}
RESULT: dict[str, Any] = {"role": "tool", "tool_call_id": "call_1", "content": "a\nb"}


def parsed(body: dict[str, Any]) -> ChatMessage:
    return parse_message_json(json.dumps(body))


def test_messages_of_the_same_shape_share_one_fields_set_and_one_empty_extras() -> None:
    first, second = parsed(CALL), parsed({**CALL, "content": "checking"})
    assert first.__pydantic_fields_set__ is second.__pydantic_fields_set__
    assert first.__pydantic_extra__ is second.__pydantic_extra__ == {}
    [call_a], [call_b] = first.tool_calls or [], second.tool_calls or []
    assert call_a.function.__pydantic_fields_set__ is call_b.function.__pydantic_fields_set__
    assert parsed(RESULT).__pydantic_fields_set__ == {"role", "tool_call_id", "content"}


def test_a_copy_with_updates_leaves_every_other_message_as_it_was() -> None:
    first, second = parsed(RESULT), parsed(RESULT)
    pruned = first.model_copy(update={"content": "digest", "reasoning": "extra"})

    assert dump_message(pruned) == {**RESULT, "content": "digest", "reasoning": "extra"}
    assert dump_message(first) == dump_message(second) == RESULT
    assert first.__pydantic_extra__ == second.__pydantic_extra__ == {}
    assert first.__pydantic_fields_set__ == {"role", "tool_call_id", "content"}


def test_a_pruned_copy_shares_the_bookkeeping_of_the_messages_it_was_copied_from() -> None:
    original = parsed({**RESULT, "content": "x" * 500})
    [group] = prune_groups(group_messages([StoredMessage(1, parsed(CALL), 10),
                                           StoredMessage(2, original, 900)]),
                           audit_mode=False, counter=shared_counter())

    pruned = group.messages[1].message
    assert pruned.text.startswith(DIGEST_MARKER)
    assert pruned.__pydantic_fields_set__ is original.__pydantic_fields_set__
    assert pruned.__pydantic_extra__ is original.__pydantic_extra__
    assert original.text == "x" * 500


def test_shared_messages_round_trip_and_compare_as_unshared_ones_do() -> None:
    with_extras: dict[str, Any] = {**RESULT, "reasoning_content": "why"}
    for body in (CALL, RESULT, with_extras):
        message = parsed(body)
        assert dump_message(message) == body
        assert message == ChatMessage.model_validate(body)
    assert parsed(with_extras).__pydantic_extra__ == {"reasoning_content": "why"}
    assert parsed(RESULT).__pydantic_extra__ == {}  # another's extras were not shared


def test_a_shared_message_is_still_frozen() -> None:
    message = parsed(RESULT)
    with pytest.raises(ValidationError):
        message.content = "changed"  # type: ignore[misc]  # what is tested is the refusal
    with pytest.raises(ValidationError):
        del message.content
    assert message.__pydantic_fields_set__ == {"role", "tool_call_id", "content"}
