"""Whose an updated summary's items are: once a summary holds several parties, each
constraint and decision keeps the label of the party that stated it in every later update,
and an earlier party's open items stay open under its name, never closed by the next.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worker.compaction.parties import Party
from worker.compaction.requests import RequestLedger
from worker.compaction.schema import Summary

# Sections whose items say whose they are once a summary holds several parties.
PARTY_SECTIONS = ("constraints_and_preferences", "key_decisions")
# Open items an earlier party left: still open, but not the current party's to act on.
OPEN_SECTIONS = ("pending", "remaining_work")
LEFT_OPEN = "Left open by "
_LABEL = re.compile(r"\A\[party (?P<seq>\d+)(?:, (?P<identity>[^\]]*))?\] ")
_LEFT_OPEN = re.compile(rf"\A{LEFT_OPEN}(?P<label>\[party [^\]]*\]): ")
# Where a prior that labels nothing began: its first span line (``fallback._describe_span``).
_FIRST_SEQ = re.compile(r"\bseq (?P<seq>\d+)\b")


@dataclass(frozen=True, slots=True)
class PartyTurn:
    """The span's parties (``find_parties``) and whether the prior's current party ended in
    it (the span starts another conversation): read once per job from its requests."""

    parties: tuple[Party, ...]
    prior_ended: bool


def read_party_turn(prior: Summary | None, ledger: RequestLedger) -> PartyTurn:
    """The span's party turn: the prior's party ended when the span states a new goal
    while a prior goal stood (the same signal the extractive summary settles by)."""
    return PartyTurn(ledger.parties, bool(prior and prior.goal and ledger.goal))


def left_open(item: str, label: str) -> str:
    """An earlier party's open item as the summary keeps it."""
    return f"{LEFT_OPEN}{label.strip()}: {item}"


def is_left_open(item: str) -> bool:
    """Whether ``item`` is an earlier party's open item (``left_open``)."""
    return bool(_LEFT_OPEN.match(item))


def label_of(item: str) -> str:
    """The party label ``item`` starts with ("" for none), as ``Party.label`` writes it."""
    found = _LABEL.match(item) or _LEFT_OPEN.match(item)
    if found is None:
        return ""
    return found.group(0) if found.re is _LABEL else found.group("label") + " "


def attribute_parties(prior: Summary | None, new: Summary, turn: PartyTurn,
                      is_settled: Callable[[str], bool]) -> tuple[Summary | None, Summary]:
    """``prior`` and ``new`` with their items labelled for the update, when the updated
    summary holds several parties (else unchanged): the prior's current party's items take
    its label when it ended, its open items that ``new`` does not settle (``is_settled``)
    become ``left_open``; the span's unlabelled items take the label of the party they
    belong to (the prior's current one while it goes on, else the span's latest); each
    goal names its party the same way."""
    several = len(turn.parties) > 1
    if prior is None:
        return None, _labelled(new, turn.parties[-1].label()) if several else new
    carried = current_label(prior)
    if not (turn.prior_ended or any(map(label_of, [prior.goal, *_party_items(prior)]))):
        return prior, new
    if turn.prior_ended:
        prior = _relabel(prior, carried, lambda item: not is_settled(item))
    if turn.parties and (several or not turn.prior_ended):
        # The span's first party goes on with the prior's current one, under its label.
        first = turn.parties[0].label()
        new = new.model_copy(update={name: [carried + item.removeprefix(first)
                                            if item.startswith(first) else item
                                            for item in new.items_of(name)]
                                     for name in PARTY_SECTIONS})
    newest = turn.parties[-1].label() if turn.prior_ended and turn.parties else carried
    return _labelled(prior, carried, goal_only=True), _labelled(new, newest)


def current_label(prior: Summary) -> str:
    """The label of the prior's current party: its goal's, else the latest party its items'
    labels name, else the one its first span line starts (a prior that labels nothing held
    one party)."""
    if label_of(prior.goal):
        return label_of(prior.goal)
    seqs = [(int(found.group("seq")), label_of(item)) for item in _party_items(prior)
            if (found := _LABEL.match(label_of(item)))]
    if seqs:
        return max(seqs)[1]
    starts = [int(m.group("seq")) for item in prior.completed_actions
              if (m := _FIRST_SEQ.search(item))]
    return Party(min(starts, default=1)).label()


def _labelled(summary: Summary, label: str, *, goal_only: bool = False) -> Summary:
    """``summary`` with ``label`` on its goal and, unless ``goal_only``, its unlabelled
    party items: the goal names the current party, so the next update reads its label
    there even while the party has stated no constraint or decision yet."""
    update: dict[str, Any] = {} if goal_only else _labelled_items(summary, label)
    if summary.goal and not label_of(summary.goal):
        update["goal"] = label + summary.goal
    return summary.model_copy(update=update)


def _labelled_items(summary: Summary, label: str) -> dict[str, list[str]]:
    """``summary``'s party sections with ``label`` on each item that has none."""
    return {name: [item if label_of(item) else label + item for item in summary.items_of(name)]
            for name in PARTY_SECTIONS}


def _party_items(summary: Summary) -> list[str]:
    return [item for name in (*PARTY_SECTIONS, *OPEN_SECTIONS) for item in summary.items_of(name)]


def _relabel(prior: Summary, label: str, is_open: Callable[[str], bool]) -> Summary:
    """The prior's unlabelled party items with ``label``; its open items ``left_open``."""
    update = _labelled_items(prior, label)
    update.update({name: [left_open(item, label) if is_open(item) and not is_left_open(item)
                          else item for item in prior.items_of(name)]
                   for name in OPEN_SECTIONS})
    return prior.model_copy(update=update)


def without_party(item: str) -> str:
    """``item`` without its party label or ``left_open`` prefix: the words as stated."""
    found = _LEFT_OPEN.match(item)
    item = item[found.end():] if found else item
    found = _LABEL.match(item)
    return item[found.end():] if found else item
