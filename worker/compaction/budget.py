"""Fitting a summary into its token budget by section: each section gets a weighted fair
share so none can starve another, the items most worth keeping win inside a section, and
the block is rendered and counted once (per-line costs predict, one exact count confirms).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from worker.compaction.schema import (
    BLOCK_HEAD,
    BLOCK_TAIL,
    EMPTY_ITEM_SEGMENT,
    LIST_SECTIONS,
    SECTION_HEADS,
    Summary,
    block_segments,
    count_block_segments,
    empty_block_tokens,
    goal_line,
    is_packable,
    render_summary_block,
)
from worker.compaction.schema import item_line_texts as item_line_texts  # summary_update's import
from worker.compaction.tokens import TokenCounter

# Shares of the room left after the headings and the goal; a section that needs less
# than its share gives the rest to the others.
SECTION_WEIGHTS: dict[str, int] = {
    "constraints_and_preferences": 2,
    "completed_actions": 3,
    "key_decisions": 4,
    "resolved": 1,
    "pending": 3,
    "relevant_artifacts": 6,
    "remaining_work": 2,
}
ITEM_CAP_TOKENS = 96
GOAL_CAP_TOKENS = 160
# At a summary update, the new span's items get this share of each section before prior items:
# otherwise a full prior summary outranks every new fact, round after round. A quarter,
# not a half: a 20% growth's values fit in it, and a larger reserve spends the prior's
# room on the new span's least salient values (bench.fidelity compares the shares).
FRESH_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class SummaryBudget:
    """How many tokens a job's summary block may take: ``base_tokens``, growing by
    ``span_ratio`` of every span a summary takes in, up to ``max_tokens``.

    A fixed budget turns a long session into a contest the newest facts lose: 750 values
    a user or the agent must quote (a 200k-token customer session) need about 8,000 tokens
    listed bare. The prior block carries what earlier spans earned, so the budget follows
    everything the summary covers, not just the newest span, and never shrinks below what
    the prior block holds unless the ceiling says so.
    """

    base_tokens: int
    span_ratio: float = 0.0
    max_tokens: int | None = None  # None: base_tokens (a fixed budget)

    def __post_init__(self) -> None:
        if self.base_tokens <= 0 or self.span_ratio < 0:
            raise ValueError("base_tokens must be positive and span_ratio at least 0")
        if self.max_tokens is not None and self.max_tokens < self.base_tokens:
            raise ValueError("max_tokens must be at least base_tokens")

    def for_span(self, span_tokens: int, prior_summary_tokens: int = 0) -> int:
        """Return the budget of the summary that updates a prior block of
        ``prior_summary_tokens`` with a span of ``span_tokens``:
        clamp(prior + ratio * span, base, max)."""
        ceiling = self.base_tokens if self.max_tokens is None else self.max_tokens
        grown = prior_summary_tokens + int(span_tokens * self.span_ratio)
        return max(self.base_tokens, min(ceiling, grown))


@dataclass(frozen=True, slots=True)
class FittedSummary:
    """A summary within its budget, with its rendered block and the block's token count."""

    summary: Summary
    text: str
    tokens: int


@dataclass(frozen=True, slots=True)
class _Section:
    name: str
    lines: tuple[str, ...]  # each item's bullet line with its line break
    costs: tuple[int, ...]  # tokens of each item's line
    order: tuple[int, ...]  # item indexes, most worth keeping first
    fresh: frozenset[int]  # the new span's items (all of them outside an update)
    packable: tuple[bool, ...]  # each relevant artifact's ``is_packable`` (else empty)


