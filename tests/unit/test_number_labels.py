"""Bare numbers keep their labels: a 9-12 digit value is listed with the word the text put
before it and the name it gave it beside it, by the merge, for both summarizers; checked
on wordings a seeded grammar writes and through the job on a generated session."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from bench.fidelity_truth import count_bare_numbers
from tests.support.generated import LabelledNumber, labelled_number
from tests.support.job_harness import JobHarness
from tests.unit.session_strategies import shared_counter, to_stored
from tests.unit.test_schema import filled
from worker.compaction import identify_message
from worker.compaction.fallback import fallback_summary
from worker.compaction.grouping import group_messages
from worker.compaction.identifiers import extract_identifiers
from worker.compaction.intake import IntakePolicy
from worker.compaction.number_labels import label_number, label_numbers
from worker.compaction.outcomes import classify_calls
from worker.compaction.schema import Summary
from worker.compaction.summary_update import update_summary
from worker.compaction.truth import find_contradictions, read_record
from worker.errors import Outcome
from worker.platform.ingest import ImportStatus, import_sessions

SEEDS = range(200)


def listed(number: LabelledNumber) -> str:
    return f"{number.label} {number.value}" + (f" ({number.name})" if number.name else "")


@pytest.mark.parametrize("seed", SEEDS)
def test_a_number_is_listed_with_the_label_its_text_gave_it(seed: int) -> None:
    number = labelled_number(random.Random(seed))
    assert label_number(number.value, [number.text]) == listed(number)


@pytest.mark.parametrize("text", ["Call me at 123456789 tonight.", "#123456789 is it.",
                                  "123456789", "Numbers: 1123456789 and 123456789"])
def test_a_number_no_word_names_stays_bare(text: str) -> None:
    assert label_number("123456789", [text]) == "123456789"


def session(seed: int, count: int) -> tuple[list[dict[str, Any]], list[LabelledNumber]]:
    """User turns and tool results that give ``count`` numbers their labels."""
    rng = random.Random(seed)
    numbers = [labelled_number(rng) for _ in range(count)]
    messages: list[dict[str, Any]] = []
    for index, number in enumerate(numbers):
        call_id = f"c{seed}_{index}"
        messages += [
            {"role": "user", "content": f"Please check this. {number.text}"},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": call_id, "type": "function",
                "function": {"name": "lookup", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call_id, "content": number.text},
            {"role": "assistant", "content": "Checked."}]
    return messages, numbers


@pytest.mark.parametrize("seed", SEEDS[:40])
def test_the_span_labels_come_from_the_stored_mentions(seed: int) -> None:
    messages, numbers = session(seed, 6)
    stored = to_stored(messages, shared_counter())
    mentions = {m.seq: json.dumps([list(i) for i in identify_message(m.message)])
                for m in stored}
    indexed = {n.value for n in numbers if any(f'"{n.value}"' in m for m in mentions.values())}
    # The index names the numbers its rules read (a JSON key, "order 123..."), not all.
    assert label_numbers(group_messages(stored), mentions) == \
        {n.value: listed(n) for n in numbers if n.value in indexed}


def test_the_merge_lists_bare_numbers_with_their_labels_and_counts_them_reattached() -> None:
    new = filled(goal="User request: swap the item.", relevant_artifacts=["123456789"])
    merged = update_summary(None, new, budget_tokens=2_000, counter=shared_counter(),
                            identifiers=["123456789", "987654321"],
                            labels={"123456789": "item 123456789 (Kettle)",
                                     "987654321": "order 987654321"})
    assert merged.summary.relevant_artifacts == ["item 123456789 (Kettle)", "order 987654321"]
    # The one listed bare is re-attached with its label, the one left out re-attached.
    assert merged.reattached == ("123456789", "987654321")


@pytest.mark.parametrize("seed", SEEDS[:10])
def test_every_bare_number_a_job_lists_carries_its_label(seed: int) -> None:
    messages, _ = session(seed, 30)
    harness = JobHarness(shared_counter())
    system = {"role": "system", "content": "You are an agent."}
    [report] = import_sessions([{"session_id": "s", "messages": [system, *messages]}],
                               store=harness.store, counter=harness.counter,
                               policy=IntakePolicy(), now=harness.clock())
    assert report.status is ImportStatus.IMPORTED
    assert harness.run("s", force=True).outcome is Outcome.COMPACTED
    summary = Summary.model_validate(harness.store.revisions("s")[0].summary)
    bare, unlabelled = count_bare_numbers(summary)
    assert bare >= 5 and unlabelled == 0


def test_a_call_line_names_its_bare_number_by_the_argument_and_stays_checked() -> None:
    messages = [
        {"role": "user", "content": "Please refund my order."},
        *[m for n, result in ((1, "Error: refund failed"), (2, '{"status": "done"}'))
          for m in ({"role": "assistant", "content": None, "tool_calls": [{
              "id": f"c{n}", "type": "function", "function": {
                  "name": "refund", "arguments": f'{{"order_id": "93181874304{n}"}}'}}]},
              {"role": "tool", "tool_call_id": f"c{n}", "content": result})]]
    stored = to_stored(messages, shared_counter())
    groups = group_messages(stored)
    summary = fallback_summary(groups, artifacts=extract_identifiers(stored),
                               budget_tokens=2_000, counter=shared_counter()).summary
    assert "called refund(order_id 931818743041) → failed: Error: refund failed" in \
        summary.completed_actions
    assert "called refund(order_id 931818743042) → ok" in summary.completed_actions
    record = read_record(groups, outcomes=classify_calls(groups),
                         artifacts=extract_identifiers(stored), prior=None,
                         tail_continues=False)
    assert find_contradictions(summary, record) == []
    lying = summary.model_copy(update={"completed_actions": [
        "called refund(order_id 931818743041) → ok"]})
    assert [c.kind for c in find_contradictions(lying, record)] == ["false_outcome"]
