"""Schema migrations by URL: upgrade to a revision and report the current one.

The alembic scripts are packaged in ``db/migrations`` (script location ``db:migrations``),
so no ``alembic.ini`` is needed. The application never uses ``create_all``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

from db.engine import create_db_engine, derive_read_engine
from db.errors import SchemaLockTimeout, SchemaMissing, translate_errors

__all__ = [
    "LOCK_ATTEMPTS",
    "LOCK_TIMEOUT_S",
    "SchemaLockTimeout",
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
# An ALTER waiting for its table's lock holds up every statement on that table queued
# after it (the platform's appends, the jobs' snapshots): on PostgreSQL a migration waits
# this long for a lock, then gives way (its transaction rolled back, nothing changed),
# pauses as long, and tries again, up to LOCK_ATTEMPTS times in all.
LOCK_TIMEOUT_S = 5.0
LOCK_ATTEMPTS = 4
_LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for a lock_timeout that expired
_log = logging.getLogger("alembic.runtime.migration")  # where alembic reports its steps


def upgrade_database(url: str, revision: str = "head", *, lock_timeout_s: float = LOCK_TIMEOUT_S,
                     lock_attempts: int = LOCK_ATTEMPTS) -> None:
    """Upgrade the schema at ``url`` to ``revision`` (idempotent; one transaction).

    Raises:
        SchemaLockTimeout: on PostgreSQL, a table's lock was not had within
            ``lock_timeout_s`` on any of ``lock_attempts`` attempts.
    """
    _run(url, lambda config: command.upgrade(config, revision), lock_timeout_s, lock_attempts)


def downgrade_database(url: str, revision: str, *, lock_timeout_s: float = LOCK_TIMEOUT_S,
                       lock_attempts: int = LOCK_ATTEMPTS) -> None:
    """Downgrade the schema at ``url`` to ``revision`` (``base`` drops every table);
    raises SchemaLockTimeout as ``upgrade_database`` does."""
    _run(url, lambda config: command.downgrade(config, revision), lock_timeout_s,
         lock_attempts)


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


def _run(url: str, step: Callable[[Config], None], lock_timeout_s: float,
         lock_attempts: int) -> None:
    if lock_timeout_s <= 0 or lock_attempts < 1:
        raise ValueError("lock_timeout_s must be positive and lock_attempts at least 1")
    engine = create_db_engine(url)
    try:
        for attempt in range(1, lock_attempts + 1):
            try:
                _run_once(engine, step, lock_timeout_s)
                return
            except SchemaLockTimeout:
                if attempt == lock_attempts:
                    raise SchemaLockTimeout(
                        f"waited {lock_timeout_s:g} s for a table's lock on each of "
                        f"{lock_attempts} attempts: long transactions hold it (see "
                        "pg_stat_activity); nothing was changed, run it again once they "
                        "end") from None
                _log.warning("a table's lock was not free within %g s (attempt %d of %d): "
                             "nothing changed; trying again in %g s", lock_timeout_s,
                             attempt, lock_attempts, lock_timeout_s)
                time.sleep(lock_timeout_s)
    finally:
        engine.dispose()


def _run_once(engine: Engine, step: Callable[[Config], None], lock_timeout_s: float) -> None:
    """Run ``step`` in one transaction; SchemaLockTimeout when a lock was not had in time
    (the transaction rolled back)."""
    with translate_errors(), engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # A migration may rewrite a large table: the service's timeout is not its.
            connection.execute(text("SET LOCAL statement_timeout = 0"))
            # Concurrent upgrades queue here, with no lock timeout yet.
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK_KEY}
            )
            connection.execute(text(
                f"SET LOCAL lock_timeout = '{max(1, round(lock_timeout_s * 1000))}ms'"))
        try:
            step(_config(connection))
        except OperationalError as error:
            if getattr(error.orig, "sqlstate", None) == _LOCK_NOT_AVAILABLE:
                raise SchemaLockTimeout(str(error.orig).strip()) from error
            raise


def _config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.attributes["connection"] = connection
    return config