def fit_summary(summary: Summary, budget_tokens: int, counter: TokenCounter, *,
                prior_items: Mapping[str, AbstractSet[int]] | None = None) -> FittedSummary:
    """Return ``summary`` shrunk to fit ``budget_tokens``, rendered and counted.

    Long items are cut to ``ITEM_CAP_TOKENS`` and the goal to ``GOAL_CAP_TOKENS``; then
    each section keeps what fits its share of ``SECTION_WEIGHTS``. ``prior_items`` gives,
    per section, the indexes of the items that came from the prior summary: the others are
    the new span's and get ``FRESH_SHARE`` of the section first. Inside a share, relevant
    artifacts are kept in list order (an update lists them ranked, newest first), other
    sections newest first. The goal is shortened only when no item fits. Deterministic.

    Raises:
        ValueError: the budget is below the block of an empty summary (headings alone).
    """
    floor_tokens = empty_block_tokens(counter)
    if budget_tokens < floor_tokens:
        raise ValueError(f"summary budget {budget_tokens} is below the {floor_tokens}-token "
                         "block of an empty summary")
    # The block is counted as its lines' counts added (``block_segments``), each line
    # encoded once: a block of at most N bytes (so at most N tokens) is counted as is; a
    # larger one only when its items' costs say it may fit, and otherwise goes straight to
    # choosing items by those costs.
    capped, lines = _capped(summary, counter)
    if not _surely_over_in_bytes(capped, lines, budget_tokens):
        segments = block_segments(capped, item_lines=lines)
        text = "".join(segments)
        if len(text.encode()) <= budget_tokens:
            return FittedSummary(capped, text, count_block_segments(segments, counter))
    sections = _measure(capped, lines, counter, prior_items or {})
    if _estimate(floor_tokens, sections) <= budget_tokens * _SURELY_OVER:
        whole = _counted(capped, lines, counter)
        if whole.tokens <= budget_tokens:
            return whole
    goal_tokens = _line_tokens(goal_line(capped.goal), counter)
    room_tokens = budget_tokens - floor_tokens + _line_tokens(goal_line(""), counter)
    kept = _select(sections, room_tokens - goal_tokens)
    fitted = _counted_keep(capped, kept, sections, counter)
    # Item costs undercount where tokens merge across items and by a bullet per artifact
    # line: shed the least worth keeping items until their costs cover the excess.
    while fitted.tokens > budget_tokens and any(kept.values()):
        _shed(kept, sections, fitted.tokens - budget_tokens)
        fitted = _counted_keep(capped, kept, sections, counter)
    if fitted.tokens > budget_tokens:
        fitted = _fit_goal(fitted, budget_tokens, counter)
    return fitted


def _line_tokens(line: str, counter: TokenCounter) -> int:
    return counter.count_text(f"{line}\n")


# Lines' costs can differ from the block's count by a few tokens (merges across items, a
# bullet per shared artifact line): only a block this far over by its lines' costs is
# taken as over without counting it whole, so a summary that fits is always returned as is.
_SURELY_OVER = 1.25


def _estimate(floor_tokens: int, sections: Sequence[_Section]) -> int:
    return floor_tokens + sum(sum(section.costs) for section in sections)


def _counted(summary: Summary, lines: Mapping[str, Sequence[str]], counter: TokenCounter,
             packable: Sequence[bool] | None = None) -> FittedSummary:
    """Render and count ``summary`` whose list sections' bullet lines are ``lines`` (and
    whose artifacts' ``is_packable`` are ``packable``, when given)."""
    segments = block_segments(summary, item_lines=lines, packable=packable)
    return FittedSummary(summary, "".join(segments), count_block_segments(segments, counter))


def _surely_over_in_bytes(capped: Summary, lines: Mapping[str, Sequence[str]],
                          budget_tokens: int) -> bool:
    """Whether the block surely takes more than ``budget_tokens`` bytes (so it may take
    more tokens), by a bound found without packing the artifacts' lines."""
    fixed = [BLOCK_HEAD, f"{goal_line(capped.goal)}\n", *SECTION_HEADS.values(), BLOCK_TAIL,
             *(EMPTY_ITEM_SEGMENT for name in LIST_SECTIONS if not lines[name])]
    every_line = "".join([*fixed, *(line for name in LIST_SECTIONS for line in lines[name])])
    # A shared artifact line ("- a, b\n") takes a byte less per value, at most, than a
    # line of each value's own ("- a\n").
    return len(every_line.encode()) - len(lines["relevant_artifacts"]) > budget_tokens


