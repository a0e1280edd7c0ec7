"""When to compact (trigger policy, anti-thrash) and where: the boundary between the span
to summarize and the verbatim tail.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from worker.compaction.grouping import Group, GroupKind

# Anti-thrash looks at this many most recent compactions.
THRASH_WINDOW_RUNS = 2


@dataclass(frozen=True, slots=True)
class TriggerPolicy:
    """Token thresholds of the trigger and of the boundary planner."""

    trigger_tokens: int
    floor_tokens: int
    tail_budget_tokens: int
    min_tail_user_turns: int
    thrash_min_saving_ratio: float = 0.10
    thrash_lift_ratio: float = 1.5

    def __post_init__(self) -> None:
        if not 0 < self.floor_tokens <= self.trigger_tokens:
            raise ValueError("floor_tokens must be positive and at most trigger_tokens")
        if self.tail_budget_tokens < 0 or self.min_tail_user_turns < 0:
            raise ValueError("tail_budget_tokens and min_tail_user_turns must be >= 0")
        if not 0 <= self.thrash_min_saving_ratio <= 1 or self.thrash_lift_ratio < 1:
            raise ValueError("thrash_min_saving_ratio must be in [0, 1], thrash_lift_ratio >= 1")


class DecisionReason(StrEnum):
    """Why a session is or is not compacted (stable values: they are logged)."""

    FORCED = "forced"
    OVER_TRIGGER = "over_trigger"
    UNDER_TRIGGER = "under_trigger"
    ANTI_THRASH = "anti_thrash"
    THRASH_LIFTED = "thrash_lifted"


@dataclass(frozen=True, slots=True)
class Decision:
    compact: bool
    reason: DecisionReason


def decide_compaction(
    projection_tokens: int,
    recent_savings: Sequence[float],
    policy: TriggerPolicy,
    force: bool,
) -> Decision:
    """Decide whether to compact a projection of ``projection_tokens``.

    ``recent_savings`` are the saving ratios of the last compactions, newest first. When
    the last two each saved less than ``thrash_min_saving_ratio``, compacting again would
    likely save as little, so it is skipped unless the projection grew past
    ``trigger * thrash_lift_ratio``. ``force`` skips both checks.
    """
    if force:
        return Decision(True, DecisionReason.FORCED)
    if projection_tokens <= policy.trigger_tokens:
        return Decision(False, DecisionReason.UNDER_TRIGGER)
    recent = list(recent_savings[:THRASH_WINDOW_RUNS])
    thrashing = len(recent) == THRASH_WINDOW_RUNS and all(
        saving < policy.thrash_min_saving_ratio for saving in recent
    )
    if not thrashing:
        return Decision(True, DecisionReason.OVER_TRIGGER)
    if projection_tokens > policy.trigger_tokens * policy.thrash_lift_ratio:
        return Decision(True, DecisionReason.THRASH_LIFTED)
    return Decision(False, DecisionReason.ANTI_THRASH)


@dataclass(frozen=True, slots=True)
class Boundary:
    """Where a compaction cuts.

    The new projection is ``instructions + summary + tail``; ``span`` is what the summary
    covers besides the prior summary. ``through_seq`` is the new revision's high mark:
    every message with a higher seq is in ``tail``. ``system_tokens``: the session's
    system prompt kept outside its messages (an Anthropic ``system``), an instruction
    too.
    """

    through_seq: int
    span: tuple[Group, ...]
    tail: tuple[Group, ...]
    instructions: tuple[Group, ...]
    system_tokens: int = 0

    @property
    def span_tokens(self) -> int:
        return sum(group.tokens for group in self.span)

    @property
    def tail_tokens(self) -> int:
        return sum(group.tokens for group in self.tail)

    @property
    def instruction_tokens(self) -> int:
        return self.system_tokens + sum(group.tokens for group in self.instructions)

    def projected_tokens(self, summary_tokens: int) -> int:
        """Tokens of the projection once a summary of ``summary_tokens`` is in place."""
        return self.instruction_tokens + summary_tokens + self.tail_tokens


def plan_boundary(
    groups: Sequence[Group],
    *,
    prior_through_seq: int,
    summary_tokens: int,
    policy: TriggerPolicy,
    system_tokens: int = 0,
) -> Boundary | None:
    """Choose the boundary; None when there is nothing new to summarize.

    The tail is a suffix of whole groups, found in two steps:

    1. The required tail: the pending group (and anything after it), extended back to
       hold the last ``min_tail_user_turns`` user turns. Those turns win over the floor,
       but not over the trigger: when keeping them would leave the projection above
       ``trigger_tokens`` (compaction could not help, and a long autonomous tool run
       after the last user turn would wedge the session), only the pending part is
       required.
    2. The tail then grows back one group at a time while its conversation tokens stay
       within ``tail_budget_tokens`` and the projection (instructions + summary + tail)
       stays within ``floor_tokens``; it stops at the first group that breaks either.
       Instruction groups cost nothing here (they are kept wherever they sit).

    ``system_tokens`` (a system prompt kept outside the messages) is always in the
    projection, like ``summary_tokens``: it counts in both the floor and the trigger.

    The span is every non-instruction group after ``prior_through_seq`` before the tail;
    a group straddling ``prior_through_seq`` (only possible with malformed history) is
    summarized whole rather than lost.
    """
    start = bisect_right(groups, prior_through_seq, key=lambda group: group.last_seq)
    fixed_tokens = summary_tokens + system_tokens
    required = _required_tail_start(groups, start, fixed_tokens, policy)
    tail_start = _grow_tail(groups, start, required, fixed_tokens, policy)
    span = tuple(group for group in groups[start:tail_start] if not group.is_instruction)
    if not span:
        return None
    return Boundary(
        through_seq=groups[tail_start - 1].last_seq,
        span=span,
        tail=tuple(groups[tail_start:]),
        instructions=tuple(group for group in groups[:tail_start] if group.is_instruction),
        system_tokens=system_tokens,
    )


def _required_tail_start(
    groups: Sequence[Group], start: int, fixed_tokens: int, policy: TriggerPolicy
) -> int:
    pending_at = next((i for i in range(start, len(groups)) if groups[i].pending), len(groups))
    index, users = pending_at, 0
    while users < policy.min_tail_user_turns and index > start:
        index -= 1
        users += groups[index].kind is GroupKind.USER
    if _projected_tokens(groups, index, fixed_tokens) > policy.trigger_tokens:
        return pending_at
    return index


def _grow_tail(
    groups: Sequence[Group], start: int, tail_start: int, fixed_tokens: int,
    policy: TriggerPolicy,
) -> int:
    conversation_tokens = sum(g.tokens for g in groups[tail_start:] if not g.is_instruction)
    projected = _projected_tokens(groups, tail_start, fixed_tokens)
    while tail_start > start:
        group = groups[tail_start - 1]
        if not group.is_instruction:
            if (conversation_tokens + group.tokens > policy.tail_budget_tokens
                    or projected + group.tokens > policy.floor_tokens):
                break
            conversation_tokens += group.tokens
            projected += group.tokens
        tail_start -= 1
    return tail_start


def _projected_tokens(groups: Sequence[Group], tail_start: int, fixed_tokens: int) -> int:
    """Instructions before the tail + the summary and system prompt (``fixed_tokens``) +
    the whole tail."""
    kept_instructions = sum(g.tokens for g in groups[:tail_start] if g.is_instruction)
    return kept_instructions + fixed_tokens + sum(g.tokens for g in groups[tail_start:])
