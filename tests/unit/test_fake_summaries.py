"""The test server's model follows the prompt's merge rules as a careful model would, and
no further: the goal as it stands now, the prior's answered pending items copied verbatim
into resolved, errors that ended a tool call in pending; identifiers copied whole; as done
only what the assistant of a transcript said or did."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.support.fake_summaries import build_summary
from tests.unit.session_strategies import drawn_request, shared_counter, to_stored
from tests.unit.test_fallback import exchange
from tests.unit.test_schema import filled
from worker.compaction.chunking import part_marker
from worker.compaction.grouping import group_messages
from worker.compaction.prompts import build_merge_messages, build_summarize_messages, render_group
from worker.compaction.schema import Summary
from worker.compaction.truth import DONE_SECTIONS


def reply_to(messages: list[dict[str, Any]], prior: Summary | None) -> dict[str, Any]:
    span = group_messages(to_stored(messages, shared_counter()))
    text = "\n\n".join(render_group(group) for group in span)
    prompt = build_summarize_messages(text, prior=prior, identifiers=[])
    return build_summary(str(prompt[-1]["content"]))


def test_a_continued_conversation_keeps_the_prior_goal_and_closes_what_it_answers() -> None:
    prior = filled(goal="Move ZFA04Y to a later flight",
                   pending=["Unanswered user request: is HAT170 on time?", "Refund for 4WQ150"])
    reply = reply_to([{"role": "assistant", "content": "HAT170 is on time."}], prior)
    assert reply["goal"] == prior.goal
    assert "Unanswered user request: is HAT170 on time?" in reply["resolved"]
    assert "Refund for 4WQ150" not in reply["resolved"]


def test_a_new_customer_sets_the_goal_and_a_failed_call_is_pending() -> None:
    messages = [
        {"role": "user", "content": "[SESSION BOUNDARY 2/2] The previous customer "
         "conversation has ended."},
        {"role": "user", "content": "Hello, please pin sqlalchemy==2.0.1 for me."},
        *exchange("c1", "run_tests", {"target": "tests"}, "Error: ERR-3283 bad row"),
    ]
    reply = reply_to(messages, filled(goal="Serve the first customer"))
    assert reply["goal"] == "Hello, please pin sqlalchemy==2.0.1 for me."
    assert "Open error: Error: ERR-3283 bad row" in reply["pending"]
    assert "sqlalchemy==2.0.1" in reply["relevant_artifacts"]


@pytest.mark.parametrize("seed", range(8))
def test_a_merge_or_a_cut_messages_part_files_nothing_of_its_own_as_done(seed: int) -> None:
    rng = random.Random(seed)
    request, named = drawn_request(rng)
    partials = [filled(goal=request, completed_actions=[f"Looked up the {named}"]),
                filled(goal=request, key_decisions=[f"Keep the {named}"])]
    merge = build_merge_messages(partials, prior=None, identifiers=[])
    # The later parts of a long user message carry no header naming their speaker.
    part = build_summarize_messages(f"{part_marker(2, 3, 5, 5)}{request} " * 3,
                                    prior=None, identifiers=[])

    merged = build_summary(str(merge[-1]["content"]))
    cut = build_summary(str(part[-1]["content"]))
    assert [merged[name] for name in DONE_SECTIONS] == [[f"Looked up the {named}"], []]
    assert [cut[name] for name in DONE_SECTIONS] == [[], []]
