"""Engine construction for PostgreSQL (psycopg 3), direct or behind a transaction pooler,
and SQLite (WAL, ``BEGIN IMMEDIATE``).

Behind a pooler in transaction mode (PgBouncer's ``pool_mode = transaction``) each
transaction may run on another server connection, shared with other clients: the engine
sends no startup ``options`` (PgBouncer refuses them), sets its statement timeout with
``SET LOCAL`` as each transaction begins, and never uses a server-side prepared statement
(psycopg's ``prepare_threshold=None``, which ``db/row_stream.py`` reads too). This is the
one place the two differ; the URL's ``compactor_*`` query keys (see
:func:`with_postgres_timeouts`) carry the choice, so that every caller that opens a store
by URL gets it.

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
# The URL query keys the engine reads and removes before the driver sees the URL.
POOLER_KEY = "compactor_pooler"
STATEMENT_TIMEOUT_KEY = "compactor_statement_timeout_ms"
POOLERS = ("none", "transaction")
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
    pooler = parsed.query.get(POOLER_KEY, "none")
    timeout_ms = parsed.query.get(STATEMENT_TIMEOUT_KEY, "0")
    if pooler not in POOLERS or not isinstance(timeout_ms, str) or not timeout_ms.isdigit():
        raise ValueError(f"{POOLER_KEY} must be one of {', '.join(POOLERS)} and "
                         f"{STATEMENT_TIMEOUT_KEY} a number of milliseconds")
    parsed = parsed.difference_update_query([POOLER_KEY, STATEMENT_TIMEOUT_KEY])
    deadline = call_timeout_s is not None and parsed.drivername.startswith("postgresql")
    # Behind a transaction pooler a named prepared statement would live on a server
    # connection other clients share: psycopg prepares none.
    connect_args = {"prepare_threshold": None} if pooler == "transaction" else {}
    # hide_parameters: bound values are message contents, which never go into errors/logs.
    # With a deadline the checkout event pings instead, under the deadline.
    engine = create_engine(parsed, pool_pre_ping=not deadline, hide_parameters=True,
                           json_deserializer=load_json, connect_args=connect_args)
    if engine.dialect.name == "sqlite":
        _configure_sqlite(engine, sqlite_busy_timeout_ms)
        return engine
    if int(timeout_ms):
        set_timeout_per_transaction(engine, int(timeout_ms))
    if deadline and call_timeout_s is not None:
        bound_store_calls(engine, call_timeout_s)
    return engine


def set_timeout_per_transaction(engine: Engine, statement_timeout_ms: int) -> None:
    """Begin each of ``engine``'s transactions with ``SET LOCAL statement_timeout``: the
    setting ends with the transaction, so a pooled server connection carries none of it to
    the next client. A statement run in autocommit has no transaction to scope it to and
    gets the server's default (the RUNBOOK's "behind PgBouncer" sets one for the role)."""
    setting = f"SET LOCAL statement_timeout = {int(statement_timeout_ms)}"

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        if connection.connection.dbapi_connection.autocommit:  # type: ignore[union-attr]  # psycopg's
            return
        connection.exec_driver_sql(setting)


def load_json(data: str | bytes) -> Any:
    """Decode a JSON column as ``json.loads`` does, without its sniffing of a byte
    string's encoding: the database sends UTF-8, and a job decodes two values a message
    (bodies and identifiers, ~9k at 1M tokens; 1.6 -> 0.5 us for a small one)."""
    return _JSON_DECODER.decode(data.decode() if isinstance(data, bytes) else data)


def with_postgres_timeouts(url: str, *, connect_timeout_s: int, statement_timeout_s: int,
                           keepalives_idle_s: int, pooler: str = "none") -> str:
    """``url`` with libpq's connect timeout, TCP keepalives and a statement timeout, unless
    it sets them itself (a non-PostgreSQL URL is returned as it is).

    A PostgreSQL that hangs then fails a job in seconds to minutes (``store_unavailable``,
    retried) instead of holding it until the hard time limit kills it. Direct, the statement
    timeout is a startup option of the connection; behind a transaction ``pooler`` it is
    left to :func:`create_db_engine`, which sets it in each transaction.
    """
    parsed = make_url(url)
    if not parsed.drivername.startswith(("postgresql", "postgres")):
        return url
    pooler = str(parsed.query.get(POOLER_KEY, pooler))  # the URL's own value wins
    if pooler not in POOLERS:
        raise ValueError(f"pooler must be one of {', '.join(POOLERS)}, not {pooler!r}")
    defaults = {"connect_timeout": str(connect_timeout_s), "keepalives": "1",
                "keepalives_idle": str(keepalives_idle_s), "keepalives_interval": "10",
                "keepalives_count": "3"}
    if pooler == "transaction":
        defaults[POOLER_KEY] = pooler
        defaults[STATEMENT_TIMEOUT_KEY] = str(statement_timeout_s * 1000)
    elif statement_timeout_s:
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
