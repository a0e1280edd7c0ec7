"""Each tool call's outcome, classified once from its result's full original text:
succeeded, failed (with the lines that say so) or unknown. Ingest classifies each result
as it stores it (:func:`classify_results`); a job takes that outcome, and classifies from
the text only a result stored before ingest did. The extractive summary reports these and
validation holds every summary to them; salience features the failures' codes.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import accumulate
from typing import Any, Generic, TypeVar

from worker.compaction.grouping import Group
from worker.compaction.messages import ChatMessage, FunctionCall, Role, StoredMessage

T = TypeVar("T")
MAX_LINES = 3
LINE_CHARS = 200
# Signals a failure gives anywhere in its output: a test runner's summary, a non-zero exit
# code, a traceback or a top-level error line, an HTTP status of 400 or more.
FAILED_SIGNALS = (
    r"(?i:\b[1-9]\d* (?:failed|failing|failures?|errors?)\b)"
    r"|\bFAILED\b|^(?:--- )?FAIL(?::|\b)"
    r"|(?i:\bexit(?:ed)?(?: with)?(?: code| status)\b:? *[1-9]\d*\b)"
    r"|(?i:\bexited with:? *[1-9]\d*\b)"
    r"|(?i:[\"']?\b(?:returncode|return_code|exit_code|exitcode|exit_status)[\"']?\s*[:=]\s*"
    r"[1-9]\d*\b)"
    r"|Traceback \(most recent call last\)"
    r"|^(?i:error|fatal|panic)(?:\[[\w-]+\])?:"
    r"|^\w*(?:Error|Exception)\b:"
    r"|(?i:\bHTTP/\d(?:\.\d)? [45]\d\d\b|\bstatus(?: code)?:? [45]\d\d\b)"
)
# Signals a success gives: passed tests, exit code 0, a short "... successful" reply.
SUCCEEDED_SIGNALS = (
    r"(?i:\b[1-9]\d* passed\b|\bexit(?:ed)?(?: with)?(?: code| status)\b:? *0\b"
    r"|test result: ok\b|[\"']?\b(?:returncode|return_code|exit_code)[\"']?\s*[:=]\s*0\b)"
    r"|^(?:ok|PASS)\b"
)


def _opening_with(first: str, signals: str) -> re.Pattern[str]:
    """``signals`` (multiline), each match opening at a line's start or on a character of
    ``first`` (any case): a look-ahead rejects every other position with one test, where
    the engine would try each alternative."""
    return re.compile(rf"(?:^|(?=(?i:[{first}])))(?:{signals})", re.MULTILINE)


_FAILED = _opening_with("1-9\"'efhrst", FAILED_SIGNALS)
_SUCCEEDED = _opening_with("1-9\"'ert", SUCCEEDED_SIGNALS)
# Every match of the signals holds on its line a match of one of these in the lowercased
# text, or of ``_CAPITAL_ANCHOR`` in the text as it is, or opens the result with "ok" or
# "pass": a result can be megabytes, and only the lines holding one are searched. Each
# opens with a literal, which the engine finds as fast as ``str.find``; the look-behinds
# keep code's "failed" and "pass" off the lines searched.
_ANCHORS = tuple(re.compile(anchor) for anchor in (
    r"fa(?:tal|il(?<= fail))", r"error(?:[:\[]|(?<= error))", r"x(?:it|ception:)",
    r"r(?:n_?c|aceback|esult: ok)", r"p(?:anic|/|ass(?:(?<=\npass)|(?<= pass)ed))",
    r"us(?::? [45]| code)", r"\nok"))
# ``FAILED`` and ``FAIL`` (lowercase "fail" only after a count) count in capitals only.
_CAPITAL_ANCHOR = re.compile("FAIL")
_SHORT_SUCCESS = re.compile(r"(?i:\A[^\n]{0,80}\b(?:successful(?:ly)?|succeeded|success)\b"
                            r"[^\n]{0,80}\Z)")
_FAILED_STATUS = frozenset({"error", "errored", "failed", "failure", "fail", "fatal",
                            "rejected", "denied", "aborted", "crashed", "timeout",
                            "timed_out", "invalid"})
_OK_STATUS = frozenset({"ok", "success", "succeeded", "successful", "done", "completed",
                        "complete", "passed", "pass"})
# A call's arguments in canonical form; one encoder for all (``json.dumps`` with options
# builds a new one per call).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_CODE_KEYS = ("returncode", "return_code", "exit_code", "exitCode", "exit_status")
_HTTP_KEYS = ("status_code", "statusCode", "http_status", "status")


class CallStatus(StrEnum):
    """How a tool call ended, as its result says."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"


class _Memo(Generic[T]):
    """``compute`` of each distinct text, worked out once and only when asked: a span
    repeats its result lines and its calls' arguments again and again."""

    __slots__ = ("_compute", "_found")

    def __init__(self, compute: Callable[[str], T]) -> None:
        self._compute = compute
        self._found: dict[str, T] = {}

    def __call__(self, text: str) -> T:
        found = self._found.get(text)
        if found is None:
            found = self._found[text] = self._compute(text)
        return found


