"""Composing the deterministic strategies under a token budget, the way Microsoft Agent
Framework chains them: what the strategy tests check the strategies against. The
service runs one strategy per job (``apply_strategy``), never a chain."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from worker.compaction.grouping import Group
from worker.compaction.strategies import (
    SizeUnit,
    StrategyConfig,
    StrategyName,
    apply_strategy,
    truncate_groups,
)
from worker.compaction.tokens import TokenCounter

# A step takes the current groups and returns new ones, or None when it declines
# (a summarization slot may decline, for instance when its breaker is open).
Step = Callable[[list[Group]], list[Group] | None]


def compose_to_budget(
    groups: Sequence[Group], budget_tokens: int, steps: Sequence[Step]
) -> list[Group]:
    """Apply ``steps`` in order until the groups fit ``budget_tokens``, then truncate.

    Put the cheapest steps first (collapse, drop, then a caller's summarization). A final
    oldest-first truncation by tokens meets the budget whenever the instructions, the
    last conversation group and a pending group fit in it.
    """
    current = list(groups)
    for step in steps:
        if sum(group.tokens for group in current) <= budget_tokens:
            return current
        stepped = step(current)
        if stepped is not None:
            current = stepped
    return truncate_groups(
        current, max_size=budget_tokens, compact_to=budget_tokens, unit=SizeUnit.TOKENS
    )


def build_step(config: StrategyConfig, counter: TokenCounter) -> Step:
    """Return the strategy named in ``config`` as a step for :func:`compose_to_budget`."""
    def step(groups: list[Group]) -> list[Group]:
        return apply_strategy(groups, config, counter)
    return step


def default_steps(
    counter: TokenCounter, *, keep_last_tool_groups: int = 2, summarize: Step | None = None
) -> list[Step]:
    """Collapse, then drop, then ``summarize`` if given: cheapest first."""
    steps = [
        build_step(StrategyConfig(StrategyName.TOOL_RESULT_COLLAPSE,
                                  keep_last_tool_groups=keep_last_tool_groups), counter),
        build_step(StrategyConfig(StrategyName.TOOL_CALL_DROP,
                                  keep_last_tool_groups=keep_last_tool_groups), counter),
    ]
    return [*steps, summarize] if summarize is not None else steps
