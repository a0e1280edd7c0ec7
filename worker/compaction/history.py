"""Facts before history: near the budget's ceiling the prior summary's completed and
resolved items are folded into grouped count lines per action and kind (twelve refund
calls that ended ok become one line with the count and their order ids), so the room
prose took goes to open items, decisions, constraints and identifiers.

A grouped line keeps the count and quotes every identifier its items quoted that no open
item, decision, constraint or the goal quotes (the prior's artifact list then drops it
rather than list it twice); it states no call outcome in the form the truth check reads as a
claim ("tool → ok"), and a later update folds it again with the next prior items.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from worker.compaction.fallback import ARROW, TIMES
from worker.compaction.identifier_rules import find_identifiers
from worker.compaction.number_labels import BARE_NUMBER, is_bare_number, label_number
from worker.compaction.schema import LIST_SECTIONS, Summary
from worker.compaction.substrings import TextGrams
from worker.compaction.tokens import TokenCounter

# Sections told as history: folded before any open item, decision, constraint or value.
FOLDED_SECTIONS = ("completed_actions", "resolved")
ARTIFACTS = "relevant_artifacts"
GROUPED = "Earlier: "
CONTINUED = " (continued)"
# A grouped line stays under the budget's per-item cap, which would cut a value in half.
MAX_LINE_TOKENS = 80

_GROUPED_LINE = re.compile(rf"\A{GROUPED}(?P<head>.+?)"
                           rf"(?: {TIMES}(?P<count>\d+)|{re.escape(CONTINUED)})"
                           r"(?:: (?P<values>.*))?\Z")
_SPAN_LINE = re.compile(r"\ACompacted seq (?P<first>\d+) to (?P<last>\d+): (?P<counts>.*) "
                        r"messages\Z")
_ROLE_COUNT = re.compile(r"(?P<count>\d+) (?P<role>\w+)")
# The extractive summary's call and look-up lines (``fallback._draft_actions``).
_CALL_LINE = re.compile(rf"\Acalled (?P<tool>[\w.-]+)\((?P<args>[^()]*)\){ARROW}"
                        r"(?P<said>ok|failed|unknown|no result yet)(?P<rest>.*)\Z", re.DOTALL)
_LOOKUP_LINE = re.compile(rf"\Alooked up with (?P<tool>[\w.-]+) {TIMES}(?P<count>\d+)"
                          r"(?: \((?P<values>.*)\))?\Z")
# Resolved items by the prefix the summarizers give them.
_RESOLVED_HEADS = (("Answered: ", "requests answered"), ("Acted on: ", "requests acted on"),
                   ("Fixed: ", "errors fixed"), ("Superseded: ", "decisions superseded"))
_OTHER_HEADS = {"completed_actions": "work reported done", "resolved": "items resolved"}


@dataclass
class _Group:
    count: int = 0
    values: dict[str, None] = field(default_factory=dict)  # in first-quoted order


@dataclass
class _Spans:
    first: int | None = None
    last: int = 0
    roles: dict[str, int] = field(default_factory=dict)


def fold_history(summary: Summary, prior_items: dict[str, set[int]], counter: TokenCounter
                 ) -> tuple[Summary, dict[str, set[int]]]:
    """Return ``summary`` with the prior's items of ``FOLDED_SECTIONS`` (``prior_items``:
    their indexes per section) folded into grouped lines ahead of the new span's items,
    and ``prior_items`` with the grouped lines' indexes in their place.

    A value a grouped line quotes leaves the prior's relevant artifacts: listed twice, it
    would take the room of a value listed nowhere else.
    """
    elsewhere = TextGrams("\n".join([summary.goal, *(
        item for name in LIST_SECTIONS if name not in (*FOLDED_SECTIONS, ARTIFACTS)
        for item in summary.items_of(name))]))
    update: dict[str, list[str]] = {}
    indexes = dict(prior_items)
    quoted: set[str] = set()
    for name in FOLDED_SECTIONS:
        items, earlier = summary.items_of(name), prior_items.get(name, set())
        grouped = _grouped_lines(name, [items[i] for i in sorted(earlier)], elsewhere,
                                 counter, quoted)
        update[name] = [*grouped, *(item for i, item in enumerate(items) if i not in earlier)]
        indexes[name] = set(range(len(grouped)))
    listed, earlier = summary.relevant_artifacts, prior_items.get(ARTIFACTS, set())
    update[ARTIFACTS] = [value for index, value in enumerate(listed)
                         if index not in earlier or _number_of(value) not in quoted]
    fresh_count = len(listed) - len(earlier)
    indexes[ARTIFACTS] = set(range(fresh_count, len(update[ARTIFACTS])))
    return summary.model_copy(update=update), indexes


def _grouped_lines(section: str, items: Sequence[str], elsewhere: TextGrams,
                   counter: TokenCounter, quoted: set[str]) -> list[str]:
    """The grouped lines of ``items``; adds the values they quote to ``quoted`` (each by
    ``_number_of``)."""
    spans = _Spans()
    groups: dict[str, _Group] = {}
    for item in items:
        if _add_span(spans, item):
            continue
        head, count, values = _read_item(section, item)
        group = groups.setdefault(head, _Group())
        group.count += count
        group.values.update(dict.fromkeys(v for v in values if not _is_held(v, elsewhere)))
    lines = [_span_line(spans)] if spans.first is not None else []
    for head, group in groups.items():
        quoted.update(map(_number_of, group.values))
        lines.extend(_split_line(head, group, counter))
    return lines


def _read_item(section: str, item: str) -> tuple[str, int, list[str]]:
    """An item's group head, how many it counts for and the identifiers it quotes."""
    if grouped := _GROUPED_LINE.match(item):
        values = grouped.group("values")
        return (grouped.group("head"), int(grouped.group("count") or 0),
                values.split(", ") if values else [])
    if call := _CALL_LINE.match(item):
        args = [value for value in call.group("args").split(", ") if value]
        return (f"calls to {call.group('tool')}, outcome {call.group('said')}", 1,
                [*args, *_quoted_values(call.group("rest"))])
    if lookup := _LOOKUP_LINE.match(item):
        values = lookup.group("values")
        return (f"looked up with {lookup.group('tool')}", int(lookup.group("count")),
                values.split(", ") if values else [])
    head = next((head for prefix, head in _RESOLVED_HEADS if item.startswith(prefix)),
                _OTHER_HEADS[section])
    return head, 1, _quoted_values(item)


