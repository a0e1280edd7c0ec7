"""Salience: what a summary shows first, ranked by what the agent that continues needs
rather than by how often a value repeats.

Tiers, most salient first: values that ended a tool call or a test run and values the
caller features (decisions, open requests); values a user or the assistant said; values
only a tool returned (bare numbers last); tool names. Within a tier an error code leads,
then the newest value, then the rarer one: a code seen once outranks an id a search
listed fifty times.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from worker.compaction.grouping import Group
from worker.compaction.identifiers import Artifact
from worker.compaction.messages import Role
from worker.compaction.substrings import TextGrams

# A failing tool says so up front ("Error: ...", {"error": ...}, a traceback); a word
# like "failed" deep in a log or a test report ("0 failed") is not a failure of the call.
_FAILED_LEAD = re.compile(
    r'(?i:\A\s*(?:\{\s*"(?:error|errors)"|(?:error|failed|failure|fatal|exception|traceback)\b))'
)
# A test run or a build says how it ended on its last line ("2 failed, 3 passed", "exit
# code 1", "FAILED tests/...", "ValueError: ..."); the lines just above carry the codes.
_FAILED_END = re.compile(
    r"(?i:\b[1-9]\d* (?:failed|errors?)\b|\bexit (?:code|status):? *[1-9]\d*\b)"
    r"|\bFAILED\b|\A\w*(?:Error|Exception)\b:"
)
_FAILURE_DETAIL = re.compile(r"\bFAILED\b|\bERROR\b|\w*(?:Error|Exception)\b:|\bE\d{3,5}\b")
TAIL_LINES = 3


@dataclass(frozen=True, slots=True)
class Failure:
    """A tool call that ended in an error: its call id, tool, seq and the lines that say so."""

    call_id: str
    tool: str
    seq: int
    lines: tuple[str, ...]


def find_failures(span: Sequence[Group]) -> list[Failure]:
    """Return the span's tool results that report a failure, in order."""
    failures: list[Failure] = []
    for group in span:
        for stored in group.messages:
            message = stored.message
            if message.role is not Role.TOOL:
                continue
            lines = failing_lines(message.text)
            if lines:
                call_id = message.tool_call_id or ""
                tool = message.name or _called_tool(group, call_id)
                failures.append(Failure(call_id, tool, stored.seq, lines))
    return failures


def _called_tool(group: Group, call_id: str) -> str:
    """The function a call of ``group`` named, looked up only for a failed result (few)."""
    names = {c.id: c.function.name for m in group.messages for c in m.message.tool_calls or ()}
    return names.get(call_id, "a tool")


def failing_lines(text: str) -> tuple[str, ...]:
    """Return the lines of a tool result that say it failed (none when it did not)."""
    leads = _FAILED_LEAD.match(text) is not None
    if not leads:
        # Most results did not fail: their last line alone says so.
        last = _last_line(text)
        if last is not None and not (last and _ends_in_failure(last)):
            return ()
    tail = _last_lines(text, TAIL_LINES)  # the non-blank lines' last TAIL_LINES, stripped
    if not tail:
        return ()
    if leads:
        first = _first_line(text)
        # tail holds every line but the first only when there are at most TAIL_LINES.
        return (first, *tail[1 if len(tail) < TAIL_LINES else 0:][-TAIL_LINES + 1:])
    if not _ends_in_failure(tail[-1]):
        return ()
    details = [line for line in tail[:-1] if _FAILURE_DETAIL.search(line)]
    return (*details, tail[-1])


def _ends_in_failure(line: str) -> bool:
    """Whether ``line`` says a run failed (``_FAILED_END``), the pattern searched only in a
    line that holds one of the words it needs (a JSON log line's "error" key is not one)."""
    if line.isascii():
        # Every match holds one of these, one per branch of the pattern. Only for ASCII: in
        # a case-insensitive pattern "i" also matches the dotless "\u0131", which
        # ``str.lower`` keeps apart.
        lowered = line.lower()
        if not (" failed" in lowered or " error" in lowered or "exit " in lowered
                or "FAILED" in line or "Error:" in line or "Exception:" in line):
            return False
    return _FAILED_END.search(line) is not None


