"""One job's world in memory, for the unit suite: the fake store, a movable clock, the
real provider breaker on in-memory state, the real extractive fallback, and a scripted
provider-backed summarizer. Sessions are generated (``tests/support/generated.py``) and
imported through the real intake; no service is needed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from db import JobSnapshot
from tests.support.fake_store import FakeStore
from tests.support.generated import generated_session
from worker.compaction.intake import IntakePolicy
from worker.compaction.plan import TriggerPolicy
from worker.compaction.schema import Summary
from worker.compaction.tokens import TokenCounter
from worker.job import pipeline
from worker.job.values import JobDeps, JobPolicy, JobRequest, JobResult
from worker.platform.ingest import ImportStatus, import_sessions
from worker.shared_state.provider_breaker import InMemoryBreakerState, ProviderBreaker
from worker.summarizers import ExtractiveSummarizer, SummaryDraft, SummaryUsage, SummaryWork

COOLDOWN_S = 600
LEASE_TTL_S = 30
BREAKER_THRESHOLD = 3
PROVIDER_THRESHOLD = 2
# A generated exchange is about 150 tokens: 16 of them put a session over the trigger.
POLICY = JobPolicy(
    trigger=TriggerPolicy(trigger_tokens=2_000, floor_tokens=1_000, tail_budget_tokens=400,
                          min_tail_user_turns=1),
    summary_budget_tokens=800, audit_mode=False, span_strategy=None, lease_ttl_s=LEASE_TTL_S,
    breaker_threshold=BREAKER_THRESHOLD, breaker_cooldown_s=COOLDOWN_S, fallback_when_open=False,
)


class FakeClock:
    """The job's clock, moved by the test (cooldowns and lease expiry without sleeping)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class ScriptedSummarizer:
    """An LLM-like summarizer (it uses the provider): the extractive summary of the span,
    a scripted draft, or a scripted error; ``before`` runs first, as a competitor would."""

    kind = "llm"
    uses_provider = True

    def __init__(self, counter: TokenCounter) -> None:
        self._inner = ExtractiveSummarizer(counter)
        self.seen: list[SummaryWork] = []
        self.error: Exception | None = None
        self.summary: Summary | None = None
        self.before: Callable[[], None] | None = None

    def summarize(self, work: SummaryWork) -> SummaryDraft:
        self.seen.append(work)
        if self.before is not None:
            self.before()
        if self.error is not None:
            raise self.error
        summary = self.summary or self._inner.summarize(work).summary
        return SummaryDraft(summary, kind=self.kind, model="scripted", prompt_version="test",
                            usage=SummaryUsage(llm_calls=1, prompt_tokens=work.span_tokens,
                                               completion_tokens=50, chunks=1))


@dataclass
class JobHarness:
    """The fake store and the job's dependencies as a worker process wires them."""

    counter: TokenCounter
    policy: JobPolicy = POLICY
    store: FakeStore = field(default_factory=FakeStore)
    clock: FakeClock = field(default_factory=FakeClock)
    jobs: int = 0

    def __post_init__(self) -> None:
        self.summarizer = ScriptedSummarizer(self.counter)
        self.provider_state = InMemoryBreakerState()
        self.provider = ProviderBreaker(self.provider_state, threshold=PROVIDER_THRESHOLD,
                                        cooldown_s=COOLDOWN_S, trial_s=COOLDOWN_S,
                                        clock=self.clock)
        self.deps = JobDeps(store=self.store, summarizer=self.summarizer,
                            fallback=ExtractiveSummarizer(self.counter, kind="fallback"),
                            counter=self.counter, provider_breaker=self.provider,
                            clock=self.clock, worker_id="host:1")

    def with_policy(self, **changes: Any) -> JobHarness:
        self.policy = dataclasses.replace(self.policy, **changes)
        return self

    def run(self, session_id: str, *, force: bool = False, task_id: str | None = None,
            redelivered: bool = False, attempt: int = 1) -> JobResult:
        self.jobs += 1
        request = JobRequest(session_id, "test", force, task_id=task_id or f"task-{self.jobs}",
                             attempt=attempt, redelivered=redelivered)
        return pipeline.run(request, self.deps, self.policy)

    def record_snapshots(self, *, then_advance_s: float = 0) -> list[JobSnapshot[Any] | None]:
        """The snapshots this harness's jobs take with their lease, from now on; after
        each, the clock moves on ``then_advance_s``."""
        taken: list[JobSnapshot[Any] | None] = []
        take = self.store.start_job_with_snapshot

        def recording(*args: Any, **kwargs: Any) -> JobSnapshot[Any] | None:
            taken.append(take(*args, **kwargs))
            self.clock.advance(then_advance_s)
            return taken[-1]

        self.store.start_job_with_snapshot = recording  # type: ignore[method-assign]
        return taken

    def add_session(self, session_id: str, turns: int) -> str:
        """Import a generated session of ``turns`` exchanges through the real intake."""
        [report] = import_sessions([generated_session(session_id, turns)], store=self.store,
                                   counter=self.counter, policy=IntakePolicy(), now=self.clock())
        assert report.status is ImportStatus.IMPORTED, report
        return session_id

    def state(self, session_id: str) -> tuple[Any, ...]:
        """Everything a job that failed must leave alone: history, revisions, projection."""
        return (self.store.messages(session_id), self.store.revisions(session_id),
                self.store.projection(session_id),
                self.store.get_session(session_id).active_revision_id)
