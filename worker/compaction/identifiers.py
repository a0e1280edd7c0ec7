"""Verbatim identifiers (paths, error codes, ids, hashes, versions, URLs, tickets, tool
names): found once per message when it is stored (``identify_message``), then ranked
into a span's artifact index from those stored mentions (``collect_artifacts``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from worker.compaction import identifier_rules
from worker.compaction.identifier_rules import find_identifiers
from worker.compaction.messages import INSTRUCTION_ROLES, ChatMessage, Role, StoredMessage

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
    "search_text",
]

# Where an identifier occurred: what the user or the assistant said, what the assistant
# passed to a tool, or only what a tool returned.
SOURCES = ("user", "assistant", "tool_argument", "tool_output")
SAID_SOURCES = frozenset({"user", "assistant", "tool_argument"})


@dataclass(frozen=True, slots=True)
class Artifact:
    """One identifier of a span: its verbatim value, kind, occurrences, first and last
    position, and the ``SOURCES`` it occurred in."""

    value: str
    kind: str
    count: int
    first_seq: int
    last_seq: int
    sources: frozenset[str]

    @property
    def is_said(self) -> bool:
        """Whether the user or the assistant said it (in text or a tool call's arguments)."""
        return not self.sources.isdisjoint(SAID_SOURCES)


class Mention(NamedTuple):
    """An identifier's occurrences in one message from one source; stored per message
    at ingest as the JSON array ``[value, kind, source, count]``."""

    value: str
    kind: str
    source: str
    occurrences: int


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


def identify_message(message: ChatMessage) -> list[Mention]:
    """Return the identifiers of one message with their source, once per value and source.

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
    return [Mention(value, kind, source, count)
            for (value, kind, source), count in counts.items()]


def search_text(message: ChatMessage) -> str:
    """The text recall searches: the message's text, then each tool call's name and
    arguments, one per line."""
    calls = [f"{c.function.name} {c.function.arguments}" for c in message.tool_calls or ()]
    return "\n".join([message.text, *calls]) if calls else message.text


@dataclass(slots=True)
class _Tally:
    kind: str
    count: int
    mentions: int
    first_seq: int
    last_seq: int
    sources: frozenset[str]  # one of a few combinations, shared by every tally that has it


StoredMention = tuple[str, str, str, int]  # a Mention as the store hands it back


def collect_artifacts(mentions: Iterable[tuple[int, Iterable[StoredMention]]]) -> list[Artifact]:
    """Collect the stored mentions of a span, ``(seq, mentions)`` in seq order, into its
    artifacts, most important first.

    Rank: kind weight times (occurrences + occurrences outside tool results), so an id the
    user or agent spoke outranks one only listed in a search result; ties go to the
    earlier first occurrence.
    """
    tallies: dict[str, _Tally] = {}
    weights = KIND_WEIGHTS
    # Each artifact's sources are one of a few sets: shared, not a set of its own each
    # (~14k artifacts at 1M tokens, 216 bytes a set).
    shared = _SharedSources()
    # The loop runs once per stored mention (~30k at 1M tokens): kept inline.
    for seq, found in mentions:
        for value, kind, source, count in found:
            said = 0 if source == "tool_output" else count
            tally = tallies.get(value)
            if tally is None:
                tallies[value] = _Tally(kind, count, said, seq, seq, shared.of(source))
                continue
            tally.count += count
            tally.mentions += said
            if seq > tally.last_seq:
                tally.last_seq = seq
            if source not in tally.sources:
                tally.sources = shared.adding(tally.sources, source)
            if weights.get(kind, 0) > weights.get(tally.kind, 0):
                tally.kind = kind
    # A stable sort: equal keys stay in first-seen order.
    ranked = sorted(tallies.items(), key=lambda item: (
        -weights.get(item[1].kind, 1) * (item[1].count + item[1].mentions), item[1].first_seq))
    return [Artifact(value, t.kind, t.count, t.first_seq, t.last_seq, t.sources)
            for value, t in ranked]


class _SharedSources:
    """One frozenset per distinct combination of sources."""

    def __init__(self) -> None:
        self._sets: dict[frozenset[str], frozenset[str]] = {}

    def of(self, source: str) -> frozenset[str]:
        return self._share(frozenset((source,)))

    def adding(self, sources: frozenset[str], source: str) -> frozenset[str]:
        return self._share(sources | {source})

    def _share(self, sources: frozenset[str]) -> frozenset[str]:
        return self._sets.setdefault(sources, sources)


def dump_artifacts_json(artifacts: Iterable[Artifact]) -> str:
    """The artifacts as the JSON array a revision row stores, encoded straight from them:
    each one's object exists only while it is written. Artifacts share a few sets of
    sources (``collect_artifacts``): each set is sorted once."""
    sorted_sources: dict[frozenset[str], list[str]] = {}

    def artifact_object(artifact: Artifact) -> dict[str, Any]:
        sources = sorted_sources.get(artifact.sources)
        if sources is None:
            sources = sorted_sources[artifact.sources] = sorted(artifact.sources)
        return {"value": artifact.value, "kind": artifact.kind, "count": artifact.count,
                "first_seq": artifact.first_seq, "last_seq": artifact.last_seq,
                "sources": sources}

    return json.dumps(list(artifacts), default=artifact_object)


def extract_identifiers(messages: Sequence[StoredMessage]) -> list[Artifact]:
    """Find and rank the identifiers of messages that were never stored (tests, tools);
    a job ranks the mentions stored at ingest instead."""
    return collect_artifacts((m.seq, identify_message(m.message)) for m in messages)
