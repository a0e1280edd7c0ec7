"""The due-session scan's SQL: which sessions may be enqueued, read in keyset pages.

Two tiers, each a range scan of its own index (migration 0002), so a scan reads the due
candidates and never every session: first sessions whose projection is over the trigger
(largest projection first), then "dirty" sessions under it whose tokens appended since
the last compaction exceed the dirty threshold (most appended first).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, Select, or_, select, tuple_
from sqlalchemy.orm import Session

from db.models import SessionRow
from db.queue import is_marker_free


class DueWhy(StrEnum):
    """Why a session is due: its tier (also the ``reason`` of the job the scan sends)."""

    OVER_TRIGGER = "over_trigger"
    DIRTY = "dirty"


@dataclass(frozen=True, slots=True)
class DueCriteria:
    """The thresholds of a due session, as plain values (the scheduler's policy)."""

    trigger_tokens: int
    dirty_tokens: int
    quiet_period_s: float
    breaker_cooldown_s: float
    marker_ttl_s: float


@dataclass(frozen=True, slots=True)
class DueCursor:
    """Where a tier's next page starts: after this (order key, row id)."""

    order_key: int
    row_id: int


@dataclass(frozen=True, slots=True)
class DueRow:
    """A session of a page, with the figures the scheduler ranks and budgets by."""

    session_id: str
    projection_tokens: int
    tokens_since_compaction: int
    why: DueWhy


@dataclass(frozen=True, slots=True)
class DuePage:
    """One page of a tier; ``next_after`` is None on the tier's last page."""

    sessions: list[DueRow]
    next_after: DueCursor | None


# Each tier's ordering column; migration 0002 indexes (column, id) for both.
_ORDER_KEYS: dict[DueWhy, Any] = {
    DueWhy.OVER_TRIGGER: SessionRow.projection_tokens,
    DueWhy.DIRTY: SessionRow.tokens_since_compaction,
}


def read_due_page(
    session: Session, why: DueWhy, criteria: DueCriteria, now: datetime, *, limit: int,
    after: DueCursor | None = None,
) -> DuePage:
    """Read one page of ``why``'s tier in the caller's transaction."""
    rows = list(session.execute(due_page_query(why, criteria, now, limit=limit, after=after)))
    sessions = [DueRow(row.session_id, row.projection_tokens, row.tokens_since_compaction, why)
                for row in rows]
    last = DueCursor(rows[-1].order_key, rows[-1].id) if len(rows) == limit else None
    return DuePage(sessions, last)


def due_page_query(
    why: DueWhy, criteria: DueCriteria, now: datetime, *, limit: int,
    after: DueCursor | None = None,
) -> Select[Any]:
    """The SQL of one page of a tier, after the keyset cursor ``after``."""
    key = _ORDER_KEYS[why]
    if why is DueWhy.OVER_TRIGGER:
        size = [SessionRow.projection_tokens > criteria.trigger_tokens]
    else:
        size = [
            SessionRow.tokens_since_compaction > criteria.dirty_tokens,
            SessionRow.projection_tokens <= criteria.trigger_tokens,
        ]
    statement = (
        select(
            SessionRow.id,
            SessionRow.session_id,
            SessionRow.projection_tokens,
            SessionRow.tokens_since_compaction,
            key.label("order_key"),
        )
        .where(*size, *is_eligible(criteria, now))
        .order_by(key.desc(), SessionRow.id.desc())
        .limit(limit)
    )
    if after is not None:
        # A row-value comparison is one index range condition on (key, id).
        statement = statement.where(
            tuple_(key, SessionRow.id) < tuple_(after.order_key, after.row_id)
        )
    return statement


def is_eligible(criteria: DueCriteria, now: datetime) -> list[ColumnElement[bool]]:
    """SQL conditions of a session the scan may enqueue, whatever its size: quiet,
    unleased, admitted by its breaker, and without a fresh queued-job marker."""
    quiet_before = now - timedelta(seconds=criteria.quiet_period_s)
    return [
        or_(SessionRow.last_appended_at.is_(None), SessionRow.last_appended_at <= quiet_before),
        or_(SessionRow.lease_expires_at.is_(None), SessionRow.lease_expires_at <= now),
        is_admitted_by_breaker(now, criteria.breaker_cooldown_s),
        is_marker_free(now, criteria.marker_ttl_s),
    ]


def is_admitted_by_breaker(now: datetime, cooldown_s: float) -> ColumnElement[bool]:
    """SQL condition: the session's breaker would admit a job at ``now``.

    The SQL form of ``worker.compaction.breaker.admit`` (db/ may not import worker/):
    closed admits; open or half-open (a trial is out) admits once ``cooldown_s`` has
    passed since ``opened_at``, or when no opening time is known.
    ``tests/integration/test_breaker_rule.py`` checks the two agree on both databases.
    """
    cooled_before = now - timedelta(seconds=cooldown_s)
    return or_(
        SessionRow.breaker_state == "closed",
        SessionRow.breaker_opened_at.is_(None),
        SessionRow.breaker_opened_at <= cooled_before,
    )
