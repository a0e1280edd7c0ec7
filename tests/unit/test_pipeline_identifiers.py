"""A job ranks the identifiers stored at ingest: it never scans the span for them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.support.job_harness import JobHarness
from tests.unit.session_strategies import shared_counter
from worker.compaction import identifier_rules
from worker.compaction.fallback import TIMES
from worker.compaction.identifiers import extract_identifiers
from worker.compaction.messages import StoredMessage, parse_message
from worker.compaction.schema import Summary
from worker.errors import Outcome
from worker.summarizers import ExtractiveSummarizer

SESSION = "s-ids"
LONG_TURNS = 20


def test_a_job_ranks_stored_identifiers_without_scanning_the_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness = JobHarness(shared_counter())
    harness.add_session(SESSION, LONG_TURNS)
    # A scripted draft: the extractive summarizer reads tool-call arguments itself.
    harness.summarizer.summary = Summary(
        goal="Check the user's reservations.", constraints_and_preferences=[],
        completed_actions=["Looked up each reservation."], key_decisions=[], resolved=[],
        pending=[], relevant_artifacts=[], remaining_work=[])
    calls: list[str] = []
    find, labelled = identifier_rules.find_identifiers, identifier_rules._find_labelled

    def counting_find(*args: Any, **kwargs: Any) -> Any:
        calls.append("find_identifiers")
        return find(*args, **kwargs)

    def counting_labelled(text: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(text)  # every scan, however find_identifiers was imported
        return labelled(text, *args, **kwargs)

    monkeypatch.setattr(identifier_rules, "find_identifiers", counting_find)
    monkeypatch.setattr(identifier_rules, "_find_labelled", counting_labelled)

    result = harness.run(SESSION)

    assert result.outcome is Outcome.COMPACTED
    # One scan, of the draft (the truth check reads the identifiers it quotes), none of the span.
    assert len(calls) == 1 and calls[0].startswith("Check the user's reservations.")
    [revision] = harness.store.revisions(SESSION)
    monkeypatch.undo()
    span = [StoredMessage(m.seq, parse_message(m.body), m.tokens)
            for m in harness.store.messages(SESSION) if m.seq <= revision.through_seq]
    expected = [a.value for a in extract_identifiers(span)]
    assert [a["value"] for a in revision.artifacts] == expected
    assert "HAT100" in expected


def test_the_extractive_summary_of_a_job_scans_no_text_for_identifiers_either(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness = JobHarness(shared_counter())
    harness.add_session(SESSION, LONG_TURNS)
    harness.deps = dataclasses.replace(harness.deps,
                                       summarizer=ExtractiveSummarizer(harness.counter))
    calls: list[str] = []
    labelled = identifier_rules._find_labelled

    def counting_labelled(text: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(text)  # every scan goes through it
        return labelled(text, *args, **kwargs)

    monkeypatch.setattr(identifier_rules, "_find_labelled", counting_labelled)

    result = harness.run(SESSION)

    assert (result.outcome, result.summarizer) == (Outcome.COMPACTED, "extractive")
    [revision] = harness.store.revisions(SESSION)
    # One scan, of the draft (the truth check reads the identifiers it quotes), none of the span.
    assert len(calls) == 1 and calls[0].startswith(revision.summary["goal"])
    # The calls' values still reach the summary, from the stored index.
    actions = "\n".join(revision.summary["completed_actions"])
    assert f"get_reservation_details {TIMES}17 (s-idsR0, s-idsR1, s-idsR2, s-idsR3)" in actions