def _target_memo() -> _Memo[str]:
    """A span's canonical targets (few are read: a claimed call's, a failed tool's)."""
    return _Memo(_target)


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """A tool call's outcome: its call id, tool, seq (of the result), how it ended, its
    lines (a failure's: the lines that say so; an unknown one's: a record's status or the
    result's last line), and the call's arguments as passed (``target``: canonical)."""

    call_id: str
    tool: str
    seq: int
    status: CallStatus
    lines: tuple[str, ...]
    arguments: str = ""
    memo: _Memo[str] = field(default_factory=_target_memo, compare=False, repr=False)

    @property
    def target(self) -> str:
        """The call's arguments in one canonical form: the same target compares equal."""
        return self.memo(self.arguments)

    @property
    def failed(self) -> bool:
        return self.status is CallStatus.FAILED


# A failed call: what salience and the summaries name ``failures``.
Failure = CallOutcome
# A tool result's outcome as ingest stores it with its item: the call id it answers, how
# it ended and its lines; a job reads it back as the JSON list ``[call_id, status, lines]``.
ResultOutcome = tuple[str, CallStatus, tuple[str, ...]]
# A status by its stored value (a stored value of no status is classified again).
_STATUSES = {status.value: status for status in CallStatus}


class _LineSignals:
    """Whether a line holds a failure or a success signal, each distinct line searched
    once: a span's results repeat their lines (a test run's assertion, its summary)."""

    def __init__(self) -> None:
        self.failed = _Memo(lambda line: _FAILED.search(line) is not None)
        self.succeeded = _Memo(lambda line: _SUCCEEDED.search(line) is not None)


def classify_result(text: str) -> tuple[CallStatus, tuple[str, ...]]:
    """Classify one tool result from its full text; a failure comes with the lines that
    say so, an unknown outcome with what the result last said."""
    return _classify_text(text, None, _LineSignals())


def _classify_text(text: str, lines: list[str] | None, signals: _LineSignals
                   ) -> tuple[CallStatus, tuple[str, ...]]:
    """``classify_result``, given the text's candidate lines when they are known."""
    stripped = text.strip()
    if not stripped:
        return CallStatus.UNKNOWN, ()
    if stripped[0] == "{":
        record = _json_object(stripped)
        if record is not None:
            return _classify_record(record)
    if lines is None:
        [lines] = _candidate_lines([text])
    failing = _failing_lines(lines, signals)
    if failing:
        return CallStatus.FAILED, failing
    if any(map(signals.succeeded, lines)) or _SHORT_SUCCESS.match(stripped):
        return CallStatus.SUCCEEDED, ()
    if stripped[0] in "[{":  # a JSON value's last line is a fragment of it
        return CallStatus.UNKNOWN, ()
    return CallStatus.UNKNOWN, (_clip(stripped[stripped.rfind("\n") + 1:].strip()),)


def failing_lines(text: str) -> tuple[str, ...]:
    """Return the lines of a tool result that say it failed (none when it did not)."""
    status, lines = classify_result(text)
    return lines if status is CallStatus.FAILED else ()


def classify_results(items: Iterable[Sequence[ChatMessage]]
                     ) -> list[tuple[ResultOutcome, ...]]:
    """Classify the tool results of each item (its chat messages) from their full texts,
    in order: what ingest stores with each item. The results of all the items are
    scanned together, as a job's span was, each classified as it would be alone."""
    results = [[message for message in messages if message.role is Role.TOOL]
               for messages in items]
    classified = iter(_classify_texts([message.text for found in results
                                       for message in found]))
    return [tuple([(message.tool_call_id or "", *next(classified)) for message in found])
            for found in results]


def classify_calls(span: Sequence[Group],
                   stored: Mapping[int, Sequence[Sequence[Any]]] | None = None
                   ) -> list[CallOutcome]:
    """Return the outcome of every tool result of ``span``, in order: as ``stored`` holds
    it (by seq, the ``[call_id, status, lines]`` ingest stored of the item's results, in
    order), else classified from its text (a result stored before ingest classified)."""
    results: list[tuple[StoredMessage, FunctionCall | None]] = []
    for group in span:
        calls = {c.id: c.function for m in group.messages for c in m.message.tool_calls or ()}
        results.extend((message, calls.get(message.message.tool_call_id or ""))
                       for message in group.messages if message.message.role is Role.TOOL)
    known = _stored_outcomes(results, stored or {})
    texts = [message.message.text for (message, _), outcome in zip(results, known, strict=True)
             if outcome is None]
    classified = iter(_classify_texts(texts))
    outcomes: list[CallOutcome] = []
    memo = _target_memo()
    for (message, function), outcome in zip(results, known, strict=True):
        status, found = next(classified) if outcome is None else outcome
        tool = message.message.name or (function.name if function else "a tool")
        outcomes.append(CallOutcome(message.message.tool_call_id or "", tool, message.seq,
                                    status, found, function.arguments if function else "",
                                    memo))
    return outcomes


