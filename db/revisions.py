"""Swap and rollback of a session's active revision, inside a write transaction.

Both run under the session's row lock, point the session at a revision and recompute its
token figures in SQL. ``db/store.py`` owns the transaction; these functions never commit.
"""

from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy.orm import Session

from db import queries as q
from db.errors import LeaseLost, RevisionConflict, RevisionNotFound
from db.models import RevisionRow, SessionRow
from db.records import BreakerUpdate, NewRevision, NewRun, RevisionRecord


def swap_in(
    session: Session, session_id: str, *, expected_revision_id: int | None,
    lease_owner: str | None, revision: NewRevision, run: NewRun, now: datetime,
    breaker: BreakerUpdate | None = None,
) -> int:
    """Compare-and-swap the active revision, set the breaker (closed unless ``breaker``
    says otherwise), record the run."""
    row = q.find_session(session, session_id, lock=True)
    _check_lease(row, lease_owner, now)
    if row.active_revision_id != expected_revision_id:
        raise RevisionConflict(
            f"session {session_id!r}: active revision is {row.active_revision_id}, "
            f"expected {expected_revision_id}"
        )
    parent = _active_revision_row(session, row)
    _check_bounds(row, parent, revision)
    figures = q.measure_projection(
        session, row.id, revision.through_seq, revision.snapshot_head_seq, revision.block_tokens
    )
    created = _insert_revision(session, row, parent, revision, figures, now)
    _point_session(row, created.id, figures)
    row.last_compacted_at = now
    breaker = breaker or BreakerUpdate(state="closed", failures=0, opened_at=None)
    row.breaker_state, row.breaker_failures = breaker.state, breaker.failures
    row.breaker_opened_at = breaker.opened_at
    q.insert_run(session, run, revision_id=created.id)
    return created.id


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
        figures = q.measure_projection(session, row.id, 0, 0, 0)
        _point_session(row, None, figures)
        return None
    figures = q.measure_projection(
        session, row.id, target.through_seq, target.snapshot_head_seq, target.block_tokens
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
        session, row.id, target.through_seq, target.snapshot_head_seq, target.block_tokens
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


def load_active_revision(session: Session, row: SessionRow) -> RevisionRecord | None:
    revision = _active_revision_row(session, row)
    return q.to_revision_record(revision, row.session_id) if revision else None


def _active_revision_row(session: Session, row: SessionRow) -> RevisionRow | None:
    if row.active_revision_id is None:
        return None
    return q.find_revision(session, row.active_revision_id)


def _check_lease(row: SessionRow, owner: str | None, now: datetime) -> None:
    if owner is None:
        return
    expires_at = row.lease_expires_at
    if row.lease_owner != owner or expires_at is None or expires_at <= now:
        raise LeaseLost(
            f"session {row.session_id!r}: lease is held by {row.lease_owner!r} until "
            f"{expires_at}, not by {owner!r}"
        )


def _check_bounds(row: SessionRow, parent: RevisionRow | None, revision: NewRevision) -> None:
    """Refuse a revision that would un-summarize its parent's span or see the future."""
    floor_seq = parent.through_seq if parent else 0
    if not floor_seq <= revision.through_seq <= revision.snapshot_head_seq <= row.head_seq:
        raise ValueError(
            f"session {row.session_id!r}: need parent through_seq {floor_seq} <= through_seq "
            f"{revision.through_seq} <= snapshot_head_seq {revision.snapshot_head_seq} <= "
            f"head_seq {row.head_seq}"
        )


def _insert_revision(
    session: Session, row: SessionRow, parent: RevisionRow | None, revision: NewRevision,
    figures: q.ProjectionFigures, now: datetime,
) -> RevisionRow:
    created = RevisionRow(
        session_id=row.id, parent_revision_id=parent.id if parent else None,
        through_seq=revision.through_seq, snapshot_head_seq=revision.snapshot_head_seq,
        summary=revision.summary, block=revision.block, block_tokens=revision.block_tokens,
        artifacts=json.loads(revision.artifacts_json), summary_tokens=revision.summary_tokens,
        span_tokens=revision.span_tokens,
        projection_tokens_before=revision.projection_tokens_before,
        projection_tokens_after=figures.projection_tokens,
        model=revision.model, prompt_version=revision.prompt_version,
        summarizer=revision.summarizer, created_at=now,
    )
    session.add(created)
    session.flush()
    return created


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
