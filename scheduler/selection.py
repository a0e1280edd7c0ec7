"""Which sessions a scan takes, in order of gain, within its job cap and token budget.

The due sessions themselves come from the store (``Store.iter_due_sessions``: keyset
pages of two indexed tiers, the SQL in ``db/scan.py``); this module holds the policy
around them: the summarizer tokens each would cost, and the cap and budget of one scan.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from db import DueCriteria, DueRow, DueWhy, Exclusion, Store

# A dirty session left out because it holds no more than the verbatim tail.
TAIL_ONLY = "tail_only"


class StopReason(StrEnum):
    """Why a scan stopped taking sessions."""

    EXHAUSTED = "exhausted"  # every due session was taken
    MAX_JOBS = "max_jobs"
    TOKEN_BUDGET = "token_budget"


@dataclass(frozen=True, slots=True)
class ScanPolicy:
    """The plain values a scan needs; built from settings by the entrypoints."""

    trigger_tokens: int
    dirty_ratio: float
    tail_budget_tokens: int
    quiet_period_s: float
    breaker_cooldown_s: float
    marker_ttl_s: float
    batch_size: int
    max_jobs: int
    token_budget: int | None = None

    def __post_init__(self) -> None:
        if self.trigger_tokens <= 0 or self.dirty_ratio <= 0:
            raise ValueError("trigger_tokens and dirty_ratio must be positive")
        if self.batch_size <= 0 or self.max_jobs <= 0:
            raise ValueError("batch_size and max_jobs must be positive")
        if self.token_budget is not None and self.token_budget <= 0:
            raise ValueError("token_budget must be positive when set")

    @property
    def dirty_tokens(self) -> int:
        """Tokens appended since the last compaction above which a session is dirty."""
        return int(self.trigger_tokens * self.dirty_ratio)

    @property
    def criteria(self) -> DueCriteria:
        """The thresholds the store's scan filters by."""
        return DueCriteria(
            trigger_tokens=self.trigger_tokens, dirty_tokens=self.dirty_tokens,
            quiet_period_s=self.quiet_period_s, breaker_cooldown_s=self.breaker_cooldown_s,
            marker_ttl_s=self.marker_ttl_s,
        )


@dataclass(frozen=True, slots=True)
class DueSession:
    """A session the scan would compact, and the summarizer tokens that would cost."""

    session_id: str
    projection_tokens: int
    tokens_since_compaction: int
    why: DueWhy
    estimated_tokens: int


@dataclass
class Allowance:
    """What is left of one scan's job cap and token budget (mutable, per scan)."""

    max_jobs: int
    token_budget: int | None
    jobs: int = 0
    tokens: int = 0

    @classmethod
    def of(cls, policy: ScanPolicy, limit: int | None = None) -> Allowance:
        cap = policy.max_jobs if limit is None else min(policy.max_jobs, limit)
        return cls(max_jobs=cap, token_budget=policy.token_budget)

    def refusal(self, due: DueSession) -> StopReason | None:
        """Why ``due`` may not be taken, or None when it may.

        The budget is spent in gain order: the first session that does not fit ends
        the scan, so a smaller session never jumps ahead of a bigger one.
        """
        if self.jobs >= self.max_jobs:
            return StopReason.MAX_JOBS
        if self.token_budget is not None and self.tokens + due.estimated_tokens > self.token_budget:
            return StopReason.TOKEN_BUDGET
        return None

    def spend(self, due: DueSession) -> None:
        self.jobs += 1
        self.tokens += due.estimated_tokens

    def refund(self, due: DueSession) -> None:
        """Give back what ``due`` took (its job was not enqueued after all)."""
        self.jobs -= 1
        self.tokens -= due.estimated_tokens

    def take(self, candidates: list[DueSession]) -> tuple[list[DueSession], StopReason | None]:
        """Spend on the longest prefix of ``candidates`` that fits; return it and why the
        next one does not (None: all fit)."""
        for index, due in enumerate(candidates):
            refusal = self.refusal(due)
            if refusal is not None:
                return candidates[:index], refusal
            self.spend(due)
        return candidates, None


