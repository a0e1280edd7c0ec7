"""Intake of Responses items and Anthropic messages: shape and pairing, no repair but
of unstorable text.

Pure. Items that pass come out as the dicts they came in as (stored verbatim); a problem
names the field at fault (``items[3].call_id``), and a record of one format is never
read as another: a chat field in a Responses item, an Anthropic block in a chat message
or a Responses item, a chat role in an Anthropic message, is a ``format_mismatch``.
Pairing follows the providers' rules: every call is answered before the next item that
is not a call or a result (Responses), or by the very next message (Anthropic); only a
call at the very end may wait for its result.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from worker.compaction.formats import (
    ANTHROPIC_BLOCKS,
    ANTHROPIC_ONLY_BLOCKS,
    RESPONSES_CALLS,
    RESPONSES_OUTPUTS,
    RESPONSES_TYPES,
    ItemView,
    SessionFormat,
    responses_call_id,
    view_anthropic_message,
    view_responses_item,
)
from worker.compaction.intake import Action, IntakePolicy, Problem, ProblemKind, clean_text
from worker.compaction.limits import MAX_MESSAGES, MAX_NESTING_DEPTH, measure_depth

_MESSAGE_ROLES = frozenset({"user", "assistant", "system", "developer"})
_ASSISTANT_BLOCKS = frozenset({"thinking", "redacted_thinking", "tool_use", "server_tool_use",
                               "web_search_tool_result"})
# Required string fields per Responses item type and Anthropic block type.
_RESPONSES_FIELDS = {"function_call": ("call_id", "name", "arguments"),
                     "custom_tool_call": ("call_id", "name", "input"),
                     **dict.fromkeys(("computer_call", "local_shell_call", "shell_call",
                                      "apply_patch_call", "tool_search_call", "program",
                                      "function_call_output", "custom_tool_call_output",
                                      "computer_call_output", "shell_call_output",
                                      "apply_patch_call_output", "tool_search_output",
                                      "program_output"), ("call_id",)),
                     "local_shell_call_output": ("id",)}
# Outputs whose result is their ``output`` field (the others hold it in their own fields).
_OUTPUT_FIELD = frozenset({"function_call_output", "custom_tool_call_output",
                           "computer_call_output", "local_shell_call_output",
                           "shell_call_output", "apply_patch_call_output"})
_BLOCK_FIELDS = {"text": ("text",), "thinking": ("thinking", "signature"),
                 "redacted_thinking": ("data",), "tool_use": ("id", "name"),
                 "server_tool_use": ("id", "name"), "tool_result": ("tool_use_id",),
                 "web_search_tool_result": ("tool_use_id",)}


@dataclass(frozen=True)
class CheckedItems:
    """The items to store (verbatim; empty when rejected), their views, every problem."""

    items: tuple[dict[str, Any], ...]
    views: tuple[ItemView, ...]
    problems: tuple[Problem, ...]
    rejected: bool


class _Check:
    def __init__(self, policy: IntakePolicy) -> None:
        self.policy = policy
        self.problems: list[Problem] = []

    def report(self, kind: ProblemKind, index: int | None, detail: str) -> None:
        """Record a problem: text is cleaned as the policy says; nothing else is repaired
        (a placeholder result or a dropped block would break what the provider signed)."""
        action = (self.policy.action_for(kind) if kind is ProblemKind.INVALID_TEXT
                  else Action.REJECT)
        self.problems.append(Problem(kind, index, detail, action))

    def admit(self, index: int, raw: Any, field: str) -> dict[str, Any] | None:
        """The item cleaned of unstorable text, or None when it is not an object."""
        if not isinstance(raw, dict):
            self.report(ProblemKind.MALFORMED_MESSAGE, index, f"{field} is not an object")
            return None
        if measure_depth(raw) > MAX_NESTING_DEPTH:
            self.report(ProblemKind.TOO_LARGE, index, f"{field}: objects and arrays nested "
                        f"deeper than {MAX_NESTING_DEPTH} levels")
            return None
        data, changed = clean_text(raw)
        if changed:
            self.report(ProblemKind.INVALID_TEXT, index,
                        f"{field}: NUL byte or lone surrogate in a string")
        return data  # type: ignore[no-any-return]  # clean_text keeps a dict a dict

    def result(self, items: list[dict[str, Any]], view: Callable[[dict[str, Any]], ItemView],
               *, is_append: bool) -> CheckedItems:
        rejected = any(p.action is Action.REJECT for p in self.problems)
        if not items and not is_append and not rejected:
            self.report(ProblemKind.EMPTY_SESSION, None, "no items")
            rejected = True
        if rejected:
            return CheckedItems((), (), tuple(self.problems), True)
        return CheckedItems(tuple(items), tuple(view(item) for item in items),
                            tuple(self.problems), False)


def check_responses_items(
    raw_items: Sequence[Any], policy: IntakePolicy, *, open_ids: Collection[str] = (),
    seen_ids: Collection[str] = frozenset(), is_append: bool = False,
) -> CheckedItems:
    """Check Responses input items against the stored session's open and used call ids."""
    check = _Check(policy)
    if len(raw_items) > MAX_MESSAGES:
        check.report(ProblemKind.TOO_LARGE, None, f"{len(raw_items):,} items; at most "
                     f"{MAX_MESSAGES:,} at once")
        return check.result([], view_responses_item, is_append=is_append)
    open_calls: dict[str, str | None] = dict.fromkeys(open_ids)  # call_id -> call type
    seen = set(seen_ids) | set(open_ids)
    items: list[dict[str, Any]] = []
    for index, raw in enumerate(raw_items):
        field = f"items[{index}]"
        item = check.admit(index, raw, field)
        if item is None:
            continue
        problem = _responses_shape(item, field)
        if problem is not None:
            check.report(problem[0], index, problem[1])
            continue
        kind = item.get("type", "message")
        call_id = responses_call_id(item)
        if kind in RESPONSES_OUTPUTS:
            call_kind = open_calls.pop(call_id, "absent")
            if call_kind not in (None, RESPONSES_OUTPUTS[kind]):
                check.report(ProblemKind.ORPHAN_TOOL_RESULT, index, f"{field}.call_id "
                             f"{call_id!r} answers no open {RESPONSES_OUTPUTS[kind]}")
                continue
        elif kind in RESPONSES_CALLS:
            if call_id in seen:
                check.report(ProblemKind.DUPLICATE_TOOL_CALL_ID, index,
                             f"{field}.call_id {call_id!r} is already used")
                continue
            seen.add(call_id)
            open_calls[call_id] = kind
        elif open_calls:
            check.report(ProblemKind.MISSING_TOOL_RESULT, index, f"{field} ({kind}) comes "
                         f"before the output of call {next(iter(open_calls))!r}")
            open_calls.clear()
        items.append(item)
    return check.result(items, view_responses_item, is_append=is_append)


