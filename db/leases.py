"""The conditional UPDATEs of one session row's lease and breaker columns.

Statements only: ``db/store.py`` runs each in its own transaction and tells a session
that did not match apart from one that does not exist.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Update, update

from db.models import BREAKER_STATES, SessionRow
from db.records import BreakerUpdate


def renew_lease(session_id: str, owner: str, ttl_s: float, now: datetime) -> Update:
    """Extend the lease to ``now + ttl_s`` only while ``owner`` still holds it: a
    heartbeat never takes a lease back that its job's last transaction released."""
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be positive, got {ttl_s}")
    return (
        update(SessionRow)
        .where(SessionRow.session_id == session_id, SessionRow.lease_owner == owner)
        .values(lease_expires_at=now + timedelta(seconds=ttl_s))
    )


def release_lease(session_id: str, owner: str) -> Update:
    """Release the lease if ``owner`` holds it."""
    return (
        update(SessionRow)
        .where(SessionRow.session_id == session_id, SessionRow.lease_owner == owner)
        .values(lease_owner=None, lease_expires_at=None)
    )


def set_breaker(session_id: str, breaker: BreakerUpdate) -> Update:
    """Persist the breaker's fields; ValueError for a state the table would refuse."""
    check_breaker(breaker)
    return (
        update(SessionRow)
        .where(SessionRow.session_id == session_id)
        .values(
            breaker_state=breaker.state,
            breaker_failures=breaker.failures,
            breaker_opened_at=breaker.opened_at,
        )
    )


def check_breaker(breaker: BreakerUpdate) -> None:
    """ValueError for a breaker state the table would refuse."""
    if breaker.state not in BREAKER_STATES or breaker.failures < 0:
        raise ValueError(f"invalid breaker update {breaker!r}")
