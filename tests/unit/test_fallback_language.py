"""The extractive summary reads plain language: decisions and confirmations, completed
actions with their results, answered and open requests, the latest goal, and the prior
items its span settles (the update contract); checked on generated spans and on the real
corpus sessions."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.support.corpus import skip_without_corpus
from tests.unit.session_strategies import shared_counter, to_stored
from tests.unit.test_fallback import corpus_spans, exchange, summarize
from tests.unit.test_schema import filled
from worker.compaction.fallback import fallback_summary
from worker.compaction.grouping import group_messages
from worker.compaction.identifiers import extract_identifiers
from worker.compaction.outcomes import find_failures
from worker.compaction.salience import featured_values, rank_artifacts
from worker.compaction.schema import Summary
from worker.compaction.summary_update import update_summary

BLOCK_TOKENS = 4_096

CODING_SPAN: list[dict[str, Any]] = [
    {"role": "user", "content": "Please fix the failing import in src/db.py."},
    *exchange("c1", "run_tests", {"target": "tests/test_db.py"},
              "FAILED tests/test_db.py::test_up - ERR-3283: bad row\n=== 1 failed ==="),
    {"role": "assistant", "content": "Decision: pin sqlalchemy==2.0.1 because 1.4 lacks "
     "async. We'll go with the async engine. Shall I edit src/db.py now?"},
    {"role": "user", "content": "Yes, go ahead."},
    *exchange("c2", "edit_file", {"path": "src/db.py"}, "wrote src/db.py (4 lines changed)"),
    *exchange("c3", "run_tests", {"target": "tests/test_db.py"}, "=== 3 passed in 0.2s ==="),
    {"role": "assistant", "content": "Fixed: the import works and the tests pass."},
]


def test_decisions_and_confirmations_are_recognised_with_what_they_answer() -> None:
    decisions = summarize(CODING_SPAN).key_decisions
    assert decisions == [
        "Decision: pin sqlalchemy==2.0.1 because 1.4 lacks async.",
        "We'll go with the async engine.",
        "User confirmed: Yes, go ahead. (to: Shall I edit src/db.py now?)",
    ]


def test_completed_actions_carry_their_results_and_the_agents_reports() -> None:
    actions = summarize(CODING_SPAN).completed_actions
    assert "called run_tests(tests/test_db.py) → failed: FAILED tests/test_db.py::test_up - " \
           "ERR-3283: bad row" in actions
    assert "called edit_file(src/db.py) → unknown (wrote src/db.py (4 lines changed))" \
        in actions
    assert "called run_tests(tests/test_db.py) → ok" in actions
    assert actions[-1] == "Fixed: the import works and the tests pass."


def test_a_failure_fixed_later_in_the_span_is_resolved_not_open() -> None:
    summary = summarize(CODING_SPAN)
    assert not any(item.startswith("Open error") for item in summary.pending)
    assert any(item.startswith("Fixed: run_tests failed:") and "ERR-3283" in item
               for item in summary.resolved)
    unfixed = summarize(CODING_SPAN[:3])
    assert any("ERR-3283" in item for item in unfixed.pending)


def test_requests_answered_in_the_span_are_resolved_and_the_last_unanswered_is_open() -> None:
    span = [{"role": "user", "content": "Can you check HAT170?"},
            {"role": "assistant", "content": "HAT170 is on time."},
            {"role": "user", "content": "Could you also book a seat on HAT171?"}]
    summary = summarize(span)
    assert summary.resolved == ["Answered: Can you check HAT170?"]
    assert summary.pending == ["Unanswered user request: Could you also book a seat on HAT171?"]


def test_in_joined_conversations_the_goal_is_the_newest_customers_first_request() -> None:
    span = [{"role": "user", "content": "Hi, I need to cancel reservation ZFA04Y."},
            {"role": "assistant", "content": "Cancelled."},
            {"role": "user", "content": "Thanks! ###STOP###"},
            {"role": "user", "content": "[SESSION BOUNDARY 2/2] The previous customer "
             "conversation has ended."},
            {"role": "user", "content": "Hello, could you change my seat on HAT099?"},
            {"role": "assistant", "content": "Sure."}]
    assert summarize(span).goal == "User request: Hello, could you change my seat on HAT099?"


def span_summary(span: list[dict[str, Any]], prior: Summary) -> Summary:
    stored = to_stored(span, shared_counter(), first_seq=40)
    return fallback_summary(group_messages(stored), artifacts=extract_identifiers(stored),
                            budget_tokens=2_000, counter=shared_counter(), prior=prior).summary


def test_a_continued_conversation_keeps_the_prior_goal_and_settles_its_open_items() -> None:
    prior = filled(
        goal="User request: Please fix the failing import in src/db.py.",
        key_decisions=["Decision: pin sqlalchemy==1.4.2 because it is what we run."],
        pending=["Unanswered user request: Can you also bump the driver?",
                 "Open error: run_tests failed: FAILED tests/test_db.py::test_up - ERR-3283"],
    )
    span = [{"role": "assistant", "content": "Decision: pin sqlalchemy==2.0.1 because 1.4 "
             "lacks async. I bumped the driver."},
            *exchange("c9", "run_tests", {"target": "tests/test_db.py"}, "=== 3 passed ===")]
    new = span_summary(span, prior)
    assert new.goal == ""
    assert new.resolved[:3] == [*prior.pending, *prior.key_decisions]
    updated = update_summary(prior, new, budget_tokens=2_000, counter=shared_counter()).summary
    assert updated.goal == prior.goal and updated.pending == []
    assert updated.key_decisions == ["Decision: pin sqlalchemy==2.0.1 because 1.4 lacks async."]


@pytest.mark.corpus
def test_corpus_joined_sessions_take_the_goal_from_their_last_conversation() -> None:
    skip_without_corpus()
    counter = shared_counter()
    for session, groups, artifacts in corpus_spans("dev_long"):
        users = [m.get("content") or "" for m in session["messages"] if m["role"] == "user"]
        last = max(i for i, text in enumerate(users) if "SESSION BOUNDARY" in text)
        goal = fallback_summary(groups, artifacts=artifacts, budget_tokens=4_096,
                                counter=counter).summary.goal
        opening = " ".join(users[last + 1].split())[:40]
        assert goal.startswith(f"User request: {opening}"), session["session_id"]


@pytest.mark.corpus
def test_corpus_sessions_show_their_changes_decisions_and_no_answered_request_as_open() -> None:
    skip_without_corpus()
    counter, with_decisions, sessions = shared_counter(), 0, corpus_spans("dev")
    for session, groups, artifacts in sessions:
        summary = fallback_summary(groups, artifacts=artifacts, budget_tokens=4_096,
                                   counter=counter).summary
        messages = session["messages"]
        changes = {c["function"]["name"] for m in messages for c in m.get("tool_calls") or []
                   if re.match(r"(update|cancel|book|send|transfer)_", c["function"]["name"])}
        for name in changes:
            assert any(a.startswith(f"called {name}(") and " → " in a
                       for a in summary.completed_actions), (session["session_id"], name)
        if messages[-1]["role"] == "assistant" and messages[-1].get("content"):
            assert not any(p.startswith("Unanswered") for p in summary.pending)
        with_decisions += bool(summary.key_decisions)
    assert with_decisions >= 0.9 * len(sessions)


@pytest.mark.corpus
def test_corpus_joined_sessions_up_to_200k_tokens_keep_what_was_said_in_the_block() -> None:
    skip_without_corpus()
    counter = shared_counter()
    for session, groups, artifacts in corpus_spans("dev_long"):
        text = "\n".join(m.get("content") or "" for m in session["messages"])
        if counter.count_text(text) > 200_000:
            continue
        span = [group for group in groups if not group.is_instruction]
        drafted = fallback_summary(span, artifacts=artifacts, budget_tokens=BLOCK_TOKENS,
                                   counter=counter).summary
        texts = [*drafted.key_decisions, *drafted.pending]  # as the pipeline ranks them
        featured = featured_values(find_failures(span), texts, artifacts)
        ranked = [a.value for a in rank_artifacts(artifacts, featured=featured)]
        block = update_summary(None, drafted, budget_tokens=BLOCK_TOKENS, counter=counter,
                               identifiers=ranked).fitted
        said = [a.value for a in artifacts
                if a.kind != "tool" and not a.sources.isdisjoint({"user", "assistant"})]
        kept = sum(value in block.text for value in said) / len(said)
        assert kept >= 0.95 and block.tokens <= BLOCK_TOKENS, (session["session_id"], kept)