def _responses_shape(item: dict[str, Any], field: str) -> tuple[ProblemKind, str] | None:
    if "tool_calls" in item or item.get("role") == "tool":
        return ProblemKind.FORMAT_MISMATCH, (f"{field} is a chat message (role 'tool' or "
                                             "tool_calls), not a Responses item")
    kind = item.get("type", "message" if "role" in item else None)
    if not isinstance(kind, str):
        return ProblemKind.MALFORMED_MESSAGE, f"{field}.type is missing"
    if kind not in RESPONSES_TYPES:
        return ProblemKind.MALFORMED_MESSAGE, (f"{field}.type {kind!r} is not a Responses "
                                               "input item this service stores")
    if kind == "message":
        return _message_shape(item, field)
    if kind == "reasoning" and not isinstance(item.get("summary"), list):
        return ProblemKind.MALFORMED_MESSAGE, f"{field}.summary is not a list"
    for name in _RESPONSES_FIELDS.get(kind, ()):
        if not isinstance(item.get(name), str) or not item[name]:
            return ProblemKind.MALFORMED_MESSAGE, f"{field}.{name} is not a non-empty string"
    if kind in _OUTPUT_FIELD and "output" not in item:
        return ProblemKind.MALFORMED_MESSAGE, f"{field}.output is missing"
    return None


def _message_shape(item: dict[str, Any], field: str) -> tuple[ProblemKind, str] | None:
    if item.get("role") not in _MESSAGE_ROLES:
        return ProblemKind.MALFORMED_MESSAGE, f"{field}.role {item.get('role')!r} is unknown"
    content = item.get("content")
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return ProblemKind.MALFORMED_MESSAGE, f"{field}.content is not a string or a list"
    for position, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            return ProblemKind.MALFORMED_MESSAGE, f"{field}.content[{position}].type is missing"
        if kind in ANTHROPIC_ONLY_BLOCKS:
            return ProblemKind.FORMAT_MISMATCH, (f"{field}.content[{position}].type {kind!r} "
                                                 "is an Anthropic block")
    return None


