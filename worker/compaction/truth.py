"""The truth check: a summary of a span may report only what the span's record says. Each
call outcome it states (ok / failed) matches the classification of the original result; no
request it calls open was answered or acted on; no request it calls done is still open (the
open one, the goal the tail goes on with) unless the same words were asked and settled
before; no item is both open and done; every identifier it quotes occurs in the span or
the prior summary.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from itertools import accumulate

from worker.compaction.grouping import Group
from worker.compaction.identifier_rules import find_identifiers
from worker.compaction.identifiers import Artifact
from worker.compaction.messages import INSTRUCTION_ROLES, StoredMessage
from worker.compaction.outcomes import CallOutcome, CallStatus
from worker.compaction.party_items import without_party
from worker.compaction.requests import RequestLedger, read_span_requests
from worker.compaction.schema import LIST_SECTIONS, Summary
from worker.compaction.substrings import TextGrams
from worker.compaction.summary_update import normalize_item

OPEN_SECTIONS = ("pending", "remaining_work")
DONE_SECTIONS = ("completed_actions", "resolved")
# A request is quoted by its first words; fewer characters than this quote nothing.
QUOTE_WORDS = 8
MIN_QUOTE_CHARS = 20
MAX_NAMED = 5
# Up to this many values are searched in the texts one by one; more share a gram index.
MAX_PLAIN_SEARCHES = 16
# A call's outcome as a summary states it after the tool's name: "tool(args) → ok",
# "tool failed", "tool: succeeded".
_CLAIM = re.compile(
    r"(?:\((?P<args>[^()]*)\))?\s*(?:→|->|:)?\s*"
    r"(?P<word>ok|succeeded|successful|passed|failed|failing|errored)\b", re.IGNORECASE)
# Identifiers only: no outcome is stated there.
CLAIM_SECTIONS = tuple(name for name in LIST_SECTIONS if name != "relevant_artifacts")
_SAID_OK = frozenset({"ok", "succeeded", "successful", "passed"})
_LABEL = re.compile(r"\A[\w ]{1,40}:\s+")
_NO_RESULT = re.compile(r"\((?P<id>[^()\s]+)\) has no result yet")


@dataclass(frozen=True)
class Contradiction:
    """One thing a summary says that the record refutes: its kind and the identifiers
    (call ids, invented values) it concerns; never the summary's words."""

    kind: str
    ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class SpanRecord:
    """What the span's originals say, for the check: each call's outcome, the requests
    answered or acted on and those still open, the values the span and prior hold."""

    outcomes: tuple[CallOutcome, ...]
    settled_requests: tuple[str, ...]
    open_requests: tuple[str, ...]
    known_values: frozenset[str]
    messages: tuple[StoredMessage, ...]  # the span's, read only for values the index lacks
    prior_texts: tuple[str, ...] = ()  # the prior summary's goal and items
    prior_items: frozenset[str] = field(default_factory=frozenset)  # normalized, unlabelled
    # Quotes of the requests held open (the open one, the continued goal) that no request
    # answered or acted on shares: a done item quoting one can mean nothing settled.
    unsettled_quotes: tuple[str, ...] = ()

    def texts(self) -> Iterator[str]:
        """The span's texts and arguments, the outcomes' lines (read from the original
        results, which pruning may cut) and the prior summary's items."""
        yield from (m.message.text for m in self.messages)
        yield from (c.function.arguments for m in self.messages
                    for c in m.message.tool_calls or ())
        yield from (line for outcome in self.outcomes for line in outcome.lines)
        yield from self.prior_texts

    def unknown(self, values: Sequence[str]) -> list[str]:
        """The ``values`` neither the index nor the span's and prior's texts hold (whole or
        in part); the texts are read only for values the index lacks (a clipped one, a
        prior's)."""
        missing = [value for value in values if value not in self.known_values]
        if not missing:
            return []
        # A value cut short (a clipped line) is part of an indexed one.
        joined = "\n".join([*self.texts(), *self.known_values])
        if len(missing) > MAX_PLAIN_SEARCHES:
            grams = TextGrams(joined, asked=len(missing))
            return [value for value, held in zip(missing, grams.contains_each(missing),
                                                 strict=True) if not held]
        return [value for value in missing if value not in joined]


def read_record(span: Sequence[Group], *, outcomes: Sequence[CallOutcome],
                artifacts: Sequence[Artifact], prior: Summary | None,
                tail_continues: bool, ledger: RequestLedger | None = None) -> SpanRecord:
    """Read the span's record: ``outcomes`` classified from the original results,
    ``artifacts`` the identifiers ingest indexed from them (``span`` may be pruned);
    ``ledger`` the span's requests, when the caller has read them."""
    messages = [m for g in span for m in g.messages if m.message.role not in INSTRUCTION_ROLES]
    if ledger is None:
        ledger = read_span_requests(span, has_prior_goal=bool(prior and prior.goal),
                                    outcomes=outcomes, tail_continues=tail_continues)
    prior_items = [prior.goal, *(i for n in LIST_SECTIONS for i in prior.items_of(n))] \
        if prior else []
    return SpanRecord(
        outcomes=tuple(outcomes),
        settled_requests=tuple(r for r in (*ledger.answered, *ledger.acted_on)
                               if r not in ledger.open_requests),
        open_requests=ledger.open_requests,
        known_values=frozenset(a.value for a in artifacts),
        messages=tuple(messages),
        prior_texts=tuple(prior_items),
        prior_items=frozenset(normalize_item(without_party(item)) for item in prior_items),
        unsettled_quotes=_unsettled_quotes([a.text for a in ledger.held_open],
                                           [a.text for a in ledger.settled]))


