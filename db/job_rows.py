"""What a job's statements share: the tables, the constants written into their text, and
the decoding of a session row and of its active revision's labelled columns.

``db/job_lease.py``, ``db/job_snapshot.py`` and ``db/job_swap.py`` build the statements.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnClause, Connection, Row, Table, literal_column, select

from db.errors import SessionNotFound
from db.models import INSTRUCTION_ROLES, MessageRow, RevisionRow, RunRow, SessionRow
from db.records import RevisionRecord, SessionState

SESSIONS: Table = SessionRow.__table__  # type: ignore[assignment]
REVISIONS: Table = RevisionRow.__table__  # type: ignore[assignment]
MESSAGES: Table = MessageRow.__table__  # type: ignore[assignment]
RUNS: Table = RunRow.__table__  # type: ignore[assignment]
SESSION_COLUMNS = tuple(SESSIONS.c)
# The active revision's columns in the snapshot's join, prefixed apart from the session's;
# a short prefix keeps the snapshot's statements within psycopg's cache (see ``ZERO``).
REVISION_PREFIX = "r_"
REVISION_LABELS = tuple(column.label(f"{REVISION_PREFIX}{column.name}")
                        for column in REVISIONS.c)
# Constants written into the statements' text, not bound: psycopg caches its conversion of
# a statement's placeholders only for a text of at most 4,096 characters and 50
# parameters (``psycopg._queries``), and re-parses a longer one on every execution.
ZERO: ColumnClause[Any] = literal_column("0")
IS_INSTRUCTION = MESSAGES.c.role.in_(
    [literal_column(f"'{role}'") for role in INSTRUCTION_ROLES])


def to_session_state(row: Row[Any]) -> SessionState:
    """The session's record from a Core row of its table's columns."""
    return session_state_of(row._mapping)


def session_state_of(m: Mapping[Any, Any]) -> SessionState:
    """The session's record from its table's columns by name."""
    return SessionState(
        session_id=m["session_id"], metadata=m["metadata"], session_format=m["format"],
        head_seq=m["head_seq"],
        active_revision_id=m["active_revision_id"], system_tokens=m["system_tokens"],
        total_tokens=m["total_tokens"],
        projection_tokens=m["projection_tokens"],
        tokens_since_compaction=m["tokens_since_compaction"], created_at=m["created_at"],
        last_appended_at=m["last_appended_at"], last_compacted_at=m["last_compacted_at"],
        lease_owner=m["lease_owner"], lease_expires_at=m["lease_expires_at"],
        breaker_state=m["breaker_state"], breaker_failures=m["breaker_failures"],
        breaker_opened_at=m["breaker_opened_at"], queued_at=m["queued_at"],
        queued_job_id=m["queued_job_id"],
    )


def revision_of(session_id: str, mapping: Mapping[Any, Any]) -> RevisionRecord | None:
    """The active revision from its ``REVISION_LABELS`` columns; None when it has none."""
    if mapping[f"{REVISION_PREFIX}id"] is None:
        return None
    return RevisionRecord(
        session_id=session_id,
        **{c.name: mapping[f"{REVISION_PREFIX}{c.name}"] for c in REVISIONS.c
           if c.name != "session_id"},
    )


def check_exists(connection: Connection, session_id: str) -> None:
    """SessionNotFound unless the session exists."""
    found = connection.execute(
        select(SESSIONS.c.id).where(SESSIONS.c.session_id == session_id)).first()
    if found is None:
        raise SessionNotFound(f"no session {session_id!r}")
