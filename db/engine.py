"""Engine construction for PostgreSQL (psycopg 3) and SQLite (WAL, ``BEGIN IMMEDIATE``).

SQLite gets SQLAlchemy's documented pysqlite recipe: the driver's own BEGIN is disabled
and the engine emits ``BEGIN IMMEDIATE``, so a write transaction takes the write lock up
front and two writers never deadlock on a read-to-write lock upgrade. Read transactions
(see :func:`derive_read_engine`) use a deferred ``BEGIN``, a consistent WAL snapshot.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url

from db.call_deadline import bound_store_calls

# Execution option read by the SQLite begin hook; a name SQLAlchemy itself never uses.
SQLITE_BEGIN_OPTION = "compactor_sqlite_begin"
_JSON_DECODER = json.JSONDecoder()


def create_db_engine(url: str, *, sqlite_busy_timeout_ms: int = 10_000,
                     call_timeout_s: float | None = None) -> Engine:
    """Create the engine for ``url``; ``postgresql://`` URLs are mapped to psycopg 3.

    With ``call_timeout_s``, a PostgreSQL store call (one pool checkout) that overruns it
    has its connection shut down from this side (``db/call_deadline.py``).
    """
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    deadline = call_timeout_s is not None and parsed.drivername.startswith("postgresql")
    # hide_parameters: bound values are message contents, which never go into errors/logs.
    # With a deadline the checkout event pings instead, under the deadline.
    engine = create_engine(parsed, pool_pre_ping=not deadline, hide_parameters=True,
                           json_deserializer=load_json)
    if engine.dialect.name == "sqlite":
        _configure_sqlite(engine, sqlite_busy_timeout_ms)
    elif deadline and call_timeout_s is not None:
        bound_store_calls(engine, call_timeout_s)
    return engine


def load_json(data: str | bytes) -> Any:
    """Decode a JSON column as ``json.loads`` does, without its sniffing of a byte
    string's encoding: the database sends UTF-8, and a job decodes two values a message
    (bodies and identifiers, ~9k at 1M tokens; 1.6 -> 0.5 us for a small one)."""
    return _JSON_DECODER.decode(data.decode() if isinstance(data, bytes) else data)


def with_postgres_timeouts(url: str, *, connect_timeout_s: int, statement_timeout_s: int,
                           keepalives_idle_s: int) -> str:
    """``url`` with libpq's connect timeout, TCP keepalives and a statement timeout, unless
    it sets them itself (a non-PostgreSQL URL is returned as it is).

    A PostgreSQL that hangs then fails a job in seconds to minutes (``store_unavailable``,
    retried) instead of holding it until the hard time limit kills it.
    """
    parsed = make_url(url)
    if not parsed.drivername.startswith(("postgresql", "postgres")):
        return url
    defaults = {"connect_timeout": str(connect_timeout_s), "keepalives": "1",
                "keepalives_idle": str(keepalives_idle_s), "keepalives_interval": "10",
                "keepalives_count": "3"}
    if statement_timeout_s:
        defaults["options"] = f"-c statement_timeout={statement_timeout_s * 1000}"
    query = {**defaults, **parsed.query}
    return parsed.update_query_dict(query).render_as_string(hide_password=False)


def derive_read_engine(engine: Engine) -> Engine:
    """Return a view of ``engine`` whose transactions are consistent read-only snapshots.

    PostgreSQL: ``REPEATABLE READ, READ ONLY`` (every statement sees one snapshot).
    SQLite: a deferred ``BEGIN`` (a WAL reader sees one snapshot and takes no write lock).
    The view shares the engine's connection pool.
    """
    if engine.dialect.name == "sqlite":
        return engine.execution_options(**{SQLITE_BEGIN_OPTION: "DEFERRED"})
    return engine.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)


def _configure_sqlite(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from pysqlite: the begin hook below emits BEGIN.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        mode = connection.get_execution_options().get(SQLITE_BEGIN_OPTION, "IMMEDIATE")
        if mode == "AUTOCOMMIT":  # one statement, its own transaction: the driver's
            return
        if mode not in ("DEFERRED", "IMMEDIATE"):
            raise ValueError(f"{SQLITE_BEGIN_OPTION} must be DEFERRED, IMMEDIATE or "
                             f"AUTOCOMMIT, not {mode!r}")
        connection.exec_driver_sql(f"BEGIN {mode}")
