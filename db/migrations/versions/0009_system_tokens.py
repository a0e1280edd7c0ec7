"""The tokens of a session's system prompt kept outside its messages.

An Anthropic record keeps its system prompt in ``system`` (with the metadata), not in a
message; ``sessions.system_tokens`` holds its count, which the session's totals, the
scan's trigger, the job's plan and every swap and rollback add, as they count a chat
session's system message. Existing sessions get 0 (the database cannot count tokens)
until ``compactor db backfill`` counts their prompts.
Adding a column with a constant default rewrites no rows on PostgreSQL 11 and later, nor
on SQLite.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE sessions ADD COLUMN system_tokens INTEGER NOT NULL DEFAULT 0")


def downgrade() -> None:
    op.execute("ALTER TABLE sessions DROP COLUMN system_tokens")
