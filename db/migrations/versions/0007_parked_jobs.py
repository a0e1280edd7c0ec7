"""Jobs parked on the Batch API (``COMPACTOR_LLM_MODE=batch``): one row per session at
most, what its snapshot read (active revision, head), the requests for the batch to
come, the batch they went into and the answers batches gave so far. A new table: no
existing row is touched.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# The column types of db/types.py, spelled out here so this file never changes with them.
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON_DATA = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
UTC_DATETIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "parked_jobs",
        sa.Column("id", ID, nullable=False),
        sa.Column("session_id", ID, nullable=False),
        sa.Column("revision_id", ID, nullable=True),
        sa.Column("head_seq", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("requests", JSON_DATA, nullable=False),
        sa.Column("batch_id", sa.String(), nullable=True),
        sa.Column("answers", JSON_DATA, nullable=False),
        sa.Column("parked_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_parked_jobs"),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"],
                                name="fk_parked_jobs_session_id_sessions"),
        sa.UniqueConstraint("session_id", name="uq_parked_jobs_session_id"),
        sa.CheckConstraint("state IN ('open', 'submitted', 'answered')",
                           name="ck_parked_jobs_state"),
    )
    op.create_index("ix_parked_jobs_state", "parked_jobs", ["state"])
    op.create_index("ix_parked_jobs_batch_id", "parked_jobs", ["batch_id"])


def downgrade() -> None:
    op.drop_table("parked_jobs")
