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
    LIST_SECTIONS,
    Summary,
    empty_summary,
    goal_line,
    item_line,
    render_summary_block,
)
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
# At a merge, the new span's items get this share of each section before prior items:
# otherwise a full prior summary outranks every new fact, round after round.
FRESH_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class FittedSummary:
    """A summary within its budget, with its rendered block and the block's token count."""

    summary: Summary
    text: str
    tokens: int


@dataclass(frozen=True, slots=True)
class _Section:
    name: str
    costs: tuple[int, ...]  # tokens of each item's line
    order: tuple[int, ...]  # item indexes, most worth keeping first
    fresh: frozenset[int]  # the new span's items (all of them outside a merge)


def fit_summary(summary: Summary, budget_tokens: int, counter: TokenCounter, *,
                prior_items: Mapping[str, AbstractSet[int]] | None = None) -> FittedSummary:
    """Return ``summary`` shrunk to fit ``budget_tokens``, rendered and counted.

    Long items are cut to ``ITEM_CAP_TOKENS`` and the goal to ``GOAL_CAP_TOKENS``; then
    each section keeps what fits its share of ``SECTION_WEIGHTS``. ``prior_items`` gives,
    per section, the indexes of the items that came from the prior summary: the others are
    the new span's and get ``FRESH_SHARE`` of the section first. Inside a share, relevant
    artifacts are kept in list order (a merge lists them ranked, newest first), other
    sections newest first. The goal is shortened only when no item fits. Deterministic.

    Raises:
        ValueError: the budget is below the block of an empty summary (headings alone).
    """
    floor_tokens = counter.count_text(render_summary_block(empty_summary()))
    if budget_tokens < floor_tokens:
        raise ValueError(f"summary budget {budget_tokens} is below the {floor_tokens}-token "
                         "block of an empty summary")
    capped, sections = _measure(summary, counter, prior_items or {})
    goal_tokens = _line_tokens(goal_line(capped.goal), counter)
    room_tokens = budget_tokens - floor_tokens + _line_tokens(goal_line(""), counter)
    kept = _select(sections, room_tokens - goal_tokens)
    fitted = _keep(capped, kept)
    text = render_summary_block(fitted)
    tokens = counter.count_text(text)
    # Line costs undercount only where tokens merge across lines: shed one item at a time.
    while tokens > budget_tokens and any(kept.values()):
        _shed_one(kept, sections)
        fitted = _keep(capped, kept)
        text = render_summary_block(fitted)
        tokens = counter.count_text(text)
    if tokens > budget_tokens:
        fitted = _fit_goal(fitted, budget_tokens, counter)
        text = render_summary_block(fitted)
        tokens = counter.count_text(text)
    return FittedSummary(fitted, text, tokens)


def _line_tokens(line: str, counter: TokenCounter) -> int:
    return counter.count_text(f"{line}\n")


def _measure(summary: Summary, counter: TokenCounter,
             prior_items: Mapping[str, AbstractSet[int]]) -> tuple[Summary, list[_Section]]:
    """Cap long items and the goal; cost every item's line once."""
    goal = summary.goal
    if _line_tokens(goal_line(goal), counter) > GOAL_CAP_TOKENS:
        goal = truncate_text(goal, GOAL_CAP_TOKENS, counter)
    capped: dict[str, Any] = {"goal": goal}
    sections: list[_Section] = []
    for name in LIST_SECTIONS:
        items, costs = [], []
        for item in summary.items_of(name):
            cost = _line_tokens(item_line(item), counter)
            if cost > ITEM_CAP_TOKENS:
                item = truncate_text(item, ITEM_CAP_TOKENS, counter)
                cost = _line_tokens(item_line(item), counter)
            items.append(item)
            costs.append(cost)
        capped[name] = items
        earlier = prior_items.get(name, frozenset())
        indexes = list(range(len(items)))
        if name != "relevant_artifacts":
            indexes.reverse()
        fresh = [index for index in indexes if index not in earlier]
        order = (*fresh, *(index for index in indexes if index in earlier))
        sections.append(_Section(name, tuple(costs), order, frozenset(fresh)))
    return Summary.model_validate(capped), sections


def _select(sections: Sequence[_Section], room_tokens: int) -> dict[str, dict[int, None]]:
    """Pick each section's items within its fair share, then spend what is left over."""
    shares = _share_out({s.name: sum(s.costs) for s in sections}, max(room_tokens, 0))
    # Per section, the kept item indexes in the order they were taken (an ordered set).
    kept: dict[str, dict[int, None]] = {s.name: {} for s in sections}
    used = {s.name: 0 for s in sections}
    for section in sections:
        share = shares[section.name]
        has_prior = len(section.fresh) < len(section.costs)
        fresh_cap = int(share * FRESH_SHARE) if has_prior else share
        # The new span's items to their reserve, prior items to the share, then any.
        for cap, fresh in ((fresh_cap, True), (share, False), (share, None)):
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
    for index in section.order:
        if index in kept or (fresh is not None and (index in section.fresh) != fresh):
            continue
        if used + section.costs[index] <= cap:
            kept[index] = None
            used += section.costs[index]
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


def _shed_one(kept: dict[str, dict[int, None]], sections: Sequence[_Section]) -> None:
    """Drop the least worth keeping item of the section that holds the most tokens."""
    costs = {s.name: s.costs for s in sections}
    fullest = max((name for name in kept if kept[name]),
                  key=lambda name: (sum(costs[name][i] for i in kept[name]),
                                    -SECTION_WEIGHTS[name]))
    kept[fullest].popitem()


def _keep(summary: Summary, kept: Mapping[str, Mapping[int, None]]) -> Summary:
    chosen: dict[str, Any] = {"goal": summary.goal}
    for name in LIST_SECTIONS:
        items = summary.items_of(name)
        chosen[name] = [items[index] for index in sorted(kept[name])]
    return Summary.model_validate(chosen)


def _fit_goal(summary: Summary, budget_tokens: int, counter: TokenCounter) -> Summary:
    """Return ``summary`` with the longest goal prefix that fits (the empty goal always does)."""
    low, high = 0, counter.count_text(summary.goal)
    while low < high:
        middle = (low + high + 1) // 2
        trial = summary.model_copy(update={"goal": truncate_text(summary.goal, middle, counter)})
        if counter.count_text(render_summary_block(trial)) <= budget_tokens:
            low = middle
        else:
            high = middle - 1
    return summary.model_copy(update={"goal": truncate_text(summary.goal, low, counter)})


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
