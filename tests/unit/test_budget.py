"""Fitting a summary to its budget: by section, so no section starves another; the new
span's items first up to their reserved share; rendered and counted once."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.session_strategies import shared_counter
from tests.unit.test_schema import ITEMS, SUMMARIES, filled
from worker.compaction import budget
from worker.compaction.budget import (
    FRESH_SHARE,
    FittedSummary,
    SummaryBudget,
    fit_summary,
    truncate_text,
)
from worker.compaction.schema import (
    LIST_SECTIONS,
    Summary,
    block_segments,
    count_summary_tokens,
    empty_block_tokens,
    empty_summary,
    goal_line,
    item_line,
    render_summary_block,
)
from worker.compaction.tokens import TokenCounter
from worker.settings.config import Settings
from worker.tokenizer.offline import load_encoding


@settings(max_examples=40, deadline=None)
@given(SUMMARIES, st.integers(85, 800))
def test_fitting_is_deterministic_within_budget_and_carries_its_rendering_and_count(
    summary: Summary, budget_tokens: int
) -> None:
    counter = shared_counter()
    budget_tokens = max(budget_tokens, count_summary_tokens(empty_summary(), counter))
    fitted = fit_summary(summary, budget_tokens, counter)
    assert fit_summary(summary, budget_tokens, counter) == fitted
    assert fitted.text == render_summary_block(fitted.summary)
    assert fitted.tokens == counter.count_text(fitted.text) <= budget_tokens
    # Built without validation from validated items: what validating it would give.
    assert Summary.model_validate(fitted.summary.model_dump()) == fitted.summary
    if count_summary_tokens(summary, counter) <= budget_tokens and not _has_long_items(summary):
        assert fitted.summary == summary


def _has_long_items(summary: Summary) -> bool:
    counter = shared_counter()
    items = [item for name in LIST_SECTIONS for item in summary.items_of(name)]
    return any(counter.count_text(item_line(item)) > 90 for item in items)


# Where a piece could run on past a line break: spaces, breaks, slashes, apostrophes,
# digits, marks and Unicode spaces next to punctuation.
_TRICKY_TEXT = st.lists(st.sampled_from(
    ["'s", "'LL", "ab", "AB", "12345", "-", ".", "!?", " ", "  ", "\t", "/", "\n", "\r\n", "\r",
     "é", "\u0301", "²", "\u00a0", "\x85", "\u2028", "\x1c", "中文", "pm_5wq", "HTTP 503"]),
    max_size=12).map("".join)


@settings(max_examples=150, deadline=None)
@given(st.lists(ITEMS | st.text() | _TRICKY_TEXT, max_size=12),
       st.sampled_from(["o200k_base", "cl100k_base"]))
def test_bullet_lines_counted_joined_count_as_each_alone(items: list[str], encoding: str
                                                         ) -> None:
    counter = TokenCounter(load_encoding(encoding))
    lines = [f"{item_line(item)}\n" for item in items]
    expected = [counter.count_text(line) for line in lines]
    assert counter.count_lines(lines) == counter.for_job().count_lines(lines) == expected


TRICKY_SUMMARIES = st.fixed_dictionaries(
    {"goal": _TRICKY_TEXT | ITEMS,
     **{name: st.lists(ITEMS | _TRICKY_TEXT | st.text(), max_size=8) for name in LIST_SECTIONS}}
).map(Summary.model_validate)


@settings(max_examples=150, deadline=None)
@given(TRICKY_SUMMARIES, st.sampled_from(["o200k_base", "cl100k_base"]))
def test_a_blocks_count_is_its_lines_counts_added(summary: Summary, encoding: str) -> None:
    counter = TokenCounter(load_encoding(encoding))
    text = render_summary_block(summary)
    assert "".join(block_segments(summary)) == text
    assert count_summary_tokens(summary, counter) == counter.count_text(text)
    assert count_summary_tokens(summary, counter.for_job()) == counter.count_text(text)


def plain_fit(summary: Summary, budget_tokens: int, counter: TokenCounter,
              prior_items: dict[str, set[int]]) -> FittedSummary:
    """``fit_summary`` the plain way: every block it weighs rendered and counted whole."""
    def whole(fitted: Summary) -> FittedSummary:
        text = render_summary_block(fitted)
        return FittedSummary(fitted, text, counter.count_text(text))

    def kept_only(kept: dict[str, dict[int, None]]) -> Summary:
        return Summary.model_validate({"goal": capped.goal, **{
            name: [capped.items_of(name)[i] for i in sorted(kept[name])]
            for name in LIST_SECTIONS}})

    floor_tokens = counter.count_text(render_summary_block(empty_summary()))
    capped, lines = budget._capped(summary, counter)
    sections = budget._measure(capped, lines, counter, prior_items)
    fitted = whole(capped)
    if len(fitted.text.encode()) <= budget_tokens or (
            budget._estimate(floor_tokens, sections) <= budget_tokens * budget._SURELY_OVER
            and fitted.tokens <= budget_tokens):
        return fitted
    room_tokens = (budget_tokens - floor_tokens + counter.count_text(f"{goal_line('')}\n")
                   - counter.count_text(f"{goal_line(capped.goal)}\n"))
    kept = plain_select(sections, room_tokens)
    fitted = whole(kept_only(kept))
    while fitted.tokens > budget_tokens and any(kept.values()):
        budget._shed(kept, sections, fitted.tokens - budget_tokens)
        fitted = whole(kept_only(kept))
    if fitted.tokens <= budget_tokens:
        return fitted
    shortened = fitted.summary

    def with_goal(max_tokens: int) -> FittedSummary:
        goal = truncate_text(shortened.goal, max_tokens, counter)
        return whole(shortened.model_copy(update={"goal": goal}))

    low, high = 0, counter.count_text(shortened.goal)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if with_goal(middle).tokens <= budget_tokens else (
            low, middle - 1)
    return with_goal(low)


def plain_select(sections: Sequence[budget._Section], room_tokens: int
                 ) -> dict[str, dict[int, None]]:
    """``budget._select`` the plain way: every pass over every item of its section."""
    def take(section: budget._Section, cap: int, fresh: bool | None) -> None:
        for index in section.order:
            if index in kept[section.name] or (
                    fresh is not None and (index in section.fresh) != fresh):
                continue
            if used[section.name] + section.costs[index] <= cap:
                kept[section.name][index] = None
                used[section.name] += section.costs[index]

    shares = budget._share_out({s.name: sum(s.costs) for s in sections}, max(room_tokens, 0))
    kept: dict[str, dict[int, None]] = {s.name: {} for s in sections}
    used = {s.name: 0 for s in sections}
    for section in sections:
        share = shares[section.name]
        has_prior = len(section.fresh) < len(section.costs)
        for cap, fresh in ((int(share * FRESH_SHARE) if has_prior else share, True),
                           (share, False), (share, None)):
            take(section, cap, fresh)
    left_tokens = max(room_tokens, 0) - sum(used.values())
    for section in sorted(sections, key=lambda s: -budget.SECTION_WEIGHTS[s.name]):
        before = used[section.name]
        take(section, before + left_tokens, None)
        left_tokens -= used[section.name] - before
    return kept


@settings(max_examples=60, deadline=None)
@given(TRICKY_SUMMARIES | SUMMARIES, st.integers(85, 700), st.booleans())
def test_fitting_gives_what_rendering_and_counting_every_block_whole_gives(
    summary: Summary, budget_tokens: int, has_prior: bool
) -> None:
    counter = shared_counter()
    budget_tokens = max(budget_tokens, count_summary_tokens(empty_summary(), counter))
    prior_items = ({name: set(range(0, len(summary.items_of(name)), 2))
                    for name in LIST_SECTIONS} if has_prior else {})
    fitted = fit_summary(summary, budget_tokens, counter.for_job(), prior_items=prior_items)
    assert fitted == plain_fit(summary, budget_tokens, counter, prior_items)


def test_a_flooded_section_cannot_starve_the_others() -> None:
    counter = shared_counter()
    summary = filled(
        goal="Move mia_li_3668 to a later flight",
        resolved=[f"old question {n} about HAT{n:03d} settled" for n in range(40)],
        relevant_artifacts=[f"gift_card_{n:07d}" for n in range(80)],
        key_decisions=["Agreed to waive the change fee"],
        pending=["Confirm the new seat on HAT170"],
        completed_actions=["Cancelled ZFA04Y", "Booked HAT170"],
    )
    budget_tokens = count_summary_tokens(summary, counter) // 2
    fitted = fit_summary(summary, budget_tokens, counter).summary
    assert fitted.goal == summary.goal
    for name in ("key_decisions", "pending", "completed_actions"):
        assert fitted.items_of(name) == summary.items_of(name)
    assert 0 < len(fitted.resolved) < len(summary.resolved)
    assert 0 < len(fitted.relevant_artifacts) < len(summary.relevant_artifacts)


def test_inside_a_section_the_newest_items_stay_and_artifacts_keep_their_rank() -> None:
    counter = shared_counter()
    summary = filled(completed_actions=[f"step {n} on HAT{n:03d} done" for n in range(60)],
                     relevant_artifacts=[f"ranked_id_{n}" for n in range(60)])
    budget_tokens = count_summary_tokens(summary, counter) // 2
    fitted = fit_summary(summary, budget_tokens, counter).summary
    actions, artifacts = fitted.completed_actions, fitted.relevant_artifacts
    assert actions == summary.completed_actions[-len(actions):]
    assert artifacts == summary.relevant_artifacts[:len(artifacts)]


def test_the_new_spans_items_keep_their_reserved_share_against_a_full_prior() -> None:
    counter = shared_counter()
    prior = [f"prior_fact_{n}" for n in range(100)]
    fresh = [f"fresh_fact_{n}" for n in range(100)]
    summary = filled(relevant_artifacts=[*fresh, *prior])
    budget_tokens = count_summary_tokens(filled(relevant_artifacts=prior[:40]), counter)
    fitted = fit_summary(summary, budget_tokens, counter,
                         prior_items={"relevant_artifacts": set(range(100, 200))}).summary
    kept_fresh = [item for item in fitted.relevant_artifacts if item.startswith("fresh")]
    kept_prior = [item for item in fitted.relevant_artifacts if item.startswith("prior")]
    assert kept_fresh == fresh[:len(kept_fresh)]
    assert kept_prior == prior[:len(kept_prior)]  # an update lists the prior's newest first
    share = len(kept_fresh) / (len(kept_fresh) + len(kept_prior))
    assert FRESH_SHARE - 0.1 <= share <= FRESH_SHARE + 0.1


def test_the_budget_grows_with_what_the_summary_covers_between_its_floor_and_ceiling() -> None:
    budget = SummaryBudget(4_096, span_ratio=0.06, max_tokens=16_384)
    assert budget.for_span(10_000) == 4_096  # a short span: the floor
    assert budget.for_span(192_000) == 11_520  # a long first span: 6% of it
    assert budget.for_span(40_000, prior_summary_tokens=11_500) == 13_900  # prior + 6%
    assert budget.for_span(40_000, prior_summary_tokens=16_000) == 16_384  # the ceiling
    assert SummaryBudget(4_096).for_span(1_000_000, 4_000) == 4_096  # no ratio: fixed
    with pytest.raises(ValueError, match="max_tokens"):
        SummaryBudget(4_096, 0.06, max_tokens=1_000)


@given(context=st.integers(4_000, 2_000_000), ceiling=st.integers(4_096, 200_000))
@settings(max_examples=200, deadline=None)
def test_a_jobs_ceiling_leaves_the_floor_room_for_instructions_and_tail(
    context: int, ceiling: int,
) -> None:
    config = Settings(model_context_tokens=context, summary_budget_max_tokens=ceiling)
    effective = config.effective_summary_budget_max_tokens
    assert config.summary_budget_tokens <= effective <= ceiling
    assert effective == config.summary_budget_tokens or effective <= config.floor_tokens * 3 / 4
    assert effective == ceiling or effective == config.summary_budget_tokens \
        or effective == config.floor_tokens * 3 // 4  # the window lowered it, no more


def test_artifacts_share_lines_so_a_value_costs_about_its_own_tokens() -> None:
    counter = shared_counter()
    values = [f"credit_card_{n:07d}" for n in range(400)]
    summary = filled(goal="Refund the order", relevant_artifacts=values)
    budget_tokens = count_summary_tokens(empty_summary(), counter) + 1_000
    fitted = fit_summary(summary, budget_tokens, counter)
    kept = fitted.summary.relevant_artifacts
    line_tokens = counter.count_text(f"- {values[0]}\n")  # a bullet line per value: 8
    assert fitted.tokens <= budget_tokens
    assert kept == values[:len(kept)]
    assert len(kept) > 1.1 * 1_000 / line_tokens
    assert "- credit_card_0000000, credit_card_0000001, " in fitted.text


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_a_budget_below_an_empty_block_is_refused(encoding: str) -> None:
    counter = TokenCounter(load_encoding(encoding))
    floor_tokens = counter.count_text(render_summary_block(empty_summary()))
    # Remembered by encoding: each encoding's own floor, for a plain or a job's counter.
    assert empty_block_tokens(counter) == empty_block_tokens(counter.for_job()) == floor_tokens
    assert fit_summary(empty_summary(), floor_tokens, counter).tokens == floor_tokens
    with pytest.raises(ValueError, match="below"):
        fit_summary(filled(goal="x " * 50), floor_tokens - 1, counter)


def test_the_goal_is_shortened_last_and_the_empty_goal_fits_the_floor() -> None:
    counter = shared_counter()
    floor_tokens = count_summary_tokens(empty_summary(), counter)
    summary = filled(goal="rebook " * 400, pending=["confirm"])
    fitted = fit_summary(summary, floor_tokens + 10, counter)
    assert fitted.tokens <= floor_tokens + 10
    assert fitted.summary.goal.startswith("rebook")


@pytest.mark.parametrize(
    ("text", "max_tokens"),
    [("alpha beta gamma " * 50 + "ZFA04Y", 20), ("one two three", 100), ("x" * 500, 10)],
)
def test_truncation_cuts_at_a_word_boundary_and_marks_the_cut(text: str, max_tokens: int) -> None:
    counter = shared_counter()
    cut = truncate_text(text, max_tokens, counter)
    if counter.count_text(text) <= max_tokens:
        assert cut == text
        return
    assert cut.endswith("…")
    assert counter.count_text(cut) <= max_tokens + 1
    head = cut.removesuffix("…")
    assert text.startswith(head)
    if " " in head:
        assert text[len(head)] == " "

