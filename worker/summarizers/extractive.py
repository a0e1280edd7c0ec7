"""The embedded deterministic (extractive) summarizer: no network, always in budget.
It summarizes the span alone; the pipeline updates the prior summary with it."""

from __future__ import annotations

from worker.compaction import TokenCounter, fallback_summary
from worker.summarizers.base import SummaryDraft, SummaryWork

# Stored as the revision's prompt_version, so a changed extraction is traceable too.
EXTRACTIVE_VERSION = "extractive-v3"


class ExtractiveSummarizer:
    """Builds the summary from structure alone: deterministic, offline, always in budget."""

    kind = "extractive"
    uses_provider = False

    def __init__(self, counter: TokenCounter, *, kind: str = "extractive") -> None:
        self._counter = counter
        self.kind = kind

    def summarize(self, work: SummaryWork) -> SummaryDraft:
        fitted = fallback_summary(
            work.span,
            artifacts=work.artifacts,
            outcomes=work.outcomes,
            ranked=work.ranked_artifacts,
            budget_tokens=work.budget_tokens,
            counter=work.counter or self._counter,
            prior=work.prior,
            tail_continues=work.tail_continues,
            ledger=work.requests,
            passed_values=work.passed_values,
        )
        return SummaryDraft(summary=fitted.summary, kind=self.kind, model=self.kind,
                            prompt_version=EXTRACTIVE_VERSION, tokens=fitted.tokens)
