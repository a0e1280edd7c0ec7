"""Each tool result's outcome classified once at ingest, stored with its message.

``messages.outcomes`` holds, as JSON text, the outcome of every tool result the message
holds, ``[call_id, status, lines]`` each in the order of its results (a chat ``tool``
message and a Responses output item hold one, an Anthropic user message one per
``tool_result`` block, any other message none: ``[]``). NULL means not classified: the
messages stored before this revision, until ``compactor db backfill`` classifies them (the
worker classifies; a migration cannot); a job classifies those from their text. Text,
not JSONB: a job reads it as the text it stores, and nothing queries inside it.
Adding a nullable column without a default rewrites no rows, on PostgreSQL or SQLite.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE messages ADD COLUMN outcomes TEXT")


def downgrade() -> None:
    op.execute("ALTER TABLE messages DROP COLUMN outcomes")
