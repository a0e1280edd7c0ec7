"""Jobs parked on the Batch API: the row a job leaves when its summarizer requests went
to a batch, and the poller's reads and writes of it (``db/store_batches.py`` holds the
transactions). A session has one at most; erasing the session erases it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, distinct, func, select
from sqlalchemy.orm import Session

from db import queries as q
from db.models import PARK_STATES, ParkedJobRow, SessionRow


@dataclass(frozen=True, slots=True)
class ParkedJob:
    """A parked job: the active revision and head its snapshot read, its requests for the
    batch to come (``state`` open) or in ``batch_id`` (submitted), and every answer its
    batches gave, by request key (the provider's output or error line, as given)."""

    session_id: str
    revision_id: int | None
    head_seq: int
    state: str
    requests: list[dict[str, Any]]
    batch_id: str | None
    answers: dict[str, Any]
    parked_at: datetime


def write_park(session: Session, park: ParkedJob) -> None:
    """Put ``park`` in place of the session's parked job, if it had one."""
    row = q.find_session(session, park.session_id)
    session.execute(delete(ParkedJobRow).where(ParkedJobRow.session_id == row.id))
    session.add(ParkedJobRow(session_id=row.id, revision_id=park.revision_id,
                             head_seq=park.head_seq, state=park.state,
                             requests=park.requests, batch_id=park.batch_id,
                             answers=park.answers, parked_at=park.parked_at))


def drop_park(session: Session, session_id: str) -> bool:
    """Erase the session's parked job; whether it had one."""
    pk = select(SessionRow.id).where(SessionRow.session_id == session_id).scalar_subquery()
    deleted = session.execute(delete(ParkedJobRow).where(ParkedJobRow.session_id == pk)
                              .returning(ParkedJobRow.id))
    return deleted.first() is not None


def read_parks(session: Session, *, session_id: str | None = None, state: str | None = None,
               batch_id: str | None = None, limit: int | None = None) -> list[ParkedJob]:
    """The parked jobs matching every filter given, oldest first."""
    statement = (select(ParkedJobRow, SessionRow.session_id)
                 .join(SessionRow, SessionRow.id == ParkedJobRow.session_id)
                 .order_by(ParkedJobRow.id).limit(limit))
    if session_id is not None:
        statement = statement.where(SessionRow.session_id == session_id)
    if state is not None:
        statement = statement.where(ParkedJobRow.state == state)
    if batch_id is not None:
        statement = statement.where(ParkedJobRow.batch_id == batch_id)
    return [_park(row, external) for row, external in session.execute(statement)]


def mark_submitted(session: Session, session_ids: Sequence[str], batch_id: str) -> None:
    """Record that the open requests of these sessions' parked jobs went into ``batch_id``."""
    for row in _rows(session, session_ids):
        row.state, row.batch_id = "submitted", batch_id


def add_answers(session: Session, answers: dict[str, dict[str, Any]]) -> None:
    """Add each session's answers (by request key) to its parked job, now answered."""
    for row in _rows(session, list(answers)):
        external = session.get_one(SessionRow, row.session_id).session_id
        row.answers = {**row.answers, **answers[external]}
        row.state = "answered"


def count_parks(session: Session) -> tuple[dict[str, int], int]:
    """Parked jobs per state, and the distinct batches the submitted ones wait on."""
    by_state: dict[str, int] = {
        state: count for state, count in session.execute(
            select(ParkedJobRow.state, func.count()).group_by(ParkedJobRow.state))}
    batches = session.execute(select(func.count(distinct(ParkedJobRow.batch_id)))
                              .where(ParkedJobRow.state == "submitted")).scalar_one()
    return {state: by_state.get(state, 0) for state in PARK_STATES}, int(batches)


def _rows(session: Session, session_ids: Sequence[str]) -> list[ParkedJobRow]:
    statement = (select(ParkedJobRow)
                 .join(SessionRow, SessionRow.id == ParkedJobRow.session_id)
                 .where(SessionRow.session_id.in_(session_ids)).with_for_update())
    return list(session.scalars(statement))


def _park(row: ParkedJobRow, session_id: str) -> ParkedJob:
    return ParkedJob(session_id, row.revision_id, row.head_seq, row.state, row.requests,
                     row.batch_id, row.answers, row.parked_at)
