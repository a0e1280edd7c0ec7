"""Whole facts: a user's turn keeps every sentence that states a constraint, a preference
or a fact about the user's situation, wherever in the turn it stands; checked on turns a
seeded grammar writes, alone and competing with a long span for the budget."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.support.generated import _FILLERS, fact_session, fact_turn, generated_turns
from tests.unit.session_strategies import shared_counter, to_stored
from worker.compaction.facts import is_fact
from worker.compaction.fallback import fallback_summary
from worker.compaction.grouping import group_messages
from worker.compaction.identifiers import extract_identifiers
from worker.compaction.schema import Summary

BASE_BUDGET_TOKENS = 4_096  # the production default of summary_budget_tokens
SEEDS = range(120)


def summarize(messages: list[dict[str, Any]]) -> Summary:
    stored = to_stored(messages, shared_counter())
    return fallback_summary(group_messages(stored), artifacts=extract_identifiers(stored),
                            budget_tokens=BASE_BUDGET_TOKENS, counter=shared_counter()).summary


@pytest.mark.parametrize("seed", SEEDS)
def test_the_decisive_later_sentence_of_every_user_turn_is_kept(seed: int) -> None:
    messages, planted = fact_session(seed, random.Random(seed).randint(1, 6))
    kept = summarize(messages).constraints_and_preferences
    assert [turn.fact for turn in planted if turn.fact not in kept] == []


@pytest.mark.parametrize("seed", SEEDS[:30])
def test_facts_keep_their_share_when_a_long_span_competes_for_the_budget(seed: int) -> None:
    messages, planted = fact_session(seed, 6)
    # 120 earlier exchanges of calls, identifiers, answers and requests before the facts.
    crowded = [messages[0], *generated_turns(f"C{seed}", 120), *messages[1:]]
    summary = summarize(crowded)
    assert summary.completed_actions and len(summary.relevant_artifacts) > 20
    assert [turn.fact for turn in planted
            if turn.fact not in summary.constraints_and_preferences] == []


def test_every_fact_of_a_turn_is_kept_not_one_sentence_per_turn() -> None:
    turn = "I'm only using mobile data right now. Also, I'm currently traveling abroad in France."
    messages = [{"role": "user", "content": turn},
                {"role": "assistant", "content": "Roaming may be off; let me check."}]
    assert summarize(messages).constraints_and_preferences == [
        "I'm only using mobile data right now.",
        "Also, I'm currently traveling abroad in France."]


@pytest.mark.parametrize("seed", range(40))
def test_a_turns_fact_is_told_from_its_fillers(seed: int) -> None:
    turn = fact_turn(random.Random(seed))
    assert is_fact(turn.fact)
    assert [filler for filler in _FILLERS if filler in turn.text and is_fact(filler)] == []


@pytest.mark.parametrize("question", [
    "Can I still use my phone abroad?", "Is the premium plan due by Friday?",
    "Could you ship it to Lisbon instead?"])
def test_a_question_states_no_fact(question: str) -> None:
    assert not is_fact(question)


def test_a_users_decision_is_listed_with_the_decisions_not_again_as_a_fact() -> None:
    messages = [{"role": "user", "content": "We decided to keep card_1234; do not change it. "
                 "I'm only on mobile data today."},
                {"role": "assistant", "content": "Understood."}]
    summary = summarize(messages)
    assert summary.key_decisions == ["We decided to keep card_1234; do not change it."]
    assert summary.constraints_and_preferences == ["I'm only on mobile data today."]
