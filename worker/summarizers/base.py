"""The summarizer port: what the pipeline asks a summarizer for and gets back.

Implementations: ``extractive.py`` (deterministic, offline) and ``llm.py`` (any
OpenAI-compatible endpoint, chunk-and-merge).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from worker.compaction.grouping import Group
from worker.compaction.identifiers import Artifact
from worker.compaction.schema import Summary


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
