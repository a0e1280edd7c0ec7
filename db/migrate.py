"""Schema migrations by URL: upgrade to a revision and report the current one.

The alembic scripts are packaged in ``db/migrations`` (script location ``db:migrations``),
so no ``alembic.ini`` is needed. The application never uses ``create_all``.
"""

from __future__ import annotations

from collections.abc import Callable

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from db.engine import create_db_engine, derive_read_engine
from db.errors import SchemaMissing, translate_errors

__all__ = [
    "SchemaMissing",
    "check_schema",
    "current_revision",
    "downgrade_database",
    "head_revision",
    "upgrade_database",
]

SCRIPT_LOCATION = "db:migrations"
# Serializes concurrent upgrades on PostgreSQL (workers starting together); any
# constant works as long as it is the same for every process.
_PG_MIGRATION_LOCK_KEY = 0x636F6D70  # "comp"


def upgrade_database(url: str, revision: str = "head") -> None:
    """Upgrade the schema at ``url`` to ``revision`` (idempotent; one transaction)."""
    _run(url, lambda config: command.upgrade(config, revision))


def downgrade_database(url: str, revision: str) -> None:
    """Downgrade the schema at ``url`` to ``revision`` (``base`` drops every table)."""
    _run(url, lambda config: command.downgrade(config, revision))


def current_revision(url: str) -> str | None:
    """Return the schema revision at ``url`` (None: never migrated)."""
    engine = create_db_engine(url)
    try:
        return _read_revision(engine)
    finally:
        engine.dispose()


def check_schema(engine: Engine) -> None:
    """Raise SchemaMissing unless the database behind ``engine`` is at the head revision."""
    current, head = _read_revision(engine), head_revision()
    if current != head:
        raise SchemaMissing(
            f"database schema is at revision {current or 'none (never migrated)'}, "
            f"the code needs {head}"
        )


def head_revision() -> str:
    """Return the newest revision the packaged scripts define."""
    head = ScriptDirectory.from_config(_config()).get_current_head()
    if head is None:
        raise RuntimeError(f"no migration scripts found in {SCRIPT_LOCATION}")
    return head


def known_revisions() -> list[str]:
    """The packaged revisions, oldest first (``base``, before the first, not included)."""
    scripts = ScriptDirectory.from_config(_config())
    return [script.revision for script in reversed(list(scripts.walk_revisions()))]


def _read_revision(engine: Engine) -> str | None:
    with translate_errors(), derive_read_engine(engine).connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def _run(url: str, step: Callable[[Config], None]) -> None:
    engine = create_db_engine(url)
    try:
        with translate_errors(), engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                # A migration may rewrite a large table: the service's timeout is not its.
                connection.execute(text("SET LOCAL statement_timeout = 0"))
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK_KEY}
                )
            step(_config(connection))
    finally:
        engine.dispose()


def _config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.attributes["connection"] = connection
    return config
