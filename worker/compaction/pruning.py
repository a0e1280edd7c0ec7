"""Pre-pruning of old tool outputs to one-line digests before the summarizer reads them.

Tool outputs are the bulk of agent sessions and mostly noise once acted upon; audit mode
keeps them whole. Stored messages are never touched: pruning returns new groups.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

from worker.compaction.grouping import Group, GroupKind
from worker.compaction.messages import ChatMessage, Role, StoredMessage, share_bookkeeping
from worker.compaction.tokens import TokenCounter

DIGEST_LINE_CHARS = 160
DIGEST_MARKER = "[tool result digest]"
DIGEST_FIRST_LINE = "; first line: "
UNKNOWN_TOOL = "unknown_tool"
_NOISE = string.punctuation + string.whitespace


def first_meaningful_line(text: str, max_chars: int = DIGEST_LINE_CHARS) -> str:
    """Return the first line holding more than punctuation, cut to ``max_chars``.

    A line that is only brackets or quotes (``{``, ``],``) says nothing about the output.
    A cut line ends with `` ...``; an output without such a line gives ``""``.
    """
    return _first_meaningful(text.splitlines(), max_chars)


def _first_meaningful(lines: Sequence[str], max_chars: int) -> str:
    for line in lines:
        stripped = line.strip()
        if stripped.strip(_NOISE):  # empty when every character is noise
            if len(stripped) > max_chars:
                return stripped[:max_chars].rstrip() + " ..."
            return stripped
    return ""


def digest_tool_output(tool_name: str, content_text: str) -> str:
    """Return a one-line digest of one tool output: its size and first meaningful line."""
    lines = content_text.splitlines()  # split once: a long span holds megabytes of output
    first = _first_meaningful(lines, DIGEST_LINE_CHARS) or "(none)"
    return (
        f"{DIGEST_MARKER} {tool_name}: {len(content_text):,} chars, "
        f"{len(lines):,} lines{DIGEST_FIRST_LINE}{first}"
    )


def prune_groups(
    groups: Sequence[Group],
    *,
    audit_mode: bool,
    counter: TokenCounter,
    keep_recent_tool_groups: int = 0,
) -> list[Group]:
    """Replace tool outputs with digests, except in the last ``keep_recent_tool_groups``.

    Pruned tool messages are new ``ChatMessage`` copies (only ``content`` differs) whose
    token count is recounted with ``counter``; an output shorter than its digest is kept.
    Every other group is returned as is. In audit mode the groups are returned unchanged.
    """
    if audit_mode:
        return list(groups)
    tool_positions = [i for i, group in enumerate(groups) if group.kind is GroupKind.TOOL_EXCHANGE]
    keep = set(tool_positions[-keep_recent_tool_groups:]) if keep_recent_tool_groups > 0 else set()
    return [
        group if group.kind is not GroupKind.TOOL_EXCHANGE or i in keep
        else _prune_exchange(group, counter)
        for i, group in enumerate(groups)
    ]


def tool_names_by_call_id(group: Group) -> dict[str, str]:
    """Map each tool call id of a group to the called function's name."""
    return {
        call.id: call.function.name
        for stored in group.messages
        for call in stored.message.tool_calls or ()
    }


def tool_name_of(stored: StoredMessage, names: dict[str, str]) -> str:
    """Name the tool a result came from: its call's function, else its own ``name``."""
    message = stored.message
    return names.get(message.tool_call_id or "") or message.name or UNKNOWN_TOOL


def _prune_exchange(group: Group, counter: TokenCounter) -> Group:
    names = tool_names_by_call_id(group)
    pruned: list[StoredMessage] = []
    for stored in group.messages:
        if stored.message.role is not Role.TOOL:
            pruned.append(stored)
            continue
        text = stored.message.text
        digest = digest_tool_output(tool_name_of(stored, names), text)
        if len(digest) >= len(text):
            pruned.append(stored)  # a short output is its own best digest
            continue
        message = stored.message.model_copy(update={"content": digest})
        share_bookkeeping(message)  # the copy's own set and extras, as a parsed message's
        pruned.append(_DigestMessage(stored.seq, message, counter))
    return Group(group.kind, tuple(pruned), group.pending)


class _DigestMessage(StoredMessage):
    """A pruned tool message whose count is taken on first use: a summarizer that reads
    the pruned span as text (the LLM prompt, the extractive draft) never asks it, and a
    long span has hundreds of digests to encode."""

    __slots__ = ("_counter", "_tokens")
    _counter: TokenCounter
    _tokens: int | None

    def __init__(self, seq: int, message: ChatMessage, counter: TokenCounter) -> None:
        for name, value in (("seq", seq), ("message", message), ("reasoning", ""),
                            ("_counter", counter), ("_tokens", None)):
            object.__setattr__(self, name, value)

    @property  # read-only, as the frozen field it stands for
    def tokens(self) -> int:
        tokens = self._tokens
        if tokens is None:
            tokens = self._counter.count_message(self.message)
            object.__setattr__(self, "_tokens", tokens)
        return tokens

    # Equal to, hashed and pickled as the StoredMessage it stands for.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoredMessage):
            return NotImplemented
        return ((self.seq, self.message, self.tokens, self.reasoning)
                == (other.seq, other.message, other.tokens, other.reasoning))

    def __hash__(self) -> int:
        return hash((self.seq, self.message, self.tokens, self.reasoning))

    def __reduce__(self) -> tuple[type[StoredMessage], tuple[int, ChatMessage, int]]:
        return StoredMessage, (self.seq, self.message, self.tokens)
