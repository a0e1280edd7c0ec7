"""Deterministic compaction strategies over groups, matching Microsoft Agent Framework's:
truncation, sliding window, tool-call drop and tool-result collapse (a job runs the one
``COMPACTOR_SPAN_STRATEGY`` names). No LLM; every output stays valid for the chat API.

Shared guarantees: instruction groups are always kept, a pending group is never touched,
and groups are kept, dropped or replaced whole, so no tool call loses its results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from worker.compaction.grouping import Group, GroupKind
from worker.compaction.messages import ChatMessage, Role, StoredMessage
from worker.compaction.pruning import first_meaningful_line, tool_name_of, tool_names_by_call_id
from worker.compaction.tokens import TokenCounter

COLLAPSED_RESULT_CHARS = 80

class StrategyName(StrEnum):
    TRUNCATION = "truncation"
    SLIDING_WINDOW = "sliding_window"
    TOOL_CALL_DROP = "tool_call_drop"
    TOOL_RESULT_COLLAPSE = "tool_result_collapse"


class SizeUnit(StrEnum):
    """What truncation measures."""

    MESSAGES = "messages"
    TOKENS = "tokens"


@dataclass(frozen=True, slots=True)
class StrategyConfig:
    """One named strategy and its knobs; knobs other strategies use are ignored."""

    name: StrategyName
    max_size: int = 0  # truncation: act only above this size (unit)
    compact_to: int = 0  # truncation: shrink to at most this size (unit)
    unit: SizeUnit = SizeUnit.TOKENS
    keep_last_groups: int = 20  # sliding window
    keep_last_tool_groups: int = 2  # tool-call drop and tool-result collapse

    def __post_init__(self) -> None:
        if min(self.max_size, self.compact_to, self.keep_last_groups,
               self.keep_last_tool_groups) < 0:
            raise ValueError("strategy sizes and counts must be >= 0")
        if self.compact_to > self.max_size:
            raise ValueError(f"compact_to ({self.compact_to}) must not exceed max_size "
                             f"({self.max_size})")


def truncate_groups(
    groups: Sequence[Group], *, max_size: int, compact_to: int, unit: SizeUnit
) -> list[Group]:
    """Above ``max_size``, drop the oldest groups until the size is at most ``compact_to``.

    The last conversation group and a pending group are kept, so the result may stay
    above ``compact_to`` when those and the instructions alone exceed it.
    """
    if compact_to > max_size:
        raise ValueError(f"compact_to ({compact_to}) must not exceed max_size ({max_size})")
    kept = list(groups)
    size = sum(_size(group, unit) for group in kept)
    if size <= max_size:
        return kept
    conversation = [i for i, group in enumerate(kept) if not group.is_instruction]
    protected = set(conversation[-1:]) | {i for i, group in enumerate(kept) if group.pending}
    dropped: set[int] = set()
    for index in conversation:
        if size <= compact_to:
            break
        if index not in protected:
            dropped.add(index)
            size -= _size(kept[index], unit)
    return [group for i, group in enumerate(kept) if i not in dropped]


def slide_window(groups: Sequence[Group], *, keep_last_groups: int) -> list[Group]:
    """Keep the instructions and the last ``keep_last_groups`` conversation groups."""
    conversation = [i for i, group in enumerate(groups) if not group.is_instruction]
    window = set(conversation[-keep_last_groups:]) if keep_last_groups > 0 else set()
    return [g for i, g in enumerate(groups) if g.is_instruction or g.pending or i in window]


def drop_tool_groups(groups: Sequence[Group], *, keep_last_tool_groups: int) -> list[Group]:
    """Drop tool exchanges whole, except the last ``keep_last_tool_groups``."""
    older = _older_tool_groups(groups, keep_last_tool_groups)
    return [group for i, group in enumerate(groups) if i not in older]


def collapse_tool_groups(
    groups: Sequence[Group], *, keep_last_tool_groups: int, counter: TokenCounter
) -> list[Group]:
    """Replace older tool exchanges with one assistant message listing their results.

    The message reads ``[Tool results: name: first line; ...]`` after the assistant's
    own text, if it had any; it takes the exchange's first seq.
    """
    older = _older_tool_groups(groups, keep_last_tool_groups)
    return [
        _collapse_exchange(group, counter) if i in older else group
        for i, group in enumerate(groups)
    ]


def apply_strategy(
    groups: Sequence[Group], config: StrategyConfig, counter: TokenCounter
) -> list[Group]:
    """Run the strategy named in ``config`` once."""
    if config.name is StrategyName.TRUNCATION:
        return truncate_groups(
            groups, max_size=config.max_size, compact_to=config.compact_to, unit=config.unit
        )
    if config.name is StrategyName.SLIDING_WINDOW:
        return slide_window(groups, keep_last_groups=config.keep_last_groups)
    if config.name is StrategyName.TOOL_CALL_DROP:
        return drop_tool_groups(groups, keep_last_tool_groups=config.keep_last_tool_groups)
    return collapse_tool_groups(
        groups, keep_last_tool_groups=config.keep_last_tool_groups, counter=counter
    )


def _size(group: Group, unit: SizeUnit) -> int:
    return group.tokens if unit is SizeUnit.TOKENS else len(group.messages)


def _tokens(groups: Sequence[Group]) -> int:
    return sum(group.tokens for group in groups)


def _older_tool_groups(groups: Sequence[Group], keep_last: int) -> set[int]:
    """Indices of settled tool exchanges other than the last ``keep_last`` of them."""
    settled = [
        i for i, group in enumerate(groups)
        if group.kind is GroupKind.TOOL_EXCHANGE and not group.pending
    ]
    return set(settled[:max(len(settled) - keep_last, 0)])


def _collapse_exchange(group: Group, counter: TokenCounter) -> Group:
    names = tool_names_by_call_id(group)
    results = [
        f"{tool_name_of(stored, names)}: "
        f"{first_meaningful_line(stored.message.text, COLLAPSED_RESULT_CHARS) or '(empty)'}"
        for stored in group.messages
        if stored.message.role is Role.TOOL
    ]
    own_text = "\n".join(
        stored.message.text for stored in group.messages
        if stored.message.role is not Role.TOOL and stored.message.text
    )
    listing = f"[Tool results: {'; '.join(results)}]"
    message = ChatMessage(role=Role.ASSISTANT, content=f"{own_text}\n{listing}" if own_text
                          else listing)
    stored = StoredMessage(group.first_seq, message, counter.count_message(message))
    return Group(GroupKind.ASSISTANT, (stored,))
