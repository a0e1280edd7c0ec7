"""Parsing and validation: one case per failure reason (``truncated`` is the LLM
summarizer's, after its retry), the one JSON recovery from prose, and identifiers
re-attached rather than failed on. Replies are parsed, updated into the prior as the
pipeline's summary update does (re-attaching the span's identifiers), then validated."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.session_strategies import shared_counter
from worker.compaction.schema import (
    Summary,
    count_summary_tokens,
    empty_summary,
    summary_text,
)
from worker.compaction.summary_update import UpdatedSummary, update_summary
from worker.compaction.validation import (
    REASONS,
    extract_json_object,
    parse_summary,
    validate_summary,
)
from worker.errors import SummaryInvalid

GOOD: dict[str, Any] = {
    **empty_summary().model_dump(),
    "goal": "Cancel reservation ZFA04Y for mia_li_3668",
    "completed_actions": ["Looked up ZFA04Y"],
    "pending": ["Confirm the refund to credit_card_4421486"],
}
DEFAULTS: dict[str, Any] = {
    "span_tokens": 2_000,
    "identifiers": ["ZFA04Y", "mia_li_3668"],
    "budget_tokens": 1_024,
    "replaced_tokens": 2_500,
}


def run(raw: str | dict[str, Any] | None, prior: Summary | None = None, **overrides: Any
        ) -> UpdatedSummary:
    options, counter = {**DEFAULTS, **overrides}, shared_counter()
    identifiers = options.pop("identifiers")
    summary = parse_summary(raw)
    updated = update_summary(prior, summary, budget_tokens=options["budget_tokens"],
                             counter=counter, identifiers=identifiers)
    return validate_summary(summary, updated, counter=counter, **options)


@pytest.mark.parametrize(
    ("raw", "overrides", "reason", "message_part"),
    [
        (None, {}, "empty_output", "nothing"),
        ("   \n", {}, "empty_output", "nothing"),
        ({}, {}, "empty_output", "nothing"),
        ('{"goal": "Cancel ZFA04Y", "pending": [', {}, "malformed_json", "JSON"),
        ("I could not summarize this.", {}, "malformed_json", "JSON"),
        ({**GOOD, "notes": ["x"]}, {}, "schema_mismatch", "notes"),
        ({k: v for k, v in GOOD.items() if k != "resolved"}, {}, "schema_mismatch", "resolved"),
        ({**GOOD, "goal": ["not", "a", "string"]}, {}, "schema_mismatch", "goal"),
        (json.dumps([GOOD]), {}, "schema_mismatch", "list"),
        ({**GOOD, "goal": ""}, {}, "empty_sections", "goal"),
        ({**GOOD, "completed_actions": [], "pending": []}, {}, "empty_sections", "pending"),
        ({**GOOD, "key_decisions": ["ZFA04Y " * 400]}, {"budget_tokens": 300},
         "over_budget", "300-token budget"),
        (GOOD, {"replaced_tokens": 100}, "not_smaller", "100 tokens"),
    ],
    ids=[
        "empty-none", "empty-blank", "empty-dict", "malformed-cut",
        "malformed-prose", "schema-extra-key", "schema-missing-section", "schema-wrong-type",
        "schema-array", "empty-goal", "empty-progress", "over-budget", "not-smaller",
    ],
)
def test_each_failure_has_its_reason(
    raw: str | dict[str, Any] | None, overrides: dict[str, Any], reason: str, message_part: str
) -> None:
    with pytest.raises(SummaryInvalid) as caught:
        run(raw, **overrides)
    assert caught.value.reason == reason
    assert reason in REASONS
    assert message_part in caught.value.message


def test_a_good_reply_passes_as_text_or_dict() -> None:
    from_text = run(json.dumps(GOOD))
    assert from_text == run(GOOD)
    assert from_text.summary == Summary.model_validate(GOOD)
    assert from_text.reattached == ()


def test_empty_sections_are_fine_for_a_short_span() -> None:
    empty = empty_summary().model_dump()
    assert run(empty, span_tokens=499, identifiers=[]).summary == empty_summary()


def test_a_reply_in_prose_with_a_fenced_block_is_read() -> None:
    reply = f"Here you go:\n```json\n{json.dumps(GOOD, indent=2)}\n```\nAnything else?"
    assert run(reply).summary == Summary.model_validate(GOOD)


def test_a_dropped_identifier_is_reattached_not_failed_on() -> None:
    result = run(GOOD, identifiers=["HAT170", "ZFA04Y", "4WQ150", "mia_li_3668"])
    assert result.reattached == ("HAT170", "4WQ150")
    assert result.summary.relevant_artifacts == ["HAT170", "4WQ150"]


def test_reattachment_stops_at_the_budget_keeping_the_most_salient_first() -> None:
    counter = shared_counter()
    summary = Summary.model_validate(GOOD)
    identifiers = [f"HAT{n:03d}" for n in range(200)]
    budget_tokens = count_summary_tokens(summary, counter) + 40
    result = run(GOOD, identifiers=identifiers, budget_tokens=budget_tokens)
    added = result.reattached
    assert 0 < len(added) < len(identifiers)
    assert list(added) == identifiers[: len(added)]
    assert result.fitted.tokens == count_summary_tokens(result.summary, counter) <= budget_tokens


def test_a_prior_summary_is_updated_and_its_identifiers_count_as_present() -> None:
    prior = Summary.model_validate({
        **empty_summary().model_dump(), "goal": "Book a flight",
        "pending": ["Confirm the refund to credit_card_4421486"],
        "relevant_artifacts": ["HAT170"],
    })
    reply = {**GOOD, "resolved": ["Confirm the refund to credit_card_4421486"],
             "pending": ["Send the receipt"]}
    result = run(reply, prior=prior, identifiers=["HAT170", "ZFA04Y"])
    assert result.summary.goal == GOOD["goal"]
    assert result.summary.pending == ["Send the receipt"]
    assert result.summary.relevant_artifacts == ["HAT170"]
    assert result.reattached == ()


def test_the_goal_may_stand_from_the_prior_but_progress_must_be_the_spans_own() -> None:
    prior = Summary.model_validate({**GOOD, "goal": "Book a flight"})
    assert run({**GOOD, "goal": ""}, prior=prior).summary.goal == "Book a flight"
    with pytest.raises(SummaryInvalid) as caught:
        run({**GOOD, "completed_actions": [], "pending": []}, prior=prior)
    assert caught.value.reason == "empty_sections"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('Sure! ```\n{"a": {"b": [1, 2]}}\n``` done', {"a": {"b": [1, 2]}}),
        ('The summary is {"a": "brace } in a string", "b": "quote \\" too"} ok',
         {"a": "brace } in a string", "b": 'quote " too'}),
        ('Set {x} aside; the answer: {"a": 2} and {"a": 3}', {"a": 2}),
        ('Sure.\n```python\n{"goal": "a"}\n```\nDone.', {"goal": "a"}),
        ('Here it is: {"goal": "a", "pending": ["b"]} hope that helps',
         {"goal": "a", "pending": ["b"]}),
    ],
    ids=["fenced", "fenced-untagged", "braces-in-strings", "first-parseable-object",
         "fenced-other-tag", "inline-in-prose"],
)
def test_extract_json_object_reads_replies_in_prose(text: str, expected: dict[str, Any]) -> None:
    assert extract_json_object(text) == expected


@pytest.mark.parametrize("text", ["", "no json here", "[1, 2]", '{"a": 1', "{oops}",
                                  'Here: {"goal": "a", "pending": ['])
def test_extract_json_object_fails_as_malformed_json(text: str) -> None:
    with pytest.raises(SummaryInvalid) as caught:
        extract_json_object(text)
    assert caught.value.reason == "malformed_json"


def test_summary_text_holds_goal_and_every_item() -> None:
    text = summary_text(Summary.model_validate(GOOD))
    assert "mia_li_3668" in text and "credit_card_4421486" in text