def _capped(summary: Summary, counter: TokenCounter) -> tuple[Summary, dict[str, list[str]]]:
    """Cut the goal and long items to their caps; return the summary with its list
    sections' bullet lines. A line of at most N bytes is at most N tokens, so only longer
    ones are encoded here."""
    goal = summary.goal
    if _over_cap(f"{goal_line(goal)}\n", GOAL_CAP_TOKENS, counter):
        goal = truncate_text(goal, GOAL_CAP_TOKENS, counter)
    capped: dict[str, Any] = {"goal": goal}
    lines: dict[str, list[str]] = {}
    for name in LIST_SECTIONS:
        items = summary.items_of(name)
        lines[name] = item_line_texts(items)
        # The common short ASCII line is let through without a call.
        capped[name] = [truncate_text(item, ITEM_CAP_TOKENS, counter)
                        if (len(line) > ITEM_CAP_TOKENS or not line.isascii())
                        and _over_cap(line, ITEM_CAP_TOKENS, counter) else item
                        for item, line in zip(items, lines[name], strict=True)]
    result = Summary.model_validate(capped)
    for name in LIST_SECTIONS:
        if result.items_of(name) != summary.items_of(name):
            lines[name] = item_line_texts(result.items_of(name))
    return result, lines


def _over_cap(text: str, cap_tokens: int, counter: TokenCounter) -> bool:
    """Whether a line (with its line break) takes more than ``cap_tokens`` tokens."""
    size = len(text) if text.isascii() else len(text.encode())
    return size > cap_tokens and counter.count_text(text) > cap_tokens


def _measure(capped: Summary, lines: Mapping[str, Sequence[str]], counter: TokenCounter,
             prior_items: Mapping[str, AbstractSet[int]]) -> list[_Section]:
    """Cost every (capped) item's line once and order each section's items."""
    sections: list[_Section] = []
    for name in LIST_SECTIONS:
        items = capped.items_of(name)
        costs = counter.count_lines(lines[name])
        packable: tuple[bool, ...] = ()
        if name == "relevant_artifacts":
            # On a shared line, ", " stands for the bullet's "-" and the line break.
            packable = tuple(map(is_packable, items))
            costs = [cost - shares for cost, shares in zip(costs, packable, strict=True)]
        earlier = prior_items.get(name, frozenset())
        indexes = list(range(len(items)))
        if name != "relevant_artifacts":
            indexes.reverse()
        fresh = [index for index in indexes if index not in earlier]
        order = (*fresh, *(index for index in indexes if index in earlier))
        sections.append(_Section(name, tuple(lines[name]), tuple(costs), order,
                                 frozenset(fresh), packable))
    return sections


def _select(sections: Sequence[_Section], room_tokens: int) -> dict[str, dict[int, None]]:
    """Pick each section's items within its fair share, then spend what is left over."""
    shares = _share_out({s.name: sum(s.costs) for s in sections}, max(room_tokens, 0))
    # Per section, the kept item indexes in the order they were taken (an ordered set).
    kept: dict[str, dict[int, None]] = {s.name: {} for s in sections}
    used = {s.name: 0 for s in sections}
    for section in sections:
        share = shares[section.name]
        # The new span's items to their reserve, prior items to the share, then any.
        # Without prior items the reserve is the share, and the passes after the first
        # would take nothing: what did not fit then fits no better with more used.
        phases = (((int(share * FRESH_SHARE), True), (share, False), (share, None))
                  if len(section.fresh) < len(section.costs) else ((share, True),))
        for cap, fresh in phases:
            used[section.name] = _take(section, kept[section.name], used[section.name], cap,
                                       fresh)
    left_tokens = max(room_tokens, 0) - sum(used.values())
    for section in sorted(sections, key=lambda s: -SECTION_WEIGHTS[s.name]):
        before = used[section.name]
        used[section.name] = _take(section, kept[section.name], before, before + left_tokens,
                                   None)
        left_tokens -= used[section.name] - before
    return kept


def _take(section: _Section, kept: dict[int, None], used: int, cap: int, fresh: bool | None
          ) -> int:
    """Add items in ``section.order`` while they fit ``cap``, only the new span's (``fresh``
    True), only the prior's (False) or any (None); return the tokens used."""
    order, costs, fresh_count = section.order, section.costs, len(section.fresh)
    # ``order`` lists the new span's items first.
    candidates = (order if fresh is None else order[:fresh_count] if fresh
                  else order[fresh_count:])
    for index in candidates:
        if index not in kept and used + costs[index] <= cap:
            kept[index] = None
            used += costs[index]
    return used


