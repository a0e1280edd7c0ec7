"""The summary update: the prior summary updated with the new span's section by section,
prior items first and each once, settled items closed, the span's identifiers re-attached,
the new span's facts given their share, always within the budget, rendered and counted once."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.session_strategies import shared_counter
from tests.unit.test_schema import SUMMARIES
from worker.compaction.schema import Summary, count_summary_tokens, empty_summary
from worker.compaction.summary_update import normalize_item, update_summary

BUDGET_TOKENS = 4_096


def filled(**sections: Any) -> Summary:
    """A summary with the given sections and every other one empty."""
    return Summary.model_validate({**empty_summary().model_dump(), **sections})


@pytest.mark.parametrize(
    ("prior", "new", "expected"),
    [
        (
            filled(completed_actions=["Booked HAT170", "Called think"]),
            filled(completed_actions=["booked hat170.", "Cancelled ZFA04Y"]),
            filled(completed_actions=["Booked HAT170", "Called think", "Cancelled ZFA04Y"]),
        ),
        (
            filled(goal="Book a flight", pending=["Refund for ZFA04Y", "Seat for HAT170"]),
            filled(goal="", resolved=["Refund for ZFA04Y issued to the gift card"]),
            filled(goal="Book a flight", pending=["Seat for HAT170"],
                   resolved=["Refund for ZFA04Y issued to the gift card"]),
        ),
        (
            filled(goal="Book a flight", remaining_work=["Send the receipt"]),
            filled(goal="Cancel ZFA04Y", resolved=["send the receipt"]),
            filled(goal="Cancel ZFA04Y", resolved=["send the receipt"]),
        ),
        (   # a short pending item is not settled by merely appearing inside a longer one
            filled(pending=["refund"]),
            filled(resolved=["refund for another booking"]),
            filled(pending=["refund"], resolved=["refund for another booking"]),
        ),
        (
            filled(goal="Fix the build", key_decisions=["Decision: pin sqlalchemy==1.4.2"]),
            filled(key_decisions=["Decision: pin sqlalchemy==2.0.1 because 1.4 lacks async"],
                   resolved=["Superseded: Decision: pin sqlalchemy==1.4.2"]),
            filled(goal="Fix the build",
                   key_decisions=["Decision: pin sqlalchemy==2.0.1 because 1.4 lacks async"],
                   resolved=["Superseded: Decision: pin sqlalchemy==1.4.2"]),
        ),
        (
            filled(pending=["Open error: run_tests failed: E3283-SCHEMA in tests/test_db.py"]),
            filled(resolved=["Open error: run_tests failed: E3283-SCHEMA in tests/test_db.py"]),
            filled(resolved=["Open error: run_tests failed: E3283-SCHEMA in tests/test_db.py"]),
        ),
    ],
    ids=["dedupe-prior-first", "pending-moves-to-resolved", "newer-goal", "short-item",
         "superseded-decision", "fixed-error"],
)
def test_update_rules(prior: Summary, new: Summary, expected: Summary) -> None:
    updated = update_summary(prior, new, budget_tokens=BUDGET_TOKENS, counter=shared_counter())
    assert updated.summary == expected


def test_without_a_prior_the_new_summary_is_only_fitted_to_the_budget() -> None:
    new = filled(goal="Book a flight", completed_actions=["Booked HAT170"])
    counter = shared_counter()
    assert update_summary(None, new, budget_tokens=BUDGET_TOKENS, counter=counter).summary == new
    small = count_summary_tokens(new, counter) - 3
    fitted = update_summary(None, new, budget_tokens=small, counter=counter)
    assert fitted.fitted.tokens <= small < count_summary_tokens(new, counter)


@settings(max_examples=30, deadline=None)
@given(st.lists(SUMMARIES, min_size=11, max_size=11), st.integers(85, 1_500))
def test_ten_successive_updates_never_exceed_the_budget(
    summaries_: list[Summary], budget_tokens: int
) -> None:
    counter = shared_counter()
    budget_tokens = max(budget_tokens, count_summary_tokens(empty_summary(), counter))
    current = update_summary(None, summaries_[0], budget_tokens=budget_tokens, counter=counter)
    for new in summaries_[1:]:
        current = update_summary(current.summary, new, budget_tokens=budget_tokens,
                                 counter=counter)
        assert count_summary_tokens(current.summary, counter) == current.fitted.tokens
        assert current.fitted.tokens <= budget_tokens


def test_identifiers_the_updated_state_lacks_are_listed_first_in_salience_order() -> None:
    prior = filled(goal="Book a flight", relevant_artifacts=["HAT170"])
    new = filled(completed_actions=["Cancelled ZFA04Y"])
    updated = update_summary(prior, new, budget_tokens=BUDGET_TOKENS, counter=shared_counter(),
                             identifiers=["E3283-SCHEMA", "ZFA04Y", "HAT170", "mia_li_3668"])
    # ZFA04Y is only in history (completed actions), which ages out first: listed too.
    assert updated.reattached == ("E3283-SCHEMA", "ZFA04Y", "mia_li_3668")
    assert updated.summary.relevant_artifacts == ["E3283-SCHEMA", "ZFA04Y", "mia_li_3668",
                                                  "HAT170"]


def test_a_full_prior_leaves_the_new_spans_facts_their_reserved_share() -> None:
    counter = shared_counter()
    prior = filled(goal="Serve customers", relevant_artifacts=[f"OLD{n:04d}" for n in range(300)])
    budget_tokens = count_summary_tokens(prior, counter)
    fresh = [f"NEW{n:04d}" for n in range(40)]
    updated = update_summary(prior, filled(), budget_tokens=budget_tokens, counter=counter,
                             identifiers=fresh)
    assert updated.reattached == tuple(fresh)
    assert updated.fitted.tokens <= budget_tokens
    assert any(item.startswith("OLD") for item in updated.summary.relevant_artifacts)


def test_indexed_values_lead_whatever_order_the_summarizer_listed_them_in() -> None:
    counter = shared_counter()
    ranked = [f"pm_{n:07d}" for n in range(60)]
    # An LLM lists code-local names and the span's values in its own order.
    listed = [*(f"queue_{n}" for n in range(60)), *reversed(ranked[:30])]
    new = filled(goal="Refund the orders", relevant_artifacts=listed)
    budget_tokens = count_summary_tokens(filled(goal="Refund the orders"), counter) + 300
    updated = update_summary(None, new, budget_tokens=budget_tokens, counter=counter,
                             identifiers=ranked)
    kept = updated.summary.relevant_artifacts
    assert updated.fitted.tokens <= budget_tokens
    assert kept == ranked[:len(kept)]  # the model's names and order gave way to salience
    assert updated.reattached == tuple(value for value in ranked[30:] if value in kept)


@given(st.text(st.characters(codec="utf-8")) | st.text(" \t\n\x1f\x85\xa0\u2003\u2028.;:!Aa1"))
def test_an_items_key_is_its_words_case_folded_without_end_dots(text: str) -> None:
    assert normalize_item(text) == " ".join(text.split()).rstrip(".;:!").casefold()
