"""Verbatim identifiers (paths, error codes, ids, hashes, versions, URLs, tickets, tool
names): found once per message when it is stored (``identify_message``), then ranked
into a span's artifact index from those stored mentions (``collect_artifacts``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any, NamedTuple

from worker.compaction import identifier_rules
from worker.compaction.identifier_rules import find_identifiers
from worker.compaction.messages import INSTRUCTION_ROLES, ChatMessage, Role, StoredMessage
from worker.compaction.schema import item_line_texts
from worker.compaction.tokens import TokenCounter

__all__ = [
    "KIND_WEIGHTS",
    "SAID_SOURCES",
    "SOURCES",
    "Artifact",
    "Mention",
    "StoredMention",
    "collect_artifacts",
    "dump_artifacts_json",
    "extract_identifiers",
    "find_identifiers",
    "identify_message",
    "noting_passed_values",
    "search_text",
]

# Where an identifier occurred: what the user or the assistant said, what the assistant
# passed to a tool, or only what a tool returned.
SOURCES = ("user", "assistant", "tool_argument", "tool_output")
SAID_SOURCES = frozenset({"user", "assistant", "tool_argument"})


@dataclass(slots=True)
class Artifact:
    """One identifier of a span: its verbatim value, kind, occurrences, first and last
    position, and the ``SOURCES`` it occurred in. A value, never changed once built; not
    frozen: a job builds one per value of its span (~14k at 1M tokens), and a frozen
    dataclass's ``__init__`` costs ~4x as much."""

    value: str
    kind: str
    count: int
    first_seq: int
    last_seq: int
    sources: frozenset[str]
    line_tokens: int | None = None  # its summary line's tokens as ingest counted them

    @property
    def is_said(self) -> bool:
        """Whether the user or the assistant said it (in text or a tool call's arguments)."""
        return not self.sources.isdisjoint(SAID_SOURCES)


class Mention(NamedTuple):
    """An identifier's occurrences in one message from one source; stored per message
    at ingest as the JSON array ``[value, kind, source, count, line_tokens]``.
    ``line_tokens``: the tokens of the value's bullet line in a summary block (``"- "``,
    the value, the line break), counted once at ingest so that no job encodes it again;
    None for a tool name (never listed), or where no counter was at hand (messages stored
    before it was kept have four fields)."""

    value: str
    kind: str
    source: str
    occurrences: int
    line_tokens: int | None = None


# Ranking weight per kind: how much losing one would hurt the agent that continues.
KIND_WEIGHTS: dict[str, int] = {
    "error": 5,
    "id": 4,
    "url": 3,
    "path": 3,
    "uuid": 3,
    "hash": 3,
    "ticket": 3,
    "email": 2,
    "phone": 2,
    "version": 2,
    "tool": 1,
}


def identify_message(message: ChatMessage, counter: TokenCounter | None = None
                     ) -> list[Mention]:
    """Return the identifiers of one message with their source, once per value and source,
    with their summary lines' token counts when a ``counter`` is given (ingest gives one;
    a ``TokenCounter.for_job`` counter counts a value repeated across messages once).

    Instruction messages yield none: the projection keeps them verbatim.
    """
    if message.role in INSTRUCTION_ROLES:
        return []
    is_output = message.role is Role.TOOL
    source = "tool_output" if is_output else message.role.value
    counts: Counter[tuple[str, str, str]] = Counter(
        (value, kind, source)
        for value, kind in identifier_rules.find_identifiers(message.text, said=not is_output)
    )
    for call in message.tool_calls or ():
        counts[(call.function.name, "tool", "tool_argument")] += 1
        counts.update((value, kind, "tool_argument")
                      for value, kind in identifier_rules.find_identifiers(
                          call.function.arguments))
    line_tokens: dict[str, int] = {}
    if counter is not None and counts:
        # One line per value, however many sources it has. Left uncounted: tool names (a
        # summary never lists them) and a value with a line break (not its own line).
        values = [value for value in dict.fromkeys(value for value, kind, _ in counts
                                                   if kind != "tool")
                  if "\n" not in value and "\r" not in value]
        line_tokens = dict(zip(values, counter.count_lines(item_line_texts(values)),
                               strict=True))
    return [Mention(value, kind, source, count, line_tokens.get(value))
            for (value, kind, source), count in counts.items()]


def search_text(message: ChatMessage) -> str:
    """The text recall searches: the message's text, then each tool call's name and
    arguments, one per line."""
    calls = [f"{c.function.name} {c.function.arguments}" for c in message.tool_calls or ()]
    return "\n".join([message.text, *calls]) if calls else message.text


StoredMention = tuple[str, str, str, int, int | None]  # a Mention as the store hands it back

# Each kind's name as one string, not one per artifact as the stored JSON decodes.
_KIND_NAMES = {kind: kind for kind in KIND_WEIGHTS}


