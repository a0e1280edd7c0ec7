"""Queued-job markers on session rows: at most one queued job per session.

The marker (``queued_at``, ``queued_job_id``) is set by a conditional UPDATE *before* the
job message is published, and cleared when the job ends. That UPDATE is the
de-duplication guard: of two enqueuers racing for one session exactly one changes the
row. A marker older than its TTL stands for a lost message and may be replaced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import ColumnElement, Connection, String, cast, literal, or_, select, update

from db.models import SessionRow

# Bound parameters per statement stay far below SQLite's limit (32,766).
_IDS_PER_STATEMENT = 1_000


class MarkStatus(StrEnum):
    """What an attempt to mark a session as queued found (values are what users see)."""

    ENQUEUED = "enqueued"  # the marker is now this attempt's job
    ALREADY_QUEUED = "already_queued"  # a fresh marker names another job
    UNKNOWN_SESSION = "unknown_session"


@dataclass(frozen=True, slots=True)
class MarkResult:
    """One session's attempt; ``job_id`` is the job the marker holds (None if unknown)."""

    session_id: str
    status: MarkStatus
    job_id: str | None


class QueueMarkers:
    """Marker writes inside one transaction of the store (``Store.queue_markers``); none
    of them guards anything until that transaction commits."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def mark(self, session_id: str, job_id: str, *, now: datetime,
             marker_ttl_s: float) -> MarkResult:
        """Set the session's marker to ``job_id`` unless a fresh marker exists.

        On PostgreSQL a racing UPDATE waits for the row lock and re-checks the
        condition, so exactly one of two concurrent callers gets ENQUEUED.
        """
        marked = self._connection.execute(
            update(SessionRow)
            .where(SessionRow.session_id == session_id, is_marker_free(now, marker_ttl_s))
            .values(queued_at=now, queued_job_id=job_id)
            .returning(SessionRow.id)
        ).first()
        if marked is not None:
            return MarkResult(session_id, MarkStatus.ENQUEUED, job_id)
        existing = self._connection.execute(
            select(SessionRow.queued_job_id).where(SessionRow.session_id == session_id)
        ).first()
        if existing is None:
            return MarkResult(session_id, MarkStatus.UNKNOWN_SESSION, None)
        return MarkResult(session_id, MarkStatus.ALREADY_QUEUED, existing.queued_job_id)

    def mark_many(self, session_ids: Sequence[str], job_id_prefix: str, *, now: datetime,
                  marker_ttl_s: float) -> dict[str, str]:
        """Mark each session that has no fresh marker; return {session_id: job_id} of
        those marked. A marked session's job id is ``job_id_prefix`` + its row id, so one
        prefix per scan makes every job id unique.

        The bulk form of :meth:`mark` (one UPDATE per chunk of ids): the guard is the
        same conditional UPDATE.
        """
        marked: dict[str, str] = {}
        job_id = literal(job_id_prefix, String) + cast(SessionRow.id, String)
        for start in range(0, len(session_ids), _IDS_PER_STATEMENT):
            chunk = session_ids[start:start + _IDS_PER_STATEMENT]
            rows = self._connection.execute(
                update(SessionRow)
                .where(SessionRow.session_id.in_(chunk), is_marker_free(now, marker_ttl_s))
                .values(queued_at=now, queued_job_id=job_id)
                .returning(SessionRow.session_id, SessionRow.queued_job_id)
            )
            marked.update((session_id, str(job)) for session_id, job in rows)
        return marked

    def replace(self, session_id: str, stale_job_id: str, job_id: str, *,
                now: datetime) -> bool:
        """Point the marker at ``job_id`` if it still names ``stale_job_id`` (a job the
        broker lost); return whether it did. Of two replacers, one wins."""
        replaced = self._connection.execute(
            update(SessionRow)
            .where(SessionRow.session_id == session_id,
                   SessionRow.queued_job_id == stale_job_id)
            .values(queued_at=now, queued_job_id=job_id)
            .returning(SessionRow.id)
        ).first()
        return replaced is not None

    def clear(self, session_id: str, job_id: str) -> bool:
        """Clear the session's marker if it still names ``job_id``; return whether it did.

        A job that ends clears only its own marker, never a newer one that replaced it.
        """
        cleared = self._connection.execute(
            update(SessionRow)
            .where(SessionRow.session_id == session_id, SessionRow.queued_job_id == job_id)
            .values(queued_at=None, queued_job_id=None)
            .returning(SessionRow.id)
        ).first()
        return cleared is not None


def is_marker_free(now: datetime, marker_ttl_s: float) -> ColumnElement[bool]:
    """SQL condition: the session has no queued-job marker younger than ``marker_ttl_s``."""
    stale_before = now - timedelta(seconds=marker_ttl_s)
    return or_(SessionRow.queued_at.is_(None), SessionRow.queued_at <= stale_before)
