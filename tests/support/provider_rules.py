"""What the providers' APIs refuse in a request's input, as plain checks: the property
tests hold every projection to them, and the test server answers 400 with their words.

Some rules need what the provider itself produced (which reasoning item preceded which
call, the encrypted content and signatures it issued): ``original`` is that record,
the session as stored; a projection may drop its items, never change or separate them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CALLS = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output",
         "computer_call": "computer_call_output", "local_shell_call": "local_shell_call_output",
         "shell_call": "shell_call_output", "apply_patch_call": "apply_patch_call_output",
         "tool_search_call": "tool_search_output", "program": "program_output"}
OUTPUTS = {output: call for call, output in CALLS.items()}


def _key(item: dict[str, Any]) -> str:
    return str(item.get("call_id") or item.get("id") or id(item))


def responses_rejections(items: Sequence[dict[str, Any]],
                         original: Sequence[dict[str, Any]]) -> list[str]:
    """The errors the Responses API answers for ``items`` as input (none: accepted)."""
    errors: list[str] = []
    follows: dict[str, str] = {}  # reasoning id -> the key of the item it preceded
    reasoning_of: dict[str, str] = {}  # an item of a reply -> the reasoning it began with
    issued = {item["id"]: item.get("encrypted_content") for item in original
              if item.get("type") == "reasoning"}
    reply: str | None = None  # the reasoning id the current reply began with
    for before, item in zip([None, *original], original, strict=False):
        kind = item.get("type", "message")
        if before is not None and before.get("type") == "reasoning":
            follows[before["id"]] = _key(item)
        if kind == "reasoning":
            reply = item["id"]
        elif kind in OUTPUTS or item.get("role") not in (None, "assistant"):
            reply = None
        elif reply is not None:
            reasoning_of[_key(item)] = reply
    calls: dict[str, str] = {}
    answered: set[str] = set()
    seen: set[str] = set()  # reasoning ids sent so far
    for position, item in enumerate(items):
        kind = item.get("type", "message")
        needed = reasoning_of.get(_key(item))
        if needed is not None and needed not in seen:
            errors.append(f"Item {_key(item)!r} of type {kind!r} was provided without its "
                          "required 'reasoning' item.")
        if kind == "reasoning":
            if issued.get(item.get("id")) != item.get("encrypted_content"):
                errors.append(f"reasoning {item.get('id')!r}: encrypted content could not "
                              "be verified")
            after = items[position + 1] if position + 1 < len(items) else None
            if after is None or follows.get(item["id"]) != _key(after):
                errors.append(f"Item {item['id']!r} of type 'reasoning' was provided "
                              "without its required following item.")
            seen.add(item["id"])
        elif kind in CALLS:
            calls[item["call_id"]] = kind
        elif kind in OUTPUTS:
            # A local shell call's output names its call by ``id``.
            call_id = str(item.get("call_id", item.get("id")))
            if calls.get(call_id) != OUTPUTS[kind]:
                errors.append(f"No tool call found for {kind} with call_id {call_id!r}.")
            answered.add(call_id)
    errors += [f"No tool output found for {kind} {call_id!r}." for call_id, kind
               in calls.items() if call_id not in answered]
    return errors


def anthropic_rejections(messages: Sequence[dict[str, Any]],
                         original: Sequence[dict[str, Any]]) -> list[str]:
    """The errors the Messages API answers for ``messages`` (none: accepted)."""
    errors: list[str] = []
    signed = {(block["thinking"], block["signature"]) for message in original
              for block in _blocks(message) if block.get("type") == "thinking"}
    redacted = {block["data"] for message in original for block in _blocks(message)
                if block.get("type") == "redacted_thinking"}
    if messages and messages[0].get("role") != "user":
        errors.append("messages: the first message must use the user role")
    waiting: set[str] = set()
    for index, message in enumerate(messages):
        blocks = _blocks(message)
        kinds = [block.get("type") for block in blocks]
        results = {b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"}
        if waiting - results:
            errors.append(f"messages.{index}: tool_use ids were found without tool_result "
                          f"blocks immediately after: {sorted(waiting - results)}")
        if results - waiting:
            errors.append(f"messages.{index}: unexpected tool_use_id found in tool_result "
                          f"blocks: {sorted(results - waiting)}")
        if "tool_result" in kinds and kinds[:len(results)] != ["tool_result"] * len(results):
            errors.append(f"messages.{index}: tool_result blocks must come first")
        for block in blocks:
            if block.get("type") == "thinking" and \
                    (block.get("thinking"), block.get("signature")) not in signed:
                errors.append(f"messages.{index}: Invalid signature in thinking block")
            if block.get("type") == "redacted_thinking" and block.get("data") not in redacted:
                errors.append(f"messages.{index}: Invalid redacted_thinking block")
        waiting = ({b["id"] for b in blocks if b.get("type") == "tool_use"}
                   if message.get("role") == "assistant" else set())
    if waiting:
        errors.append(f"messages: tool_use ids were found without tool_result blocks "
                      f"immediately after: {sorted(waiting)}")
    return errors


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return [block for block in content if isinstance(block, dict)] \
        if isinstance(content, list) else []
