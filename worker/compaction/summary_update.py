"""Updating the prior summary with the new span's: the pipeline's summary update, once per
job, after the summarizer (which summarizes the span alone) and before validation.

The contract both summarizers write to (the LLM prompt states it, the extractive
summarizer follows it): the span's summary names, verbatim in ``resolved``, each prior
item the span settled (an answered request, a fixed error, a superseded decision or
goal), and its goal is the goal as it stands now.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from worker.compaction.budget import FittedSummary, fit_summary, item_line_texts
from worker.compaction.history import fold_history
from worker.compaction.identifiers import Artifact
from worker.compaction.party_items import PartyTurn, attribute_parties
from worker.compaction.schema import LIST_SECTIONS, Summary
from worker.compaction.substrings import TextGrams
from worker.compaction.tokens import TokenCounter

# Prior items a resolved entry can close; resolved and completed work stay as history.
CLOSABLE_SECTIONS = frozenset({"pending", "remaining_work", "key_decisions"})
# History ages out first under the budget: an identifier only history mentions is listed
# in relevant_artifacts too.
HISTORY_SECTIONS = frozenset({"completed_actions", "resolved", "remaining_work"})
MIN_ARTIFACT_TOKENS = 3


@dataclass(frozen=True, slots=True)
class UpdatedSummary:
    """The updated summary within budget, rendered and counted, and the identifiers the
    update re-attached to relevant_artifacts (a bare number held without its label counts:
    it is listed again with it)."""

    fitted: FittedSummary
    reattached: tuple[str, ...]

    @property
    def summary(self) -> Summary:
        return self.fitted.summary


def update_summary(prior: Summary | None, new: Summary, *, budget_tokens: int,
                   counter: TokenCounter, identifiers: Sequence[str] = (),
                   labels: Mapping[str, str] | None = None,
                   tool_numbers: Collection[str] = (),
                   parties: PartyTurn | None = None) -> UpdatedSummary:
    """Update ``prior`` with ``new`` section by section, then fit ``budget_tokens``.

    Prior items come first, de-duplicated; prior items of ``CLOSABLE_SECTIONS`` that a
    resolved entry of ``new`` names leave (the resolved entry records them); the goal is
    the newer non-empty one. ``identifiers`` (most salient first) that the updated text
    lacks, or holds only in history that ages out first (``HISTORY_SECTIONS``), join the
    new span's artifacts. Artifacts list the new span's first (the indexed values the
    summarizer listed or left out, most salient first, then its other items), then the
    prior's, so the list reads newest and most salient first: an LLM's listing order
    decides nothing the index ranks. ``labels``: the span's bare numbers with the label
    the text gave them (``number_labels.label_number``), listed so. The budget is shared
    by section, the new span's items first up to their reserved share
    (:func:`fit_summary`); when they do not all fit, the prior's completed and resolved
    items are first folded into grouped count lines (``history.fold_history``).
    ``tool_numbers``: the span's bare numbers only a tool returned (a catalogue's item
    ids), listed after the prior's values: they say nothing of what they are, so they
    age out before any earlier value that does. ``parties``: the span's party turn
    (``party_items.read_party_turn``): once the summary holds several parties, every
    constraint and decision keeps its party's label, and an earlier party's open items the
    span does not settle stay open under its name (``party_items.attribute_parties``).
    """
    keys = _ItemKeys()
    if parties is not None:
        resolved_keys = [keys[done] for done in new.resolved]
        prior, new = attribute_parties(prior, new, parties,
                                       lambda item: _is_settled_by(keys[item], resolved_keys))
    updated = new if prior is None else _update_sections(prior, new, keys)
    wanted = _wanted(identifiers)
    known = TextGrams("\n".join([updated.goal, *(item for name in LIST_SECTIONS
                                                 if name not in HISTORY_SECTIONS
                                                 for item in updated.items_of(name))]),
                      asked=len(wanted))
    listed_as = labels or {}
    # A bare number the text holds without its label is missing its label.
    held = known.contains_each([listed_as.get(value, value) for value in wanted])
    missing = list(islice((value for value, is_held in zip(wanted, held, strict=True)
                           if not is_held), _most_listed(budget_tokens)))
    # The span's indexed values lead in salience order, whichever summarizer listed them
    # or left them out; the summarizer's other items follow.
    listed = {keys[item] for item in new.relevant_artifacts}
    leading = [value for value in wanted if keys[value] in listed]
    earlier = prior.relevant_artifacts if prior else []
    fresh = _dedupe([*_in_order(leading, missing, wanted), *new.relevant_artifacts], keys)
    trailing = [listed_as.get(value, value) for value in fresh if value in tool_numbers]
    fresh = [value for value in fresh if value not in tool_numbers]
    if labels:
        fresh = _dedupe([labels.get(value, value) for value in fresh], keys)
    artifacts = _dedupe([*fresh, *earlier, *trailing], keys)
    updated = updated.model_copy(update={"relevant_artifacts": artifacts})
    prior_items = _prior_items(prior, updated, len(fresh), keys)
    fitted = fit_summary(updated, budget_tokens, counter, prior_items=prior_items)
    if prior is not None and _drops_items(updated, fitted.summary):
        # Facts before history: the prior's completed and resolved items are folded into
        # grouped lines before any item of another section is dropped to fit.
        folded, prior_items = fold_history(updated, prior_items, counter)
        fitted = fit_summary(folded, budget_tokens, counter, prior_items=prior_items)
    kept = set(fitted.summary.relevant_artifacts)
    return UpdatedSummary(fitted, tuple(value for value in missing
                                        if listed_as.get(value, value) in kept))


def count_identifier_lines(identifiers: Sequence[str], counter: TokenCounter, *,
                           budget_tokens: int) -> None:
    """Count the lines the update costs ``identifiers`` by, before it runs: into a job's
    counter (``TokenCounter.for_job``), which the update then reads them from. A summarizer
    calls it while it waits on the model (the counts do not depend on the draft). Only the
    first values a ``budget_tokens`` summary could list are counted (~5.5k of ~14k at 1M
    tokens): the update counts any other it costs itself, as it would have."""
    wanted = _wanted(identifiers)[:_most_listed(budget_tokens)]
    counter.count_lines(item_line_texts(wanted))


def use_stored_line_counts(artifacts: Iterable[Artifact], counter: TokenCounter, *,
                           budget_tokens: int) -> None:
    """Give a job's counter (``TokenCounter.for_job``) the line counts ingest stored for
    the first ``artifacts`` (most salient first, tool names left out) a ``budget_tokens``
    summary could list: the draft's fit, the count ahead and the update then encode none
    of those lines. Only that many: the counts are held to the job's end (~5.5k of ~14k
    values at 1M tokens); the update counts any other it costs itself."""
    counted = [(artifact.value, artifact.line_tokens)
               for artifact in islice(artifacts, _most_listed(budget_tokens))
               if artifact.line_tokens is not None]
    # Keyed by the line ingest counted (``item_line_texts``, as ``identify_message``).
    counter.use_line_counts(zip(item_line_texts([value for value, _ in counted]),
                                (tokens for _, tokens in counted), strict=True))


def _most_listed(budget_tokens: int) -> int:
    """How many identifiers a block of ``budget_tokens`` could list at most: a listed one
    costs at least ``MIN_ARTIFACT_TOKENS``."""
    return budget_tokens // MIN_ARTIFACT_TOKENS


def _drops_items(summary: Summary, fitted: Summary) -> bool:
    """Whether fitting the budget left out any of ``summary``'s items."""
    return any(len(fitted.items_of(name)) < len(summary.items_of(name))
               for name in LIST_SECTIONS)