# A tool result can be megabytes: its first and last lines are read from growing slices
# of its ends, never by splitting all of it. A slice's cut line is dropped (splitlines
# on the rest gives the whole text's lines, a cut inside "\r\n" leaving only a blank).
_SLICE_CHARS = 2_048
_SHORT_SLICE_CHARS = 256


def _last_lines(text: str, count: int) -> list[str]:
    size = _SLICE_CHARS
    while True:
        whole = size >= len(text)
        parts = text.splitlines() if whole else text[-size:].splitlines()[1:]
        lines = [line.strip() for line in parts if line.strip()]
        if whole or len(lines) >= count:
            return lines[-count:]
        size *= 4


def _last_line(text: str) -> str | None:
    """The last non-blank line, stripped ("" when there is none), from a last slice of
    the text, a short one first (most last lines are short); None when the longer slice
    does not hold it whole."""
    for size in (_SHORT_SLICE_CHARS, _SLICE_CHARS):
        whole = len(text) <= size
        lines = (text if whole else text[-size:]).rstrip().splitlines()
        if whole or len(lines) > 1:
            return lines[-1].strip() if lines else ""
    return None


def _first_line(text: str) -> str:
    size = _SLICE_CHARS
    while True:
        whole = size >= len(text)
        parts = text.splitlines() if whole else text[:size].splitlines()[:-1]
        for line in parts:
            if line.strip():
                return line.strip()
        if whole:
            return ""
        size *= 4


def failure_values(failures: Sequence[Failure], artifacts: Sequence[Artifact]) -> frozenset[str]:
    """Return the span's error codes on the lines that ended a failed call: the stored
    index says which values are codes, so no line is scanned for identifiers again."""
    lines = "\n".join(line for failure in failures for line in failure.lines)
    return frozenset(a.value for a in artifacts if a.kind == "error" and a.value in lines)


def featured_values(failures: Sequence[Failure], texts: Sequence[str],
                    artifacts: Sequence[Artifact]) -> frozenset[str]:
    """Return the values that lead the ranking: the error codes that ended a call, and the
    span's identifiers that ``texts`` (a summary's decisions and open requests) name."""
    named = TextGrams("\n".join(texts), asked=len(artifacts))
    return failure_values(failures, artifacts) | {
        a.value for a in artifacts if a.kind != "tool" and named.contains(a.value)}


def rank_artifacts(artifacts: Sequence[Artifact], *, featured: Collection[str] = ()
                   ) -> tuple[Artifact, ...]:
    """Return ``artifacts`` most salient first (see the module's tiers); deterministic."""
    return tuple(sorted(artifacts, key=lambda artifact: _salience_key(artifact, featured)))


def rerank_featured(ranked: Sequence[Artifact], featured: Collection[str]
                    ) -> tuple[Artifact, ...]:
    """Return ``rank_artifacts(ranked, featured=featured)`` for ``ranked`` already ranked
    with a subset of ``featured``: only the featured values change tier (to the first),
    so they are sorted and the rest keep their order. A job ranks its span's artifacts
    once (~1.5k at 100k tokens) and features a draft's values after."""
    lead = [a for a in ranked if a.kind != "tool" and a.value in featured]
    leading = {id(a) for a in lead}
    return (*sorted(lead, key=lambda artifact: _salience_key(artifact, featured)),
            *(a for a in ranked if id(a) not in leading))


def _salience_key(artifact: Artifact, featured: Collection[str]
                  ) -> tuple[int, int, int, int, int, int, str]:
    if artifact.kind == "tool":
        tier = 3
    elif artifact.value in featured:
        tier = 0
    else:
        tier = 1 if artifact.is_said else 2
    # A bare number only a tool returned (a catalogue's item ids, labelled by a JSON key)
    # says nothing of what it is: it follows the typed values of its tier.
    bare = int(tier == 2 and artifact.value.isdigit())
    return (tier, bare, int(artifact.kind != "error"), -artifact.last_seq, artifact.count,
            artifact.first_seq, artifact.value)
