"""The planning core on real recorded sessions (../shared/corpus), at two window sizes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.support.chat_rules import find_chat_violations
from tests.support.corpus import load_corpus
from tests.support.strategy_steps import compose_to_budget, default_steps
from tests.unit.session_strategies import shared_counter, to_stored
from worker.compaction.call_plan import plan_summary_calls, render_span_items
from worker.compaction.chunking import ChunkPlan, SpanItem, output_budget_tokens
from worker.compaction.grouping import GroupKind, group_messages
from worker.compaction.messages import ChatMessage, Role, StoredMessage
from worker.compaction.plan import Boundary, TriggerPolicy, plan_boundary
from worker.compaction.pruning import prune_groups

pytestmark = pytest.mark.corpus

SUMMARY_TOKENS = 4_096
MARGIN_RATIO = 0.10
PLACEHOLDER = ChatMessage(role=Role.USER, content="[summary]")


@dataclass(frozen=True)
class Window:
    """A model window and the policy derived from it with the service's default ratios."""

    name: str
    window_tokens: int
    tail_budget_tokens: int

    @property
    def policy(self) -> TriggerPolicy:
        trigger = int(self.window_tokens * 0.70)
        return TriggerPolicy(trigger_tokens=trigger, floor_tokens=int(trigger * 0.50),
                             tail_budget_tokens=self.tail_budget_tokens, min_tail_user_turns=1)


WINDOWS = [Window("128k", 128_000, 8_000), Window("32k", 32_000, 4_000)]


@pytest.fixture(scope="module", params=["dev", "dev_long"])
def corpus(request: pytest.FixtureRequest) -> list[tuple[str, list[StoredMessage]]]:
    return [
        (session["session_id"], to_stored(session["messages"], shared_counter()))
        for session in load_corpus(request.param)
    ]


def plan_span(boundary: Boundary, window: Window) -> tuple[list[SpanItem], ChunkPlan]:
    """The span's items and its call plan, as the LLM summarizer plans a first compaction."""
    counter = shared_counter()
    pruned = prune_groups(boundary.span, audit_mode=False, counter=counter)
    items = render_span_items(pruned, counter)
    plan = plan_summary_calls(pruned, prior=None, identifiers=(),
                              window_tokens=window.window_tokens, margin_ratio=MARGIN_RATIO,
                              output_tokens=output_budget_tokens(boundary.span_tokens),
                              counter=counter)
    return items, plan


def test_grouping_re_concatenates_every_session_and_never_splits_an_exchange(
    corpus: list[tuple[str, list[StoredMessage]]],
) -> None:
    for session_id, session in corpus:
        groups = group_messages(session)
        assert [m for g in groups for m in g.messages] == session, session_id
        for group in groups:
            assert not group.pending and group.unanswered_call_ids == (), session_id
            if group.kind is GroupKind.TOOL_EXCHANGE:
                assert group.messages[0].message.tool_calls, session_id
        assert find_chat_violations([m.message for m in session]) == [], session_id


@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: w.name)
def test_boundaries_keep_projections_valid_and_reach_the_floor(
    corpus: list[tuple[str, list[StoredMessage]]], window: Window
) -> None:
    rule = window.policy
    for session_id, session in corpus:
        groups = group_messages(session)
        boundary = plan_boundary(groups, prior_through_seq=0, summary_tokens=SUMMARY_TOKENS,
                                 policy=rule)
        if boundary is None:
            continue
        kept = [m.message for g in boundary.instructions for m in g.messages]
        tail = [m.message for g in boundary.tail for m in g.messages]
        assert find_chat_violations([*kept, PLACEHOLDER, *tail]) == [], session_id
        seqs = sorted(m.seq for g in boundary.span + boundary.instructions + boundary.tail
                      for m in g.messages)
        assert seqs == [m.seq for m in session], session_id
        # Beyond the last user turn the tail only grows within the budget and the floor.
        users = sum(g.kind is GroupKind.USER for g in boundary.tail)
        assert users >= rule.min_tail_user_turns, session_id
        conversation = sum(g.tokens for g in boundary.tail if not g.is_instruction)
        assert users == rule.min_tail_user_turns or (
            conversation <= rule.tail_budget_tokens
            and boundary.projected_tokens(SUMMARY_TOKENS) <= rule.floor_tokens), session_id


@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: w.name)
def test_chunk_plans_cover_each_span_and_fit_the_window(
    corpus: list[tuple[str, list[StoredMessage]]], window: Window
) -> None:
    for session_id, session in corpus:
        boundary = plan_boundary(group_messages(session), prior_through_seq=0,
                                 summary_tokens=SUMMARY_TOKENS, policy=window.policy)
        if boundary is None:
            continue
        items, plan = plan_span(boundary, window)
        planned = [item for chunk in plan.chunks for item in chunk.items]
        assert planned == items, session_id  # corpus messages never need cutting
        assert all(chunk.tokens <= plan.budget_tokens for chunk in plan.chunks), session_id
        if sum(item.tokens for item in items) <= plan.budget_tokens:
            assert (len(plan.chunks), plan.calls) == (1, 1), session_id
        else:
            assert len(plan.chunks) >= 2 and plan.merge_calls >= 1, session_id


@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: w.name)
def test_a_second_compaction_summarizes_only_the_new_messages(
    corpus: list[tuple[str, list[StoredMessage]]], window: Window
) -> None:
    for session_id, session in corpus:
        groups = group_messages(session)
        half = groups[: len(groups) // 2]
        first = plan_boundary(half, prior_through_seq=0, summary_tokens=SUMMARY_TOKENS,
                              policy=window.policy)
        if first is None:
            continue
        second = plan_boundary(groups, prior_through_seq=first.through_seq,
                               summary_tokens=SUMMARY_TOKENS, policy=window.policy)
        if second is not None:
            assert min(g.first_seq for g in second.span) > first.through_seq, session_id


def test_the_deterministic_composition_meets_a_32k_budget_on_every_session(
    corpus: list[tuple[str, list[StoredMessage]]],
) -> None:
    steps = default_steps(shared_counter(), keep_last_tool_groups=2)
    for session_id, session in corpus:
        groups = group_messages(session)
        composed = compose_to_budget(groups, 32_000, steps)
        assert sum(g.tokens for g in composed) <= 32_000, session_id
        assert find_chat_violations([m.message for g in composed for m in g.messages]) == [], (
            session_id)