def _wanted(identifiers: Sequence[str]) -> list[str]:
    """The identifiers as the update lists them: stripped, non-empty, each once."""
    return [value for value in dict.fromkeys(value.strip() for value in identifiers) if value]


def _in_order(first: Sequence[str], second: Sequence[str], order: Sequence[str]) -> list[str]:
    """The values of ``first`` and ``second`` in the order ``order`` lists them."""
    chosen = {*first, *second}
    return [value for value in order if value in chosen]


def normalize_item(text: str) -> str:
    """Return the comparison key of an item: case-folded, spaces collapsed, no end dots.
    A text without whitespace (an identifier: most keys a job compares) is not split: no
    printable character but the space is whitespace."""
    if " " not in text and text.isprintable():
        return text.rstrip(".;:!").casefold()
    return " ".join(text.split()).rstrip(".;:!").casefold()


class _ItemKeys(dict[str, str]):
    """Each item's ``normalize_item`` key, computed on first use: an update compares the
    span's identifiers (~14k at 1M tokens) three times."""

    def __missing__(self, item: str) -> str:
        key = self[item] = normalize_item(item)
        return key


def _update_sections(prior: Summary, new: Summary, keys: _ItemKeys) -> Summary:
    updated: dict[str, Any] = {"goal": new.goal or prior.goal}
    resolved_keys = [keys[done] for done in new.resolved]
    for name in LIST_SECTIONS:
        earlier = prior.items_of(name)
        if name in CLOSABLE_SECTIONS:
            earlier = [item for item in earlier
                       if not _is_settled_by(keys[item], resolved_keys)]
        updated[name] = _dedupe([*earlier, *new.items_of(name)], keys)
    return Summary.model_validate(updated)


def _prior_items(prior: Summary | None, updated: Summary, fresh_artifacts: int,
                 keys: _ItemKeys) -> dict[str, set[int]]:
    """The indexes of each updated section's items that came from the prior summary (an
    artifact the new span named again counts as the span's)."""
    if prior is None:
        return {}
    items: dict[str, set[int]] = {}
    for name in LIST_SECTIONS:
        earlier = {keys[item] for item in prior.items_of(name)}
        items[name] = {index for index, item in enumerate(updated.items_of(name))
                       if keys[item] in earlier}
    items["relevant_artifacts"] = set(range(fresh_artifacts, len(updated.relevant_artifacts)))
    return items


def _dedupe(items: Sequence[str], keys: _ItemKeys) -> list[str]:
    seen: set[str] = set()
    kept: list[str] = []
    for item in items:
        key = keys[item]
        if key not in seen:
            seen.add(key)
            kept.append(item)
    return kept


def _is_settled_by(key: str, resolved_keys: Sequence[str]) -> bool:
    """Tell whether a prior item's key is named by a resolved one (same, or contained)."""
    # Containment needs some length: a short item like "refund" is inside too much.
    return any(key == done or (len(key) >= 12 and key in done) for done in resolved_keys)
