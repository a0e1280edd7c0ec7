"""The merge step: the new span's summary merged into the prior one section by section,
prior items first and each once, settled items moved out, always within the budget."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.session_strategies import shared_counter
from tests.unit.test_schema import SUMMARIES
from worker.compaction.merge import merge_summaries
from worker.compaction.schema import Summary, count_summary_tokens, empty_summary

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
    ],
    ids=["dedupe-prior-first", "pending-moves-to-resolved", "newer-goal", "short-item"],
)
def test_merge_rules(prior: Summary, new: Summary, expected: Summary) -> None:
    assert merge_summaries(prior, new, budget_tokens=BUDGET_TOKENS, counter=shared_counter()) \
        == expected


def test_without_a_prior_the_new_summary_is_only_fitted_to_the_budget() -> None:
    new = filled(goal="Book a flight", completed_actions=["Booked HAT170"])
    counter = shared_counter()
    assert merge_summaries(None, new, budget_tokens=BUDGET_TOKENS, counter=counter) == new
    small = count_summary_tokens(new, counter) - 3
    fitted = merge_summaries(None, new, budget_tokens=small, counter=counter)
    assert count_summary_tokens(fitted, counter) <= small < count_summary_tokens(new, counter)


@settings(max_examples=30, deadline=None)
@given(st.lists(SUMMARIES, min_size=11, max_size=11), st.integers(85, 1_500))
def test_ten_successive_merges_never_exceed_the_budget(
    summaries_: list[Summary], budget_tokens: int
) -> None:
    counter = shared_counter()
    budget_tokens = max(budget_tokens, count_summary_tokens(empty_summary(), counter))
    current = merge_summaries(None, summaries_[0], budget_tokens=budget_tokens, counter=counter)
    for new in summaries_[1:]:
        current = merge_summaries(current, new, budget_tokens=budget_tokens, counter=counter)
        assert count_summary_tokens(current, counter) <= budget_tokens
