"""The values a job carries: its request, policy, dependencies, running context and
result. Kept apart from ``pipeline.py`` so the pipeline reads as the steps alone."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from db import NewRun, Store
from worker.compaction.plan import TriggerPolicy
from worker.compaction.strategies import StrategyConfig
from worker.compaction.tokens import TokenCounter
from worker.errors import CompactionError, Outcome
from worker.summarizers import Summarizer, SummaryDraft


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


class ProviderBreakerPort(Protocol):
    """The provider-wide breaker as the pipeline sees it."""

    def admit(self) -> bool: ...
    def record_success(self) -> None: ...
    def record_failure(self) -> None: ...


@dataclass(frozen=True)
class JobDeps:
    """What a job talks to; the real ones are built per worker process in runtime.py."""

    store: Store
    summarizer: Summarizer
    fallback: Summarizer
    counter: TokenCounter
    provider_breaker: ProviderBreakerPort
    clock: Callable[[], datetime]
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")


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
    figures: dict[str, Any]
    durations_ms: dict[str, float]
    duration_ms: float
    run_recorded: bool = True
    record_error: str | None = None


@dataclass
class JobContext:
    """Mutable state of one running job: figures and step timings as they accrue."""

    request: JobRequest
    deps: JobDeps
    started_at: datetime
    started_monotonic: float
    figures: dict[str, Any] = field(default_factory=dict)
    durations_ms: dict[str, float] = field(default_factory=dict)
    summarizer_kind: str | None = None
    model: str | None = None
    prompt_version: str | None = None
    fallback_reason: str | None = None
    revision_id: int | None = None
    parent_revision_id: int | None = None
    breaker_state: str | None = None
    error: CompactionError | None = None

    @classmethod
    def start(cls, request: JobRequest, deps: JobDeps) -> JobContext:
        return cls(request=request, deps=deps, started_at=deps.clock(),
                   started_monotonic=time.monotonic())

    @property
    def owner(self) -> str:
        """The lease owner: unique per worker process and task."""
        return f"{self.deps.worker_id}:{self.request.task_id}"

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self.durations_ms[name] = round((time.monotonic() - began) * 1000, 3)

    def record_draft(self, draft: SummaryDraft) -> None:
        self.figures.update(draft.figures)
        self.summarizer_kind, self.model = draft.kind, draft.model
        self.prompt_version = draft.prompt_version

    def new_run(self, outcome: Outcome, now: datetime, *, reason: str | None = None) -> NewRun:
        return NewRun(
            session_id=self.request.session_id,
            task_id=self.request.task_id,
            attempt=self.request.attempt,
            reason=self.request.reason,
            outcome=outcome.value,
            failure_class=type(self.error).__name__ if self.error else None,
            failure_message=self.error.message if self.error else None,
            figures={**self.figures, "outcome_reason": reason or self.figures.get("decision"),
                     "durations_ms": self.durations_ms},
            revision_id=self.revision_id,
            started_at=self.started_at,
            finished_at=now,
        )

    def result(self, outcome: Outcome, *, reason: str) -> JobResult:
        error = self.error
        return JobResult(
            session_id=self.request.session_id,
            task_id=self.request.task_id,
            attempt=self.request.attempt,
            trigger=self.request.reason,
            outcome=outcome,
            reason=reason,
            summarizer=self.summarizer_kind,
            failure_class=type(error).__name__ if error else None,
            failure_message=error.message if error else None,
            retryable=bool(error and error.retryable),
            retry_after_s=getattr(error, "retry_after_s", None),
            revision_id=self.revision_id,
            parent_revision_id=self.parent_revision_id,
            breaker_state=self.breaker_state,
            figures=dict(self.figures),
            durations_ms=dict(self.durations_ms),
            duration_ms=round((time.monotonic() - self.started_monotonic) * 1000, 3),
        )
