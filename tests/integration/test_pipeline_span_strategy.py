"""The configured deterministic strategy runs on the span before it is summarized."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from worker.compaction.grouping import GroupKind
from worker.compaction.intake import IntakePolicy
from worker.compaction.tokens import TokenCounter
from worker.errors import Outcome
from worker.job import pipeline
from worker.job.values import JobRequest
from worker.platform.ingest import import_sessions
from worker.runtime import build_runtime
from worker.settings.config import Settings
from worker.summarizers import ExtractiveSummarizer, SummaryDraft, SummaryWork


class RecordingSummarizer(ExtractiveSummarizer):
    """The extractive summarizer, keeping the work it was given."""

    def __init__(self, counter: TokenCounter) -> None:
        super().__init__(counter)
        self.seen: list[SummaryWork] = []

    def summarize(self, work: SummaryWork) -> SummaryDraft:
        self.seen.append(work)
        return super().summarize(work)


def tool_heavy_session(exchanges: int) -> dict[str, object]:
    messages: list[dict[str, object]] = [{"role": "system", "content": "You are an agent."}]
    for i in range(exchanges):
        messages += [
            {"role": "user", "content": f"Please check order ORD-{i:04d} and report back."},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{i}", "type": "function",
                "function": {"name": "get_order", "arguments": f'{{"order_id": "ORD-{i:04d}"}}'}}]},
            {"role": "tool", "tool_call_id": f"call_{i}",
             "content": f'{{"order_id": "ORD-{i:04d}", "status": "shipped"}} ' + "detail " * 150},
            {"role": "assistant", "content": f"Order ORD-{i:04d} has shipped."},
        ]
    return {"session_id": "strategy-session", "messages": messages}


def test_tool_call_drop_keeps_only_the_last_tool_exchanges_of_the_span(database_url: str) -> None:
    settings = Settings(database_url=database_url, model_context_tokens=6_000,
                        tail_budget_tokens=500, span_strategy="tool_call_drop",
                        span_strategy_keep_last_tool_groups=2)
    runtime = build_runtime(settings, use_redis=False)
    recorder = RecordingSummarizer(runtime.deps.counter)
    deps = replace(runtime.deps, summarizer=recorder)
    list(import_sessions([tool_heavy_session(20)], store=runtime.store,
                         counter=deps.counter, policy=IntakePolicy(), now=datetime.now(UTC)))

    try:
        result = pipeline.run(JobRequest("strategy-session", "test"), deps, runtime.policy)
        stored = runtime.store.messages("strategy-session")
    finally:
        runtime.close()

    assert result.outcome is Outcome.COMPACTED, result
    (work,) = recorder.seen
    tool_groups = [g for g in work.span if g.kind is GroupKind.TOOL_EXCHANGE]
    assert len(tool_groups) == 2
    assert any(g.kind is GroupKind.USER for g in work.span)
    # The history itself is untouched: every message is still stored.
    assert len(stored) == 1 + 20 * 4
