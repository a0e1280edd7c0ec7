"""Whose an updated summary's items are: once a summary holds several parties, each
constraint and decision keeps the label of the party that stated it in every later update,
and an earlier party's open items stay open under its name, never closed by the next.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

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
    goal names its party the same way (also with no prior, in a span of several)."""
    if prior is None:
        several = len(turn.parties) > 1
        return None, _with_goal_label(new, turn.parties[-1].label()) if several else new
    carried = current_label(prior)
    if not (turn.prior_ended or any(label_of(i) for i in _party_items(prior))):
        return prior, new
    if turn.prior_ended:
        prior = _relabel(prior, carried, lambda item: not is_settled(item))
    span_first = turn.parties[0].label() if turn.parties else ""
    goes_on = not turn.prior_ended or len(turn.parties) > 1
    newest = turn.parties[-1].label() if turn.prior_ended and turn.parties else carried
    updates = {name: [_relabelled(item, span_first, carried) if goes_on else item
                      for item in new.items_of(name)] for name in PARTY_SECTIONS}
    new = new.model_copy(update={name: [item if label_of(item) else newest + item
                                        for item in items] for name, items in updates.items()})
    # The goal names the current party: the next update reads its label there, even while
    # the party has stated no constraint or decision yet.
    return _with_goal_label(prior, carried), _with_goal_label(new, newest)


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


def _with_goal_label(summary: Summary, label: str) -> Summary:
    if not summary.goal or label_of(summary.goal):
        return summary
    return summary.model_copy(update={"goal": label + summary.goal})


def _party_items(summary: Summary) -> list[str]:
    return [item for name in (*PARTY_SECTIONS, *OPEN_SECTIONS) for item in summary.items_of(name)]


def _relabel(prior: Summary, label: str, is_open: Callable[[str], bool]) -> Summary:
    """The prior's unlabelled party items with ``label``; its open items ``left_open``."""
    update = {name: [item if label_of(item) else label + item for item in prior.items_of(name)]
              for name in PARTY_SECTIONS}
    update.update({name: [left_open(item, label) if is_open(item) and not is_left_open(item)
                          else item for item in prior.items_of(name)]
                   for name in OPEN_SECTIONS})
    return prior.model_copy(update=update)


def _relabelled(item: str, span_first: str, carried: str) -> str:
    """An item the span's first party stated, under the label of the party it continues."""
    return carried + item.removeprefix(span_first) if span_first and \
        item.startswith(span_first) else item



def without_party(item: str) -> str:
    """``item`` without its party label or ``left_open`` prefix: the words as stated."""
    found = _LEFT_OPEN.match(item)
    item = item[found.end():] if found else item
    found = _LABEL.match(item)
    return item[found.end():] if found else item
