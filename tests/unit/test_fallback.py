"""The extractive summary: rules on a known span, always within budget, deterministic,
of the span alone (the pipeline updates the prior with it), and carrying the corpus's ids in its
artifacts."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.corpus import load_corpus, skip_without_corpus
from tests.unit.session_strategies import sessions, shared_counter, to_stored
from tests.unit.test_identifiers import _labelled_ids
from worker.compaction.facts import _FACT
from worker.compaction.fallback import (
    _AGENT_DECISION,
    _DECISION,
    _DONE,
    MAX_ARTIFACTS,
    NO_WORDS_GOAL,
    fallback_summary,
)
from worker.compaction.grouping import Group, group_messages
from worker.compaction.identifiers import (
    Artifact,
    collect_artifacts,
    extract_identifiers,
    identify_message,
    noting_passed_values,
)
from worker.compaction.messages import INSTRUCTION_ROLES, StoredMessage, parse_message
from worker.compaction.outcomes import classify_calls
from worker.compaction.pruning import prune_groups
from worker.compaction.schema import Summary, count_summary_tokens, empty_summary
from worker.compaction.sentences import Cue
from worker.compaction.summary_update import update_summary
from worker.compaction.validation import validate_summary


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def exchange(call_id: str, name: str, arguments: dict[str, Any], result: str) -> list[Any]:
    return [{"role": "assistant", "content": None,
             "tool_calls": [call(call_id, name, arguments)]},
            {"role": "tool", "tool_call_id": call_id, "content": result}]


SPAN = [
    {"role": "user",
     "content": "Hi, I want to cancel reservation ZFA04Y. My user id is mia_li_3668."},
    *exchange("c1", "get_user_details", {"user_id": "mia_li_3668"},
              json.dumps({"reservations": ["ZFA04Y", "4WQ150"]})),
    *exchange("c2", "get_reservation_details", {"reservation_id": "ZFA04Y"}, "{}"),
    *exchange("c3", "get_reservation_details", {"reservation_id": "4WQ150"}, "{}"),
    *exchange("c4", "cancel_reservation", {"reservation_id": "ZFA04Y"},
              "Error: reservation ZFA04Y cannot be cancelled after 24 hours"),
    {"role": "assistant", "content": "Sorry for the trouble. I have cancelled ZFA04Y now."},
    {"role": "user", "content": "I don't want travel insurance. Can you also check HAT170?"},
]


def summarize(messages: list[dict[str, Any]], budget_tokens: int = 2_000) -> Summary:
    stored = to_stored(messages, shared_counter(), first_seq=5)
    return fallback_summary(
        group_messages(stored), artifacts=extract_identifiers(stored),
        budget_tokens=budget_tokens, counter=shared_counter(),
    ).summary


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ("goal", "User request: Hi, I want to cancel reservation ZFA04Y. My user id is "
                 "mia_li_3668."),
        ("completed_actions", [
            "Compacted seq 5 to 15: 2 user, 5 assistant, 4 tool messages",
            "looked up with get_user_details \u00d71 (mia_li_3668)",
            "looked up with get_reservation_details \u00d72 (ZFA04Y, 4WQ150)",
            "called cancel_reservation(ZFA04Y) → failed: Error: reservation ZFA04Y cannot be "
                "cancelled "
            "after 24 hours",
            "I have cancelled ZFA04Y now.",
        ]),
        ("key_decisions", []),
        ("constraints_and_preferences", ["I don't want travel insurance."]),
        ("pending", [
            "Unanswered user request: I don't want travel insurance. Can you also check HAT170?",
            "Open error: cancel_reservation failed: Error: reservation ZFA04Y cannot be "
            "cancelled after 24 hours",
        ]),
        ("resolved", ["Answered: Hi, I want to cancel reservation ZFA04Y. My user id is "
                      "mia_li_3668."]),
        ("remaining_work", []),
    ],
)
def test_fallback_rules_on_a_known_span(section: str, expected: object) -> None:
    assert getattr(summarize(SPAN), section) == expected


def test_artifacts_are_listed_by_salience_without_tool_names() -> None:
    # The open request's HAT170 and the failure's ZFA04Y lead; newest first, then the rest.
    assert summarize(SPAN).relevant_artifacts == ["HAT170", "ZFA04Y", "4WQ150", "mia_li_3668"]


def test_a_pruned_result_is_reported_by_its_original_outcome_never_ok_by_default() -> None:
    record = json.dumps({"order_id": "#W2378156", "status": "processed", "items": ["x"] * 400})
    run = "\n".join(["collected 200 items", *["tests/test_a.py::test_x PASSED"] * 200,
                     "FAILED tests/test_sync.py::test_sync - E8028-SCHEMA"])
    messages = [{"role": "user", "content": "Please refund order #W2378156."},
                *exchange("c1", "refund", {"order_id": "#W2378156"}, record),
                *exchange("c2", "refund", {"order_id": "#W2378157"}, "[" + "1, " * 400 + "2]"),
                *exchange("c3", "run_tests", {"path": "tests/test_sync.py"}, run),
                {"role": "assistant", "content": "The refund is on its way."}]
    stored = to_stored(messages, shared_counter(), first_seq=1)
    span = prune_groups(group_messages(stored), audit_mode=False, counter=shared_counter())
    summary = fallback_summary(span, artifacts=extract_identifiers(stored), budget_tokens=2_000,
                               counter=shared_counter(),
                               outcomes=classify_calls(group_messages(stored))).summary
    assert summary.completed_actions[1:] == [
        "called refund(#W2378156) → unknown (status: processed)",
        "called refund(#W2378157) → unknown",
        "called run_tests(tests/test_sync.py) → failed: FAILED tests/test_sync.py::test_sync - "
        "E8028-SCHEMA"]
    assert "digest" not in "\n".join(summary.completed_actions)


def test_an_answered_request_is_not_pending() -> None:
    answered = [*SPAN, {"role": "assistant", "content": "HAT170 is on time."}]
    assert not any(item.startswith("Unanswered") for item in summarize(answered).pending)


def test_a_tool_call_without_its_result_is_pending() -> None:
    waiting = [*SPAN, {"role": "assistant", "content": None,
                       "tool_calls": [call("c9", "get_flight_status", {"flight": "HAT170"})]}]
    assert "Tool call get_flight_status (c9) has no result yet" in summarize(waiting).pending


def test_a_span_without_a_request_in_words_says_so_instead_of_inventing_a_goal() -> None:
    span = exchange("c1", "get_flight_status", {"flight_number": "HAT170"}, "on time")
    summary = summarize(span)
    # A long span's summary needs a goal to pass validation: a true one, not a guess.
    assert summary.goal == NO_WORDS_GOAL
    assert summary.completed_actions == [
        "Compacted seq 5 to 6: 1 assistant, 1 tool messages",
        "looked up with get_flight_status \u00d71 (HAT170)",
    ]
    assert summary.relevant_artifacts == ["HAT170"]


@settings(max_examples=40, deadline=None)
@given(sessions(max_turns=6), st.integers(0, 3_000))
def test_the_fallback_always_fits_its_budget_and_is_deterministic(
    stored: list[StoredMessage], extra_tokens: int
) -> None:
    counter = shared_counter()
    budget_tokens = count_summary_tokens(empty_summary(), counter) + extra_tokens
    groups, artifacts = group_messages(stored), extract_identifiers(stored)
    options: dict[str, Any] = {
        "artifacts": artifacts, "budget_tokens": budget_tokens, "counter": counter,
    }
    fitted = fallback_summary(groups, **options)
    summary = fitted.summary
    # The count validation takes from the draft instead of counting it again.
    assert fitted.tokens == count_summary_tokens(summary, counter) <= budget_tokens
    assert fallback_summary(list(groups), **options).summary == summary
    if extra_tokens >= 200 and any(m.message.role not in INSTRUCTION_ROLES for m in stored):
        # Room for a goal and one action: the summary passes validation of a long span.
        updated = update_summary(None, summary, budget_tokens=budget_tokens, counter=counter)
        validate_summary(summary, updated, span_tokens=10_000, budget_tokens=budget_tokens,
                         replaced_tokens=10**9, counter=counter,
                         span_summary_tokens=fitted.tokens)


def test_a_span_without_user_words_still_fills_the_load_bearing_sections() -> None:
    summary = summarize([{"role": "assistant", "content": "Here is the plan. Step one."}])
    assert summary.goal == "Agent topic: Here is the plan. Step one."
    assert summary.completed_actions == ["Compacted seq 5 to 5: 1 assistant messages"]


@functools.cache
def corpus_spans(name: str) -> list[tuple[dict[str, Any], list[Group], list[Artifact]]]:
    """Each corpus session with its groups and artifact index (token counts not needed)."""
    prepared = []
    for session in load_corpus(name):
        stored = [StoredMessage(n, parse_message(m), 0) for n, m in enumerate(session["messages"])]
        prepared.append((session, group_messages(stored), extract_identifiers(stored)))
    return prepared


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["dev", "dev_long"])
def test_corpus_fallbacks_fit_their_budget(name: str) -> None:
    skip_without_corpus()
    counter = shared_counter()
    for session, groups, artifacts in corpus_spans(name):
        for budget_tokens in (256, 1_024):
            summary = fallback_summary(
                groups, artifacts=artifacts, budget_tokens=budget_tokens,
                counter=counter,
            ).summary
            tokens = count_summary_tokens(summary, counter)
            assert tokens <= budget_tokens, f"{session['session_id']}: {tokens} tokens"


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["dev", "dev_long"])
def test_corpus_ids_survive_into_the_fallback_artifacts(name: str) -> None:
    skip_without_corpus()
    counter = shared_counter()
    for session, groups, artifacts in corpus_spans(name):
        summary = fallback_summary(
            groups, artifacts=artifacts, budget_tokens=4_096, counter=counter
        ).summary
        listed = summary.relevant_artifacts
        values = [a.value for a in artifacts if a.kind != "tool"]
        assert set(listed) <= set(values), session["session_id"]
        assert len(listed) == min(len(values), MAX_ARTIFACTS), session["session_id"]
        if name == "dev":  # short sessions: every id a tool call named fits
            missing = _labelled_ids(session) - set(listed)
            assert not missing, f"{session['session_id']}: {sorted(missing)}"


@pytest.mark.parametrize(
    ("result", "is_failure"),
    [
        ("Error: payment amount does not add up", True),
        ('{"error": "reservation not found"}', True),
        ("Traceback (most recent call last):\n  File \"x.py\", line 1", True),
        ("===== 12 passed, 0 failed in 3.1s =====", False),
        ("2024-05-01 INFO start\n2024-05-01 ERROR retrying upstream\n2024-05-01 INFO ok", False),
        ('{"status": "ok", "errors_seen_last_week": 0}', False),
        ("FAILED tests/test_db.py::test_up - E3283-SCHEMA\n=== 1 failed, 3 passed ===", True),
        ("build step 3\nexit code 2", True),
    ],
)
def test_only_a_result_that_leads_or_ends_with_an_error_counts_as_a_failed_call(
    result: str, is_failure: bool
) -> None:
    span = [{"role": "user", "content": "Please run the check for ticket OPS-12."},
            *exchange("c1", "run_check", {"ticket": "OPS-12"}, result)]
    failures = [a for a in summarize(span).pending if a.startswith("Open error: run_check")]
    assert bool(failures) is is_failure


@settings(max_examples=60, deadline=None)
@given(sessions(max_turns=6, allow_huge=False), st.integers(0, 2))
def test_calls_show_the_same_values_from_their_stored_index_as_from_their_arguments(
    stored: list[StoredMessage], unindexed_every: int,
) -> None:
    """A job reads what each call passed from its message's stored mentions; a message
    stored before indexing (or a caller without the index) has its arguments read."""
    passed: dict[int, tuple[str, ...]] = {}
    mentions = [(m.seq, identify_message(m.message)) for m in stored
                if unindexed_every == 0 or m.seq % (unindexed_every + 1)]
    artifacts = collect_artifacts(noting_passed_values(mentions, passed))
    drafts = [fallback_summary(group_messages(stored), artifacts=artifacts,
                               budget_tokens=4_000, counter=shared_counter(),
                               passed_values=values).summary
              for values in (passed, None)]
    assert drafts[0] == drafts[1]


# Cue words in any case, with the letters Unicode folds onto ASCII ones (long s, dotless
# i, Kelvin sign) and punctuation that makes or breaks a word boundary.
_CUE_TEXT = st.lists(st.sampled_from(
    ["we'll use", "DECIDED", "Decision :", "pinned", "Can't", "CANNOT", "not eligible",
     "Successfully", "cancelled", "canceled", "has been", "HAVE  BEEN", "don't want",
     "No later than", "prefer", "\u017fuccessfully", "\u0131f", "\u212aeep", "İ", "x", "_", "1",
     " ", ".", "?", "'", "\n", "é"]), max_size=10).map("".join)


@settings(max_examples=300, deadline=None)
@given(_CUE_TEXT, st.sampled_from([_FACT, _DECISION, _AGENT_DECISION, _DONE]))
def test_a_cue_finds_what_its_case_insensitive_pattern_finds(text: str, cue: Cue) -> None:
    assert cue.search(text) is (cue._any_case.search(text) is not None)


def test_a_cue_must_be_written_in_lowercase() -> None:
    with pytest.raises(ValueError, match="lowercase"):
        Cue(r"\bDone\b")
    assert Cue(r"\Adone\b\s*\Z").search("DONE ")
