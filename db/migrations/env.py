"""Alembic environment: runs on the connection that ``db.migrate`` hands over.

Batch mode is on, so an ALTER that SQLite cannot do in place is done by rebuilding the
table; on PostgreSQL batch operations are plain ALTERs.
"""

from __future__ import annotations

from alembic import context

from db.models import Base


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:
        raise RuntimeError(
            "run migrations through db.migrate.upgrade_database (or `compactor migrate`), "
            "which passes the connection in"
        )
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("offline (--sql) migrations are not supported; run them online")
run_migrations_online()