def collect_artifacts(mentions: Iterable[tuple[int, Sequence[Sequence[Any]]]]
                      ) -> list[Artifact]:
    """Collect the stored mentions of a span, ``(seq, mentions)`` in seq order, into its
    artifacts, most important first. Each mention is ``[value, kind, source, count,
    line_tokens]``: a :data:`StoredMention`, or its JSON array decoded (four fields where
    stored before line counts were kept). An artifact's ``line_tokens`` is the first one
    its mentions carry.

    Rank: kind weight times (occurrences + occurrences outside tool results), so an id the
    user or agent spoke outranks one only listed in a search result; ties go to the
    earlier first occurrence.
    """
    # Per value: [value, kind, count, said count, first_seq, last_seq, sources,
    # line tokens].
    tallies: dict[str, list[Any]] = {}
    weights = KIND_WEIGHTS
    # Each artifact's sources are one of a few sets: shared, not a set of its own each
    # (~14k artifacts at 1M tokens, 216 bytes a set).
    shared = _SharedSources()
    # The loop runs once per stored mention (~30k at 1M tokens): kept inline, a list per
    # value rather than an object.
    for seq, found in mentions:
        if found and len(found[0]) < 5:  # one message's mentions share their shape
            found = [(*mention, None) for mention in found]
        for value, kind, source, count, line_tokens in found:
            said = 0 if source == "tool_output" else count
            tally = tallies.get(value)
            if tally is None:
                tallies[value] = [value, kind, count, said, seq, seq, shared.of(source),
                                  line_tokens]
                continue
            tally[2] += count
            tally[3] += said
            if tally[7] is None:  # first seen in a message stored before line counts
                tally[7] = line_tokens
            if seq > tally[5]:
                tally[5] = seq
            if source not in tally[6]:
                tally[6] = shared.adding(tally[6], source)
            if weights.get(kind, 0) > weights.get(tally[1], 0):
                tally[1] = kind
    ranked = list(tallies.values())
    # Values were first seen in seq order: a stable sort leaves equal scores in order of
    # first occurrence.
    ranked.sort(key=lambda tally: -weights.get(tally[1], 1) * (tally[2] + tally[3]))
    kinds = _KIND_NAMES
    return [Artifact(value, kinds.get(kind, kind), count, first_seq, last_seq, sources,
                     line_tokens)
            for value, kind, count, _, first_seq, last_seq, sources, line_tokens in ranked]


def noting_passed_values(mentions: Iterable[tuple[int, Sequence[Sequence[Any]]]],
                         passed: dict[int, tuple[str, ...]]
                         ) -> Iterator[tuple[int, Sequence[Sequence[Any]]]]:
    """Hand ``mentions`` on as they come (to ``collect_artifacts``), noting in ``passed``
    each indexed message's values found in its tool calls' arguments (none where it made
    no call): what a call passed is read from its own message's index, not tried against
    every value of the span."""
    for seq, found in mentions:
        passed[seq] = tuple(dict.fromkeys(
            mention[0] for mention in found
            if mention[2] == "tool_argument" and mention[1] != "tool"))
        yield seq, found


class _SharedSources:
    """One frozenset per distinct combination of sources."""

    def __init__(self) -> None:
        self._sets: dict[frozenset[str], frozenset[str]] = {}
        self._single: dict[str, frozenset[str]] = {}

    def of(self, source: str) -> frozenset[str]:
        sources = self._single.get(source)
        if sources is None:
            sources = self._single[source] = self._share(frozenset((source,)))
        return sources

    def adding(self, sources: frozenset[str], source: str) -> frozenset[str]:
        return self._share(sources | {source})

    def _share(self, sources: frozenset[str]) -> frozenset[str]:
        return self._sets.setdefault(sources, sources)


def dump_artifacts_json(artifacts: Iterable[Artifact]) -> str:
    """The artifacts as the JSON array a revision row stores: the text ``json.dumps``
    gives of their objects, written straight from them, without a dict per artifact
    (half the time at ~14k artifacts). Artifacts share a few sets of sources
    (``collect_artifacts``): each set is encoded once."""
    encoded_sources: dict[frozenset[str], str] = {}

    def sources_json(sources: frozenset[str]) -> str:
        encoded = encoded_sources.get(sources)
        if encoded is None:
            encoded = encoded_sources[sources] = json.dumps(sorted(sources))
        return encoded

    encode = encode_basestring_ascii
    return "[" + ", ".join([
        f'{{"value": {encode(a.value)}, "kind": {encode(a.kind)}, "count": {a.count:d}, '
        f'"first_seq": {a.first_seq:d}, "last_seq": {a.last_seq:d}, '
        f'"sources": {sources_json(a.sources)}}}'
        for a in artifacts]) + "]"


def extract_identifiers(messages: Sequence[StoredMessage]) -> list[Artifact]:
    """Find and rank the identifiers of messages that were never stored (tests, tools);
    a job ranks the mentions stored at ingest instead."""
    return collect_artifacts((m.seq, identify_message(m.message)) for m in messages)
