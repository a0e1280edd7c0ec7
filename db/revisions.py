"""Rollback and roll-forward of a session's active revision, inside a write transaction.

Both run under the session's row lock, point the session at a revision and recompute its
token figures in SQL. ``db/store.py`` owns the transaction; these functions never commit.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from db import queries as q
from db.errors import RevisionNotFound
from db.models import RevisionRow, SessionRow
from db.records import RevisionRecord


def roll_back(
    session: Session, session_id: str, to_revision_id: int | None
) -> RevisionRecord | None:
    """Point the session at the active revision's parent, or at its ancestor
    ``to_revision_id``; return the new active revision."""
    row = q.find_session(session, session_id, lock=True)
    active = _active_revision_row(session, row)
    if active is None:
        raise RevisionNotFound(f"session {session_id!r} has no active revision")
    target = _find_ancestor(session, active, to_revision_id)
    if target is None:
        figures = q.measure_projection(session, row, 0, 0, 0)
        _point_session(row, None, figures)
        return None
    figures = q.measure_projection(
        session, row, target.through_seq, target.snapshot_head_seq, target.block_tokens
    )
    _point_session(row, target.id, figures)
    return q.to_revision_record(target, session_id)


def roll_forward(session: Session, session_id: str, to_revision_id: int) -> RevisionRecord:
    """Point the session at ``to_revision_id``, a later revision descending from the
    active one (any of its revisions when none is active); return it."""
    row = q.find_session(session, session_id, lock=True)
    target = q.find_revision(session, to_revision_id)
    if target.session_id != row.id:
        raise RevisionNotFound(f"session {session_id!r} has no revision {to_revision_id}")
    if row.active_revision_id is not None and row.active_revision_id not in _ancestor_ids(
            session, target):
        raise RevisionNotFound(f"revision {to_revision_id} is not a later revision of the "
                               f"active revision {row.active_revision_id}")
    figures = q.measure_projection(
        session, row, target.through_seq, target.snapshot_head_seq, target.block_tokens
    )
    _point_session(row, target.id, figures)
    return q.to_revision_record(target, session_id)


def _ancestor_ids(session: Session, revision: RevisionRow) -> set[int]:
    ancestors: set[int] = set()
    parent_id = revision.parent_revision_id
    while parent_id is not None and parent_id not in ancestors:
        ancestors.add(parent_id)
        parent_id = q.find_revision(session, parent_id).parent_revision_id
    return ancestors


def _active_revision_row(session: Session, row: SessionRow) -> RevisionRow | None:
    if row.active_revision_id is None:
        return None
    return q.find_revision(session, row.active_revision_id)


def _point_session(
    row: SessionRow, revision_id: int | None, figures: q.ProjectionFigures
) -> None:
    row.active_revision_id = revision_id
    row.projection_tokens = figures.projection_tokens
    row.tokens_since_compaction = figures.unsummarized_tokens


def _find_ancestor(
    session: Session, active: RevisionRow, revision_id: int | None
) -> RevisionRow | None:
    """Return the parent of ``active`` (None: no summary), or its ancestor ``revision_id``."""
    if revision_id is None:
        parent_id = active.parent_revision_id
        return q.find_revision(session, parent_id) if parent_id is not None else None
    ancestor_id = active.parent_revision_id
    while ancestor_id is not None:
        ancestor = q.find_revision(session, ancestor_id)
        if ancestor.id == revision_id:
            return ancestor
        ancestor_id = ancestor.parent_revision_id
    raise RevisionNotFound(
        f"revision {revision_id} is not an ancestor of the active revision {active.id}"
    )