def estimate_summarizer_tokens(projection_tokens: int, tail_budget_tokens: int) -> int:
    """Tokens the summarizer would read: the projection less the verbatim tail."""
    return max(0, projection_tokens - tail_budget_tokens)


def due_why(projection_tokens: int, tokens_since_compaction: int, *, compacted: bool,
            policy: ScanPolicy) -> DueWhy | None:
    """Whether a session's size makes it due, and in which tier (None: it is not).

    The Python form of the scan's SQL (``db/scan.py``, ``is_due_by_size``): over the
    trigger, or "dirty": compacted before and grown by more than ``dirty_tokens`` since.
    A session never compacted is due only over the trigger.
    ``tests/integration/test_due_rule.py`` checks the two agree on both databases.
    """
    if projection_tokens > policy.trigger_tokens:
        return DueWhy.OVER_TRIGGER
    if compacted and tokens_since_compaction > policy.dirty_tokens:
        return DueWhy.DIRTY
    return None


def iter_due_sessions(store: Store, policy: ScanPolicy, now: datetime) -> Iterator[DueSession]:
    """Yield every due session once, most to gain first (see ``Store.iter_due_sessions``)."""
    for row in store.iter_due_sessions(policy.criteria, now, page_size=policy.batch_size):
        due = _due_session(row, policy)
        if _holds_more_than_tail(due):
            yield due


@dataclass(frozen=True, slots=True)
class ScanPreview:
    """What a scan at one instant would take, why it would stop, and why it would leave
    every other session out: reason -> sessions (a ``db.Exclusion``, ``tail_only``, or
    the stop reason for due sessions beyond the job cap or token budget)."""

    sessions: list[DueSession]
    stopped: StopReason
    left_out: dict[str, int]


def preview_scan(store: Store, policy: ScanPolicy, now: datetime, *,
                 limit: int | None = None) -> ScanPreview:
    """What ``compactor scan --dry-run`` shows: the sessions one scan would take within its
    cap and budget, why it would stop, and what it leaves out, by reason (one more read,
    over every session)."""
    counts = store.count_scan_exclusions(policy.criteria, now)
    taken, stopped, passed_over = _take_due(store, policy, now, limit)
    left_out = {reason.value: counts.get(reason.value, 0) for reason in Exclusion}
    left_out.update(passed_over)
    return ScanPreview(taken, stopped,
                       {reason: count for reason, count in left_out.items() if count})


def _take_due(store: Store, policy: ScanPolicy, now: datetime, limit: int | None
              ) -> tuple[list[DueSession], StopReason, Counter[str]]:
    """Walk every due session in gain order: those a scan takes, why it stops, and the
    due sessions it passes over (``tail_only``, or the stop reason for those after it)."""
    allowance = Allowance.of(policy, limit)
    taken: list[DueSession] = []
    stopped: StopReason | None = None
    passed_over: Counter[str] = Counter()
    for row in store.iter_due_sessions(policy.criteria, now, page_size=policy.batch_size):
        due = _due_session(row, policy)
        if not _holds_more_than_tail(due):
            passed_over[TAIL_ONLY] += 1
            continue
        if stopped is None:
            stopped = allowance.take([due])[1]
        if stopped is None:
            taken.append(due)
        else:  # the scan ends at the first session that does not fit
            passed_over[stopped.value] += 1
    return taken, stopped or StopReason.EXHAUSTED, passed_over


def _holds_more_than_tail(due: DueSession) -> bool:
    # A dirty session's job is forced, so it must hold more than the verbatim tail.
    # Checked here: in SQL the planner may take it for an index range.
    return due.why is DueWhy.OVER_TRIGGER or due.estimated_tokens > 0


def _due_session(row: DueRow, policy: ScanPolicy) -> DueSession:
    return DueSession(
        session_id=row.session_id,
        projection_tokens=row.projection_tokens,
        tokens_since_compaction=row.tokens_since_compaction,
        why=row.why,
        estimated_tokens=estimate_summarizer_tokens(row.projection_tokens,
                                                    policy.tail_budget_tokens),
    )