def check_anthropic_messages(
    raw_messages: Sequence[Any], policy: IntakePolicy, *, open_ids: Collection[str] = (),
    is_append: bool = False,
) -> CheckedItems:
    """Check Anthropic messages; ``open_ids``: the stored last message's unanswered
    ``tool_use`` ids, which the first message given must answer."""
    check = _Check(policy)
    if len(raw_messages) > MAX_MESSAGES:
        check.report(ProblemKind.TOO_LARGE, None, f"{len(raw_messages):,} messages; at "
                     f"most {MAX_MESSAGES:,} at once")
        return check.result([], view_anthropic_message, is_append=is_append)
    waiting = set(open_ids)
    seen = set(open_ids)
    messages: list[dict[str, Any]] = []
    for index, raw in enumerate(raw_messages):
        field = f"messages[{index}]"
        message = check.admit(index, raw, field)
        if message is None:
            continue
        problem = _anthropic_shape(message, field)
        if problem is not None:
            check.report(problem[0], index, problem[1])
            continue
        view = view_anthropic_message(message)
        # Server tools answer themselves in the same message.
        own = {call.call_id for call in view.calls}
        answered = {output.call_id for output in view.outputs} - own
        if waiting - answered:
            check.report(ProblemKind.MISSING_TOOL_RESULT, index, f"{field} does not answer "
                         f"tool_use {sorted(waiting - answered)[0]!r} of the message before")
        if answered - waiting:
            check.report(ProblemKind.ORPHAN_TOOL_RESULT, index, f"{field}: tool_result for "
                         f"{sorted(answered - waiting)[0]!r} answers no tool_use of the "
                         "message before")
        results = {output.call_id for output in view.outputs}
        calls = [call.call_id for call in view.calls if call.call_id not in results]
        if seen.intersection(calls):
            check.report(ProblemKind.DUPLICATE_TOOL_CALL_ID, index,
                         f"{field}: tool_use id {sorted(seen.intersection(calls))[0]!r} "
                         "is already used")
        seen.update(calls)
        waiting = set(calls)
        messages.append(message)
    return check.result(messages, view_anthropic_message, is_append=is_append)


def _anthropic_shape(message: dict[str, Any], field: str) -> tuple[ProblemKind, str] | None:
    role = message.get("role")
    if "tool_calls" in message or role in ("tool", "system", "developer"):
        return ProblemKind.FORMAT_MISMATCH, (
            f"{field}.role {role!r} or tool_calls belongs to a chat message (an Anthropic "
            "record keeps its system prompt in \"system\"; results are tool_result blocks)")
    if role not in ("user", "assistant"):
        return ProblemKind.MALFORMED_MESSAGE, f"{field}.role {role!r} is unknown"
    content = message.get("content")
    if isinstance(content, str):
        return None
    if not isinstance(content, list) or not content:
        return ProblemKind.MALFORMED_MESSAGE, f"{field}.content is not a string or a list"
    for position, block in enumerate(content):
        problem = _block_shape(block, str(role), f"{field}.content[{position}]")
        if problem is not None:
            return problem
    return None


def _block_shape(block: object, role: str, field: str) -> tuple[ProblemKind, str] | None:
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(block, dict) or not isinstance(kind, str):
        return ProblemKind.MALFORMED_MESSAGE, f"{field}.type is missing"
    if kind not in ANTHROPIC_BLOCKS:
        mismatch = kind in RESPONSES_TYPES or kind in ("input_text", "output_text", "image_url")
        return (ProblemKind.FORMAT_MISMATCH if mismatch else ProblemKind.MALFORMED_MESSAGE,
                f"{field}.type {kind!r} is not an Anthropic content block")
    for name in _BLOCK_FIELDS.get(kind, ()):
        if not isinstance(block.get(name), str):
            return ProblemKind.MALFORMED_MESSAGE, f"{field}.{name} is not a string"
    if kind in ("tool_use", "server_tool_use") and not isinstance(block.get("input"), dict):
        return ProblemKind.MALFORMED_MESSAGE, f"{field}.input is not an object"
    if kind in _ASSISTANT_BLOCKS and role != "assistant":
        return ProblemKind.MALFORMED_MESSAGE, f"{field}: a {kind} block in a {role} message"
    if kind == "tool_result" and role != "user":
        return ProblemKind.MALFORMED_MESSAGE, f"{field}: a tool_result block in a {role} message"
    return None


def find_foreign_chat_fields(raw_messages: Sequence[Any]) -> Problem | None:
    """The first sign that chat messages are another format's (an Anthropic block, a
    Responses item type), as a rejection naming the field; None when there is none."""
    for index, raw in enumerate(raw_messages):
        if not isinstance(raw, dict):
            continue
        kind = raw.get("type")
        if isinstance(kind, str) and kind in RESPONSES_TYPES - {"message"}:
            return _mismatch(index, f"messages[{index}].type {kind!r} is a Responses item: "
                             f"give the record \"format\": \"{SessionFormat.RESPONSES}\"")
        content = raw.get("content")
        for position, part in enumerate(content if isinstance(content, list) else ()):
            block = part.get("type") if isinstance(part, dict) else None
            if block in ANTHROPIC_ONLY_BLOCKS:
                return _mismatch(index, f"messages[{index}].content[{position}].type "
                                 f"{block!r} is an Anthropic block: give the record "
                                 f"\"format\": \"{SessionFormat.ANTHROPIC}\"")
    return None


def _mismatch(index: int, detail: str) -> Problem:
    return Problem(ProblemKind.FORMAT_MISMATCH, index, detail, Action.REJECT)
