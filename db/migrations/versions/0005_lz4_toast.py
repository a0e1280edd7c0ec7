"""PostgreSQL: the large columns compressed with lz4, where the server has it.

A swap writes the summary, its block and the span's identifiers (~100 KB of JSON at a
100k-token session) and a snapshot reads every message body; values over ~2 KB are
compressed, by default with pglz. lz4 compresses and decompresses several times faster:
the swap statement of a 100k-token job took 2.2 ms on the server with pglz, 0.85 with
lz4, and its lease and snapshot statement 1.9 against 1.6 (docs/BENCHMARKS.md).

Only the values written from then on use lz4 (nothing is rewritten; the old ones stay
readable as they are). Each ALTER holds its table's ACCESS EXCLUSIVE lock for an instant,
and waits for it at most ``db.migrate``'s lock timeout (behind a long transaction the
upgrade gives way and tries again). Skipped on SQLite, on PostgreSQL before 14, and
on a server built without lz4 (``--with-lz4``), which keeps pglz.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

import logging

from alembic import op
from sqlalchemy import text

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# The columns whose values can exceed the ~2 KB at which PostgreSQL compresses.
LARGE_COLUMNS = (
    ("messages", "body"),
    ("messages", "identifiers"),
    ("messages", "search_text"),
    ("revisions", "summary"),
    ("revisions", "block"),
    ("revisions", "artifacts"),
)
# pg_settings lists lz4 among this setting's values only where the server was built with it.
LZ4_AVAILABLE = text("SELECT 'lz4' = ANY(enumvals) FROM pg_settings "
                     "WHERE name = 'default_toast_compression'")


def _set_compression(method: str) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    if not bind.execute(LZ4_AVAILABLE).scalar():
        logging.getLogger("alembic.runtime.migration").warning(
            "lz4 is not available on this PostgreSQL server (14 or later, built with "
            "--with-lz4): large values stay compressed with pglz")
        return
    for table, column in LARGE_COLUMNS:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION {method}")


def upgrade() -> None:
    _set_compression("lz4")


def downgrade() -> None:
    _set_compression("default")
