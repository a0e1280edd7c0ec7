"""The summarizer port: what the pipeline asks a summarizer for and gets back.

Implementations: ``extractive.py`` (deterministic, offline) and ``llm.py`` (any
OpenAI-compatible endpoint, chunk-and-merge).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from worker.compaction import (
    Artifact,
    CallOutcome,
    Failure,
    Group,
    RequestLedger,
    Summary,
    TokenCounter,
    count_identifier_lines,
    dump_artifacts_json,
    failure_values,
    rank_artifacts,
    read_span_requests,
    use_stored_line_counts,
)


@dataclass(frozen=True)
class SummaryWork:
    """Everything a summarizer needs for one job, already pruned and indexed.

    ``outcomes`` are the span's tool results classified once from the span as stored
    (before pruning shortens old tool outputs): the summarizers, the update's ranking and
    the truth check share them. ``counter`` is the job's (``TokenCounter.for_job``): what
    the summarizer counts, the update and validation need not encode again (None: the
    summarizer's own).
    """

    span: tuple[Group, ...]
    prior: Summary | None
    artifacts: tuple[Artifact, ...]
    outcomes: tuple[CallOutcome, ...]
    span_tokens: int
    budget_tokens: int
    counter: TokenCounter | None = None
    # Whether the verbatim tail goes on with the span's latest conversation.
    tail_continues: bool = False
    # The span's bare numbers as the merge lists them, with the labels the text gave them.
    number_labels: Mapping[str, str] = field(default_factory=dict)
    # Per indexed message of the span, the values its tool calls passed, from its stored
    # index (``noting_passed_values``).
    passed_values: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    @functools.cached_property
    def failures(self) -> tuple[Failure, ...]:
        """The outcomes of the calls that failed."""
        return tuple(outcome for outcome in self.outcomes if outcome.failed)

    @functools.cached_property
    def requests(self) -> RequestLedger:
        """The span's requests, read once per job for the extractive draft and the truth
        check."""
        return read_span_requests(self.span, has_prior_goal=bool(self.prior and self.prior.goal),
                                  outcomes=self.outcomes, tail_continues=self.tail_continues)

    @functools.cached_property
    def ranked_artifacts(self) -> tuple[Artifact, ...]:
        """The artifacts most salient first, the error codes that ended a call leading:
        ranked once per job for the prompt's list, the extractive draft and the update
        (each features its own values with ``rerank_featured``)."""
        return rank_artifacts(self.artifacts,
                              featured=failure_values(self.failures, self.artifacts))

    def listable_artifacts(self) -> Iterator[Artifact]:
        """The ranked artifacts a summary may list (tool names are not), most salient
        first, before a draft features its own."""
        return (artifact for artifact in self.ranked_artifacts if artifact.kind != "tool")

    @property
    def identifiers(self) -> list[str]:
        """The values of ``listable_artifacts``."""
        return [artifact.value for artifact in self.listable_artifacts()]

    @functools.cached_property
    def artifacts_json(self) -> str:
        """The span's artifacts as the revision row stores them."""
        return dump_artifacts_json(self.artifacts)

    def use_stored_line_counts(self) -> None:
        """Give the job's counter the line counts ingest stored for the identifiers a
        summary of this budget could list (``summary_update.use_stored_line_counts``)."""
        if self.counter is not None:
            use_stored_line_counts(self.listable_artifacts(), self.counter,
                                   budget_tokens=self.budget_tokens)

    def prepare_update(self) -> None:
        """Do ahead the work of the steps after the summarizer that no draft changes: the
        artifacts' JSON, and the token counts of the identifiers' lines in the job's
        counter. A summarizer that waits on a model calls it meanwhile; the update and the
        swap then find it done (or do it themselves, as they would have)."""
        _ = self.artifacts_json
        if self.counter is not None:
            count_identifier_lines(self.identifiers, self.counter,
                                   budget_tokens=self.budget_tokens)


@dataclass(frozen=True)
class SummaryUsage:
    """What making a summary cost; the names are ``JobFigures`` fields."""

    llm_calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    llm_retries: int = 0
    llm_latency_s: float = 0.0
    chunks: int = 0
    merge_rounds: int = 0
    llm_model: str | None = None  # None: no model was called
    cost_usd: float | None = 0.0  # None: the model has no price in the table


@dataclass(frozen=True)
class SummaryDraft:
    """The summary of the span alone, before the summary update and validation."""

    summary: Summary
    kind: str
    model: str
    prompt_version: str
    usage: SummaryUsage = field(default_factory=SummaryUsage)
    # The summary's rendered block in tokens, where the summarizer counted it (the
    # extractive one fits its draft); None: validation counts it.
    tokens: int | None = None


class BatchPending(Exception):
    """A call whose answer a batch has not given yet: its request waits for the next batch
    (``worker/summarizers/batch_replay.py``); the job parks."""


class BatchLineFailed(Exception):
    """A request a batch did not answer, under the deterministic fallback: the job commits
    the deterministic summary instead. ``error`` is what the line ended with."""

    def __init__(self, error: Exception, reason: str) -> None:
        super().__init__(str(error))
        self.error, self.reason = error, reason


class Summarizer(Protocol):
    """Summarizes ``work.span`` only. ``work.prior`` is read-only context (what is already
    stored): the draft must not repeat it; the pipeline updates the prior with it afterwards."""

    kind: str
    uses_provider: bool

    def summarize(self, work: SummaryWork) -> SummaryDraft: ...
