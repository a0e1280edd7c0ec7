"""Whose items stay whose across updates: a joined session compacted over several rounds,
its first party leaving a request open as the next starts, keeps the first party's
constraints and decisions under its label in every later summary, and its open request
open under its name, never done or resolved; the truth check finds nothing to refute.
Sessions come from the seeded joined-session grammar, cut at seeded points."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.support.generated import PlantedParty, joined_session
from tests.unit.session_strategies import shared_counter, to_stored
from tests.unit.test_schema import filled
from worker.compaction.fallback import UNANSWERED, fallback_summary
from worker.compaction.grouping import group_messages
from worker.compaction.identifiers import extract_identifiers
from worker.compaction.outcomes import classify_calls
from worker.compaction.parties import BOUNDARY, Party, find_parties
from worker.compaction.party_items import LEFT_OPEN, PartyTurn, read_party_turn
from worker.compaction.requests import read_span_requests
from worker.compaction.schema import Summary
from worker.compaction.summary_update import update_summary
from worker.compaction.truth import find_contradictions, read_record

FIRST_SEQ = 1
BUDGET_TOKENS = 4_096
# A party a boundary marker or a greeting starts: a new identity at a span's first turn is
# not told from the prior's party yet (the span does not see the prior's identity).
SEEDS = [seed for seed in range(80)
         if joined_session(seed, 2)[1][1].signal in ("boundary", "greeting_after_closing")]
_OPEN_ASKS = ("Could you also refund order {code}?", "Can you check invoice {code} too?",
              "Please move ticket {code} to next week.")


def joined_with_open_request(seed: int) -> tuple[list[dict[str, Any]], list[PlantedParty],
                                                 str, int]:
    """A two-party joined session whose first party's last turn is a request nobody
    answers before the second party starts; the request and the index after it."""
    rng = random.Random(seed)
    messages, planted = joined_session(seed, 2)
    code = f"#{rng.choice('WQZ')}{rng.randint(1_000_000, 9_999_999)}"
    ask = rng.choice(_OPEN_ASKS).format(code=code)
    second = planted[1]
    at = second.first_index - (second.signal == "boundary")
    messages.insert(at, {"role": "user", "content": ask})
    return messages, planted, ask, at + 1


def compact_in_rounds(messages: list[dict[str, Any]], cuts: list[int]) -> list[Summary]:
    """Each round's updated summary: the extractive draft of the span between two cuts,
    folded into the prior with the span's party turn, checked against the span's record."""
    counter = shared_counter()
    stored = to_stored(messages, counter, first_seq=FIRST_SEQ)
    prior: Summary | None = None
    summaries = []
    for start, end in zip([0, *cuts], [*cuts, len(stored)], strict=True):
        span = group_messages(stored[start:end])
        artifacts = extract_identifiers(stored[start:end])
        outcomes = classify_calls(span)
        ledger = read_span_requests(span, has_prior_goal=bool(prior and prior.goal),
                                    outcomes=outcomes, tail_continues=False)
        new = fallback_summary(span, artifacts=artifacts, budget_tokens=BUDGET_TOKENS,
                               counter=counter, prior=prior, outcomes=outcomes,
                               ledger=ledger).summary
        updated = update_summary(prior, new, budget_tokens=BUDGET_TOKENS, counter=counter,
                                 parties=read_party_turn(prior, ledger)).summary
        record = read_record(span, outcomes=outcomes, artifacts=artifacts, prior=prior,
                             tail_continues=False, ledger=ledger)
        assert find_contradictions(updated, record) == []
        summaries.append(prior := updated)
    return summaries


def seeded_cuts(seed: int, messages: list[dict[str, Any]], after_open: int) -> list[int]:
    """Up to four cuts before user turns, one right after the open request; none between a
    boundary marker and the turn it starts (a span does not know what the prior's last
    message said)."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user" and i > 1
             and not BOUNDARY.search(messages[i - 1]["content"] or "")]
    drawn = random.Random(seed).sample(users, min(3, len(users)))
    return sorted({*drawn, after_open})


