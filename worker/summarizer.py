"""The summarizer port: what the pipeline asks for and gets back, and the embedded
deterministic (extractive) summarizer that needs no network.

The LLM implementation lives in ``worker/chunk_merge.py``; both return a summary that
already incorporates the prior one, so the pipeline validates one shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from worker.compaction.fallback import fallback_summary
from worker.compaction.grouping import Group
from worker.compaction.identifiers import Artifact
from worker.compaction.schema import Summary
from worker.compaction.tokens import TokenCounter

# Stored as the revision's prompt_version, so a changed extraction is traceable too.
EXTRACTIVE_VERSION = "extractive-v1"


@dataclass(frozen=True)
class SummaryWork:
    """Everything a summarizer needs for one job, already pruned and indexed."""

    span: tuple[Group, ...]
    prior: Summary | None
    artifacts: tuple[Artifact, ...]
    span_tokens: int
    budget_tokens: int


@dataclass(frozen=True)
class SummaryDraft:
    """A summary before validation, with the figures of how it was made."""

    summary: Summary
    kind: str
    model: str
    prompt_version: str
    figures: dict[str, int | float] = field(default_factory=dict)


class Summarizer(Protocol):
    kind: str
    uses_provider: bool

    def summarize(self, work: SummaryWork) -> SummaryDraft: ...


class ExtractiveSummarizer:
    """Builds the summary from structure alone: deterministic, offline, always in budget."""

    kind = "extractive"
    uses_provider = False

    def __init__(self, counter: TokenCounter, *, kind: str = "extractive") -> None:
        self._counter = counter
        self.kind = kind

    def summarize(self, work: SummaryWork) -> SummaryDraft:
        summary = fallback_summary(
            work.span,
            prior=work.prior,
            artifacts=work.artifacts,
            budget_tokens=work.budget_tokens,
            counter=self._counter,
        )
        return SummaryDraft(summary=summary, kind=self.kind, model=self.kind,
                            prompt_version=EXTRACTIVE_VERSION,
                            figures={"llm_calls": 0, "chunks": 0, "merge_rounds": 0})