def _stored_outcomes(results: Sequence[tuple[StoredMessage, FunctionCall | None]],
                     stored: Mapping[int, Sequence[Sequence[Any]]]
                     ) -> list[tuple[CallStatus, tuple[str, ...]] | None]:
    """Each result's stored outcome: the one at its position among its item's results
    when it answers the same call; None where there is none (classified from the text)."""
    known: list[tuple[CallStatus, tuple[str, ...]] | None] = []
    position, last_seq = 0, None
    for message, _ in results:
        position = position + 1 if message.seq == last_seq else 0
        last_seq = message.seq
        entries = stored.get(message.seq, ())
        entry = entries[position] if position < len(entries) else None
        status = None
        if entry is not None and entry[0] == (message.message.tool_call_id or ""):
            status = _STATUSES.get(entry[1])
        known.append(None if status is None or entry is None else (status, tuple(entry[2])))
    return known


def _classify_texts(texts: list[str]) -> list[tuple[CallStatus, tuple[str, ...]]]:
    """``classify_result`` of each text, their lines found in one scan of them all."""
    if not texts:  # every result's outcome was stored at ingest
        return []
    signals = _LineSignals()
    return [_classify_text(text, lines, signals)
            for text, lines in zip(texts, _candidate_lines(texts), strict=True)]


def find_failures(span: Sequence[Group]) -> list[CallOutcome]:
    """Return the span's tool results that report a failure, in order."""
    return [outcome for outcome in classify_calls(span) if outcome.failed]


def _target(arguments: str) -> str:
    """A call's arguments in one canonical form: the same target compares equal."""
    try:
        return _CANONICAL.encode(json.loads(arguments))
    except ValueError:
        return " ".join(arguments.split())


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _classify_record(record: dict[str, Any]) -> tuple[CallStatus, tuple[str, ...]]:
    """A JSON result's outcome from its top-level fields; nested records are its data."""
    for key in ("error", "errors"):
        if record.get(key):
            return CallStatus.FAILED, (_clip(f"{key}: {_one_line(record[key])}"),)
    for key in ("success", "ok"):
        if record.get(key) is False:
            return CallStatus.FAILED, (f"{key}: false",)
    status = record.get("status")
    if isinstance(status, str) and status.casefold() in _FAILED_STATUS:
        return CallStatus.FAILED, (_clip(f"status: {status}"),)
    for key in _HTTP_KEYS:
        code = record.get(key)
        if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
            return CallStatus.FAILED, (f"{key}: {code}",)
    for key in _CODE_KEYS:
        code = record.get(key)
        if isinstance(code, int) and not isinstance(code, bool) and code != 0:
            return CallStatus.FAILED, (f"{key}: {code}",)
    succeeded = ((isinstance(status, str) and status.casefold() in _OK_STATUS)
                 or record.get("success") is True or record.get("ok") is True
                 or any(record.get(key) == 0 for key in _CODE_KEYS))
    if succeeded:
        return CallStatus.SUCCEEDED, ()
    return CallStatus.UNKNOWN, (_clip(f"status: {status}"),) if isinstance(status, str) else ()


def _failing_lines(lines: list[str], signals: _LineSignals) -> tuple[str, ...]:
    """The lines a failure signal is on: the first ones and the last (a run's summary)."""
    matched = list(dict.fromkeys(line.strip() for line in lines if signals.failed(line)))
    if not matched:
        return ()
    shown = matched if len(matched) <= MAX_LINES else [*matched[:MAX_LINES - 1], matched[-1]]
    return tuple(_clip(line) for line in shown)


def _candidate_lines(texts: Sequence[str]) -> list[list[str]]:
    """Each text's lines holding an anchor, in order. The texts are scanned as one, each
    after a line break (so "ok" or "pass" opening one opens a line); when lowercasing
    changes their length, so offsets would not match, each is scanned alone, and one
    whose own length changes gives every line."""
    joined = "\n" + "\n".join(texts)
    low = joined.lower()
    if len(low) != len(joined):
        return [text.splitlines() if len(text.lower()) != len(text)
                else _candidate_lines([text])[0] for text in texts]
    starts: set[int] = set()
    for anchor in _ANCHORS:
        starts.update(low.rfind("\n", 0, found.end()) + 1 for found in anchor.finditer(low))
    starts.update(joined.rfind("\n", 0, found.end()) + 1
                  for found in _CAPITAL_ANCHOR.finditer(joined))
    # Text i opens at offsets[i]; a line never runs past the break that ends its text.
    offsets = list(accumulate((len(text) + 1 for text in texts[:-1]), initial=1))
    lines: list[list[str]] = [[] for _ in texts]
    for start in sorted(starts):
        end = joined.find("\n", start)
        lines[bisect_right(offsets, start) - 1].append(joined[start:end if end >= 0 else None])
    return lines


def _one_line(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return " ".join(text.split())


def _clip(line: str) -> str:
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS].rstrip() + " ..."
