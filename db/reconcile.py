"""The reconciler's reads: sessions that hold a queued-job marker or a lease (or a dead
lease alone, for the quick sweep), and which of them the scan would take were their
marker free.

The marker and the Redis message are two records of one job; the reconciler
(``scheduler/reconcile.py``) compares them and repairs a session whose job is gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from db.models import SessionRow
from db.scan import DueCriteria, DueWhy, is_admitted_by_breaker


@dataclass(frozen=True, slots=True)
class HeldSession:
    """A session with a queued-job marker, a lease, or both."""

    session_id: str
    queued_job_id: str | None
    queued_at: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None


def read_held_sessions(session: Session, *, queued_before: datetime,
                       limit: int) -> list[HeldSession]:
    """Sessions whose marker was set before ``queued_before``, or that hold a lease."""
    rows = session.execute(
        select(SessionRow.session_id, SessionRow.queued_job_id, SessionRow.queued_at,
               SessionRow.lease_owner, SessionRow.lease_expires_at)
        .where(or_(and_(SessionRow.queued_job_id.is_not(None),
                        SessionRow.queued_at <= queued_before),
                   SessionRow.lease_owner.is_not(None)))
        .order_by(SessionRow.id)
        .limit(limit)
    )
    return [HeldSession(*row) for row in rows]


def read_dead_leases(session: Session, *, now: datetime, limit: int) -> list[HeldSession]:
    """Sessions whose lease is past its expiry: its job's worker died, or stalled."""
    rows = session.execute(
        select(SessionRow.session_id, SessionRow.queued_job_id, SessionRow.queued_at,
               SessionRow.lease_owner, SessionRow.lease_expires_at)
        .where(SessionRow.lease_owner.is_not(None), SessionRow.lease_expires_at <= now)
        .order_by(SessionRow.id)
        .limit(limit)
    )
    return [HeldSession(*row) for row in rows]


def read_due_among(session: Session, session_ids: Sequence[str], criteria: DueCriteria,
                   now: datetime) -> dict[str, tuple[DueWhy, int]]:
    """Of ``session_ids``, those a scan would find due, ignoring their marker and lease:
    {session_id: (tier, projection tokens)}."""
    quiet_before = now - timedelta(seconds=criteria.quiet_period_s)
    over = SessionRow.projection_tokens > criteria.trigger_tokens
    dirty = SessionRow.tokens_since_compaction > criteria.dirty_tokens
    rows = session.execute(
        select(SessionRow.session_id, over.label("over"), SessionRow.projection_tokens)
        .where(SessionRow.session_id.in_(list(session_ids)), or_(over, dirty),
               or_(SessionRow.last_appended_at.is_(None),
                   SessionRow.last_appended_at <= quiet_before),
               is_admitted_by_breaker(now, criteria.breaker_cooldown_s))
    )
    return {row.session_id: (DueWhy.OVER_TRIGGER if row.over else DueWhy.DIRTY,
                             int(row.projection_tokens)) for row in rows}
