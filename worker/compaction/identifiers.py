"""Verbatim identifiers of a span (paths, error codes, ids, hashes, versions, URLs,
tickets, tool names): what a summary must carry unchanged, ranked into an artifact index.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from worker.compaction.messages import INSTRUCTION_ROLES, Role, StoredMessage

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
    "version": 2,
    "tool": 1,
}

_ERRNO_NAMES = (
    "ENOENT|EACCES|EPERM|EEXIST|EINVAL|EISDIR|ENOTDIR|ENOSPC|EROFS|EBADF|EBUSY|EAGAIN|EPIPE"
    "|EMFILE|ENOMEM|ETIMEDOUT|ECONNREFUSED|ECONNRESET|ECONNABORTED|EADDRINUSE|EHOSTUNREACH"
    "|ENETUNREACH|ENOTFOUND|ENOTEMPTY|EAI_AGAIN"
)
_ERROR_PREFIXES = "ORA|PLS|TNS|ERR|SQLSTATE"
_RUNTIMES = "python|node|java|go|ruby|version|release"
_ID_LABELS = (
    "reservation|booking|confirmation|order|ticket|account|user|customer|member"
    "|transaction|invoice|case|flight|record|locator"
)
_ID_KEY = r"(?:id|[A-Za-z0-9_]*(?:_id|_number|_code|Id|ID|Number|Code))"
_ZONE = r"(?:Z|[+-]\d{2}:?\d{2})?"
_PRERELEASE = r"(?:-[0-9A-Za-z]+(?:\.[0-9A-Za-z]+)*)?"
# Prefixes that look like ticket keys but name encodings, ciphers or standards.
_NOT_TICKETS = frozenset({"UTF", "SHA", "AES", "ISO", "RSA", "COVID", "GPT", "MD", "TLS", "SSL"})

# Earlier rules win: a span matched by one is masked from the later ones, so a URL's
# path is not also a path and an error code is not also an id. A group named ``v`` marks
# the value inside a labelled match (``"reservation_id": "HATHAT"`` yields ``HATHAT``).
# ``needles``: the rule is skipped for text holding none of them (most text lacks "://").
# ``prose_only``: skipped for JSON text, where the key rules already read labelled values.
@dataclass(frozen=True, slots=True)
class _Rule:
    kind: str  # "" masks the match without reporting it
    pattern: re.Pattern[str]
    needles: tuple[str, ...] = ()
    prose_only: bool = False


def _rule(kind: str, pattern: str, *needles: str, prose_only: bool = False) -> _Rule:
    return _Rule(kind, re.compile(pattern), needles, prose_only)


_RULES: tuple[_Rule, ...] = (
    _rule("url", r"\b(?:https?|ftp|wss?|s3|gs)://[^\s\"'<>()\[\]{}`]+[^\s\"'<>()\[\]{}`.,;:!?]",
          "://"),
    _rule("email", r"\b[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b", "@"),
    _rule("uuid", r"\b[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}\b", "-"),
    # Dates and times are masked, not reported: ``2024-05-15T15:00`` is not id ``15T15``.
    _rule("", rf"\b\d{{4}}-\d\d-\d\d(?:[T ]\d\d:\d\d(?::\d\d(?:\.\d+)?)?{_ZONE})?\b", "-"),
    _rule("id", rf"\"{_ID_KEY}\"\s*:\s*\"(?P<v>[A-Za-z0-9][A-Za-z0-9_.:/-]{{2,63}})\"", '"'),
    _rule("id", rf"\"{_ID_KEY}\"\s*:\s*(?P<v>\d{{3,20}})\b", '"'),
    # A code listed in a JSON array: ``"reservations": ["ZFA04Y", "HATHAT"]``.
    _rule("id", r"(?<=[\[,])\s*\"(?P<v>[A-Z0-9]{5,12})\"(?=\s*[,\]])", '"'),
    _rule("path", r"(?<![\w.:/~])(?:~|\.\.?)?(?:/[\w.@+-]+){2,}/?", "/"),
    _rule("path", r"(?<![\w.:/])~/[\w.@+-]+(?:/[\w.@+-]+)*", "~/"),
    _rule("path", r"\b[A-Za-z]:\\(?:[\w.-]+\\)*[\w.-]+", ":\\"),
    _rule("path", r"(?<![\w/.])[\w.-]+(?:/[\w.-]+)+\.[A-Za-z][A-Za-z0-9]{0,7}\b", "/"),
    _rule(
        "path",
        r"(?<![\w/.-])[\w-]+\.(?:py|pyi|js|mjs|ts|tsx|jsx|json|ya?ml|toml|md|txt|csv|log"
        r"|sh|go|rs|java|kt|cs|c|h|cc|cpp|hpp|rb|php|sql|html|css|ini|cfg|conf|lock|xml"
        r"|env|proto|tf)\b",
        ".",
    ),
    _rule("error", r"\bHTTP(?:/\d(?:\.\d)?)?[ :]+[45]\d\d\b", "HTTP"),
    _rule("error", r"(?i:\bstatus(?: code)?)[ :]+[45]\d\d\b", "tatus", "TATUS"),
    _rule("error", rf"\b(?:{_ERROR_PREFIXES})[-_ ]?\d{{3,5}}\b", *_ERROR_PREFIXES.split("|")),
    _rule("error", rf"\b(?:{_ERRNO_NAMES})\b", "E"),
    _rule("error", r"\bE\d{3,5}\b", "E"),
    _rule("error", r"\b[A-Z][a-z]+(?:[A-Z][a-z0-9]*)*(?:Error|Exception|Fault)\b",
          "Error", "Exception", "Fault"),
    _rule("version", rf"\bv\d+(?:\.\d+){{1,3}}{_PRERELEASE}\b", "v"),
    _rule("version", rf"(?<![\w.])\d+(?:\.\d+){{2,3}}{_PRERELEASE}(?!\.?\d)(?!\w)", "."),
    _rule("version", rf"(?i:\b(?:{_RUNTIMES})\s+)(?P<v>\d+\.\d+)\b", "."),
    _rule("ticket", r"\b(?P<v>[A-Z][A-Z0-9]{1,9}-\d{2,6})\b", "-"),
    _rule("ticket", r"(?<![\w&#])#\d{2,7}\b", "#"),
    _rule("id", rf"(?i:\b(?:{_ID_LABELS})(?:\s+(?:id|number|code|no\.?|#))?\s*(?:is|:|=|#)?\s*)"
                r"(?P<v>[A-Z0-9]{5,12})\b", prose_only=True),
    _rule("id", r"\b[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*_[A-Za-z0-9]*\d[A-Za-z0-9]*\b", "_"),
    # Each of the last three first checks the whole word's length and alphabet, then
    # that it mixes the character classes (much faster than lookaheads over ``\w*``).
    _rule("id", r"\b(?=[A-Z0-9]{5,16}\b)(?=[A-Z]*\d)(?=\d*[A-Z])[A-Z0-9]+"),
    _rule("id", r"\b(?=[A-Za-z0-9]{8,40}\b)(?=[A-Za-z]*\d)(?=[A-Z0-9]*[a-z])(?=[a-z0-9]*[A-Z])"
                r"[A-Za-z0-9]+"),
    _rule("hash", r"\b(?=[0-9a-f]{7,64}\b)(?=[a-f]*\d)(?=\d*[a-f])[0-9a-f]+"),
)


def find_identifiers(text: str) -> list[tuple[str, str]]:
    """Return ``(value, kind)`` for every identifier in ``text``, in text order."""
    taken = bytearray(len(text))
    found: list[tuple[int, str, str]] = []
    is_json = text.lstrip()[:1] in ("{", "[")
    for rule in _RULES:
        if rule.needles and not any(needle in text for needle in rule.needles):
            continue
        if rule.prose_only and is_json:
            continue
        kind, pattern = rule.kind, rule.pattern
        for match in pattern.finditer(text):
            start, end = match.span()
            if any(taken[start:end]):
                continue
            value = match.group("v") if "v" in pattern.groupindex else match.group(0)
            if kind == "ticket" and value.split("-", 1)[0] in _NOT_TICKETS:
                continue
            taken[start:end] = b"\x01" * (end - start)
            if kind:
                found.append((start, value, kind))
    found.sort(key=lambda item: item[0])
    return [(value, kind) for _, value, kind in found]


@dataclass
class _Tally:
    kind: str
    count: int
    mentions: int
    first_seq: int
    last_seq: int
    order: int
    sources: set[str]


def extract_identifiers(messages: Sequence[StoredMessage]) -> list[Artifact]:
    """Return the span's identifiers, de-duplicated and ranked most important first.

    Rank: kind weight times (occurrences + occurrences outside tool results), so an id the
    user or agent spoke outranks one only listed in a search result; ties go to the
    earlier first occurrence. Instruction messages are skipped: the projection keeps them
    verbatim, so their identifiers are never lost.
    """
    tallies: dict[str, _Tally] = {}
    for seq, source, value, kind in _occurrences(messages):
        is_result = source == "tool_output"
        tally = tallies.get(value)
        if tally is None:
            tallies[value] = _Tally(kind, 1, int(not is_result), seq, seq, len(tallies),
                                    {source})
            continue
        tally.count += 1
        tally.mentions += int(not is_result)
        tally.last_seq = seq
        tally.sources.add(source)
        if KIND_WEIGHTS[kind] > KIND_WEIGHTS[tally.kind]:
            tally.kind = kind
    ranked = sorted(
        tallies.items(),
        key=lambda item: (-_score(item[1]), item[1].first_seq, item[1].order),
    )
    return [Artifact(value, t.kind, t.count, t.first_seq, t.last_seq, frozenset(t.sources))
            for value, t in ranked]


def _score(tally: _Tally) -> int:
    return KIND_WEIGHTS[tally.kind] * (tally.count + tally.mentions)


def _occurrences(messages: Sequence[StoredMessage]) -> Iterator[tuple[int, str, str, str]]:
    """Yield ``(seq, source, value, kind)`` for each identifier occurrence (``SOURCES``)."""
    for stored in messages:
        message = stored.message
        if message.role in INSTRUCTION_ROLES:
            continue
        source = "tool_output" if message.role is Role.TOOL else message.role.value
        for value, kind in find_identifiers(message.text):
            yield stored.seq, source, value, kind
        for call in message.tool_calls or ():
            yield stored.seq, "tool_argument", call.function.name, "tool"
            for value, kind in find_identifiers(call.function.arguments):
                yield stored.seq, "tool_argument", value, kind
