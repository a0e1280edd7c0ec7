"""The night's bill as the store knows it: every run started in a window with its figures,
and for a run that made a revision, the session's model requests (its assistant messages)
appended since its previous compaction (the parent revision, else the session's start).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, Select, and_, func, select
from sqlalchemy.orm import Session, aliased

from db import queries as q
from db.models import MessageRow, RevisionRow, RunRow, SessionRow
from db.records import RunRecord

_made = aliased(RevisionRow, name="made")
_parent = aliased(RevisionRow, name="parent")


@dataclass(frozen=True, slots=True)
class CostedRun:
    """A run, and for one that made a revision the session's requests since the one
    before (``requests_since_previous`` over ``previous_at`` to ``compacted_at``)."""

    run: RunRecord
    compacted_at: datetime | None = None
    previous_at: datetime | None = None
    requests_since_previous: int | None = None


def select_costed_runs(since: datetime, until: datetime | None
                       ) -> Select[RunRow, datetime, datetime, int]:
    """Runs started in [since, until), oldest first, each with its revision's times and the
    session's assistant messages appended between its previous compaction and it."""
    previous_at = func.coalesce(_parent.created_at, SessionRow.created_at)
    requests = (select(func.count()).select_from(MessageRow)
                .where(MessageRow.session_id == SessionRow.id, MessageRow.role == "assistant",
                       MessageRow.created_at >= previous_at,
                       MessageRow.created_at <= _made.created_at)
                .scalar_subquery())
    window: list[ColumnElement[bool]] = [RunRow.started_at >= since]
    if until is not None:
        window.append(RunRow.started_at < until)
    return (select(RunRow, _made.created_at, previous_at, requests)
            .outerjoin(_made, _made.id == RunRow.revision_id)
            .outerjoin(_parent, _parent.id == _made.parent_revision_id)
            .outerjoin(SessionRow, SessionRow.id == _made.session_id)
            .where(and_(*window))
            .order_by(RunRow.started_at, RunRow.id))


def read_costed_runs(session: Session, since: datetime, until: datetime | None
                     ) -> list[CostedRun]:
    """Run ``select_costed_runs`` and decode its rows."""
    costed = []
    for run, compacted_at, previous_at, requests in session.execute(
            select_costed_runs(since, until)):
        made = compacted_at is not None
        costed.append(CostedRun(q.to_run_record(run), compacted_at,
                                previous_at if made else None, requests if made else None))
    return costed
