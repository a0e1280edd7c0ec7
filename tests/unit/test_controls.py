"""Control characters: found in ids (C0, DEL, C1, format and bidi controls, line
separators) and named by code point and position; escaped for printing (as ``\\x1b``)
and inside JSON (as ``\\u001b``) without changing the value; ordinary text untouched."""

from __future__ import annotations

import json

import pytest

from worker.broker.contract import JobMessage
from worker.broker.tasks import parse_job
from worker.compaction import escape_controls, escape_controls_in_json, find_control_character
from worker.errors import JobRejected


@pytest.mark.parametrize("text, code_point, position", [
    ("abc\x1b[2J", "U+001B", 3),
    ("\x00", "U+0000", 0),
    ("id\x7f", "U+007F", 2),
    ("id-\x9b31m", "U+009B", 3),
    ("invoice\u202egpj.exe", "U+202E", 7),
    ("a\u2066b", "U+2066", 1),
    ("zero\u200bwidth", "U+200B", 4),
    ("line\u2028break", "U+2028", 4),
    ("tab\there", "U+0009", 3),
])
def test_the_first_control_character_is_named_with_its_position(
    text: str, code_point: str, position: int
) -> None:
    assert find_control_character("session_id", text) == (
        f"session_id contains control character {code_point} at position {position}")


@pytest.mark.parametrize("text", [
    "session-42", "café au lait", "会话-七", "naïve\u00a0space", "emoji-\U0001f600", "a b",
])
def test_printable_text_has_no_control_character_and_prints_as_it_is(text: str) -> None:
    assert find_control_character("session_id", text) is None
    assert escape_controls(text) == text


def test_escapes_show_what_was_there() -> None:
    assert escape_controls("a\x1b[31mb\x9bc\u202ed\U000e0001\n") == \
        "a\\x1b[31mb\\x9bc\\u202ed\\U000e0001\\x0a"


def test_json_escapes_keep_the_value_and_leave_no_control_character() -> None:
    value = {"id": "x\x1b\x7f\x9b\u202e\U000e0001 é 会"}
    text = escape_controls_in_json(json.dumps(value, ensure_ascii=False))

    assert json.loads(text) == value
    assert find_control_character("json", text) is None
    assert "é 会" in text


def test_a_job_message_with_a_control_character_in_its_id_is_rejected_naming_it() -> None:
    assert JobMessage.model_validate({"session_id": "ok-1"}).session_id == "ok-1"
    with pytest.raises(JobRejected) as rejected:
        parse_job((), {"session_id": "abc\x1b]0;pwned\x07", "reason": "r", "force": False},
                  "task-1", 1)

    assert rejected.value.reason == "malformed_message"
    assert "session_id contains control character U+001B at position 3" in str(rejected.value)
