"""Initial schema: sessions, messages, revisions, runs.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# The column types of db/types.py, spelled out here so this file never changes with them.
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
KEY = sa.String().with_variant(sa.String(collation="C"), "postgresql")
JSON_DOCUMENT = sa.JSON()
JSON_DATA = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
UTC_DATETIME = sa.DateTime(timezone=True)
INSTRUCTION_ROLES = sa.text("role IN ('system', 'developer')")


def upgrade() -> None:
    _create_sessions()
    _create_revisions()
    # sessions and revisions point at each other: the second key comes after both exist.
    with op.batch_alter_table("sessions") as batch:
        batch.create_foreign_key(
            "fk_sessions_active_revision_id_revisions", "revisions",
            ["active_revision_id"], ["id"],
        )
    _create_messages()
    _create_runs()


def downgrade() -> None:
    op.drop_table("runs")
    op.drop_table("messages")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_constraint("fk_sessions_active_revision_id_revisions", type_="foreignkey")
    op.drop_table("revisions")
    op.drop_table("sessions")


def _create_sessions() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", ID, nullable=False),
        sa.Column("session_id", KEY, nullable=False),
        sa.Column("metadata", JSON_DOCUMENT, nullable=False),
        sa.Column("head_seq", sa.Integer(), nullable=False),
        sa.Column("active_revision_id", ID, nullable=True),
        sa.Column("total_tokens", sa.Integer(), nullable=False),
        sa.Column("projection_tokens", sa.Integer(), nullable=False),
        sa.Column("tokens_since_compaction", sa.Integer(), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("last_appended_at", UTC_DATETIME, nullable=True),
        sa.Column("last_compacted_at", UTC_DATETIME, nullable=True),
        sa.Column("lease_owner", sa.String(), nullable=True),
        sa.Column("lease_expires_at", UTC_DATETIME, nullable=True),
        sa.Column("breaker_state", sa.String(), nullable=False),
        sa.Column("breaker_failures", sa.Integer(), nullable=False),
        sa.Column("breaker_opened_at", UTC_DATETIME, nullable=True),
        sa.Column("queued_at", UTC_DATETIME, nullable=True),
        sa.Column("queued_job_id", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_sessions"),
        sa.UniqueConstraint("session_id", name="uq_sessions_session_id"),
        sa.CheckConstraint(
            "breaker_state IN ('closed', 'open', 'half_open')",
            name="ck_sessions_breaker_state",
        ),
    )


def _create_revisions() -> None:
    op.create_table(
        "revisions",
        sa.Column("id", ID, nullable=False),
        sa.Column("session_id", ID, nullable=False),
        sa.Column("parent_revision_id", ID, nullable=True),
        sa.Column("through_seq", sa.Integer(), nullable=False),
        sa.Column("snapshot_head_seq", sa.Integer(), nullable=False),
        sa.Column("summary", JSON_DOCUMENT, nullable=False),
        sa.Column("block", JSON_DOCUMENT, nullable=False),
        sa.Column("block_tokens", sa.Integer(), nullable=False),
        sa.Column("artifacts", JSON_DATA, nullable=False),
        sa.Column("summary_tokens", sa.Integer(), nullable=False),
        sa.Column("span_tokens", sa.Integer(), nullable=False),
        sa.Column("projection_tokens_before", sa.Integer(), nullable=False),
        sa.Column("projection_tokens_after", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(), nullable=True),
        sa.Column("prompt_version", sa.String(), nullable=True),
        sa.Column("summarizer", sa.String(), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_revisions"),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name="fk_revisions_session_id_sessions"
        ),
        sa.ForeignKeyConstraint(
            ["parent_revision_id"], ["revisions.id"],
            name="fk_revisions_parent_revision_id_revisions",
        ),
        sa.CheckConstraint(
            "summarizer IN ('llm', 'extractive', 'fallback')", name="ck_revisions_summarizer"
        ),
        sa.CheckConstraint(
            "through_seq <= snapshot_head_seq", name="ck_revisions_through_within_snapshot"
        ),
    )
    op.create_index("ix_revisions_session_id", "revisions", ["session_id"])


def _create_messages() -> None:
    op.create_table(
        "messages",
        sa.Column("id", ID, nullable=False),
        sa.Column("session_id", ID, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(), nullable=False),
        sa.Column("tool_call_id", sa.String(), nullable=True),
        sa.Column("body", JSON_DOCUMENT, nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_messages"),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name="fk_messages_session_id_sessions"
        ),
        sa.UniqueConstraint("session_id", "seq", name="uq_messages_session_id_seq"),
    )
    op.create_index(
        "ix_messages_instructions", "messages", ["session_id", "seq"],
        postgresql_where=INSTRUCTION_ROLES, sqlite_where=INSTRUCTION_ROLES,
    )


def _create_runs() -> None:
    op.create_table(
        "runs",
        sa.Column("id", ID, nullable=False),
        sa.Column("session_id", KEY, nullable=False),
        sa.Column("task_id", sa.String(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(), nullable=False),
        sa.Column("outcome", sa.String(), nullable=False),
        sa.Column("failure_class", sa.String(), nullable=True),
        sa.Column("failure_message", sa.Text(), nullable=True),
        sa.Column("figures", JSON_DATA, nullable=False),
        sa.Column("revision_id", ID, nullable=True),
        sa.Column("started_at", UTC_DATETIME, nullable=False),
        sa.Column("finished_at", UTC_DATETIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        sa.ForeignKeyConstraint(
            ["revision_id"], ["revisions.id"], name="fk_runs_revision_id_revisions"
        ),
    )
    op.create_index("ix_runs_session_id_started_at", "runs", ["session_id", "started_at"])
    op.create_index("ix_runs_outcome", "runs", ["outcome"])
