"""Identifiers computed once at ingest, a per-session artifact index, and recall.

``messages`` gains ``identifiers`` (the message's mentions, ``[value, kind, source,
count]``) and ``search_text`` (what recall searches); both are NULL for messages stored
before this revision until ``compactor db backfill`` fills them (the worker computes
them; a migration cannot). ``artifacts`` holds one
row per identifier of a session. Recall's text index: a trigram GIN index on PostgreSQL
(pg_trgm), an external-content FTS5 table with the trigram tokenizer on SQLite, kept in
step with ``messages`` by triggers.

Revision ID: 0003
Revises: 0002
Create Date: 2025-01-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON_DATA = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

SQLITE_SEARCH = (
    "CREATE VIRTUAL TABLE message_search USING fts5(search_text, content='messages', "
    "content_rowid='id', tokenize='trigram')",
    "CREATE TRIGGER message_search_insert AFTER INSERT ON messages BEGIN "
    "INSERT INTO message_search(rowid, search_text) VALUES (new.id, new.search_text); END",
    "CREATE TRIGGER message_search_delete AFTER DELETE ON messages BEGIN "
    "INSERT INTO message_search(message_search, rowid, search_text) "
    "VALUES ('delete', old.id, old.search_text); END",
    "CREATE TRIGGER message_search_update AFTER UPDATE OF search_text ON messages BEGIN "
    "INSERT INTO message_search(message_search, rowid, search_text) "
    "VALUES ('delete', old.id, old.search_text); "
    "INSERT INTO message_search(rowid, search_text) VALUES (new.id, new.search_text); END",
)


def upgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("identifiers", JSON_DATA, nullable=True))
        batch.add_column(sa.Column("search_text", sa.Text(), nullable=True))
    op.create_table(
        "artifacts",
        sa.Column("id", ID, nullable=False),
        sa.Column("session_id", ID, nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("first_seq", sa.Integer(), nullable=False),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("sources", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_artifacts"),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name="fk_artifacts_session_id_sessions"
        ),
        sa.UniqueConstraint("session_id", "value", name="uq_artifacts_session_id_value"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        op.execute("CREATE INDEX ix_messages_search_text_trgm ON messages "
                   "USING gin (search_text gin_trgm_ops)")
    else:
        for statement in SQLITE_SEARCH:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX ix_messages_search_text_trgm")
    else:
        for trigger in ("insert", "delete", "update"):
            op.execute(f"DROP TRIGGER message_search_{trigger}")
        op.execute("DROP TABLE message_search")
    op.drop_table("artifacts")
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("search_text")
        batch.drop_column("identifiers")
