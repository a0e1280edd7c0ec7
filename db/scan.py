"""The due-session scan's SQL: which sessions may be enqueued, read in keyset pages.

Two tiers, each a range scan of its own index (migration 0002), so a scan reads the due
candidates and never every session: first sessions whose projection is over the trigger
(largest projection first), then "dirty" sessions under it, compacted before, whose tokens
appended since the last compaction exceed the dirty threshold (most appended first). A
session never compacted is due only over the trigger. ``scheduler.selection.due_why`` is
the same rule in Python; ``tests/integration/test_due_rule.py`` checks the two agree.

``count_exclusions`` explains a scan: why each session it would not enqueue is left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Select,
    and_,
    case,
    func,
    not_,
    or_,
    select,
    tuple_,
)
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
            SessionRow.last_compacted_at.is_not(None),
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


# The count of sessions no exclusion applies to, in ``count_exclusions``.
ELIGIBLE = "eligible"


class Exclusion(StrEnum):
    """Why a scan leaves a session out, checked in this order (the first one counts)."""

    UNDER_TRIGGER = "under_trigger"  # neither over the trigger nor dirty
    QUIET_PERIOD = "quiet_period"  # appended to within quiet_period_s
    LEASED = "leased"  # a job holds its lease
    BREAKER_OPEN = "breaker_open"  # its breaker is open and still cooling down
    ALREADY_QUEUED = "already_queued"  # a queued-job marker younger than marker_ttl_s


def is_due_by_size(criteria: DueCriteria) -> ColumnElement[bool]:
    """SQL condition: over the trigger, or dirty (compacted before and grown since)."""
    return or_(
        SessionRow.projection_tokens > criteria.trigger_tokens,
        and_(SessionRow.last_compacted_at.is_not(None),
             SessionRow.tokens_since_compaction > criteria.dirty_tokens),
    )


def is_eligible(criteria: DueCriteria, now: datetime) -> list[ColumnElement[bool]]:
    """SQL conditions of a session the scan may enqueue, whatever its size: quiet,
    unleased, admitted by its breaker, and without a fresh queued-job marker."""
    return list(_eligibility(criteria, now).values())


def _eligibility(criteria: DueCriteria, now: datetime) -> dict[Exclusion, ColumnElement[bool]]:
    quiet_before = now - timedelta(seconds=criteria.quiet_period_s)
    return {
        Exclusion.QUIET_PERIOD: or_(SessionRow.last_appended_at.is_(None),
                                    SessionRow.last_appended_at <= quiet_before),
        Exclusion.LEASED: or_(SessionRow.lease_expires_at.is_(None),
                              SessionRow.lease_expires_at <= now),
        Exclusion.BREAKER_OPEN: is_admitted_by_breaker(now, criteria.breaker_cooldown_s),
        Exclusion.ALREADY_QUEUED: is_marker_free(now, criteria.marker_ttl_s),
    }


def count_exclusions(session: Session, criteria: DueCriteria, now: datetime) -> dict[str, int]:
    """Count every session by the first reason the scan leaves it out (``eligible``: none).

    One aggregate over all sessions (a full read, unlike the scan's index ranges): what
    ``compactor scan --dry-run`` shows to explain an empty or short list.
    """
    passes = {Exclusion.UNDER_TRIGGER: is_due_by_size(criteria), **_eligibility(criteria, now)}
    reason = case(*((not_(condition), exclusion.value) for exclusion, condition in passes.items()),
                  else_=ELIGIBLE).label("reason")
    classified = select(reason).select_from(SessionRow).subquery()
    counted = select(classified.c.reason, func.count()).group_by(classified.c.reason)
    return {str(row[0]): int(row[1]) for row in session.execute(counted)}


def is_admitted_by_breaker(now: datetime, cooldown_s: float) -> ColumnElement[bool]:
    """SQL condition: the session's breaker would admit a job at ``now``
    (:func:`breaker_admits` on the sessions table)."""
    return breaker_admits(SessionRow, now - timedelta(seconds=cooldown_s))


def breaker_admits(session: Any, cooldown_start: datetime | BindParameter[Any]
                   ) -> ColumnElement[bool]:
    """SQL condition: the breaker of ``session`` (the mapped sessions, or the columns of a
    CTE of their rows) admits a job whose clock less the cooldown is ``cooldown_start``.

    The SQL form of ``worker.compaction.breaker.admit`` (db/ may not import worker/):
    closed admits; open or half-open (a trial is out) admits once the cooldown has
    passed since ``opened_at``, or when no opening time is known.
    ``tests/integration/test_breaker_rule.py`` checks the two agree on both databases.
    """
    return or_(
        session.breaker_state == "closed",
        session.breaker_opened_at.is_(None),
        session.breaker_opened_at <= cooldown_start,
    )
