"""Tool outcomes: every result classified once from its full original text, succeeded,
failed (with the lines that say so) or unknown, by general signals wherever they are."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.session_strategies import shared_counter, to_stored
from tests.unit.test_fallback import exchange
from worker.compaction.grouping import group_messages
from worker.compaction.outcomes import (
    FAILED_SIGNALS,
    LINE_CHARS,
    MAX_LINES,
    SUCCEEDED_SIGNALS,
    CallStatus,
    classify_calls,
    classify_result,
)

FAILED, SUCCEEDED, UNKNOWN = CallStatus.FAILED, CallStatus.SUCCEEDED, CallStatus.UNKNOWN
PASSING = "\n".join(f"tests/test_m.py::test_{n} PASSED [{n:3d}%]" for n in range(1, 80))


@pytest.mark.parametrize(
    ("result", "status", "lines"),
    [
        ("Error: not enough seats on HAT229", FAILED, ("Error: not enough seats on HAT229",)),
        ("collected 3 items\nFAILED tests/test_db.py::test_up - ERR-3283: bad row\n"
         "=== 1 failed, 2 passed ===", FAILED,
         ("FAILED tests/test_db.py::test_up - ERR-3283: bad row", "=== 1 failed, 2 passed ===")),
        # The failure on the last line of a long run, its first line harmless.
        (f"{PASSING}\nFAILED tests/test_sync.py::test_sync - E8028-SCHEMA", FAILED,
         ("FAILED tests/test_sync.py::test_sync - E8028-SCHEMA",)),
        # A failure in the middle: neither end says so.
        (f"{PASSING}\nTraceback (most recent call last):\n  File \"a.py\", line 3\n"
         f"KeyError: 'x'\n{PASSING}", FAILED,
         ("Traceback (most recent call last):", "KeyError: 'x'")),
        ("compiling\nlinking\nexit code 2", FAILED, ("exit code 2",)),
        ("build\nprocess exited with 1", FAILED, ("process exited with 1",)),
        ("--- FAIL: TestSync (0.01s)\nFAIL\tpkg/sync\t0.2s", FAILED,
         ("--- FAIL: TestSync (0.01s)", "FAIL\tpkg/sync\t0.2s")),
        ("Tests:       2 failed, 5 passed, 7 total", FAILED,
         ("Tests:       2 failed, 5 passed, 7 total",)),
        ("test result: FAILED. 3 passed; 1 failed", FAILED,
         ("test result: FAILED. 3 passed; 1 failed",)),
        ("goroutine 1 [running]:\npanic: runtime error", FAILED, ("panic: runtime error",)),
        ("HTTP/1.1 503 Service Unavailable", FAILED, ("HTTP/1.1 503 Service Unavailable",)),
        (json.dumps({"error": {"code": "E42", "message": "no such order"}}), FAILED,
         ('error: {"code": "E42", "message": "no such order"}',)),
        (json.dumps({"errors": ["bad id"]}), FAILED, ('errors: ["bad id"]',)),
        (json.dumps({"status": "failed", "id": "W1"}), FAILED, ("status: failed",)),
        (json.dumps({"success": False}), FAILED, ("success: false",)),
        (json.dumps({"ok": False}), FAILED, ("ok: false",)),
        (json.dumps({"status": 404}), FAILED, ("status: 404",)),
        (json.dumps({"returncode": 1, "stdout": "x"}), FAILED, ("returncode: 1",)),
        (json.dumps({"stdout": "", "returncode": 0}), SUCCEEDED, ()),
        (json.dumps({"status": "ok"}), SUCCEEDED, ()),
        (json.dumps({"status": "completed", "id": "W1"}), SUCCEEDED, ()),
        (json.dumps({"success": True}), SUCCEEDED, ()),
        ("=== 12 passed, 0 failed in 3.1s ===", SUCCEEDED, ()),
        ("ok  \tpkg/sync\t0.2s", SUCCEEDED, ()),
        ("Transfer successful", SUCCEEDED, ()),
        ("done\nexit code 0", SUCCEEDED, ()),
        # A record without a status, a number, a log that mentions errors: no outcome.
        (json.dumps({"reservation_id": "ZFA04Y", "status": "cancelled"}), UNKNOWN,
         ("status: cancelled",)),
        (json.dumps({"error": None, "id": "W1"}), UNKNOWN, ()),
        ("[1, 2, 3]", UNKNOWN, ()),
        ("1023.0", UNKNOWN, ("1023.0",)),
        ("2024-05-01 ERROR retrying upstream\n2024-05-01 INFO ok", UNKNOWN,
         ("2024-05-01 INFO ok",)),
        ("    error: str = ''\n    def run(self): ...", UNKNOWN, ("def run(self): ...",)),
        ("", UNKNOWN, ()),
    ],
)
def test_a_result_is_classified_from_signals_anywhere_in_it(
    result: str, status: CallStatus, lines: tuple[str, ...],
) -> None:
    assert classify_result(result) == (status, lines)


def test_each_call_of_a_span_gets_its_outcome_tool_and_target() -> None:
    messages = [*exchange("c1", "run_tests", {"path": "tests/", "k": "sync"},
                          f"{PASSING}\nFAILED tests/test_sync.py::test_sync - E8028-SCHEMA"),
                *exchange("c2", "run_tests", {"k": "sync", "path": "tests/"},
                          "=== 80 passed ==="),
                *exchange("c3", "book", {"id": "W1"}, json.dumps({"id": "W1"}))]
    outcomes = classify_calls(group_messages(to_stored(messages, shared_counter())))
    assert [(o.call_id, o.tool, o.status) for o in outcomes] == [
        ("c1", "run_tests", FAILED), ("c2", "run_tests", SUCCEEDED), ("c3", "book", UNKNOWN)]
    # The same arguments in another order are the same target.
    assert outcomes[0].target == outcomes[1].target != outcomes[2].target


# The signals as written, searched in every line: the definition the classifier's
# shortcuts (anchored candidate lines, look-aheads) must agree with.
PLAIN_FAILED = re.compile(FAILED_SIGNALS, re.MULTILINE)
PLAIN_SUCCEEDED = re.compile(SUCCEEDED_SIGNALS, re.MULTILINE)
SHORT_SUCCESS = re.compile(r"(?i:\A[^\n]{0,80}\b(?:successful(?:ly)?|succeeded|success)\b"
                           r"[^\n]{0,80}\Z)")
# Pieces of signals, near misses, cases, line breaks and characters whose case folds oddly.
PIECES = ("1 failed", "42 Failures", "12 Errors", "3 FAILED", "FAILED", "FAIL", "--- FAIL:",
          "failed", "fail", "exit code 2", "Exit Status: 0", "exited with 3", "exit",
          "returncode=1", "'exit_code': 0", '"return_code" : 4', "return",
          "Traceback (most recent call last)", "traceback", "error:", "Error[E0308]:",
          "ValueError:", " error", "fatal:", "PANIC:",
          "HTTP/1.1 404", "http/2 500", "status 503", "Status: 200", "status code: 404",
          "2 passed", "passed", "test result: ok", "Test Result: OK", "ok", "OK", "PASS", "pass",
          "success", "Exception:", "p/", "tatus", "\u017ftatus 404", "\u212a", "\u0130", "x",
          " ", "\n", "\r\n", "\t", "0", "7", ":", "=", "-", "[", "\"", "'", "a", "_")
TEXTS = st.lists(st.sampled_from(PIECES), max_size=8).map("".join)


def classify_plainly(text: str) -> tuple[CallStatus, tuple[str, ...]]:
    """A non-JSON result's outcome by definition: each signal searched in every line."""
    stripped = text.strip()
    if not stripped:
        return UNKNOWN, ()
    lines = text.split("\n") if len(text.lower()) == len(text) else text.splitlines()
    failing = list(dict.fromkeys(line.strip() for line in lines if PLAIN_FAILED.search(line)))
    if failing:
        shown = failing if len(failing) <= MAX_LINES else [*failing[:MAX_LINES - 1],
                                                           failing[-1]]
        return FAILED, tuple(line if len(line) <= LINE_CHARS
                             else line[:LINE_CHARS].rstrip() + " ..." for line in shown)
    if any(PLAIN_SUCCEEDED.search(line) for line in lines) or SHORT_SUCCESS.match(stripped):
        return SUCCEEDED, ()
    if stripped[0] in "[{":
        return UNKNOWN, ()
    last = stripped[stripped.rfind("\n") + 1:].strip()
    return UNKNOWN, (last if len(last) <= LINE_CHARS else last[:LINE_CHARS].rstrip() + " ...",)


@settings(max_examples=1500)
@given(TEXTS, st.sampled_from(("", "  1  def run():\n", "{\n", "ok\n")))
def test_the_classifier_agrees_with_searching_every_line(text: str, opening: str) -> None:
    assert classify_result(opening + text) == classify_plainly(opening + text)


@settings(max_examples=300)
@given(st.lists(TEXTS, min_size=1, max_size=5))
def test_a_span_s_results_scanned_together_are_classified_as_each_alone(
    texts: list[str],
) -> None:
    messages = [m for i, text in enumerate(texts) for m in exchange(f"c{i}", "run", {}, text)]
    stored = to_stored(messages, shared_counter())
    outcomes = classify_calls(group_messages(stored))
    results = [s.message.text for s in stored if s.message.tool_call_id]
    assert [(o.status, o.lines) for o in outcomes] == [classify_plainly(t) for t in results]
