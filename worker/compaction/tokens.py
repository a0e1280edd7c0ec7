"""Token counts of text and chat messages with an encoding the caller loaded (offline
loading lives outside the core, in ``worker.tokenizer``), and the chat API's per-message
overhead.

Message overhead follows OpenAI's published counting recipe for chat models: 3 tokens
per message plus its role, 1 more when ``name`` is set, 3 to prime the reply. Tool calls
are counted as their name and argument string plus 3 tokens each, and image parts as a
flat 85 tokens (a low-detail image); the API's exact tool-call framing is unpublished,
so these are approximations that the summarizer's safety margin absorbs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from worker.compaction.messages import ChatMessage

if TYPE_CHECKING:
    import tiktoken

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
TOKENS_PER_TOOL_CALL = 3
TOKENS_PER_IMAGE_PART = 85
REPLY_PRIMING_TOKENS = 3


@dataclass(frozen=True)
class TokenCounter:
    """Counts text and chat messages with one encoding."""

    encoding: tiktoken.Encoding

    def count_text(self, text: str) -> int:
        """Count ``text`` as plain text (special-token strings count as ordinary text)."""
        return len(self.encoding.encode_ordinary(text)) if text else 0

    def count_lines(self, lines: Sequence[str]) -> list[int]:
        """Count each of ``lines`` (bullet lines: each starts with "-" and ends in its one
        line break) in one encode of them joined: one call instead of one per line.

        The joined count is the lines' counts added: tiktoken splits text into pieces
        before it merges bytes, and under both supported patterns no piece runs past a line
        break into a line that starts with "-". A line's tokens then end at the one token
        that holds its line break; other lines are counted one by one.
        """
        if not lines:
            return []
        tokens = self.encoding.encode_ordinary("".join(lines))
        breaks = _line_break_tokens(self.encoding.name)
        for token in set(tokens).difference(breaks):
            breaks[token] = b"\n" in self.encoding.decode_single_token_bytes(token)
        ends = [index for index, token in enumerate(tokens, 1) if breaks[token]]
        if len(ends) != len(lines):  # a line that is no bullet line
            return [self.count_text(line) for line in lines]
        return [end - start for start, end in zip([0, *ends], ends, strict=False)]

    def count_message(self, message: ChatMessage) -> int:
        """Count one message as the chat API would bill it, overhead included."""
        total = TOKENS_PER_MESSAGE + self.count_text(message.role.value)
        total += self._count_content(message.content)
        if message.name:
            total += TOKENS_PER_NAME + self.count_text(message.name)
        for call in message.tool_calls or ():
            total += TOKENS_PER_TOOL_CALL
            total += self.count_text(call.function.name) + self.count_text(call.function.arguments)
        return total

    def use_line_counts(self, counts: Iterable[tuple[str, int]]) -> None:
        """Take ``(line, tokens)`` pairs counted elsewhere (ingest stores each identifier's
        summary line count): a job's counter answers those texts from them; a plain
        counter, which remembers nothing, ignores them."""

    def for_job(self) -> TokenCounter:
        """A counter for one job: it encodes each distinct text once (see ``JobCounter``)."""
        return JobCounter(self.encoding)

    def count_messages(self, messages: Iterable[ChatMessage]) -> int:
        """Count a whole prompt: every message plus the reply priming."""
        return REPLY_PRIMING_TOKENS + sum(self.count_message(m) for m in messages)

    def _count_content(self, content: str | list[dict[str, Any]] | None) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self.count_text(content)
        total = 0
        for part in content:
            text = part.get("text") if isinstance(part, dict) else None
            if isinstance(text, str):
                total += self.count_text(text)
            elif isinstance(part, dict) and part.get("type") in ("image_url", "input_image"):
                total += TOKENS_PER_IMAGE_PART
            else:
                total += self.count_text(str(part))
        return total


@functools.cache
def _line_break_tokens(encoding_name: str) -> dict[int, bool]:
    """Whether a token holds a line break, for each token ``count_lines`` met so far (a
    process meets a few thousand of the vocabulary's ~200k)."""
    return {}


# Texts up to this long are remembered: summary lines and blocks, not a long span's slices.
_REMEMBERED_CHARS = 32_768


@dataclass(frozen=True)
class JobCounter(TokenCounter):
    """A counter that encodes each distinct text once, for the one job that owns it.

    A job counts the same text in several steps: the lines a summarizer fitted to budget
    are measured again by the update, and the summarizer's block again by validation.
    The count is carried instead of redone; the memory goes with the job.
    """

    _counts: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def use_line_counts(self, counts: Iterable[tuple[str, int]]) -> None:
        self._counts.update(counts)

    def count_text(self, text: str) -> int:
        if len(text) > _REMEMBERED_CHARS:
            return super().count_text(text)
        counted = self._counts.get(text)
        if counted is None:
            counted = self._counts[text] = super().count_text(text)
        return counted

    def count_lines(self, lines: Sequence[str]) -> list[int]:
        unknown = [line for line in dict.fromkeys(lines) if line not in self._counts]
        counted = dict(zip(unknown, super().count_lines(unknown), strict=True))
        self._counts.update((line, count) for line, count in counted.items()
                            if len(line) <= _REMEMBERED_CHARS)
        return [self._counts[line] if line in self._counts else counted[line]
                for line in lines]
