"""The truth check on real recorded sessions (../shared/corpus): no truthful summary (the
extractive one, the test server's careful model) is rejected, every lying one is."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.support import fake_summaries
from tests.support.corpus import load_corpus
from tests.unit.session_strategies import shared_counter, to_stored
from worker.compaction.call_plan import render_span_items
from worker.compaction.fallback import fallback_summary
from worker.compaction.grouping import group_messages
from worker.compaction.identifiers import extract_identifiers
from worker.compaction.outcomes import classify_calls
from worker.compaction.plan import Boundary, TriggerPolicy, plan_boundary
from worker.compaction.prompts import build_summarize_messages
from worker.compaction.pruning import prune_groups
from worker.compaction.requests import continues_conversation
from worker.compaction.schema import Summary
from worker.compaction.truth import SpanRecord, find_contradictions, read_record

pytestmark = pytest.mark.corpus

# A tail of a few exchanges: most of each real session is the span.
POLICY = TriggerPolicy(trigger_tokens=2_000, floor_tokens=1_000, tail_budget_tokens=1_000,
                       min_tail_user_turns=1)
BUDGET_TOKENS = 4_096


def spans(name: str) -> list[tuple[str, Boundary]]:
    found = []
    for session in load_corpus(name):
        stored = to_stored(session["messages"], shared_counter())
        boundary = plan_boundary(group_messages(stored), prior_through_seq=0,
                                 summary_tokens=0, policy=POLICY)
        if boundary is not None and boundary.span:
            found.append((session["session_id"], boundary))
    return found


def record_of(boundary: Boundary) -> tuple[SpanRecord, dict[str, Any]]:
    """The span's record, and what the summarizers read: the pruned span and its inputs."""
    counter = shared_counter()
    stored = [m for group in boundary.span for m in group.messages]
    tail = [m for group in boundary.tail for m in group.messages]
    pruned = prune_groups(boundary.span, audit_mode=False, counter=counter)
    outcomes = classify_calls(boundary.span)
    artifacts = extract_identifiers(stored)
    continues = continues_conversation(stored, tail)
    record = read_record(pruned, outcomes=outcomes, artifacts=artifacts, prior=None,
                         tail_continues=continues)
    return record, {"span": pruned, "outcomes": outcomes, "artifacts": artifacts,
                    "tail_continues": continues}


def model_summary(pruned: Any, *, lying: bool) -> Summary:
    """The test server's summary of the prompt the LLM summarizer would send."""
    text = "\n\n".join(item.text for item in render_span_items(pruned, shared_counter()))
    prompt = build_summarize_messages(text, prior=None, identifiers=())[1]["content"]
    build = fake_summaries.build_lying_summary if lying else fake_summaries.build_summary
    return Summary.model_validate(build(prompt))


@pytest.mark.parametrize("name", ["dev", "dev_long"])
def test_no_truthful_summary_of_a_corpus_span_is_rejected(name: str) -> None:
    rejected: Counter[str] = Counter()
    checked = 0
    for session_id, boundary in spans(name):
        record, inputs = record_of(boundary)
        extractive = fallback_summary(inputs["span"], artifacts=inputs["artifacts"],
                                      outcomes=inputs["outcomes"], budget_tokens=BUDGET_TOKENS,
                                      counter=shared_counter(),
                                      tail_continues=inputs["tail_continues"]).summary
        for kind, summary in (("extractive", extractive),
                              ("llm", model_summary(inputs["span"], lying=False))):
            found = find_contradictions(summary, record)
            rejected.update(f"{kind} {c.kind} {session_id}" for c in found)
            checked += 1
    assert checked > 0
    assert dict(rejected) == {}


@pytest.mark.parametrize("name", ["dev", "dev_long"])
def test_every_lying_summary_of_a_corpus_span_is_rejected(name: str) -> None:
    kinds: Counter[str] = Counter()
    passed: list[str] = []
    for session_id, boundary in spans(name):
        record, inputs = record_of(boundary)
        found = find_contradictions(model_summary(inputs["span"], lying=True), record)
        kinds.update({c.kind for c in found})
        if not found:
            passed.append(session_id)
    assert passed == []
    # Each kind of lie is caught somewhere in the corpus, not only the invented values.
    assert {"false_outcome", "reopened_request", "invented_identifier"} <= set(kinds), kinds
