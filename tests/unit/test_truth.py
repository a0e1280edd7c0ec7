"""The truth check: a summary may say only what the span's record holds. Each lie a model
tells is found with its kind and ids; the extractive summary of the same span tells none."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.session_strategies import drawn_request, shared_counter, to_stored
from tests.unit.test_fallback import exchange
from worker.compaction import truth
from worker.compaction.errors import SummaryInvalid
from worker.compaction.fallback import fallback_summary
from worker.compaction.grouping import group_messages
from worker.compaction.identifiers import extract_identifiers
from worker.compaction.outcomes import classify_calls
from worker.compaction.pruning import prune_groups
from worker.compaction.requests import continues_conversation, read_requests
from worker.compaction.schema import Summary, empty_summary
from worker.compaction.summary_update import normalize_item, update_summary
from worker.compaction.truth import (
    Contradiction,
    SpanRecord,
    describe_contradictions,
    find_contradictions,
    read_record,
)
from worker.compaction.validation import validate_summary

FAILED_RUN = "\n".join(["collected 90 items", *["tests/test_a.py::test_x PASSED"] * 89,
                        "FAILED tests/test_sync.py::test_sync - E8028-SCHEMA"])
SPAN = [
    {"role": "user", "content": "Please cancel order #W2378156 for me."},
    *exchange("c1", "cancel_pending_order", {"order_id": "#W2378156"},
              json.dumps({"order_id": "#W2378156", "status": "cancelled"})),
    {"role": "assistant", "content": "Order #W2378156 is cancelled."},
    {"role": "user", "content": "Can you also run the sync tests in tests/test_sync.py?"},
    *exchange("c2", "run_tests", {"path": "tests/test_sync.py"}, FAILED_RUN),
    *exchange("c3", "deploy", {"env": "staging"}, json.dumps({"status": "ok"})),
]


def record_and_extractive(messages: list[dict[str, Any]], *, tail: int = 0
                          ) -> tuple[SpanRecord, Summary]:
    stored = to_stored(messages, shared_counter())
    span, rest = (stored[:-tail], stored[-tail:]) if tail else (stored, [])
    groups = group_messages(span)
    outcomes, artifacts = classify_calls(groups), extract_identifiers(span)
    continues = continues_conversation(span, rest)
    record = read_record(groups, outcomes=outcomes, artifacts=artifacts, prior=None,
                         tail_continues=continues)
    summary = fallback_summary(groups, artifacts=artifacts, outcomes=outcomes,
                               budget_tokens=2_000, counter=shared_counter(),
                               tail_continues=continues).summary
    return record, summary


def with_items(summary: Summary, **items: list[str]) -> Summary:
    return summary.model_copy(update={name: [*summary.items_of(name), *added]
                                      for name, added in items.items()})


def validation_rejection(summary: Summary, record: SpanRecord, *, span_tokens: int
                         ) -> SummaryInvalid:
    """What validation raises for ``summary`` (drafted for a span of ``span_tokens``)
    against ``record``; fails the test when it accepts it."""
    updated = update_summary(None, summary, budget_tokens=2_000, counter=shared_counter())
    with pytest.raises(SummaryInvalid) as raised:
        validate_summary(summary, updated, span_tokens=span_tokens, budget_tokens=2_000,
                         replaced_tokens=10_000, counter=shared_counter(), record=record)
    return raised.value


def test_the_extractive_summary_of_the_span_contradicts_nothing() -> None:
    record, summary = record_and_extractive(SPAN)
    assert find_contradictions(summary, record) == []
    assert "called run_tests(tests/test_sync.py) → failed: FAILED tests/test_sync.py::" \
           "test_sync - E8028-SCHEMA" in summary.completed_actions
    assert "called deploy() → ok" in summary.completed_actions


@pytest.mark.parametrize(
    ("lie", "expected"),
    [
        ({"completed_actions": ["called run_tests(tests/test_sync.py) → ok"]},
         [Contradiction("false_outcome", ("c2",))]),
        ({"completed_actions": ["run_tests passed"]}, [Contradiction("false_outcome", ("c2",))]),
        ({"completed_actions": ["called deploy(staging) → failed"]},
         [Contradiction("false_outcome", ("c3",))]),
        # A record without a status is no success to report.
        ({"completed_actions": ["called cancel_pending_order(#W2378156) → ok"]},
         [Contradiction("false_outcome", ("c1",))]),
        # Answered in the span, and listed so in resolved: reopened, and open and done.
        ({"pending": ["Unanswered user request: Please cancel order #W2378156 for me."]},
         [Contradiction("reopened_request"), Contradiction("open_and_done")]),
        ({"pending": ["Tool call deploy (c3) has no result yet"]},
         [Contradiction("reopened_call", ("c3",))]),
        ({"pending": ["Roll back the staging deploy"],
          "resolved": ["Done: roll back the staging deploy."]},
         [Contradiction("open_and_done")]),
        ({"relevant_artifacts": ["INV-740213"]},
         [Contradiction("invented_identifier", ("INV-740213",))]),
    ],
    ids=["ok-for-failed", "passed-for-failed", "failed-for-ok", "ok-for-unknown",
         "reopened-request", "reopened-call", "open-and-done", "invented-identifier"],
)
def test_each_lie_is_found_with_its_kind_and_ids(
    lie: dict[str, list[str]], expected: list[Contradiction],
) -> None:
    record, summary = record_and_extractive(SPAN)
    assert find_contradictions(with_items(summary, **lie), record) == expected


def test_a_prior_item_copied_verbatim_is_the_priors_and_not_checked_again() -> None:
    stored = to_stored(SPAN, shared_counter())
    groups = group_messages(stored)
    prior = empty_summary().model_copy(update={
        "pending": ["Open error: run_tests failed: FAILED tests/test_sync.py - E1"]})
    record = read_record(groups, outcomes=classify_calls(groups),
                         artifacts=extract_identifiers(stored), prior=prior,
                         tail_continues=False)
    # Settled by the span (the update contract), though no call of this span said E1.
    settled = empty_summary().model_copy(update={"resolved": prior.pending})
    assert find_contradictions(settled, record) == []


def test_the_description_names_kinds_counts_and_ids_only() -> None:
    found = [Contradiction("false_outcome", ("c2",)), Contradiction("false_outcome", ("c3",)),
             Contradiction("reopened_request"),
             Contradiction("invented_identifier", ("INV-740213",))]
    assert describe_contradictions(found) == (
        "the summary contradicts the span's record: false_outcome 2 (c2, c3); "
        "reopened_request 1; invented_identifier 1 (INV-740213)")


def test_validation_rejects_a_contradicting_summary_with_its_reason() -> None:
    record, summary = record_and_extractive(SPAN)
    lying = with_items(summary, completed_actions=["called run_tests(tests/test_sync.py) → ok"])
    rejected = validation_rejection(lying, record, span_tokens=10_000)
    assert rejected.reason == "summary_contradicts_history"
    assert "false_outcome 1 (c2)" in rejected.message


def test_a_request_a_succeeded_call_acted_on_is_not_open() -> None:
    messages = [{"role": "user", "content": "Please deploy build 4512 to staging."},
                *exchange("c1", "deploy", {"build": "4512"}, json.dumps({"status": "done"}))]
    record, summary = record_and_extractive(messages)
    assert not any("deploy build 4512" in item for item in summary.pending)
    assert "Acted on: Please deploy build 4512 to staging." in summary.resolved
    assert find_contradictions(summary, record) == []


def test_the_goal_is_not_answered_while_the_tail_goes_on_with_it() -> None:
    messages = [{"role": "user", "content": "Could you rebook reservation ZFA04Y to Friday?"},
                {"role": "assistant", "content": "Friday has two flights: HAT170 or HAT180."},
                {"role": "user", "content": "HAT170 please."},
                {"role": "assistant", "content": "Rebooking ZFA04Y on HAT170 now."}]
    _, continued = record_and_extractive(messages, tail=2)
    _, ended = record_and_extractive([*messages[:2], {"role": "user", "content": "###STOP###"},
                                      {"role": "user", "content": "Hi, a new question."}],
                                     tail=1)
    assert not any("rebook reservation ZFA04Y" in item for item in continued.resolved)
    assert "Answered: Could you rebook reservation ZFA04Y to Friday?" in ended.resolved


def test_a_promise_or_question_of_the_agent_is_not_a_completed_action() -> None:
    messages = [{"role": "user", "content": "Please cancel reservation ZFA04Y."},
                {"role": "assistant", "content": "Once you confirm, your reservation will be "
                 "cancelled. Shall I get it cancelled now?"}]
    _, summary = record_and_extractive(messages)
    assert not any("cancelled" in item for item in summary.completed_actions)


def test_an_error_stays_open_until_the_same_call_on_the_same_target_succeeds() -> None:
    passing = "=== 90 passed ==="
    other = [*exchange("c1", "run_tests", {"path": "tests/test_sync.py"}, FAILED_RUN),
             *exchange("c2", "run_tests", {"path": "tests/test_other.py"}, passing)]
    same = [*other, *exchange("c3", "run_tests", {"path": "tests/test_sync.py"}, passing)]
    _, still_open = record_and_extractive(other)
    _, fixed = record_and_extractive(same)
    assert [i for i in still_open.pending if i.startswith("Open error: run_tests")]
    assert not [i for i in fixed.pending if i.startswith("Open error")]
    assert [i for i in fixed.resolved if i.startswith("Fixed: run_tests failed")]


def test_a_request_that_repeats_an_answered_ones_first_words_is_not_a_reopening() -> None:
    # A customer who keeps asking: the open request shares the answered one's opening.
    messages = [
        {"role": "user", "content": "I really don't want to cancel and rebook, can you add "
         "insurance to PEP4E0?"},
        {"role": "assistant", "content": "Insurance cannot be added after booking."},
        {"role": "user", "content": "I understand, but I really don't want to cancel and "
         "rebook. Is there any way to add it?"}]
    record, summary = record_and_extractive(messages)
    assert summary.pending and summary.resolved
    assert find_contradictions(summary, record) == []


def test_an_identifier_cut_short_by_a_clipped_line_is_not_invented() -> None:
    # HAT166 only in a tool output that pruning shortens: only the index holds it.
    messages = [{"role": "user", "content": "Which flights go to Boston?"},
                *exchange("c1", "search_flights", {"to": "BOS"},
                          json.dumps([{"n": i, "pad": "x" * 400} for i in range(40)]
                                     + [{"flight_number": "HAT166"}]))]
    stored = to_stored(messages, shared_counter())
    groups = group_messages(stored)
    pruned = prune_groups(groups, audit_mode=False, counter=shared_counter())
    record = read_record(pruned, outcomes=classify_calls(groups),
                         artifacts=extract_identifiers(stored), prior=None,
                         tail_continues=False)
    cut = empty_summary().model_copy(update={"key_decisions": ["Offered HAT16"]})
    invented = empty_summary().model_copy(update={"key_decisions": ["Offered HAT999"]})
    assert "HAT166" not in "\n".join(record.texts())
    assert find_contradictions(cut, record) == []
    assert find_contradictions(invented, record) == [
        Contradiction("invented_identifier", ("HAT999",))]


def test_the_failing_line_a_summary_quotes_from_a_pruned_output_is_the_records() -> None:
    # "batch_94" is code in a tool output (not indexed), on the line that says it failed.
    run = "\n".join([*["tests/test_a.py::test_x PASSED"] * 80,
                     "FAILED tests/test_sync.py::test_sync - batch_94 lost E8028-SCHEMA"])
    messages = [{"role": "user", "content": "Please run the sync tests."},
                *exchange("c1", "run_tests", {"path": "tests/test_sync.py"}, run)]
    stored = to_stored(messages, shared_counter())
    groups = group_messages(stored)
    pruned = prune_groups(groups, audit_mode=False, counter=shared_counter())
    outcomes, artifacts = classify_calls(groups), extract_identifiers(stored)
    record = read_record(pruned, outcomes=outcomes, artifacts=artifacts, prior=None,
                         tail_continues=False)
    summary = fallback_summary(pruned, artifacts=artifacts, outcomes=outcomes,
                               budget_tokens=2_000, counter=shared_counter()).summary
    assert any("batch_94" in item for item in summary.completed_actions)
    assert find_contradictions(summary, record) == []


def test_requests_that_open_with_the_same_words_are_not_one_request_open_and_done() -> None:
    messages = [
        {"role": "user", "content": "Could you help me with the phone number +44 20 7946 2849?"},
        {"role": "assistant", "content": "That number belongs to order #W9720136."},
        {"role": "user", "content": "Could you help me with the phone number (721) 555-5256?"}]
    record, summary = record_and_extractive(messages)
    assert summary.pending and summary.resolved
    assert find_contradictions(summary, record) == []


_CLAIM_PIECES = ("ok", "OK", "Succeeded", "passed", "FAILED", "failing", "errored", "okay",
                 "run", "run_tests", "get", "x", " ", "(", ")", "\u2192", "->", ":", "-", "_",
                 ".", "\n", "a,b")


@given(st.lists(st.lists(st.sampled_from(_CLAIM_PIECES), max_size=10).map("".join),
                max_size=6),
       st.lists(st.sampled_from(("run", "run_tests", "get", "x", "tests")), unique=True,
                max_size=4))
def test_claims_read_in_the_joined_items_are_each_items_own(items: list[str],
                                                            tools: list[str]) -> None:
    # Item by item, tool by tool, each name's whole occurrences: what the claims are.
    expected = []
    for item in items:
        for tool in tools:
            at = item.find(tool)
            while at >= 0:
                end = at + len(tool)
                if not (at and re.match(r"[\w.-]", item[at - 1])) and not (
                        end < len(item) and re.match(r"[\w.-]", item[end])):
                    claim = truth._CLAIM.match(item, end)
                    if claim:
                        expected.append((tool, claim.group("args"), claim.group("word")))
                at = item.find(tool, end)
    found = [(tool, claim.group("args"), claim.group("word"))
             for tool, claim in truth._claims(items, tools)]
    assert found == expected


_DONE_PIECES = ("Answered: ", "acted on: ", "Fixed ", "fix", "FIX", "the", "bug", "Stra\u00dfe",
                "strasse", " ", "  ", "\t", "\n", ".", "!", ":", "\0", "x")


@given(st.lists(st.lists(st.sampled_from(_DONE_PIECES), max_size=8).map("".join), max_size=5),
       st.lists(st.lists(st.sampled_from(_DONE_PIECES), min_size=1, max_size=3).map(
           lambda pieces: normalize_item("".join(pieces))).filter(bool), max_size=3))
def test_done_items_are_each_read_against_the_requests_held_open(items: list[str],
                                                                 quotes: list[str]) -> None:
    # Item by item: a done item whose body (its key less its label) holds a quote.
    expected = [Contradiction("done_while_open") for item in items
                if any(q in truth._LABEL.sub("", normalize_item(item), count=1) for q in quotes)]
    record = SpanRecord(outcomes=(), settled_requests=(), open_requests=(),
                        known_values=frozenset(), messages=(), unsettled_quotes=tuple(quotes))
    found = find_contradictions(with_items(empty_summary(), completed_actions=items), record)
    assert [c for c in found if c.kind == "done_while_open"] == expected


BOUNDARY_TEXT = "[SESSION BOUNDARY 2/2] The previous customer conversation has ended."


def asked_twice(seed: int) -> tuple[list[dict[str, Any]], int, str]:
    """A session whose request is answered once and asked again in the same words, the
    second time held open: left unanswered after another goal, or the goal of a new
    conversation the tail goes on with. Returns the messages, the tail's length and the
    request."""
    rng = random.Random(seed)
    request, named = drawn_request(rng)
    other, other_named = drawn_request(rng)
    answered = [{"role": "user", "content": request},
                {"role": "assistant", "content": f"The {named} is updated as you asked."}]
    if seed % 2:
        return [{"role": "user", "content": other},
                {"role": "assistant", "content": f"The {other_named} is updated."},
                *answered, {"role": "user", "content": request}], 0, request
    return [*answered, {"role": "user", "content": BOUNDARY_TEXT},
            {"role": "user", "content": request},
            {"role": "assistant", "content": f"Looking at {named} now."},
            {"role": "user", "content": "Thanks, go ahead."},
            {"role": "assistant", "content": f"Working on {named}."}], 2, request


def without_first_answer(messages: list[dict[str, Any]], request: str
                         ) -> list[dict[str, Any]]:
    first = next(i for i, m in enumerate(messages) if m["content"] == request)
    return messages[:first] + messages[first + 2:]


@pytest.mark.parametrize("seed", range(12))
def test_a_request_asked_again_after_its_answer_may_be_listed_as_answered(seed: int) -> None:
    messages, tail, request = asked_twice(seed)
    record, summary = record_and_extractive(messages, tail=tail)
    # Listed open too, the same words are open_and_done whichever seqs: not listed here.
    answered = with_items(summary.model_copy(update={"pending": []}),
                          resolved=[f"Answered: {request}"])
    record_without, _ = record_and_extractive(without_first_answer(messages, request),
                                              tail=tail)

    assert find_contradictions(summary, record) == []
    assert find_contradictions(answered, record) == []
    # The same words with no answer before them: the done item can mean only the open one.
    assert find_contradictions(answered, record_without) == [Contradiction("done_while_open")]


@pytest.mark.parametrize("seed", range(12))
def test_the_open_request_or_continued_goal_filed_as_done_is_rejected_and_named(
    seed: int,
) -> None:
    rng = random.Random(seed)
    request, named = drawn_request(rng)
    asked = [{"role": "user", "content": request},
             {"role": "assistant", "content": f"Looking at {named} now."},
             {"role": "user", "content": "Thanks, go ahead."},
             {"role": "assistant", "content": f"Working on {named}."}]
    # Unanswered at the span's end, or the goal the verbatim tail still works on.
    messages, tail = (asked[:1], 0) if seed % 2 else (asked, 2)
    record, summary = record_and_extractive(messages, tail=tail)
    label = rng.choice(["Answered: ", "Done: ", "completed actions: ", ""])
    section = rng.choice(["completed_actions", "resolved"])
    filed = with_items(summary, **{section: [label + request]})

    assert find_contradictions(summary, record) == []
    rejected = validation_rejection(filed, record, span_tokens=100)
    assert rejected.reason == "summary_contradicts_history"
    assert "done_while_open 1" in rejected.message


def test_the_ledger_tells_a_repeated_request_from_the_open_one_by_seq() -> None:
    messages, _, request = asked_twice(1)
    ledger = read_requests(to_stored(messages, shared_counter()), has_prior_goal=False)
    assert [(a.seq, a.text) for a in ledger.settled if a.text == request] == [(3, request)]
    assert [(a.seq, a.text) for a in ledger.held_open] == [(5, request)]
