"""Partial indexes of the sessions that hold a lease or a queue marker.

The reconciler's quick sweep (dead leases, every few seconds) and its full sweep
(leases and old queue markers) read only such sessions, a handful among millions;
without these indexes each sweep read the whole sessions table. Both index ``id`` (the
sweeps' order) where the column is set, so they hold only the few held rows and a
session that takes or frees a lease or marker enters or leaves them.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# Names and predicates as db/models.py declares them.
HELD_INDEXES = {
    "ix_sessions_leased": "lease_owner IS NOT NULL",
    "ix_sessions_queued": "queued_job_id IS NOT NULL",
}


def upgrade() -> None:
    for name, predicate in HELD_INDEXES.items():
        op.create_index(name, "sessions", ["id"], postgresql_where=sa.text(predicate),
                        sqlite_where=sa.text(predicate))


def downgrade() -> None:
    for name in HELD_INDEXES:
        op.drop_index(name, table_name="sessions")
