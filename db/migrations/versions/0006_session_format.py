"""Each session's wire format: ``chat``, ``responses`` or ``anthropic``.

Fixed when the session is created (import, create or first append) and never changed:
its messages' bodies are items of that format, and a record of another format is
refused. Existing sessions are chat sessions (the column's default). Adding a column
with a constant default rewrites no rows on PostgreSQL 11 and later, nor on SQLite.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Spelled out here, not built from db/models.py, so this file never changes with it. A
# column constraint, so one statement serves both databases and SQLite can drop the
# column again without rebuilding the table (which the projection view refers to).
ADD_COLUMN = (
    "ALTER TABLE sessions ADD COLUMN format VARCHAR NOT NULL DEFAULT 'chat' "
    "CONSTRAINT ck_sessions_format CHECK (format IN ('chat', 'responses', 'anthropic'))"
)


def upgrade() -> None:
    op.execute(ADD_COLUMN)


def downgrade() -> None:
    op.execute("ALTER TABLE sessions DROP COLUMN format")
