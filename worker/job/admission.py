"""What the breakers let a job do: the session's breaker (closed, a half-open trial, or
open: skip or commit the deterministic summary) and the provider's (open: fall back from
the LLM, which is not the session's fault)."""

from __future__ import annotations

from dataclasses import dataclass

from db import (
    BreakerUpdate,
    SessionState,
)
from worker.compaction import (
    Breaker,
    BreakerState,
    admit,
)
from worker.errors import (
    BreakerOpen,
    Outcome,
    ProviderBreakerOpen,
)
from worker.job.values import JobDeps, JobPolicy, JobTrace
from worker.summarizers import Summarizer


@dataclass(frozen=True)
class Admitted:
    """What the breakers let this job do: the summarizer, and the outcome of a commit."""

    summarizer: Summarizer
    outcome: Outcome  # compacted; fallback (provider breaker open); breaker_open
    open_breaker: Breaker | None  # the session's, when a fallback commit must keep it open


def admit_job(trace: JobTrace, deps: JobDeps, policy: JobPolicy,
           session: SessionState, *, breaker_refused: bool) -> Admitted:
    """Pick the summarizer the session's breaker allows; raise when the job must not run
    (``breaker_refused``: the snapshot was read without messages, the breaker refusing
    at the lease's instant, even if its cooldown has ended since)."""
    with trace.step("breaker"):
        breaker = trace.breaker = session_breaker(session)
        trace.breaker_state = breaker.state.value
        admission = admit(breaker, deps.clock(), policy.breaker_cooldown_s)
        if breaker_refused or not admission.allowed:
            # A refused snapshot holds no message: no fallback runs on it (and the skip rule
            # refuses only under the skip policy).
            if breaker_refused or not policy.fallback_when_open:
                raise BreakerOpen("the session's breaker is open", reason="breaker_open")
            return Admitted(deps.fallback, Outcome.BREAKER_OPEN, breaker)
        if admission.breaker != breaker:  # the trial after the cooldown: record half-open
            deps.store.set_breaker(trace.request.session_id, breaker_update(admission.breaker))
            trace.breaker = admission.breaker
            trace.breaker_state = admission.breaker.state.value
        return Admitted(deps.summarizer, Outcome.COMPACTED, None)


def admit_provider(deps: JobDeps, policy: JobPolicy) -> Admitted:
    """Fall back from a provider whose breaker is open (it is not the session's fault)."""
    summarizer = deps.summarizer
    if summarizer.uses_provider and not deps.provider_breaker.admit():
        if not policy.fallback_when_open:
            raise ProviderBreakerOpen("the provider breaker is open",
                                      reason="provider_breaker_open",
                                      retry_after_s=deps.provider_breaker.reopens_in_s())
        return Admitted(deps.fallback, Outcome.FALLBACK, None)
    return Admitted(summarizer, Outcome.COMPACTED, None)


def session_breaker(session: SessionState) -> Breaker:
    return Breaker(state=BreakerState(session.breaker_state), failures=session.breaker_failures,
                   opened_at=session.breaker_opened_at)


def breaker_update(breaker: Breaker) -> BreakerUpdate:
    return BreakerUpdate(state=breaker.state.value, failures=breaker.failures,
                         opened_at=breaker.opened_at)
