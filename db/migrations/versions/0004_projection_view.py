"""The ``session_projection`` view: what a model is sent, readable from any language.

One row per projected message: ``session_id`` (the external id), ``position`` (1-based
order within the session) and ``message`` (the chat message as JSON, exactly as the Python
API returns it). The rule is ``Store.projection``'s (``db/projection.py``,
``select_projection``): instruction messages the active revision covers, its block, then
every later message; without a revision, every message. A filter on ``session_id`` is
pushed below the window on both databases, and each arm is an index range (the tail by
``(session_id, seq)``, the covered instructions by ``ix_messages_instructions``), so
reading one session reads only the rows it returns.

Revision ID: 0004
Revises: 0002
Create Date: 2025-01-03
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Spelled out here, not built from db/projection.py, so this file never changes with it;
# tests/integration/test_projection_view.py holds the two equal.
CREATE_VIEW = """
CREATE VIEW session_projection AS
SELECT
    parts.session_id,
    row_number() OVER (PARTITION BY parts.session_id ORDER BY parts.seq, parts.part)
        AS position,
    parts.message
FROM (
    SELECT s.session_id, m.seq, 0 AS part, m.body AS message
    FROM sessions AS s
    LEFT JOIN revisions AS r ON r.id = s.active_revision_id
    JOIN messages AS m ON m.session_id = s.id AND m.seq > COALESCE(r.through_seq, 0)
    UNION ALL
    SELECT s.session_id, m.seq, 0, m.body
    FROM sessions AS s
    JOIN revisions AS r ON r.id = s.active_revision_id
    JOIN messages AS m ON m.session_id = s.id AND m.seq <= r.through_seq
        AND m.role IN ('system', 'developer')
    UNION ALL
    SELECT s.session_id, r.through_seq, 1, r.block
    FROM sessions AS s
    JOIN revisions AS r ON r.id = s.active_revision_id
) AS parts
"""


def upgrade() -> None:
    op.execute(CREATE_VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW session_projection")
