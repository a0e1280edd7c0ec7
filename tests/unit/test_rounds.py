"""Rounds of growth and re-compaction through the real job (fake store, extractive path):
the summary stays within its budget, the facts first seen in each round are still visible
one round later, answered requests are never listed as open, and in joined conversations
the goal follows the newest customer. A single compaction of a long session keeps what
was said, the error codes that ended calls and the decisions' pinned values."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.support.job_harness import JobHarness
from tests.support.shaped_sessions import Planted, coding_turns, joined, service_turns
from tests.unit.session_strategies import shared_counter
from worker.compaction.intake import IntakePolicy
from worker.compaction.party_items import without_party
from worker.compaction.plan import TriggerPolicy
from worker.compaction.schema import Summary
from worker.errors import Outcome
from worker.platform.ingest import ImportStatus, append_messages, import_sessions

BUDGET_TOKENS = 4_096
SESSION = "grown"
SYSTEM = {"role": "system", "content": "You are an agent. Follow the policy."}
Shape = Callable[[str, int, int, Planted], list[dict[str, Any]]]


def harness_for_rounds() -> JobHarness:
    trigger = TriggerPolicy(trigger_tokens=4_000, floor_tokens=2_000, tail_budget_tokens=1_500,
                            min_tail_user_turns=1)
    return JobHarness(shared_counter()).with_policy(summary_budget_tokens=BUDGET_TOKENS,
                                                    trigger=trigger)


def start(harness: JobHarness, messages: list[dict[str, Any]]) -> None:
    [report] = import_sessions([{"session_id": SESSION, "messages": [SYSTEM, *messages]}],
                               store=harness.store, counter=harness.counter,
                               policy=IntakePolicy(), now=harness.clock())
    assert report.status is ImportStatus.IMPORTED


def compact(harness: JobHarness) -> tuple[str, Summary, int]:
    """Force one job; return the text the projection shows, the summary, its tokens."""
    assert harness.run(SESSION, force=True).outcome is Outcome.COMPACTED
    revision = harness.store.revisions(SESSION)[0]
    parts = [str(revision.block["content"])]
    for message in harness.store.messages(SESSION, after_seq=revision.through_seq):
        parts.append(str(message.body.get("content") or ""))
        parts += [call["function"]["arguments"] for call in message.body.get("tool_calls") or []]
    return "\n".join(parts), Summary.model_validate(revision.summary), revision.summary_tokens


def share_visible(values: list[str], text: str) -> float:
    return sum(value in text for value in values) / len(values) if values else 1.0


@pytest.mark.parametrize("shape", [coding_turns, service_turns], ids=["coding", "service"])
def test_ten_rounds_of_growth_keep_new_facts_close_requests_and_the_budget(shape: Shape) -> None:
    harness, rounds, total_turns = harness_for_rounds(), [Planted()], 20
    start(harness, shape("A", 0, total_turns, rounds[0]))
    for round_index in range(10):
        text, summary, block_tokens = compact(harness)
        assert block_tokens <= BUDGET_TOKENS + 8  # the message framing adds a few tokens
        if round_index:
            facts = rounds[round_index - 1]
            assert share_visible([*facts.said, *facts.errors, *facts.pins], text) >= 0.9
        assert share_visible([*rounds[round_index].said], text) >= 0.9
        open_requests = [item for item in summary.pending if item.startswith("Unanswered")]
        answered_earlier = [ask for facts in rounds[:round_index] for ask in facts.answered]
        assert not any(ask in item for ask in answered_earlier for item in open_requests)
        added = Planted()
        growth = max(1, total_turns // 5)
        append_messages(harness.store, harness.counter, IntakePolicy(), SESSION,
                        shape(chr(ord("B") + round_index), 0, growth, added), harness.clock())
        rounds.append(added)
        total_turns += growth


def test_in_joined_conversations_the_goal_is_the_newest_customers_request() -> None:
    harness = harness_for_rounds()
    start(harness, joined(range(12), 3, Planted()))
    for more in (range(12, 15), range(15, 30)):
        _, summary, _ = compact(harness)
        newest = newest_summarized(harness)
        assert newest > 0  # not the first customer: the span holds many conversations
        assert summary.goal.startswith("[party ")  # the goal says whose it is
        assert without_party(summary.goal).startswith(f"User request: Hello! Customer {newest} ")
        append_messages(harness.store, harness.counter, IntakePolicy(), SESSION,
                        joined(more, 3, Planted()), harness.clock())


def newest_summarized(harness: JobHarness) -> int:
    """The newest customer whose greeting the active revision covers."""
    through_seq = harness.store.revisions(SESSION)[0].through_seq
    greetings = [m for m in harness.store.messages(SESSION)
                 if m.seq <= through_seq and str(m.body.get("content")).startswith("Hello!")]
    return int(str(greetings[-1].body["content"]).split()[2])


@pytest.mark.parametrize(("shape", "turns"), [(coding_turns, 40), (service_turns, 60)],
                         ids=["coding", "service"])
def test_one_compaction_of_a_session_over_twice_the_budget_keeps_said_values_errors_and_pins(
    shape: Shape, turns: int
) -> None:
    # Dense on purpose: three said values per exchange, every coding exchange a failure
    # and a decision; about 10k tokens each into a 4k-token block.
    harness, planted = harness_for_rounds(), Planted()
    start(harness, shape("L", 0, turns, planted))
    text, _, _ = compact(harness)
    assert share_visible(planted.said, text) >= 0.95
    assert share_visible(planted.errors, text) >= 0.9
    assert share_visible(planted.pins, text) >= 0.99
