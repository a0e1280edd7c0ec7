"""The chunk-and-merge plan for a span that does not fit the summarizer's window.

It works on rendered span items (text + token count), so it does not depend on how the
prompt renders messages. Any input can be planned: an item bigger than a chunk is cut
into marked parts at line breaks or spaces, or between characters in a long unbroken run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from worker.compaction.errors import ContextOverflow
from worker.compaction.tokens import TokenCounter

OUTPUT_SPAN_RATIO = 0.15
MIN_OUTPUT_TOKENS = 1_024
MAX_OUTPUT_TOKENS = 4_096
# The smallest chunk budget worth a call: a part marker plus a useful piece of text.
MIN_CHUNK_TOKENS = 256
# A character is at most 4 UTF-8 bytes, and no byte is worse than one token.
MAX_TOKENS_PER_CHARACTER = 4
# English averages about 4 characters per token; only a starting guess, refined by counts.
CHARS_PER_TOKEN_GUESS = 4

MergeRounds = tuple[tuple[tuple[int, ...], ...], ...]


@dataclass(frozen=True, slots=True)
class SpanItem:
    """One rendered piece of the span (usually a group), or part ``part`` of ``parts``;
    ``tokens`` is its count, or its UTF-8 bytes (an upper bound) in a one-call plan made
    without exact counts (``plan_summary_calls(exact=False)``)."""

    text: str
    tokens: int
    first_seq: int
    last_seq: int
    part: int = 1
    parts: int = 1


@dataclass(frozen=True, slots=True)
class Chunk:
    """Items summarized by one map call; ``tokens`` is the sum of theirs."""

    items: tuple[SpanItem, ...]

    @property
    def tokens(self) -> int:
        return sum(item.tokens for item in self.items)

    @property
    def first_seq(self) -> int:
        return self.items[0].first_seq

    @property
    def last_seq(self) -> int:
        return self.items[-1].last_seq


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """Map calls (one per chunk), then merge rounds until one summary remains.

    Each round lists batches of indices into the previous round's outputs (round 0 reads
    the chunk outputs). A batch of one index is carried to the next round without a call.
    Every chunk's tokens are at most ``budget_tokens``.
    """

    chunks: tuple[Chunk, ...]
    merge_rounds: MergeRounds
    budget_tokens: int

    @property
    def merge_calls(self) -> int:
        return sum(1 for batches in self.merge_rounds for batch in batches if len(batch) > 1)

    @property
    def calls(self) -> int:
        """LLM calls the plan makes: 1 when the span fits in one chunk."""
        return len(self.chunks) + self.merge_calls


def output_budget_tokens(span_tokens: int, pinned: int | None = None) -> int:
    """Return the summary output budget: clamp(span * 0.15, 1024, 4096) unless pinned."""
    if pinned is not None:
        return pinned
    return max(MIN_OUTPUT_TOKENS, min(MAX_OUTPUT_TOKENS, int(span_tokens * OUTPUT_SPAN_RATIO)))


def chunk_budget_tokens(
    window_tokens: int,
    margin_ratio: float,
    output_tokens: int,
    prompt_overhead_tokens: int,
) -> int:
    """Return the span tokens one call can read: the window less margin, output and the
    prompt's overhead (which includes any prior summary it embeds).

    Raises:
        ContextOverflow: when less than ``MIN_CHUNK_TOKENS`` would be left for the span.
    """
    usable_tokens = int(window_tokens * (1 - margin_ratio))
    budget = usable_tokens - output_tokens - prompt_overhead_tokens
    if budget < MIN_CHUNK_TOKENS:
        raise ContextOverflow(
            f"summarizer window of {window_tokens} tokens (margin {margin_ratio:.0%}) leaves "
            f"{budget} tokens for the span after output {output_tokens} and prompt "
            f"{prompt_overhead_tokens}; at least {MIN_CHUNK_TOKENS} are needed",
            reason="window_too_small",
        )
    return budget


def merge_fan_in(merge_budget_tokens: int, output_tokens: int) -> int:
    """Return how many partial summaries of ``output_tokens`` one merge call can read.

    Raises:
        ContextOverflow: when fewer than two fit, so merging could never converge.
    """
    fan_in = merge_budget_tokens // max(output_tokens, 1)
    if fan_in < 2:
        raise ContextOverflow(
            f"a merge call's {merge_budget_tokens} input tokens cannot hold two partial "
            f"summaries of {output_tokens} tokens",
            reason="merge_window_too_small",
        )
    return fan_in


def plan_merge_tree(n_partials: int, fan_in: int) -> MergeRounds:
    """Batch ``n_partials`` outputs into rounds of at most ``fan_in`` until one remains.

    Batches of a round are consecutive and balanced (sizes differ by at most one), so
    order is kept and no round ends with a nearly empty call.
    """
    if fan_in < 2:
        raise ValueError(f"fan_in must be at least 2, got {fan_in}")
    rounds: list[tuple[tuple[int, ...], ...]] = []
    remaining = n_partials
    while remaining > 1:
        batch_count = -(-remaining // fan_in)
        size, bigger = divmod(remaining, batch_count)
        batches: list[tuple[int, ...]] = []
        start = 0
        for index in range(batch_count):
            end = start + size + (index < bigger)
            batches.append(tuple(range(start, end)))
            start = end
        rounds.append(tuple(batches))
        remaining = batch_count
    return tuple(rounds)


def plan_chunks(
    items: Sequence[SpanItem], *, budget_tokens: int, counter: TokenCounter, fan_in: int
) -> ChunkPlan:
    """Plan the map calls and merge rounds for ``items`` (in span order).

    One chunk when everything fits; else whole items are packed greedily into chunks of
    at most ``budget_tokens``, and an item bigger than that is first cut into parts.
    Every chunk's ``tokens`` is at most ``budget_tokens``.

    Raises:
        ContextOverflow: when ``budget_tokens`` is below ``MIN_CHUNK_TOKENS``.
    """
    if budget_tokens < MIN_CHUNK_TOKENS:
        raise ContextOverflow(
            f"chunk budget {budget_tokens} is below {MIN_CHUNK_TOKENS} tokens",
            reason="window_too_small",
        )
    chunks: tuple[Chunk, ...]
    if sum(item.tokens for item in items) <= budget_tokens:
        chunks = (Chunk(tuple(items)),) if items else ()
    else:
        pieces = [p for item in items for p in split_item(item, budget_tokens, counter)]
        chunks = _pack(pieces, budget_tokens)
    return ChunkPlan(chunks, plan_merge_tree(len(chunks), fan_in), budget_tokens)


def _pack(items: Sequence[SpanItem], budget_tokens: int) -> tuple[Chunk, ...]:
    chunks: list[Chunk] = []
    current: list[SpanItem] = []
    current_tokens = 0
    for item in items:
        if current and current_tokens + item.tokens > budget_tokens:
            chunks.append(Chunk(tuple(current)))
            current, current_tokens = [], 0
        current.append(item)
        current_tokens += item.tokens
    if current:
        chunks.append(Chunk(tuple(current)))
    return tuple(chunks)


def part_marker(part: int, parts: int, first_seq: int, last_seq: int) -> str:
    """Return the line that opens part ``part`` of a cut item."""
    seqs = f"seq {first_seq}" if first_seq == last_seq else f"seqs {first_seq}-{last_seq}"
    return f"[part {part}/{parts} of a long message, {seqs}]\n"


def split_item(item: SpanItem, budget_tokens: int, counter: TokenCounter) -> list[SpanItem]:
    """Cut an item bigger than ``budget_tokens`` into marked parts that each fit.

    The parts' texts, without their marker line, re-concatenate to the item's text.
    """
    if item.tokens <= budget_tokens:
        return [item]
    # Reserve room for the widest marker this item could get (n parts <= n characters).
    widest = len(item.text) or 1
    reserve = counter.count_text(part_marker(widest, widest, item.first_seq, item.last_seq))
    while True:
        pieces = split_text(item.text, budget_tokens - reserve, counter)
        parts = [_marked_part(item, number, pieces, counter) for number in range(len(pieces))]
        if all(part.tokens <= budget_tokens for part in parts):
            return parts
        # A marker and a piece counted together exceeded their sum: reserve more.
        reserve += MAX_TOKENS_PER_CHARACTER


def _marked_part(
    item: SpanItem, index: int, pieces: list[str], counter: TokenCounter
) -> SpanItem:
    marker = part_marker(index + 1, len(pieces), item.first_seq, item.last_seq)
    text = marker + pieces[index]
    return SpanItem(
        text, counter.count_text(text), item.first_seq, item.last_seq, index + 1, len(pieces)
    )


def split_text(text: str, budget_tokens: int, counter: TokenCounter) -> list[str]:
    """Cut ``text`` into consecutive pieces of at most ``budget_tokens`` each.

    A piece ends after its last line break, else after its last space, when that keeps
    at least half of it; else between two characters.
    """
    if budget_tokens < MAX_TOKENS_PER_CHARACTER:
        raise ValueError(f"a piece budget of {budget_tokens} tokens cannot hold a character")
    pieces: list[str] = []
    start = 0
    chars_per_token = float(CHARS_PER_TOKEN_GUESS)
    while start < len(text):
        end, tokens = _fitting_end(text, start, budget_tokens, counter, chars_per_token)
        soft_end = _soft_end(text, start, end)
        if soft_end != end and counter.count_text(text[start:soft_end]) <= budget_tokens:
            end = soft_end
        # The next piece is likely to be like this one: guess its length from this density.
        chars_per_token = max((end - start) / max(tokens, 1), 1 / MAX_TOKENS_PER_CHARACTER)
        pieces.append(text[start:end])
        start = end
    return pieces


def _fitting_end(
    text: str, start: int, budget_tokens: int, counter: TokenCounter, chars_per_token: float
) -> tuple[int, int]:
    """Return an end such that ``text[start:end]`` fits, and its tokens, from a guess
    refined by counts."""
    length = min(len(text) - start, max(1, int(budget_tokens * chars_per_token * 0.98)))
    tokens = counter.count_text(text[start:start + length])
    if tokens <= budget_tokens:
        if tokens > 0 and start + length < len(text) and tokens < budget_tokens * 0.9:
            # Text sparser than the guess: one proportional step up fills the piece.
            grown = min(len(text) - start, length * budget_tokens // tokens)
            grown_tokens = counter.count_text(text[start:start + grown])
            if grown > length and grown_tokens <= budget_tokens:
                return start + grown, grown_tokens
        return start + length, tokens
    while tokens > budget_tokens:
        length = max(1, min(length - 1, length * budget_tokens // tokens))
        tokens = counter.count_text(text[start:start + length])
    return start + length, tokens


def _soft_end(text: str, start: int, end: int) -> int:
    if end >= len(text):
        return end
    half = start + (end - start) // 2
    for separator in ("\n", " "):
        position = text.rfind(separator, half, end)
        if position >= 0:
            return position + 1
    return end