def _quoted_values(text: str) -> list[str]:
    """The identifiers ``text`` quotes, and its bare 9-12 digit numbers (which the rules
    take for ids only beside some words), a number only with the label the text gives it:
    on a grouped line no word stands before it, and a bare number says nothing."""
    found = [value for value, _ in find_identifiers(text)]
    found += [number.group() for number in BARE_NUMBER.finditer(text)]
    quoted = (label_number(value, (text,)) if is_bare_number(value) else value
              for value in found)
    return list(dict.fromkeys(value for value in quoted if not is_bare_number(value)))


def _is_held(value: str, elsewhere: TextGrams) -> bool:
    """Whether the rest of the summary quotes ``value`` (a labelled number: its number)."""
    return elsewhere.contains(value) or elsewhere.contains(_number_of(value))


def _number_of(value: str) -> str:
    """A labelled number's number (``order_id 1536995876 (Desk Lamp)``), else ``value``."""
    words = value.split(" ")
    return next((word for word in words if is_bare_number(word)), value)


def _add_span(spans: _Spans, item: str) -> bool:
    """Fold a "Compacted seq A to B" line into one range; tell whether ``item`` was one."""
    span = _SPAN_LINE.match(item)
    if span is None:
        return False
    first, last = int(span.group("first")), int(span.group("last"))
    spans.first = first if spans.first is None else min(spans.first, first)
    spans.last = max(spans.last, last)
    for count in _ROLE_COUNT.finditer(span.group("counts")):
        role = count.group("role")
        spans.roles[role] = spans.roles.get(role, 0) + int(count.group("count"))
    return True


def _span_line(spans: _Spans) -> str:
    counts = ", ".join(f"{count} {role}" for role, count in spans.roles.items())
    return f"Compacted seq {spans.first} to {spans.last}: {counts} messages"


def _split_line(head: str, group: _Group, counter: TokenCounter) -> Iterable[str]:
    """The group's line, its values spread over continuation lines under the item cap."""
    line = f"{GROUPED}{head} {TIMES}{group.count}"
    used, quoted = counter.count_text(line), 0
    for value in group.values:
        cost = counter.count_text(value) + 1
        if quoted and used + cost > MAX_LINE_TOKENS:
            yield line
            line = f"{GROUPED}{head}{CONTINUED}"
            used, quoted = counter.count_text(line), 0
        line += f", {value}" if quoted else f": {value}"
        used, quoted = used + cost, quoted + 1
    yield line