def _share_out(demands: Mapping[str, int], room_tokens: int) -> dict[str, int]:
    """Weighted max-min fair shares: whoever needs less than its share gets its need."""
    shares = {name: 0 for name in demands}
    open_ = {name for name, need in demands.items() if need > 0}
    left = room_tokens
    while open_:
        weight = sum(SECTION_WEIGHTS[name] for name in open_)
        fair = {name: left * SECTION_WEIGHTS[name] // weight for name in open_}
        satisfied = {name for name in open_ if demands[name] <= fair[name]}
        if not satisfied:
            shares.update(fair)
            break
        for name in satisfied:
            shares[name] = demands[name]
            left -= demands[name]
        open_ -= satisfied
    return shares


def _shed(kept: dict[str, dict[int, None]], sections: Sequence[_Section],
          excess_tokens: int) -> None:
    """Drop items, each the least worth keeping of the section that holds the most tokens,
    until the dropped items' costs reach ``excess_tokens`` (at least one item)."""
    costs = {s.name: s.costs for s in sections}
    held = {name: sum(costs[name][i] for i in kept[name]) for name in kept}
    freed = 0
    while freed < max(excess_tokens, 1) and any(kept.values()):
        fullest = max((name for name in kept if kept[name]),
                      key=lambda name: (held[name], -SECTION_WEIGHTS[name]))
        index, _ = kept[fullest].popitem()
        held[fullest] -= costs[fullest][index]
        freed += costs[fullest][index]


def _counted_keep(capped: Summary, kept: Mapping[str, Mapping[int, None]],
                  sections: Sequence[_Section], counter: TokenCounter) -> FittedSummary:
    """Render and count ``capped`` with only the ``kept`` items, from their measured lines.
    The items are ``capped``'s, validated already: the summary is built without again."""
    chosen: dict[str, Any] = {"goal": capped.goal}
    lines: dict[str, list[str]] = {}
    packable: list[bool] = []
    for section in sections:
        indexes = sorted(kept[section.name])
        items = capped.items_of(section.name)
        chosen[section.name] = [items[index] for index in indexes]
        lines[section.name] = [section.lines[index] for index in indexes]
        if section.packable:
            packable = [section.packable[index] for index in indexes]
    return _counted(Summary.model_construct(**chosen), lines, counter, packable)


def _fit_goal(fitted: FittedSummary, budget_tokens: int, counter: TokenCounter
              ) -> FittedSummary:
    """Return ``fitted`` with the longest goal prefix that fits (the empty goal always
    does): only the goal's line changes, so only its count is redone."""
    summary = fitted.summary
    rest_tokens = fitted.tokens - _line_tokens(goal_line(summary.goal), counter)
    low, high = 0, counter.count_text(summary.goal)
    while low < high:
        middle = (low + high + 1) // 2
        goal = truncate_text(summary.goal, middle, counter)
        if rest_tokens + _line_tokens(goal_line(goal), counter) <= budget_tokens:
            low = middle
        else:
            high = middle - 1
    shortened = summary.model_copy(update={"goal": truncate_text(summary.goal, low, counter)})
    text = render_summary_block(shortened)
    return FittedSummary(shortened, text,
                         rest_tokens + _line_tokens(goal_line(shortened.goal), counter))


def truncate_text(text: str, max_tokens: int, counter: TokenCounter) -> str:
    """Return ``text`` cut to about ``max_tokens`` at a word boundary, marked with "…"."""
    tokens = counter.encoding.encode_ordinary(text)
    if len(tokens) <= max_tokens:
        return text
    if max_tokens <= 1:
        return ""
    head = counter.encoding.decode_bytes(tokens[: max_tokens - 1]).decode("utf-8", "ignore")
    # Cutting at a space keeps identifiers whole: half an id is a wrong id.
    if " " in head.strip():
        head = head.rstrip().rsplit(" ", 1)[0]
    return head.rstrip() + "…"
