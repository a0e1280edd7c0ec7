"""Indexes of the due-session scan: one per tier of ``scheduler/selection.py``.

Over-trigger sessions are read by a backward range scan of (projection_tokens, id) and
dirty ones of (tokens_since_compaction, id); the keyset cursor is a row-value condition on
the same pair, so every page starts where the last one ended and no page reads the
sessions below the thresholds. The price: appends update both columns, so they also
update these two indexes.

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# Names follow db/models.py's naming convention (ix_<table>_<columns>).
SCAN_INDEXES = {
    "ix_sessions_projection_tokens_id": ["projection_tokens", "id"],
    "ix_sessions_tokens_since_compaction_id": ["tokens_since_compaction", "id"],
}


def upgrade() -> None:
    for name, columns in SCAN_INDEXES.items():
        op.create_index(name, "sessions", columns)


def downgrade() -> None:
    for name in SCAN_INDEXES:
        op.drop_index(name, table_name="sessions")
