"""The values a job carries: its request, policy, dependencies, the trace of a running job
and its result. Kept apart from ``pipeline.py`` so the pipeline reads as the steps alone."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from db import NewRun
from worker.compaction import Breaker, StrategyConfig, SummaryBudget, TokenCounter, TriggerPolicy
from worker.errors import CompactionError, Outcome
from worker.job.figures import JobFigures
from worker.job.ports import Batching, JobLedgerPort, ProviderBreakerPort
from worker.summarizers import Summarizer
from worker.tracing.spans import open_span


@dataclass(frozen=True)
class JobRequest:
    """One delivery of ``compactor.compact_session``, already validated."""

    session_id: str
    reason: str
    force: bool = False
    task_id: str = "inline"
    attempt: int = 1
    # An earlier delivery of this very message was lost with its worker: the lease that
    # delivery left behind may be taken over instead of waited out.
    redelivered: bool = False


@dataclass(frozen=True)
class JobPolicy:
    """The plain values a job needs from settings."""

    trigger: TriggerPolicy
    summary_budget_tokens: int
    audit_mode: bool
    span_strategy: StrategyConfig | None
    lease_ttl_s: int
    breaker_threshold: int
    breaker_cooldown_s: int
    fallback_when_open: bool
    lease_heartbeat_s: float = 0.0  # 0: the lease is not renewed while the job runs
    # The summary budget grows with what it covers (SummaryBudget): 0 keeps it fixed.
    summary_budget_span_ratio: float = 0.0
    summary_budget_max_tokens: int | None = None

    @property
    def summary_budget(self) -> SummaryBudget:
        """The summary budget's rule: summary_budget_tokens, grown by the span ratio."""
        return SummaryBudget(self.summary_budget_tokens, self.summary_budget_span_ratio,
                             self.summary_budget_max_tokens)


@dataclass(frozen=True)
class JobDeps:
    """What a job talks to; the real ones are built per worker process in runtime.py."""

    store: JobLedgerPort
    summarizer: Summarizer
    fallback: Summarizer
    counter: TokenCounter
    provider_breaker: ProviderBreakerPort
    clock: Callable[[], datetime]
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    batching: Batching | None = None  # batch mode's parts; None: synchronous calls

    def lease_owner(self, request: JobRequest) -> str:
        """The lease owner: unique per worker process and task (the task id ends it)."""
        return f"{self.worker_id}:{request.task_id}"


class Skip(Exception):
    """Raised inside the pipeline when the session needs no compaction now."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class JobResult:
    """How one job ended: everything the ``compaction.job`` event reports."""

    session_id: str
    task_id: str
    attempt: int
    trigger: str
    outcome: Outcome
    reason: str
    summarizer: str | None
    failure_class: str | None
    failure_message: str | None
    retryable: bool
    retry_after_s: float | None
    revision_id: int | None
    parent_revision_id: int | None
    breaker_state: str | None
    figures: JobFigures
    durations_ms: dict[str, float]
    duration_ms: float
    run_recorded: bool = True
    record_error: str | None = None
    # The run row the database refused: the task keeps it for the reconciler to write.
    unrecorded_run: NewRun | None = None
    # The job's last transaction cleared its queue marker: the task need not.
    queue_marker_cleared: bool = False


@dataclass
class JobTrace:
    """What a running job has learned so far; every outcome reports it, failures too."""

    request: JobRequest
    started_at: datetime
    started_monotonic: float = field(default_factory=time.monotonic)
    figures: JobFigures = field(default_factory=JobFigures)
    durations_ms: dict[str, float] = field(default_factory=dict)
    summarizer: str | None = None
    breaker_state: str | None = None
    revision_id: int | None = None
    parent_revision_id: int | None = None
    lease_tried: bool = False  # the job may hold the session's lease from here on
    breaker: Breaker | None = None  # the session's breaker, as this job last wrote it

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time a step (``durations_ms``), inside its span when the process traces."""
        began = time.monotonic()
        try:
            with open_span(f"compaction.{name}", expected=(Skip,)):
                yield
        finally:
            self.durations_ms[name] = round((time.monotonic() - began) * 1000, 3)

    def record_figures(self, **figures: Any) -> None:
        """Record figures as a step measures them (names are ``JobFigures`` fields)."""
        self.figures = dataclasses.replace(self.figures, **figures)

    def new_run(self, outcome: Outcome, reason: str, error: CompactionError | None,
                now: datetime) -> NewRun:
        """The runs row of this attempt."""
        request = self.request
        return NewRun(
            session_id=request.session_id, task_id=request.task_id, attempt=request.attempt,
            reason=request.reason, outcome=outcome.value,
            failure_class=type(error).__name__ if error else None,
            failure_message=error.message if error else None,
            figures={**self.figures.as_dict(), "outcome_reason": reason,
                     "durations_ms": dict(self.durations_ms)},
            revision_id=self.revision_id, started_at=self.started_at, finished_at=now,
        )

    def result(self, outcome: Outcome, reason: str, error: CompactionError | None) -> JobResult:
        """The result the ``compaction.job`` event reports."""
        request = self.request
        return JobResult(
            session_id=request.session_id, task_id=request.task_id, attempt=request.attempt,
            trigger=request.reason, outcome=outcome, reason=reason, summarizer=self.summarizer,
            failure_class=type(error).__name__ if error else None,
            failure_message=error.message if error else None,
            retryable=bool(error and error.retryable),
            retry_after_s=getattr(error, "retry_after_s", None),
            revision_id=self.revision_id, parent_revision_id=self.parent_revision_id,
            breaker_state=self.breaker_state, figures=self.figures,
            durations_ms=dict(self.durations_ms),
            duration_ms=round((time.monotonic() - self.started_monotonic) * 1000, 3),
        )
