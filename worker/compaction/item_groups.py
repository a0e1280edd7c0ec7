"""Atomic groups of Responses items and Anthropic messages, by the providers' pairing rules.

An item is read as the chat messages of its view, all at its seq (its tokens on the
first), and a group holds whole items only, so every boundary the plan draws between
groups falls between items of the original format:

- Responses: a reasoning item travels with the rest of its reply (its message, its
  calls made together, hosted calls) and the calls' outputs (a request that holds
  reasoning without its following item, or an item of a reply without the reasoning
  that preceded it, is refused); calls with all their outputs; a hosted call holds its
  own result.
- Anthropic: an assistant message with ``tool_use`` blocks (its thinking and redacted
  thinking inside it) with the next user message, whose ``tool_result`` blocks answer
  them.

The last group is pending while a call in it waits for its output, or a reply that
began with reasoning has no output yet: the agent is still working on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from worker.compaction.formats import (
    RESPONSES_CALLS,
    ItemView,
    SessionFormat,
    view_item,
)
from worker.compaction.grouping import Group, GroupKind
from worker.compaction.messages import INSTRUCTION_ROLES, Role, StoredMessage

# Read once: on Python 3.11 reading an enum member off its class is a descriptor call.
_ASSISTANT, _USER = Role.ASSISTANT, Role.USER


class StoredItem(NamedTuple):
    """An item at its seq: its view and the chat messages the core reads of it."""

    seq: int
    view: ItemView
    messages: tuple[StoredMessage, ...]


def read_item(session_format: SessionFormat, seq: int, tokens: int, body: dict[str, Any]
              ) -> StoredItem:
    """Read one stored body of ``session_format`` as the core's messages."""
    view = view_item(session_format, body)
    return StoredItem(seq, view, tuple([
        StoredMessage(seq, message, tokens if position == 0 else 0,
                      "" if message.role is Role.TOOL else view.reasoning)
        for position, message in enumerate(view.chat_messages())]))


def group_items(session_format: SessionFormat, items: Sequence[StoredItem]) -> list[Group]:
    """Split a Responses or Anthropic session (in seq order) into atomic groups that
    re-concatenate to it; like ``group_messages``, malformed input never raises (an
    output that answers no open call is a group of its own)."""
    if session_format is SessionFormat.ANTHROPIC:
        return _group_anthropic(items)
    return _group_responses(items)


def _group_responses(items: Sequence[StoredItem]) -> list[Group]:
    groups: list[Group] = []
    current: list[StoredItem] = []  # one reply's items from its reasoning, or an exchange
    waiting: set[str] = set()
    replying = False  # current holds a reasoning item and no output yet

    def close() -> None:
        nonlocal replying
        if current:
            groups.append(_group(current))
            current.clear()
            waiting.clear()
        replying = False

    for item in items:
        view = item.view
        answered = {output.call_id for output in view.outputs}
        if answered:
            if waiting and answered <= waiting:
                current.append(item)
                waiting.difference_update(answered)
                replying = False
                continue
            close()
            groups.append(_group([item]))
            continue
        if view.role is not _ASSISTANT:  # a user's or an instruction message
            close()
            groups.append(_group([item]))
            continue
        calls = view.kind in RESPONSES_CALLS
        if not (replying or (waiting and calls)):
            close()
        current.append(item)
        replying = replying or view.kind == "reasoning"
        waiting.update(call.call_id for call in view.calls if calls)
        if not replying and not waiting:
            close()
    if current:
        groups.append(_group(current, pending=bool(waiting) or replying))
    return groups


def _group_anthropic(items: Sequence[StoredItem]) -> list[Group]:
    groups: list[Group] = []
    calling: StoredItem | None = None  # an assistant message whose tool_use waits
    for item in items:
        view = item.view
        if calling is not None:
            answered = {output.call_id for output in view.outputs}
            if view.role is _USER and answered & _open_calls(calling.view):
                groups.append(_group([calling, item]))
                calling = None
                continue
            groups.append(_group([calling]))
            calling = None
        if view.role is _ASSISTANT and _open_calls(view):
            calling = item
            continue
        groups.append(_group([item]))
    if calling is not None:
        groups.append(_group([calling], pending=True))
    return groups


def _open_calls(view: ItemView) -> set[str]:
    """Calls of a message that a later message must answer (a server tool's result is
    in the same message)."""
    return {c.call_id for c in view.calls} - {o.call_id for o in view.outputs}


def _group(items: Sequence[StoredItem], *, pending: bool = False) -> Group:
    messages = tuple(message for item in items for message in item.messages)
    views = [item.view for item in items]
    if any(view.calls or view.outputs for view in views):
        kind = GroupKind.TOOL_EXCHANGE
    elif len(views) == 1 and views[0].role in INSTRUCTION_ROLES:
        kind = GroupKind.SYSTEM
    elif views[-1].role is _USER:
        kind = GroupKind.USER
    else:
        kind = GroupKind.ASSISTANT
    return Group(kind, messages, pending=pending)
