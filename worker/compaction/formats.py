"""Session wire formats, and the neutral view the core reads every stored item through.

A session stores the items of one format verbatim: chat-completions messages, Responses
API input items, or Anthropic Messages API messages. Counting, identifiers, recall and
summarizing read an item's neutral view (role, text, calls, outputs, reasoning text,
opaque parts) as chat messages, so each is written once. Opaque parts (encrypted
reasoning, signatures, redacted thinking, generated images) are kept in the view only to
be counted: they never reach a chat message, so never the summarizer.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from worker.compaction.messages import (
    ChatMessage,
    FunctionCall,
    Role,
    ToolCall,
    build_model,
    content_text,
    shared_fields,
)

if TYPE_CHECKING:
    from worker.compaction.tokens import TokenCounter


class SessionFormat(StrEnum):
    """A session's wire format, fixed when it is created (``sessions.format``)."""

    CHAT = "chat"
    RESPONSES = "responses"
    ANTHROPIC = "anthropic"


# Every input item type of the Responses API (tests/unit/test_wire_intake.py holds this
# against the installed SDK's own list). Items that pair a call with a later output item,
# by ``call_id`` (a local shell output names its call by ``id``):
RESPONSES_CALLS = {"function_call": "function_call_output",
                   "custom_tool_call": "custom_tool_call_output",
                   "computer_call": "computer_call_output",
                   "local_shell_call": "local_shell_call_output",
                   "shell_call": "shell_call_output",
                   "apply_patch_call": "apply_patch_call_output",
                   "tool_search_call": "tool_search_output",
                   "program": "program_output"}
RESPONSES_OUTPUTS = {output: call for call, output in RESPONSES_CALLS.items()}
# Items that hold all they say: hosted tool calls (the provider ran them, each holds its
# own result) and the API's own bookkeeping (compaction, configuration, references).
RESPONSES_HOSTED = frozenset({
    "web_search_call", "file_search_call", "code_interpreter_call", "image_generation_call",
    "mcp_call", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response",
    "compaction", "compaction_trigger", "additional_tools", "configuration_update",
    "item_reference",
})
RESPONSES_TYPES = frozenset({"message", "reasoning", *RESPONSES_CALLS, *RESPONSES_OUTPUTS,
                             *RESPONSES_HOSTED})
ANTHROPIC_BLOCKS = frozenset({"text", "image", "document", "tool_use", "tool_result",
                              "thinking", "redacted_thinking", "server_tool_use",
                              "web_search_tool_result"})
# Block types only Anthropic's content has: a chat record holding one is not chat.
ANTHROPIC_ONLY_BLOCKS = frozenset({"tool_use", "tool_result", "thinking",
                                   "redacted_thinking", "server_tool_use",
                                   "web_search_tool_result"})
# A role by its value, looked up without the enum's call (intake checked the value); the
# roles views give, read once: on Python 3.11 reading an enum member off its class is a
# descriptor call, and a job makes a view per stored item.
_ROLES = {role.value: role for role in Role}
_ASSISTANT, _TOOL = Role.ASSISTANT, Role.TOOL
# Bookkeeping of a hosted call that says nothing about what it did.
_HOSTED_SKIPPED = frozenset({"id", "type", "status", "result"})
# Where a call item holds what it was called with, by its type.
_CALL_INPUTS = ("arguments", "input", "action", "operation")


# The views are named tuples: a job makes one per stored item, and a frozen dataclass's
# construction (a guarded setattr per field) would cost more than reading the item.
class CallView(NamedTuple):
    call_id: str
    name: str
    arguments: str


class OutputView(NamedTuple):
    call_id: str
    text: str


class ItemView(NamedTuple):
    """One stored item as the core reads it, whatever its format."""

    role: Role
    text: str = ""
    calls: tuple[CallView, ...] = ()
    kind: str = "message"  # a Responses item's type; "message" in the other formats
    outputs: tuple[OutputView, ...] = ()
    reasoning: str = ""  # a reasoning summary or thinking text: may be summarized
    opaque: tuple[str, ...] = ()  # never summarized, only counted

    def chat_messages(self) -> tuple[ChatMessage, ...]:
        """The view as chat messages, opaque parts left out: results one tool message
        each, the rest one message (reasoning text after the text)."""
        # Built without validation: every field comes from an item intake checked.
        results = tuple([_tool_result(output) for output in self.outputs])
        text = "\n".join(part for part in (self.text, self.reasoning) if part)
        calls = [_tool_call(call) for call in self.calls]
        if self.role is _TOOL or (results and not text and not calls):
            return results
        message = build_model(ChatMessage, {
            "role": _ASSISTANT if calls else self.role, "content": text or None,
            "name": None, "tool_calls": calls or None, "tool_call_id": None},
            _MESSAGE_FIELDS[bool(text), bool(calls)])
        # An Anthropic user message answers its calls first, then says more.
        return (*results, message) if results else (message,)


# The given fields of the chat messages views make, by whether they hold text and calls.
_MESSAGE_FIELDS = {(text, calls): shared_fields("role", *("content",) * text,
                                                 *("tool_calls",) * calls)
                   for text in (False, True) for calls in (False, True)}
