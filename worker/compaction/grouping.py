"""Atomic message groups: the units that compaction keeps or summarizes whole.

A tool call travels with all of its results, so no plan can cut between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from worker.compaction.messages import INSTRUCTION_ROLES, ChatMessage, Role, StoredMessage


class GroupKind(StrEnum):
    """What a group is, as far as planning cares."""

    SYSTEM = "system"  # one system or developer message
    USER = "user"
    ASSISTANT = "assistant"  # assistant text without tool calls
    TOOL_EXCHANGE = "tool_exchange"  # assistant tool calls + their results, or an orphan result


@dataclass(frozen=True, slots=True)
class Group:
    """Messages that must be kept, dropped or summarized together.

    ``pending`` marks a tool exchange at the very end of the session whose results have
    not all arrived yet: the agent is still working on it, so it must stay verbatim.
    """

    kind: GroupKind
    messages: tuple[StoredMessage, ...]
    pending: bool = False

    @property
    def first_seq(self) -> int:
        return self.messages[0].seq

    @property
    def last_seq(self) -> int:
        return self.messages[-1].seq

    @property
    def tokens(self) -> int:
        """The cached token counts of the messages, summed."""
        return sum(stored.tokens for stored in self.messages)

    @property
    def is_instruction(self) -> bool:
        return self.kind is GroupKind.SYSTEM

    @property
    def unanswered_call_ids(self) -> tuple[str, ...]:
        """Tool call ids of this group that have no result in it (in call order)."""
        answered = {m.message.tool_call_id for m in self.messages if m.message.role is Role.TOOL}
        calls = [cid for m in self.messages for cid in m.message.tool_call_ids]
        return tuple(cid for cid in calls if cid not in answered)


def group_messages(messages: Sequence[StoredMessage]) -> list[Group]:
    """Split a session (in seq order) into atomic groups that re-concatenate to it.

    Malformed input never raises, because a session must never wedge the planner (intake
    normally repairs these before they are stored):

    - a tool result that answers no open call of the exchange just before it (an orphan,
      a duplicate result, a result after another message) becomes its own
      ``TOOL_EXCHANGE`` group with ``pending=False``, and closes the open exchange;
    - an exchange missing results that is followed by a non-tool message is closed with
      ``pending=False`` (``unanswered_call_ids`` tells); only the last group can be pending.
    """
    groups: list[Group] = []
    exchange: list[StoredMessage] = []
    waiting: set[str] = set()

    def close_exchange() -> None:
        if exchange:
            groups.append(Group(GroupKind.TOOL_EXCHANGE, tuple(exchange)))
            exchange.clear()
            waiting.clear()

    for stored in messages:
        message = stored.message
        if message.role is Role.TOOL:
            if exchange and message.tool_call_id in waiting:
                exchange.append(stored)
                waiting.discard(message.tool_call_id)
                continue
            close_exchange()
            groups.append(Group(GroupKind.TOOL_EXCHANGE, (stored,)))
            continue
        close_exchange()
        if message.role is Role.ASSISTANT and message.tool_calls:
            exchange.append(stored)
            waiting.update(message.tool_call_ids)
        else:
            groups.append(Group(_kind_of(message), (stored,)))
    if exchange:
        groups.append(Group(GroupKind.TOOL_EXCHANGE, tuple(exchange), pending=bool(waiting)))
    return groups


def _kind_of(message: ChatMessage) -> GroupKind:
    if message.role in INSTRUCTION_ROLES:
        return GroupKind.SYSTEM
    if message.role is Role.USER:
        return GroupKind.USER
    return GroupKind.ASSISTANT