@pytest.mark.parametrize("seed", SEEDS)
def test_an_earlier_partys_items_keep_its_label_and_its_open_request_stays_open(
        seed: int) -> None:
    messages, planted, ask, after_open = joined_with_open_request(seed)
    first, second = (Party(p.first_index + FIRST_SEQ + (i and 1)) for i, p in enumerate(planted))
    assert [p.first_seq for p in find_parties(to_stored(messages[1:], shared_counter(),
                                                        first_seq=FIRST_SEQ + 1))] \
        == [first.first_seq, second.first_seq]
    cuts = seeded_cuts(seed, messages, after_open)
    summaries = compact_in_rounds(messages, cuts)
    started = [i for i, cut in enumerate([*cuts, len(messages)]) if cut > after_open]
    for summary in summaries[started[0]:]:
        items = [*summary.constraints_and_preferences, *summary.key_decisions]
        for party, planted_party in zip((first, second), planted, strict=True):
            for said in (planted_party.fact, planted_party.decision):
                assert any(item.startswith(f"[party {party.first_seq}") and said in item
                           for item in items)
        assert all(item.startswith("[party ") for item in items)
        assert not any(ask in item for item in [*summary.resolved, *summary.completed_actions])
        assert [item.startswith(f"{LEFT_OPEN}[party {first.first_seq}")
                for item in summary.pending if ask in item] == [True]
        assert planted[1].ask in summary.goal
        assert summary.goal.startswith(f"[party {second.first_seq}")


def test_a_new_conversation_leaves_the_earlier_partys_open_items_open_under_its_name() -> None:
    prior = filled(goal="User request: I need help with order #W1234567.",
                   constraints_and_preferences=["I am in Lisbon."], key_decisions=[],
                   resolved=[], completed_actions=["Compacted seq 2 to 9: 8 user messages"],
                   pending=[f"{UNANSWERED}Could you also refund #W1234567?",
                            "Open error: update_account failed: Error: account locked"],
                   remaining_work=[])
    messages, _ = joined_session(11, 1)
    stored = to_stored(messages, shared_counter(), first_seq=20)
    span = group_messages(stored)
    ledger = read_span_requests(span, has_prior_goal=True, outcomes=classify_calls(span),
                                tail_continues=False)
    new = fallback_summary(span, artifacts=extract_identifiers(stored), prior=prior,
                           budget_tokens=BUDGET_TOKENS, counter=shared_counter(),
                           ledger=ledger).summary
    assert not set(prior.pending) & set(new.resolved)
    updated = update_summary(prior, new, budget_tokens=BUDGET_TOKENS, counter=shared_counter(),
                             parties=read_party_turn(prior, ledger)).summary
    assert updated.pending[:2] == [f"{LEFT_OPEN}[party 2]: {item}" for item in prior.pending]
    assert updated.constraints_and_preferences[0] == "[party 2] I am in Lisbon."
    assert all(item.startswith("[party 21") for item in updated.key_decisions)


def test_a_summary_of_one_party_labels_nothing() -> None:
    prior = filled(goal="User request: a", constraints_and_preferences=["I am in Lisbon."])
    new = filled(goal="", constraints_and_preferences=["I use a phone."])
    updated = update_summary(prior, new, budget_tokens=BUDGET_TOKENS, counter=shared_counter(),
                             parties=PartyTurn((Party(30),), prior_ended=False)).summary
    assert updated.constraints_and_preferences == ["I am in Lisbon.", "I use a phone."]


def test_a_party_that_stated_nothing_yet_is_named_by_its_goal_in_the_next_update() -> None:
    prior = filled(goal="[party 58, ana_li_77] User request: a new booking",
                   key_decisions=["[party 44] We'll go with the green option."])
    new = filled(goal="", key_decisions=["We'll go with the blue option."])
    updated = update_summary(prior, new, budget_tokens=BUDGET_TOKENS, counter=shared_counter(),
                             parties=PartyTurn((Party(70),), prior_ended=False)).summary
    assert updated.key_decisions == ["[party 44] We'll go with the green option.",
                                     "[party 58, ana_li_77] We'll go with the blue option."]
    assert updated.goal == prior.goal


def test_a_models_unlabelled_items_are_labelled_by_the_update_as_the_newest_partys() -> None:
    prior = filled(goal="User request: refund order #W1", completed_actions=[
        "Compacted seq 2 to 29: 14 user messages"], key_decisions=["Refund approved."],
        remaining_work=["Send the refund receipt."])
    new = filled(goal="User request: a seat change", key_decisions=["Aisle seat chosen."],
                 resolved=["Answered: which seats are free"])
    turn = PartyTurn((Party(30), Party(40, "bo_ru_12")), prior_ended=True)
    updated = update_summary(prior, new, budget_tokens=BUDGET_TOKENS, counter=shared_counter(),
                             parties=turn).summary
    assert updated.key_decisions == ["[party 2] Refund approved.",
                                     "[party 40, bo_ru_12] Aisle seat chosen."]
    assert updated.goal == "[party 40, bo_ru_12] User request: a seat change"
    assert updated.remaining_work == [f"{LEFT_OPEN}[party 2]: Send the refund receipt."]
