"""What a night cost (`compactor cost`): the runs' own figures summed (jobs, tokens by
kind, cost), and for each compaction what it saves: the tokens it removed from each of
the session's future requests, the session's request rate since its previous compaction,
and how many future requests pay the compaction back.

The cost is the one each run recorded when it ran; the Batch API figure and the saving
are priced with the table as it is now.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from db import CostedRun
from worker.compaction import ModelPrice, payback_requests, price_calls

SECONDS_PER_HOUR = 3_600


@dataclass(frozen=True)
class SessionSaving:
    """One compaction's saving. ``requests_per_hour`` and ``payback_hours`` are None when
    the session made no request since its previous compaction (or no time passed);
    ``payback_requests`` when nothing was removed or ``session_model`` has no price."""

    session_id: str
    run_id: int
    cost_usd: float | None
    tokens_removed: int
    requests_since_previous: int
    hours_since_previous: float
    requests_per_hour: float | None
    payback_requests: float | None
    payback_hours: float | None


@dataclass(frozen=True)
class CostReport:
    """The window's runs summed; ``unpriced_jobs`` made LLM calls to a model without a
    price, so ``cost_usd`` leaves them out (and so does ``cost_at_batch_price_usd``)."""

    since: datetime
    until: datetime | None
    session_model: str
    session_model_priced: bool = False
    jobs: int = 0
    jobs_by_outcome: dict[str, int] = field(default_factory=dict)
    llm_calls: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_jobs: int = 0
    cost_at_batch_price_usd: float = 0.0
    cost_at_sync_price_usd: float = 0.0  # the same tokens called synchronously
    sessions: tuple[SessionSaving, ...] = ()


def build_cost_report(runs: Sequence[CostedRun], prices: Mapping[str, ModelPrice], *,
                      since: datetime, until: datetime | None, session_model: str
                      ) -> CostReport:
    """Sum ``runs`` into a report; ``session_model``'s input price values the tokens a
    compaction removes from each future request of its session."""
    totals: Counter[str] = Counter()
    cost_usd = batch_usd = sync_usd = 0.0
    unpriced = 0
    for costed in runs:
        figures = costed.run.figures or {}
        prompt, cached = _count(figures, "prompt_tokens"), _count(figures, "cached_tokens")
        completion = _count(figures, "completion_tokens")
        totals.update(llm_calls=_count(figures, "llm_calls"), input=prompt - cached,
                      cached=cached, output=completion)
        price = prices.get(str(figures.get("llm_model")))
        if figures.get("cost_usd") is not None:
            cost_usd += float(figures["cost_usd"])
        elif _count(figures, "llm_calls"):
            unpriced += 1
        if price is not None:
            for batch in (False, True):
                priced = price_calls(price, prompt_tokens=prompt, cached_tokens=cached,
                                     completion_tokens=completion, batch=batch)
                batch_usd, sync_usd = (batch_usd + priced, sync_usd) if batch else \
                    (batch_usd, sync_usd + priced)
    session_price = prices.get(session_model)
    return CostReport(
        since, until, session_model, session_price is not None, jobs=len(runs),
        jobs_by_outcome=dict(Counter(costed.run.outcome for costed in runs)),
        llm_calls=totals["llm_calls"], input_tokens=totals["input"],
        cached_tokens=totals["cached"], output_tokens=totals["output"],
        cost_usd=cost_usd, unpriced_jobs=unpriced, cost_at_batch_price_usd=batch_usd,
        cost_at_sync_price_usd=sync_usd,
        sessions=tuple(_saving(costed, session_price) for costed in runs
                       if costed.compacted_at is not None))


def _count(figures: Mapping[str, object], name: str) -> int:
    value = figures.get(name)
    return value if isinstance(value, int) else 0


def _saving(costed: CostedRun, session_price: ModelPrice | None) -> SessionSaving:
    run, figures = costed.run, costed.run.figures or {}
    removed = max(0, _count(figures, "tokens_before") - _count(figures, "tokens_after"))
    requests = costed.requests_since_previous or 0
    hours = 0.0
    if costed.compacted_at is not None and costed.previous_at is not None:
        hours = (costed.compacted_at - costed.previous_at).total_seconds() / SECONDS_PER_HOUR
    rate = requests / hours if requests and hours > 0 else None
    cost = figures.get("cost_usd")
    cost_usd = float(cost) if isinstance(cost, int | float) else None
    payback = (payback_requests(cost_usd, removed, session_price)
               if cost_usd is not None and session_price is not None else None)
    return SessionSaving(
        run.session_id, run.id, cost_usd, removed, requests, round(hours, 3), rate, payback,
        payback / rate if payback is not None and rate else None)
