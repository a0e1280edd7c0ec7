"""Identifiers by shape, not by list: values drawn from a grammar (random segment counts,
separators, prefixes and wordings) are each found whole, never split, no part of one
listed apart."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.compaction.identifier_rules import find_identifiers

UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
LOWER = UPPER.lower()
DIGITS = "0123456789"


def _run(alphabet: str, low: int, high: int) -> st.SearchStrategy[str]:
    return st.text(alphabet, min_size=low, max_size=high)


def _number(low: int, high: int) -> st.SearchStrategy[str]:
    return st.integers(10 ** (low - 1), 10 ** high - 1).map(str)


def _joined(parts: st.SearchStrategy[list[str]], separators: str) -> st.SearchStrategy[str]:
    return st.tuples(parts, st.sampled_from(separators)).map(lambda p: p[1].join(p[0]))


# Standards' names read as ticket-shaped codes but are not identifiers (UTF-8, SHA-256).
STANDARDS = frozenset({"UTF", "SHA", "AES", "ISO", "RSA", "COVID", "GPT", "MD", "TLS", "SSL"})
PREFIXES = _run(UPPER, 2, 6).filter(lambda prefix: prefix not in STANDARDS)
# Tickets and record ids: a prefix, then one to three numbers (PROJ-12-3, OPS_4521).
TICKETS = _joined(st.tuples(PREFIXES, st.lists(_number(1, 6), min_size=1,
                                                          max_size=3))
                  .map(lambda p: [p[0], *p[1]]), "-_.:")
# Error codes: a lettered number with worded segments (E1234-SCHEMA-LOCK), constants.
ERRORS = st.one_of(
    _joined(st.tuples(_run(UPPER, 1, 4), _number(3, 5),
                      st.lists(_run(UPPER, 2, 8), max_size=3))
            .map(lambda p: [p[0] + p[1], *p[2]]), "-_.:").filter(lambda code: len(code) >= 5),
    st.lists(_run(UPPER, 3, 8), min_size=1, max_size=3).map(lambda w: "_".join(["ERR", *w])),
)
# Dotted and hex codes.
DOTTED = _joined(st.tuples(PREFIXES, st.lists(_number(1, 5), min_size=1, max_size=3))
                 .map(lambda p: [p[0], *p[1]]), ".")
HEX = st.tuples(_run("0123456789abcdef", 4, 8), st.booleans()).map(
    lambda p: "0x" + (p[0].upper() if p[1] else p[0]))
# Names with versions, any pin or tag sign.
VERSIONS = st.tuples(
    _joined(st.lists(_run(LOWER, 3, 8), min_size=1, max_size=2), "-_"),
    st.sampled_from(("==", ">=", "~=", "@", "@^", "-", "/", ":")),
    st.sampled_from(("", "v")),
    st.lists(_number(1, 2), min_size=2, max_size=4).map(".".join),
).map("".join)
# Prefixed codes (#W9502127) and mixed letters and digits with separators.
PREFIXED = st.tuples(_run(UPPER, 1, 3), _number(5, 9)).map(lambda p: f"#{p[0]}{p[1]}")
MIXED = _joined(st.tuples(_run(LOWER, 1, 4), _run(LOWER + DIGITS, 5, 10), _number(1, 3))
                .map(lambda p: [p[0], p[1] + p[2]]), "-_.")
PHONES = st.tuples(_number(1, 3), st.lists(_number(2, 4), min_size=3, max_size=5),
                   st.sampled_from(" -.")).map(lambda p: "+" + p[2].join([p[0], *p[1]]))
SHAPES = st.one_of(TICKETS, ERRORS, DOTTED, HEX, VERSIONS, PREFIXED, MIXED, PHONES)
WORDINGS = st.sampled_from(("{}", "see {}.", "the code {} again", "{} (noted)", "'{}'",
                            "failed: {}", "value={}", "[{}, x]", "use {}, then stop"))


def _assert_found_whole(value: str, text: str, said: bool) -> None:
    found = [found for found, _ in find_identifiers(text, said=said)]
    assert value in found, (text, found)
    # Never split: no part of the value is listed apart from it.
    assert not [other for other in found if other != value and other in value], (text, found)


@settings(max_examples=400, deadline=None)
@given(SHAPES, WORDINGS)
def test_an_identifier_of_any_shape_is_found_whole_where_it_is_said(
    value: str, wording: str,
) -> None:
    _assert_found_whole(value, f"Please look at {wording.format(value)} today", said=True)


@settings(max_examples=200, deadline=None)
@given(st.one_of(TICKETS, ERRORS, DOTTED, HEX, VERSIONS, PREFIXED, PHONES), WORDINGS)
def test_an_identifier_of_any_shape_is_found_whole_in_a_tool_s_output(
    value: str, wording: str,
) -> None:
    output = f"queue_2 = cache_17.get(x)\n{wording.format(value)}\nreturn queue_2"
    _assert_found_whole(value, output, said=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(SHAPES, min_size=2, max_size=5, unique=True),
       st.sampled_from((", ", " and ", "; ")))
def test_identifiers_side_by_side_are_each_found_whole(values: list[str], joiner: str) -> None:
    text = f"Keep {joiner.join(values)}."
    found = [found for found, _ in find_identifiers(text)]
    for value in values:
        assert value in found, (text, found)


@settings(max_examples=200, deadline=None)
@given(_number(9, 12), st.sampled_from(("order", "order number", "the order", "ticket",
                                        "account", "invoice no.", "case")))
def test_a_long_number_is_an_identifier_where_the_text_names_it(number: str, label: str
                                                                 ) -> None:
    assert number in [found for found, _ in find_identifiers(f"About {label} {number}, ok?")]


@pytest.mark.parametrize("text", [
    "updated 2024-05-15T15:00:00Z and 2024/05/15 at 10:30pm",
    "took 3.21s and 5000ms, 1.5GB, 12kb, a 24-hour hold on a 64-bit build",
    "gpt-4 and covid-19 and UTF-8 and SHA-256, 1/2 and 3.5",
    "rated +5 12 times",
])
def test_numbers_dates_times_and_measures_are_not_identifiers(text: str) -> None:
    assert find_identifiers(text) == []


@pytest.mark.parametrize(("text", "value"), [
    ("refund order ABCDE-123456 now", "ABCDE-123456"),  # a label's value ends with its word
    ("set pin=fastapi==1.2.3 first", "fastapi==1.2.3"),  # a key's value keeps its pin
    ("the line +453 355 5355 53 is busy", "+453 355 5355 53"),  # any grouping
])
def test_a_labelled_value_is_never_cut_short(text: str, value: str) -> None:
    _assert_found_whole(value, text, said=True)
