"""The fidelity benchmark's truth counts: a summary against the original messages it
covers and the verbatim tail after them. Outcome lines the originals refute, items both
open and done (the service's own truth check, ``worker.compaction.truth``), the goal listed
as answered or done while the tail goes on with it, and bare 9-12 digit numbers listed
without the label the text gave them. Pure functions over plain values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.compaction import (
    SessionFormat,
    StoredMessage,
    Summary,
    classify_calls,
    extract_identifiers,
    find_contradictions,
    group_items,
    group_messages,
    parse_message,
    read_item,
    read_record,
)
from worker.compaction.messages import INSTRUCTION_ROLES
from worker.compaction.number_labels import BARE_NUMBER
from worker.compaction.requests import continues_conversation, read_requests
from worker.compaction.schema import LIST_SECTIONS
from worker.compaction.summary_update import normalize_item

DONE_SECTIONS = ("completed_actions", "resolved")
# The goal is quoted by its first words; fewer characters than this quote nothing.
QUOTE_WORDS = 8
MIN_QUOTE_CHARS = 20
# Its label: a word right before it ("order 1234567890", "item_id: 1234567890",
# "get_order(1234567890") or a name in brackets right after ("1234567890 (laptop)").
_LABEL_BEFORE = re.compile(r"[A-Za-z][\w-]*[\s\"':=#(]{0,4}\Z")
_LABEL_AFTER = re.compile(r"\s*\([A-Za-z]")  # matched at the number's end


@dataclass(frozen=True)
class Untruths:
    """What one summary says against its originals, by kind."""

    false_outcomes: int = 0  # lines stating an outcome the originals refute
    open_and_done: int = 0  # items listed both as open and as done
    goal_answered_while_continued: int = 0  # 1 when the tail goes on with an answered goal
    bare_numbers: int = 0  # distinct 9-12 digit numbers standing alone in the summary
    unlabelled_numbers: int = 0  # of those, the ones no occurrence labels


def count_untruths(summary: Mapping[str, Any] | None, covered: Sequence[Mapping[str, Any]],
                   tail: Sequence[Mapping[str, Any]] = (),
                   session_format: SessionFormat = SessionFormat.CHAT) -> Untruths:
    """The summary against the originals it covers (``covered``, in seq order) and the
    verbatim tail after them (``tail``), items of ``session_format`` read through their
    neutral view."""
    if not summary:
        return Untruths()
    if session_format is SessionFormat.CHAT:
        stored = [StoredMessage(index + 1, parse_message(dict(body)), 0)
                  for index, body in enumerate([*covered, *tail])]
        spanned, after = stored[:len(covered)], stored[len(covered):]
        groups = group_messages(spanned)
    else:
        items = [read_item(session_format, index + 1, 0, dict(body))
                 for index, body in enumerate([*covered, *tail])]
        spanned = [message for item in items[:len(covered)] for message in item.messages]
        after = [message for item in items[len(covered):] for message in item.messages]
        groups = group_items(session_format, items[:len(covered)])
    record = read_record(groups, outcomes=classify_calls(groups),
                         artifacts=extract_identifiers(spanned), prior=None,
                         tail_continues=False)
    parsed = Summary.model_validate(dict(summary))
    found = find_contradictions(parsed, record)
    bare, unlabelled = count_bare_numbers(parsed)
    return Untruths(sum(c.kind == "false_outcome" for c in found),
                    sum(c.kind == "open_and_done" for c in found),
                    int(is_goal_answered_while_continued(parsed, spanned, after)),
                    bare, unlabelled)


def is_goal_answered_while_continued(summary: Summary, covered: Sequence[StoredMessage],
                                     tail: Sequence[StoredMessage]) -> bool:
    """Whether a done item (completed or resolved) quotes the request of the latest
    conversation the summary covers while the tail goes on with that conversation."""
    said = [m for m in covered if m.message.role not in INSTRUCTION_ROLES]
    if not continues_conversation(said, tail):
        return False
    goal = read_requests(said, has_prior_goal=False).goal
    quote = normalize_item(" ".join(goal.split()[:QUOTE_WORDS]))
    if len(quote) < MIN_QUOTE_CHARS:
        return False
    return any(quote in normalize_item(item)
               for name in DONE_SECTIONS for item in summary.items_of(name))


def count_bare_numbers(summary: Summary) -> tuple[int, int]:
    """The distinct bare 9-12 digit numbers in the summary, and how many of them no
    occurrence labels (a word right before, a bracketed name right after)."""
    labelled: dict[str, bool] = {}
    for item in [summary.goal, *(i for name in LIST_SECTIONS for i in summary.items_of(name))]:
        for match in BARE_NUMBER.finditer(item):
            has_label = bool(_LABEL_BEFORE.search(item, 0, match.start())
                             or _LABEL_AFTER.match(item, match.end()))
            labelled[match.group()] = labelled.get(match.group(), False) or has_label
    return len(labelled), sum(not value for value in labelled.values())