def find_contradictions(summary: Summary, record: SpanRecord) -> list[Contradiction]:
    """Return what ``summary`` (of the span alone) says against ``record``; the prior's
    items it copies verbatim (the update contract), with or without their party's label
    (``party_items.attribute_parties``), are the prior's, not checked again."""
    items = {name: _new_items(summary.items_of(name), record.prior_items)
             for name in LIST_SECTIONS}
    bodies = _Bodies()
    return [*_false_outcomes(items, record), *_reopened(items, bodies, record),
            *_done_while_open(items, bodies, record), *_open_and_done(items, bodies, record),
            *_invented(summary, items, record)]


def describe_contradictions(found: Sequence[Contradiction]) -> str:
    """One line for the run row: counts per kind and the ids concerned, no content."""
    kinds = Counter(c.kind for c in found)
    parts = []
    for kind, count in kinds.items():
        ids = list(dict.fromkeys(i for c in found if c.kind == kind for i in c.ids))
        named = f" ({', '.join(ids[:MAX_NAMED])}{', ...' if len(ids) > MAX_NAMED else ''})" \
            if ids else ""
        parts.append(f"{kind} {count}{named}")
    return f"the summary contradicts the span's record: {'; '.join(parts)}"


def _false_outcomes(items: dict[str, list[str]], record: SpanRecord
                    ) -> Iterator[Contradiction]:
    """Outcomes stated for the span's calls that the classification refutes."""
    by_tool: dict[str, list[CallOutcome]] = {}
    for outcome in record.outcomes:
        by_tool.setdefault(outcome.tool, []).append(outcome)
    # Summaries repeat a claim (a tool run on the same file): each is judged once.
    judged: dict[tuple[str, str, bool], Contradiction | None] = {}
    for tool, claim in _claims([i for name in CLAIM_SECTIONS for i in items[name]], by_tool):
        key = (tool, claim.group("args") or "", claim.group("word").casefold() in _SAID_OK)
        if key not in judged:
            judged[key] = _judge_claim(by_tool[tool], *key[1:])
        if (found := judged[key]) is not None:
            yield found


def _judge_claim(calls: list[CallOutcome], args: str, said_ok: bool) -> Contradiction | None:
    """The contradiction a claim that the calls named by ``args`` ended ok (or failed)
    makes, if none of them did."""
    named = _narrowed(calls, args)
    wanted = CallStatus.SUCCEEDED if said_ok else CallStatus.FAILED
    if any(call.status is wanted for call in named):
        return None
    return Contradiction("false_outcome", tuple(c.call_id for c in named))


def _claims(items: Sequence[str], tools: Iterable[str]) -> list[tuple[str, re.Match[str]]]:
    """Each outcome ``items`` state right after the name of one of ``tools``, item by item
    (in each, tool by tool): each name is looked for in the items joined, one C scan,
    and a claim is read only within the item the name is in."""
    joined = "\n".join(items)
    # Where each item ends: the line break after it (or the text's end).
    ends = [end - 1 for end in accumulate(len(item) + 1 for item in items)]
    found: list[tuple[int, int, int, str, re.Match[str]]] = []
    for order, tool in enumerate(tools):
        at = joined.find(tool) if tool else -1
        while at >= 0:
            end = at + len(tool)
            index = bisect_left(ends, at)
            # No name char beside the name; a line break (an item's end) is none.
            whole = end <= ends[index] and not (at and _is_name_char(joined[at - 1])) \
                and not (end < len(joined) and _is_name_char(joined[end]))
            claim = _CLAIM.match(joined, end, ends[index]) if whole else None
            if claim:
                found.append((index, order, at, tool, claim))
            at = joined.find(tool, end)
    found.sort(key=lambda claim: claim[:3])
    return [(tool, claim) for *_, tool, claim in found]


def _is_name_char(char: str) -> bool:
    """``[\\w.-]``: what ``re``'s ``\\w`` is (alphanumeric or ``_``), without the engine."""
    return char.isalnum() or char in "_.-"


