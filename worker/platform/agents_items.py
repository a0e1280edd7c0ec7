"""Exact conversion between the OpenAI Agents SDK's session items (Responses-API input
items) and the chat-completions messages the store keeps; plain dicts both ways.

Covered: user, system and developer messages (text, or ``input_text`` parts), assistant
text, ``function_call`` and ``function_call_output``. Anything else (images, files,
reasoning, hosted tool calls, refusals, unknown keys) raises :class:`UnsupportedItem`:
it is refused, never dropped. Dropped on the way in are only the Responses API's own
bookkeeping (an item's ``id``, ``status``, ``provider_data`` naming only the model and
response, a ``None`` ``phase``, empty ``annotations`` and ``logprobs``), which carry no
content.

Messages → items → messages gives the messages back. Items → messages → items gives
back the items without that bookkeeping, with two normalizations: an assistant message
of one ``output_text`` part reads back as its text, and function calls that follow
assistant text (one model reply) read back as one assistant message with ``tool_calls``,
so an assistant text message directly followed by an assistant message of tool calls
alone is stored, and read back, as one message.
"""

from __future__ import annotations

from typing import Any

INSTRUCTION_OR_USER = ("user", "system", "developer")
_BOOKKEEPING = ("id", "status", "provider_data")
# What the SDK records of the reply an item came from; other provider data (a model's
# thought signatures, say) is content a later call needs, so it is refused, not dropped.
_PROVIDER_BOOKKEEPING = frozenset({"model", "response_id"})


class UnsupportedItem(ValueError):
    """Raised when an item or a message has no exact counterpart on the other side."""


