"""The platform's read of the compacted view: the projection in one statement.
``db/migrations/versions/0004_projection_view.py`` states the projection
rule again as a view; ``tests/integration/test_projection_view.py`` holds the two equal.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Text, and_, cast, func, literal, select, union_all
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.orm import Session

from db.errors import SessionNotFound
from db.models import INSTRUCTION_ROLES, MessageRow, RevisionRow, SessionRow


def select_projection(session: Session, session_id: str) -> list[dict[str, Any]]:
    """Return the session's projection from one statement (SessionNotFound when unknown).

    The same rule as migration 0004's ``session_projection`` view, ordered by (seq,
    part): the block (part 1) lands after the instructions it covers and before the
    tail. The block arm is an outer join, so a known session always yields a row (a NULL
    block without a revision). The messages come back aggregated into one JSON array:
    decoding one value instead of a thousand rows is most of a read's time.
    """
    # Two arms, each an index range: the tail by (session_id, seq), the covered
    # instructions by the partial index of instructions, however long the history.
    tail = (
        select(MessageRow.seq.label("seq"), literal(0).label("part"),
               MessageRow.body.label("body"))
        .select_from(SessionRow)
        .outerjoin(RevisionRow, RevisionRow.id == SessionRow.active_revision_id)
        .join(MessageRow, and_(MessageRow.session_id == SessionRow.id,
                               MessageRow.seq > func.coalesce(RevisionRow.through_seq, 0)))
        .where(SessionRow.session_id == session_id)
    )
    covered = (
        select(MessageRow.seq, literal(0), MessageRow.body)
        .select_from(SessionRow)
        .join(RevisionRow, RevisionRow.id == SessionRow.active_revision_id)
        .join(MessageRow, and_(MessageRow.session_id == SessionRow.id,
                               MessageRow.seq <= RevisionRow.through_seq,
                               MessageRow.role.in_(INSTRUCTION_ROLES)))
        .where(SessionRow.session_id == session_id)
    )
    block = (
        select(func.coalesce(RevisionRow.through_seq, 0), literal(1), RevisionRow.block)
        .select_from(SessionRow)
        .outerjoin(RevisionRow, RevisionRow.id == SessionRow.active_revision_id)
        .where(SessionRow.session_id == session_id)
    )
    parts = union_all(tail, covered, block).subquery()
    if session.get_bind().dialect.name == "postgresql":
        count, items = session.execute(select(func.count(), cast(func.json_agg(
            aggregate_order_by(parts.c.body, parts.c.seq, parts.c.part)), Text))).one()
        bodies = json.loads(items) if count else []
    else:
        # SQLite 3.40 has no ORDER BY inside an aggregate: each item carries its key.
        count, items = session.execute(select(func.count(), func.json_group_array(
            func.json_array(parts.c.seq, parts.c.part, func.json(parts.c.body))))).one()
        ordered = sorted(json.loads(items), key=lambda item: (item[0], item[1]))
        bodies = [body for _, _, body in ordered]
    if not count:
        raise SessionNotFound(f"no session {session_id!r}")
    return [body for body in bodies if body is not None]
