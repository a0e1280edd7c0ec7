"""Typed identifiers as written: compound values whole, code-local names left out, each
message identified once with its source (what ingest stores and a job ranks)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cli.demo_sessions import generate_sessions
from tests.support.corpus import load_corpus, skip_without_corpus
from worker.compaction import identifier_rules
from worker.compaction.identifiers import (
    Mention,
    collect_artifacts,
    extract_identifiers,
    find_identifiers,
    identify_message,
    search_text,
)
from worker.compaction.messages import StoredMessage, parse_message


@pytest.mark.parametrize(
    ("text", "value", "kind"),
    [
        ("the migration failed with E3283-SCHEMA again", "E3283-SCHEMA", "error"),
        ("pin sqlalchemy==8.16.16 in requirements", "sqlalchemy==8.16.16", "version"),
        ("npm install left-pad@^2 first", "left-pad@^2", "version"),
        ("requires pydantic>=2.7.1", "pydantic>=2.7.1", "version"),
        ("socket closed: ERR_CONN_RESET", "ERR_CONN_RESET", "error"),
        ("upstream said HTTP 503 twice", "HTTP 503", "error"),
        ("see src/app/main.py:42: in test", "src/app/main.py", "path"),
        ("log line error=E3283-SCHEMA path=/srv/app.log", "E3283-SCHEMA", "error"),
        ("request_id=req-0a1b2c3d4e took 5000ms", "req-0a1b2c3d4e", "id"),
        ("call me at +1 415-555-0100", "+1 415-555-0100", "phone"),
        ("or at (415) 555-0100 after five", "(415) 555-0100", "phone"),
        ("order #W2378156 shipped", "#W2378156", "id"),
        ("order #ORD-6703259, please", "#ORD-6703259", "id"),
        ("refund ORD-6703259 today", "ORD-6703259", "id"),
        ("use gift_card_7091239 for the rest", "gift_card_7091239", "id"),
    ],
)
def test_compound_values_are_found_whole_as_written(text: str, value: str, kind: str) -> None:
    assert (value, kind) in find_identifiers(text)
    assert not any(found != value and found in value for found, _ in find_identifiers(text))


@pytest.mark.parametrize("name", ["queue_2", "cache_17", "test_invoices_0", "worker_3_pool"])
def test_code_local_names_in_tool_output_are_not_identifiers(name: str) -> None:
    output = f"{name} = build({name}_size, limit=10)\nreturn {name}"
    assert find_identifiers(output, said=False) == []
    assert (name, "id") in find_identifiers(f"please rename {name}")


def test_labelled_ids_in_tool_output_are_identifiers_even_when_snake_case() -> None:
    output = json.dumps({"user_id": "mia_li_3668", "payment_methods": {
        "gift_card_7091239": {"id": "gift_card_7091239"}}, "order_id": 1042337})
    found = find_identifiers(output, said=False)
    assert ("mia_li_3668", "id") in found
    assert ("gift_card_7091239", "id") in found
    assert ("1042337", "id") in found


@pytest.mark.parametrize(
    "text",
    ["API_VERSION = 3\nRETRY_LIMIT = 5\nfor item in items[:limit]:",
     "collected 42 items in 3.21s, 100% done", "priced at 255.50 on 2024-05-15 at 15:00"],
)
def test_numbers_words_and_code_constants_are_not_identifiers(text: str) -> None:
    assert find_identifiers(text, said=False) == []


def test_a_message_is_identified_once_per_value_and_source() -> None:
    message = parse_message({"role": "assistant", "content": "Retrying E1042, then E1042.",
                             "tool_calls": [{"id": "c1", "type": "function", "function": {
                                 "name": "run_tests", "arguments": '{"target": "tests/a.py"}'}}]})
    assert sorted(identify_message(message)) == sorted([
        Mention("E1042", "error", "assistant", 2),
        Mention("run_tests", "tool", "tool_argument", 1),
        Mention("tests/a.py", "path", "tool_argument", 1),
    ])
    assert "run_tests" in search_text(message) and "tests/a.py" in search_text(message)


def test_instruction_messages_have_no_mentions() -> None:
    assert identify_message(parse_message({"role": "system", "content": "see E1042"})) == []


def _demo_messages(count: int) -> list[StoredMessage]:
    records = list(generate_sessions(count, seed=7))
    bodies = [m for record in records for m in record["messages"]]
    return [StoredMessage(seq, parse_message(body), 0) for seq, body in enumerate(bodies, 1)]


def test_ranking_stored_mentions_equals_extracting_the_span() -> None:
    stored = _demo_messages(4)
    mentions = [(m.seq, [tuple(item) for item in json.loads(json.dumps(
        identify_message(m.message)))]) for m in stored]
    assert collect_artifacts(mentions) == extract_identifiers(stored)


def test_generated_coding_sessions_keep_every_planted_identifier() -> None:
    stored = _demo_messages(8)
    values = {a.value for a in extract_identifiers(stored)}
    said = "\n".join(m.message.text for m in stored if m.message.role.value == "user")
    planted = {word.rstrip(".,;") for word in said.split()
               if (word[:1].isupper() and "-" in word) or "/" in word}
    assert planted and planted <= values


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="ab_1/.:E-=@# \n\"{}", max_size=80), st.booleans())
def test_every_found_value_occurs_verbatim_in_the_text(text: str, said: bool) -> None:
    for value, _ in find_identifiers(text, said=said):
        assert value in text


def test_identifiers_come_back_in_text_order_with_labelled_values_in_place() -> None:
    # Word offsets decide the order, the labelled values' overlaps and whether a short
    # version follows a runtime's name (the first 3.11 does, the last does not).
    text = ('Python 3.11 broke src/app/main.py:12; then "booking_id": "HAT170" x<=2.0.1 '
            "order id is ZFA04Y<E3283-SCHEMA (HTTP 503), 3.11")
    assert find_identifiers(text) == [
        ("3.11", "version"), ("src/app/main.py", "path"), ("HAT170", "id"),
        ("x<=2.0.1", "version"), ("ZFA04Y", "id"), ("E3283-SCHEMA", "error"),
        ("HTTP 503", "error"),
    ]


@settings(max_examples=60, deadline=None)
@given(st.from_regex(r"[a-z]{2,8}(_[a-z]{1,6})?_[0-9]{1,3}", fullmatch=True))
def test_a_bare_snake_case_name_with_digits_in_tool_output_is_never_an_identifier(
    name: str,
) -> None:
    assert find_identifiers(f"  {name} = {name} + 1  # {name}", said=False) == []


def test_code_local_names_no_longer_crowd_out_an_error_seen_once() -> None:
    code = "\n".join(f"queue_{n} = cache_{n}.get(worker_{n})" for n in range(2000))
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "The nightly job failed with E3283-SCHEMA, please look."},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "c1", "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "src/jobs/nightly.py"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": code},
    ]
    stored = [StoredMessage(seq, parse_message(m), 0) for seq, m in enumerate(messages, 1)]
    ranked = [a.value for a in extract_identifiers(stored)]
    assert ranked[0] == "E3283-SCHEMA"
    assert not any(value.startswith(("queue_", "cache_", "worker_")) for value in ranked)


@pytest.mark.corpus
def test_corpus_payment_ids_named_in_tool_calls_are_all_extracted() -> None:
    skip_without_corpus()
    checked = 0
    for session in load_corpus("dev"):
        stored = [StoredMessage(n, parse_message(m), 0)
                  for n, m in enumerate(session["messages"])]
        values = {a.value for a in extract_identifiers(stored)}
        named = {value for m in session["messages"] for call in m.get("tool_calls") or ()
                 for key, value in json.loads(call["function"]["arguments"]).items()
                 if key == "payment_id" and isinstance(value, str)}
        assert named <= values, session["session_id"]
        checked += len(named)
    assert checked > 50


# Labels, separators, values and near misses, in cases and characters that fold oddly.
LABEL_PIECES = ("Order", "order", "ORDER", "reorder", "user", "User ID", "booking", "case",
                "Reservation Number", "flight no.", "locator", "member", "account", "ticket",
                " ", "  ", "\n", ":", "=", " is ", "#", "ABC123", "K12345", "XYZ99", "12345678",
                "abcde", "ABCDEFGHIJKLMN", ",", ".", "(", ")", "\u212a", "\u017f", "\u0130",
                "\u0131", "\u03a3", "\u00d7", "user\u017f")


@settings(max_examples=3000)
@given(st.lists(st.sampled_from(LABEL_PIECES), max_size=12).map("".join))
def test_labelled_values_are_found_where_a_label_opens_as_by_searching_every_position(
    text: str,
) -> None:
    # The shortcut tries the pattern only where a label word opens; the definition is the
    # pattern searched everywhere.
    found = [(m.span(), m.group("v")) for m in identifier_rules._labelled_matches(text)]
    assert found == [(m.span(), m.group("v"))
                     for m in identifier_rules._LABELLED.finditer(text)]
