"""Which sessions are due for compaction, in order of gain, read in keyset pages.

Two tiers, each a range scan of its own index (migration 0002), so a scan reads the due
candidates and never every session: first sessions whose projection is over the trigger
(largest projection first), then "dirty" sessions under it whose tokens appended since
the last compaction exceed ``dirty_ratio`` x trigger (most appended first).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, Select, or_, select, tuple_

from db.engine import derive_read_engine
from db.models import SessionRow
from db.queue import is_marker_free


class DueWhy(StrEnum):
    """Why a session is due (also the ``reason`` of the job the scan sends)."""

    OVER_TRIGGER = "over_trigger"
    DIRTY = "dirty"


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


# Each tier's ordering column; migration 0002 indexes (column, id) for both.
_ORDER_KEYS: dict[DueWhy, Any] = {
    DueWhy.OVER_TRIGGER: SessionRow.projection_tokens,
    DueWhy.DIRTY: SessionRow.tokens_since_compaction,
}


def iter_due_sessions(
    bind: Engine | Connection, policy: ScanPolicy, now: datetime
) -> Iterator[DueSession]:
    """Yield every due session once, most to gain first, one page per query.

    Each page is its own short read, so a long scan holds no snapshot open. A session
    whose figures change between pages may be skipped or seen twice; the enqueue guard
    makes a second sighting harmless and the next scan picks up a skipped one.
    """
    for why in DueWhy:
        cursor: tuple[int, int] | None = None
        while True:
            rows = _read_page(bind, due_page_query(why, policy, now, cursor))
            for row in rows:
                due = _due_session(row, why, policy)
                # A dirty session's job is forced, so it must hold more than the verbatim
                # tail. Checked here: in SQL the planner may take it for an index range.
                if why is DueWhy.OVER_TRIGGER or due.estimated_tokens > 0:
                    yield due
            if len(rows) < policy.batch_size:
                break
            cursor = (rows[-1].order_key, rows[-1].id)


def select_due_sessions(
    bind: Engine | Connection, policy: ScanPolicy, now: datetime, *, limit: int | None = None
) -> tuple[list[DueSession], StopReason]:
    """Return the sessions one scan would take within its cap and budget, and why it
    would stop (what ``compactor scan --dry-run`` shows)."""
    allowance = Allowance.of(policy, limit)
    taken: list[DueSession] = []
    for due in iter_due_sessions(bind, policy, now):
        accepted, refusal = allowance.take([due])
        if refusal is not None:
            return taken, refusal
        taken.extend(accepted)
    return taken, StopReason.EXHAUSTED


def is_eligible(policy: ScanPolicy, now: datetime) -> list[ColumnElement[bool]]:
    """SQL conditions of a session the scan may enqueue, whatever its size: quiet,
    unleased, admitted by its breaker, and without a fresh queued-job marker."""
    quiet_before = now - timedelta(seconds=policy.quiet_period_s)
    cooled_before = now - timedelta(seconds=policy.breaker_cooldown_s)
    return [
        or_(SessionRow.last_appended_at.is_(None), SessionRow.last_appended_at <= quiet_before),
        or_(SessionRow.lease_expires_at.is_(None), SessionRow.lease_expires_at <= now),
        # Mirrors the worker's admission: an open or half-open breaker (a trial is out)
        # admits a job only once its cooldown has passed.
        or_(
            SessionRow.breaker_state == "closed",
            SessionRow.breaker_opened_at.is_(None),
            SessionRow.breaker_opened_at <= cooled_before,
        ),
        is_marker_free(now, policy.marker_ttl_s),
    ]


def due_page_query(
    why: DueWhy, policy: ScanPolicy, now: datetime, after: tuple[int, int] | None = None
) -> Select[Any]:
    """The SQL of one page of a tier, after the keyset cursor ``(order key, id)``."""
    key = _ORDER_KEYS[why]
    if why is DueWhy.OVER_TRIGGER:
        size = [SessionRow.projection_tokens > policy.trigger_tokens]
    else:
        size = [
            SessionRow.tokens_since_compaction > policy.dirty_tokens,
            SessionRow.projection_tokens <= policy.trigger_tokens,
        ]
    statement = (
        select(
            SessionRow.id,
            SessionRow.session_id,
            SessionRow.projection_tokens,
            SessionRow.tokens_since_compaction,
            key.label("order_key"),
        )
        .where(*size, *is_eligible(policy, now))
        .order_by(key.desc(), SessionRow.id.desc())
        .limit(policy.batch_size)
    )
    if after is not None:
        # A row-value comparison is one index range condition on (key, id).
        statement = statement.where(tuple_(key, SessionRow.id) < tuple_(*after))
    return statement


def _read_page(bind: Engine | Connection, statement: Select[Any]) -> list[Any]:
    if isinstance(bind, Engine):
        # The read view: on SQLite a plain connection would take the write lock.
        with derive_read_engine(bind).connect() as conn:
            return list(conn.execute(statement))
    return list(bind.execute(statement))


def _due_session(row: Any, why: DueWhy, policy: ScanPolicy) -> DueSession:
    return DueSession(
        session_id=row.session_id,
        projection_tokens=row.projection_tokens,
        tokens_since_compaction=row.tokens_since_compaction,
        why=why,
        estimated_tokens=estimate_summarizer_tokens(row.projection_tokens,
                                                    policy.tail_budget_tokens),
    )
