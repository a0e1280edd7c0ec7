"""Whose fact: in a session that joins several parties' conversations, each party is found
by a general signal (a boundary marker, a greeting after a closing, a new identity), the
constraints and decisions say whose they are, and the goal and open items are the current
party's; checked on joined sessions a seeded grammar writes."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.support.generated import PARTY_SIGNALS, joined_session
from tests.unit.session_strategies import shared_counter, to_stored
from worker.compaction.fallback import fallback_summary
from worker.compaction.grouping import group_messages
from worker.compaction.identifiers import extract_identifiers
from worker.compaction.messages import INSTRUCTION_ROLES
from worker.compaction.parties import Party, find_parties
from worker.compaction.schema import Summary

FIRST_SEQ = 1
SEEDS = range(80)


def summarize(messages: list[dict[str, Any]], prior: Summary | None = None) -> Summary:
    stored = to_stored(messages, shared_counter(), first_seq=FIRST_SEQ)
    return fallback_summary(group_messages(stored), artifacts=extract_identifiers(stored),
                            budget_tokens=4_096, counter=shared_counter(), prior=prior).summary


def planted_parties(seed: int) -> tuple[list[dict[str, Any]], list[Any], list[Party]]:
    messages, planted = joined_session(seed, random.Random(seed).randint(2, 5))
    expected = [Party(p.first_index + FIRST_SEQ, p.identity) for p in planted]
    return messages, planted, expected


@pytest.mark.parametrize("seed", SEEDS)
def test_every_party_is_found_where_its_signal_starts_it(seed: int) -> None:
    messages, _, expected = planted_parties(seed)
    stored = [m for m in to_stored(messages, shared_counter(), first_seq=FIRST_SEQ)
              if m.message.role not in INSTRUCTION_ROLES]
    assert find_parties(stored) == expected


def test_the_grammar_draws_every_signal() -> None:
    drawn = {p.signal for seed in SEEDS for p in joined_session(seed, 5)[1]}
    assert drawn >= set(PARTY_SIGNALS)


@pytest.mark.parametrize("seed", SEEDS)
def test_each_fact_and_decision_says_whose_it_is(seed: int) -> None:
    messages, planted, expected = planted_parties(seed)
    summary = summarize(messages)
    for party, found in zip(planted, expected, strict=True):
        assert f"{found.label()}{party.fact}" in summary.constraints_and_preferences
        assert f"{found.label()}{party.decision}" in summary.key_decisions
    assert all(item.startswith("[party ")
               for item in [*summary.constraints_and_preferences, *summary.key_decisions])


@pytest.mark.parametrize("seed", SEEDS)
def test_the_goal_and_open_items_are_the_current_partys(seed: int) -> None:
    messages, planted, _ = planted_parties(seed)
    summary = summarize(messages)
    current, earlier = planted[-1], planted[:-1]
    assert current.ask in summary.goal
    pending = "\n".join(summary.pending)
    assert [p.identity for p in earlier if p.identity in pending] == []
    assert (current.identity in pending) is bool(current.failed_call)


def test_a_span_of_one_party_labels_nothing() -> None:
    messages, _ = joined_session(7, 1)
    summary = summarize(messages)
    assert summary.constraints_and_preferences and summary.key_decisions
    assert not any("[party" in item for item in
                   [*summary.constraints_and_preferences, *summary.key_decisions])


@pytest.mark.parametrize("back", [
    "Hi again! I have my user ID now.", "Hello, I'm back with the details.",
    "Hey, following up on the booking as discussed."])
def test_a_user_coming_back_after_a_farewell_is_the_same_party(back: str) -> None:
    messages = [{"role": "user", "content": "Hi, I need to change my flight."},
                {"role": "assistant", "content": "Come back with your user id. Take care!"},
                {"role": "user", "content": back},
                {"role": "assistant", "content": "Thanks, let me look."}]
    stored = to_stored(messages, shared_counter(), first_seq=FIRST_SEQ)
    assert find_parties(stored) == [Party(FIRST_SEQ)]
    greeted = [*messages[:2], {"role": "user", "content": "Hello, I want to book a hotel."}]
    assert len(find_parties(to_stored(greeted, shared_counter()))) == 2