def items_to_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Convert session items to chat messages; function calls join the assistant message
    just before them (one model reply)."""
    messages: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message_item_to_message(item))
        elif kind == "function_call":
            _add_tool_call(messages, _function_call_to_tool_call(item))
        elif kind == "function_call_output":
            messages.append(_output_to_tool_message(item))
        else:
            raise UnsupportedItem(f"items of type {kind!r} have no chat-completions form")
    return messages


def messages_to_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Convert chat messages to session items (an assistant message with tool calls
    becomes its text, if any, then one ``function_call`` item per call)."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role in INSTRUCTION_OR_USER:
            items.append(_input_message_to_item(message))
        elif role == "assistant":
            items.extend(_assistant_to_items(message))
        elif role == "tool":
            items.append(_tool_message_to_output(message))
        else:
            raise UnsupportedItem(f"messages of role {role!r} have no session-item form")
    return items


def _message_item_to_message(item: dict[str, Any]) -> dict[str, Any]:
    _require_keys(item, {"role", "content", "type", "phase", *_BOOKKEEPING}, "message")
    if item.get("phase") is not None:
        raise UnsupportedItem(f"message phase {item['phase']!r} has no chat-completions form")
    role, content = item.get("role"), item.get("content")
    if role in INSTRUCTION_OR_USER:
        return {"role": role, "content": _input_content_to_chat(content)}
    if role == "assistant":
        return {"role": "assistant", "content": _output_content_to_chat(content)}
    raise UnsupportedItem(f"message role {role!r} has no chat-completions form")


def _input_content_to_chat(content: Any) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return [{"type": "text", "text": _part_text(part, "input_text")}
            for part in _parts(content)]


def _output_content_to_chat(content: Any) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    texts = [_part_text(part, "output_text") for part in _parts(content)]
    if len(texts) == 1:
        return texts[0]
    return [{"type": "text", "text": text} for text in texts]


def _part_text(part: Any, kind: str) -> str:
    if not isinstance(part, dict) or part.get("type") != kind:
        found = part.get("type") if isinstance(part, dict) else type(part).__name__
        raise UnsupportedItem(f"content part {found!r} has no chat-completions form")
    _require_keys(part, {"type", "text", "annotations", "logprobs"}, f"{kind} part")
    if part.get("annotations") or part.get("logprobs"):
        raise UnsupportedItem(f"{kind} annotations and logprobs have no chat-completions form")
    text = part.get("text")
    if not isinstance(text, str):
        raise UnsupportedItem(f"{kind} part without text")
    return text


def _parts(content: Any) -> list[Any]:
    if not isinstance(content, list) or not content:
        raise UnsupportedItem("message content must be a string or a non-empty part list")
    return content


def _function_call_to_tool_call(item: dict[str, Any]) -> dict[str, Any]:
    _require_keys(item, {"type", "call_id", "name", "arguments", *_BOOKKEEPING},
                  "function_call")
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not all(isinstance(value, str) for value in (call_id, name, arguments)):
        raise UnsupportedItem("function_call needs string call_id, name and arguments")
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _add_tool_call(messages: list[dict[str, Any]], call: dict[str, Any]) -> None:
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _output_to_tool_message(item: dict[str, Any]) -> dict[str, Any]:
    _require_keys(item, {"type", "call_id", "output", *_BOOKKEEPING}, "function_call_output")
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str) or not isinstance(output, str):
        raise UnsupportedItem("function_call_output needs a string call_id and output "
                              "(structured outputs have no chat-completions form)")
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def _input_message_to_item(message: dict[str, Any]) -> dict[str, Any]:
    _require_keys(message, {"role", "content"}, f"{message['role']} message")
    content = message.get("content")
    if isinstance(content, str):
        return {"role": message["role"], "content": content}
    parts = [{"type": "input_text", "text": _chat_part_text(part)} for part in _parts(content)]
    return {"role": message["role"], "content": parts}


def _assistant_to_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    _require_keys(message, {"role", "content", "tool_calls"}, "assistant message")
    content, calls = message.get("content"), message.get("tool_calls")
    items: list[dict[str, Any]] = []
    if isinstance(content, str):
        items.append({"role": "assistant", "content": content})
    elif content is not None:
        parts = [{"type": "output_text", "text": _chat_part_text(part), "annotations": []}
                 for part in _parts(content)]
        items.append({"role": "assistant", "content": parts})
    if calls is None and not items:
        raise UnsupportedItem("an assistant message without content or tool calls")
    if calls is not None and (not isinstance(calls, list) or not calls):
        raise UnsupportedItem("assistant tool_calls must be a non-empty list")
    items.extend(_tool_call_to_function_call(call) for call in calls or ())
    return items


def _tool_call_to_function_call(call: Any) -> dict[str, Any]:
    if not isinstance(call, dict) or call.get("type", "function") != "function":
        raise UnsupportedItem("only function tool calls have a session-item form")
    _require_keys(call, {"id", "type", "function"}, "tool call")
    function = call.get("function")
    if not isinstance(function, dict):
        raise UnsupportedItem("a tool call without its function")
    _require_keys(function, {"name", "arguments"}, "tool call function")
    return {"type": "function_call", "call_id": call["id"], "name": function["name"],
            "arguments": function["arguments"]}


def _tool_message_to_output(message: dict[str, Any]) -> dict[str, Any]:
    _require_keys(message, {"role", "tool_call_id", "content"}, "tool message")
    content = message.get("content")
    if not isinstance(content, str):
        raise UnsupportedItem("a tool result with content parts has no session-item form")
    return {"type": "function_call_output", "call_id": message["tool_call_id"],
            "output": content}


def _chat_part_text(part: Any) -> str:
    if not isinstance(part, dict) or part.get("type") != "text" or set(part) != {"type", "text"}:
        raise UnsupportedItem("only text content parts have a session-item form")
    return str(part["text"])


def _require_keys(value: dict[str, Any], allowed: set[str], what: str) -> None:
    unknown = sorted(set(value) - allowed)
    provider_data = value.get("provider_data") if "provider_data" in allowed else None
    if provider_data and not set(provider_data) <= _PROVIDER_BOOKKEEPING:
        unknown.append("provider_data")
    if unknown:
        raise UnsupportedItem(f"{what} field(s) {unknown} have no exact counterpart")
