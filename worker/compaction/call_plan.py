"""The summarizer's calls for one span, planned as production runs them: the span's groups
rendered as the prompt renders them, packed into chunks that fit the window less its
margin, the output budget and the prompt's own overhead (prior summary and identifier
list included), then merge rounds as wide as a merge call can read. The LLM summarizer,
the tests and the plan bench all call :func:`plan_summary_calls`.

A span whose rendering fits the chunk budget in UTF-8 bytes fits it in tokens (a token is
at least one byte): a job plans it as one call without encoding it (``exact=False``)."""

from __future__ import annotations

from collections.abc import Sequence

from worker.compaction.chunking import (
    ChunkPlan,
    SpanItem,
    chunk_budget_tokens,
    merge_fan_in,
    plan_chunks,
)
from worker.compaction.grouping import Group
from worker.compaction.prompts import (
    PART_FRAMING_TOKENS,
    prompt_overhead_tokens,
    render_group,
    render_prior_json,
)
from worker.compaction.schema import Summary
from worker.compaction.tokens import TokenCounter


def render_span_items(span: Sequence[Group], counter: TokenCounter) -> list[SpanItem]:
    """Render each group of the span as the prompt shows it, with its token count."""
    return [_counted(item, counter) for item in _rendered(span)]


def _rendered(span: Sequence[Group]) -> list[SpanItem]:
    """The span's groups rendered, each sized by its UTF-8 bytes (its most tokens)."""
    items = []
    for group in span:
        text = render_group(group)
        items.append(SpanItem(text, len(text.encode()), group.first_seq, group.last_seq))
    return items


def _counted(item: SpanItem, counter: TokenCounter) -> SpanItem:
    return SpanItem(item.text, counter.count_text(item.text), item.first_seq, item.last_seq)


def plan_summary_calls(
    span: Sequence[Group],
    *,
    prior: Summary | None,
    identifiers: Sequence[str],
    window_tokens: int,
    margin_ratio: float,
    output_tokens: int,
    counter: TokenCounter,
    exact: bool = True,
) -> ChunkPlan:
    """Plan the map calls and merge rounds that summarize ``span`` in ``window_tokens``.

    With ``exact=False`` a span that fits the chunk budget in bytes is planned as one
    call whose items' ``tokens`` are their bytes (an upper bound, not a count): the same
    calls as an exact plan, without encoding the span.

    Raises:
        ContextOverflow: the window cannot hold a useful chunk, or two partial summaries.
    """
    prior_tokens = counter.count_text(render_prior_json(prior)) if prior else 0
    overhead = prompt_overhead_tokens(counter, prior_tokens, identifiers=identifiers,
                                      budget_tokens=output_tokens)
    budget = chunk_budget_tokens(window_tokens, margin_ratio, output_tokens, overhead)
    fan_in = merge_fan_in(budget, output_tokens + PART_FRAMING_TOKENS)
    items = _rendered(span)
    if exact or sum(item.tokens for item in items) > budget:
        items = [_counted(item, counter) for item in items]
    return plan_chunks(items, budget_tokens=budget, counter=counter, fan_in=fan_in)