def _narrowed(calls: list[CallOutcome], args: str) -> list[CallOutcome]:
    """The calls whose arguments hold the values a claim names (all when none does); a
    value is read without its label (``order_id 1536995876``). Each distinct arguments'
    target is read once: a span runs one test file again and again."""
    values = [v for v in (v.strip().rsplit(" ", 1)[-1] for v in args.split(",")) if v]
    if not values:
        return calls
    holds: dict[str, bool] = {}
    named = []
    for call in calls:
        held = holds.get(call.arguments)
        if held is None:
            held = holds[call.arguments] = all(value in call.target for value in values)
        if held:
            named.append(call)
    return named or calls


def _reopened(items: dict[str, list[str]], bodies: Mapping[str, str], record: SpanRecord
              ) -> Iterator[Contradiction]:
    """Open items quoting a request the span answered or acted on; calls said to lack a
    result that has one."""
    open_items = [i for name in OPEN_SECTIONS for i in items[name]]
    if not open_items:
        return
    answered = {o.call_id for o in record.outcomes}
    settled = _quotes_of(record.settled_requests, among=record.open_requests)
    for item in open_items:
        if any(bodies[item].startswith(quote) for quote in settled):
            yield Contradiction("reopened_request")
        missing = _NO_RESULT.search(item)
        if missing and missing.group("id") in answered:
            yield Contradiction("reopened_call", (missing.group("id"),))


def _done_while_open(items: dict[str, list[str]], bodies: Mapping[str, str],
                     record: SpanRecord) -> Iterator[Contradiction]:
    """Done items quoting a request held open whose words nothing settled."""
    done = [i for name in DONE_SECTIONS for i in items[name]]
    # An item's body is part of its key, and its key part of the key of the items joined
    # (by a character that is not white space): a quote that one lacks is in no body.
    quotes = record.unsettled_quotes
    joined = normalize_item("\0".join(done)) if done and quotes else ""
    if not any(quote in joined for quote in quotes):
        return
    for item in done:
        if any(quote in bodies[item] for quote in quotes):
            yield Contradiction("done_while_open")


def _open_and_done(items: dict[str, list[str]], bodies: Mapping[str, str],
                   record: SpanRecord) -> Iterator[Contradiction]:
    """Items listed both as open and as done: the same words, or the same request."""
    open_items = [i for name in OPEN_SECTIONS for i in items[name]]
    if not open_items:
        return
    done_bodies = {bodies[i] for name in DONE_SECTIONS for i in items[name]}
    quotes = _quotes_of((*record.settled_requests, *record.open_requests))
    for item in open_items:
        body = bodies[item]
        quoted = [quote for quote in quotes if body.startswith(quote)]
        if body in done_bodies or any(d.startswith(q) for q in quoted for d in done_bodies):
            yield Contradiction("open_and_done")


def _invented(summary: Summary, items: dict[str, list[str]], record: SpanRecord
              ) -> Iterator[Contradiction]:
    """Identifiers the summary quotes that neither the span nor the prior holds (a
    relevant artifact the index lists as it is is not read again)."""
    listed = [i for i in items["relevant_artifacts"] if i not in record.known_values]
    text = "\n".join([summary.goal, *listed,
                      *(i for name in CLAIM_SECTIONS for i in items[name])])
    invented = record.unknown(list(dict.fromkeys(v for v, _ in find_identifiers(text))))
    if invented:
        yield Contradiction("invented_identifier", tuple(invented))


def _new_items(items: Sequence[str], prior_items: AbstractSet[str]) -> list[str]:
    """``items`` less those whose key, without a party label, is one of ``prior_items``."""
    if not prior_items:
        return list(items)
    return [item for item in items if normalize_item(without_party(item)) not in prior_items]


class _Bodies(dict[str, str]):
    """Each open or done item's key without its label ("answered: ", "open error: "), read
    on first use: most checks have nothing to compare (no open item, no request held
    open) and read none."""

    def __missing__(self, item: str) -> str:
        body = self[item] = _LABEL.sub("", normalize_item(item), count=1)
        return body


def _quotes_of(requests: Sequence[str], among: Sequence[str] = ()) -> list[str]:
    """How an item quotes each request: its body starts with the request's first words,
    normalized. A quote too short, or one that two distinct requests (of ``requests`` and
    ``among``) start with, tells nothing apart and is left out."""
    starts = Counter(_quote(r) for r in {*requests, *among})
    return [q for q in dict.fromkeys(map(_quote, requests))
            if len(q) >= MIN_QUOTE_CHARS and starts[q] == 1]


def _unsettled_quotes(held_open: Sequence[str], settled: Sequence[str]) -> tuple[str, ...]:
    """The quotes of ``held_open`` requests that no ``settled`` one shares: words asked
    again after an answer may be quoted as done for that answer."""
    taken = {_quote(request) for request in settled}
    return tuple(q for q in dict.fromkeys(map(_quote, held_open))
                 if len(q) >= MIN_QUOTE_CHARS and q not in taken)


def _quote(request: str) -> str:
    # Split no further than the quoted words: a request may be megabytes long.
    return normalize_item(" ".join(request.split(maxsplit=QUOTE_WORDS)[:QUOTE_WORDS]))