_RESULT_FIELDS = shared_fields("role", "content", "tool_call_id")
_CALL_FIELDS = shared_fields("id", "type", "function")
_FUNCTION_FIELDS = shared_fields("name", "arguments")


def _tool_result(output: OutputView) -> ChatMessage:
    return build_model(ChatMessage, {"role": _TOOL, "content": output.text, "name": None,
                                     "tool_calls": None, "tool_call_id": output.call_id},
                       _RESULT_FIELDS)


def _tool_call(call: CallView) -> ToolCall:
    function = build_model(FunctionCall, {"name": call.name, "arguments": call.arguments},
                           _FUNCTION_FIELDS)
    return build_model(ToolCall, {"id": call.call_id, "type": "function", "function": function},
                       _CALL_FIELDS)


def count_view(view: ItemView, counter: TokenCounter) -> int:
    """An item's tokens: its chat messages' and its opaque parts' (which the provider
    sends back whole, so they take room in every request)."""
    return (sum(counter.count_message(message) for message in view.chat_messages())
            + sum(counter.count_text(part) for part in view.opaque))


def view_chat_message(message: ChatMessage) -> ItemView:
    """A chat message's view (its tool calls and result as calls and outputs)."""
    calls = tuple(CallView(c.id, c.function.name, c.function.arguments)
                  for c in message.tool_calls or ())
    if message.role is Role.TOOL:
        return ItemView(Role.TOOL, outputs=(OutputView(message.tool_call_id or "",
                                                       message.text),))
    return ItemView(message.role, message.text, calls)


def view_responses_item(item: dict[str, Any]) -> ItemView:
    """A Responses input item's view (the item has passed intake's shape check)."""
    kind = item.get("type", "message")
    if kind == "message":
        return ItemView(_ROLES[item["role"]], content_text(item.get("content")))
    if kind == "reasoning":
        texts = [part.get("text", "") for key in ("summary", "content")
                 for part in item.get(key) or () if isinstance(part, dict)]
        opaque = item.get("encrypted_content")
        return ItemView(_ASSISTANT, "", (), kind, (), "\n".join(t for t in texts if t),
                        (opaque,) if isinstance(opaque, str) else ())
    if kind in RESPONSES_CALLS:
        name = item.get("name") or kind.removesuffix("_call")
        arguments = next((item[key] for key in _CALL_INPUTS if key in item), None)
        return ItemView(_ASSISTANT, "", (CallView(
            responses_call_id(item), name,
            _as_text(_readable(item) if arguments is None else arguments)),), kind)
    if kind in RESPONSES_OUTPUTS:
        output = item["output"] if "output" in item else _readable(item)
        return ItemView(_TOOL, "", (), kind, (OutputView(
            responses_call_id(item), _as_text(output)),))
    image = item.get("result")
    return ItemView(_ASSISTANT, f"[{kind}] {_as_text(_readable(item))}", (), kind, (), "",
                    (image,) if isinstance(image, str) else ())


def _readable(item: dict[str, Any]) -> dict[str, Any]:
    """What an item without a text of its own says: every field but its bookkeeping."""
    return {key: value for key, value in item.items() if key not in _HOSTED_SKIPPED}


def responses_call_id(item: dict[str, Any]) -> str:
    """The call id a Responses call or output item pairs by (a local shell call's output
    names its call by ``id``)."""
    call_id = item.get("call_id")
    if call_id is None and item.get("type") == "local_shell_call_output":
        call_id = item.get("id")
    return str(call_id)


def view_anthropic_message(message: dict[str, Any]) -> ItemView:
    """An Anthropic message's view (the message has passed intake's shape check)."""
    role = _ROLES[message["role"]]
    content = message["content"]
    if isinstance(content, str):
        return ItemView(role, content)
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[CallView] = []
    outputs: list[OutputView] = []
    opaque: list[str] = []
    for block in content:
        kind = block["type"]
        if kind == "text":
            texts.append(block["text"])
        elif kind == "thinking":
            thinking.append(block["thinking"])
            opaque.append(block["signature"])
        elif kind == "redacted_thinking":
            opaque.append(block["data"])
        elif kind in ("tool_use", "server_tool_use"):
            calls.append(CallView(block["id"], block["name"], _as_text(block.get("input"))))
        elif kind in ("tool_result", "web_search_tool_result"):
            outputs.append(OutputView(block["tool_use_id"], _result_text(block)))
    return ItemView(role, "\n".join(texts), tuple(calls), "message", tuple(outputs),
                    "\n".join(thinking), tuple(opaque))


def view_item(session_format: SessionFormat, body: dict[str, Any]) -> ItemView:
    """The view of one stored body of ``session_format``."""
    view = _ITEM_VIEWS.get(session_format)
    if view is None:
        return view_chat_message(ChatMessage.model_validate(body))
    return view(body)


# The view of each format whose items are no chat messages, found by one lookup.
_ITEM_VIEWS = {SessionFormat.RESPONSES: view_responses_item,
               SessionFormat.ANTHROPIC: view_anthropic_message}


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return content_text(content)
    return _as_text(content)


def _as_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and "text" in p for p in value):
        return content_text(value)
    return json.dumps(value, ensure_ascii=False, sort_keys=True)
