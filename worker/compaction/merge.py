"""Merging the new span's summary into the prior one: the pipeline's merge step, once per
job, after the summarizer (which summarizes the span alone) and before validation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from worker.compaction.schema import LIST_SECTIONS, Summary, enforce_summary_budget
from worker.compaction.tokens import TokenCounter


def merge_summaries(prior: Summary | None, new: Summary, *, budget_tokens: int,
                    counter: TokenCounter) -> Summary:
    """Merge ``new`` into ``prior`` section by section, then fit ``budget_tokens``.

    Prior items come first, de-duplicated; pending items and remaining work that ``new``
    lists as resolved leave those sections (the resolved entry records them); the goal
    is the newer non-empty one. Over budget, the oldest items go first
    (:func:`enforce_summary_budget`). Without a prior, ``new`` is only fitted.
    """
    merged = new if prior is None else _merge_sections(prior, new)
    return enforce_summary_budget(merged, budget_tokens, counter)


def normalize_item(text: str) -> str:
    """Return the comparison key of an item: case-folded, spaces collapsed, no end dots."""
    return " ".join(text.split()).rstrip(".;:!").casefold()


def _merge_sections(prior: Summary, new: Summary) -> Summary:
    merged: dict[str, Any] = {"goal": new.goal or prior.goal}
    resolved_keys = [normalize_item(done) for done in new.resolved]
    for name in LIST_SECTIONS:
        items = _dedupe([*prior.items_of(name), *new.items_of(name)])
        if name in ("pending", "remaining_work"):
            items = [item for item in items if not _is_settled_by(item, resolved_keys)]
        merged[name] = items
    return Summary.model_validate(merged)


def _dedupe(items: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    kept: list[str] = []
    for item in items:
        key = normalize_item(item)
        if key not in seen:
            seen.add(key)
            kept.append(item)
    return kept


def _is_settled_by(item: str, resolved_keys: Sequence[str]) -> bool:
    """Tell whether a pending item is named by a resolved one (same text, or contained)."""
    key = normalize_item(item)
    # Containment needs some length: a short item like "refund" is inside too much.
    return any(key == done or (len(key) >= 12 and key in done) for done in resolved_keys)
