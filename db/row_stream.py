"""Rows of one PostgreSQL statement as they arrive, never the whole result set at once.

psycopg's ``execute`` receives the whole result before it returns a row: libpq keeps it as
one block of C memory (a 1M-token session's snapshot: its 3.5 MiB of JSON plus a 16-byte
slot per column per row, ~7 MiB) beside the objects the rows become. ``Cursor.stream``
reads it in chunks of rows (libpq's chunked-rows mode): the same one query and one round
trip, with at most a chunk held at once, of a statement prepared once per connection
(none behind a transaction pooler).

The statement still goes through SQLAlchemy where it matters: compiled by its dialect,
announced to its cursor events (statement counters, tracing), result values processed by
its types, and a driver error wrapped (a disconnect invalidates the pooled connection) so
that ``translate_errors`` sees what ``Connection.execute`` would have raised.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Dialect
from sqlalchemy.engine.interfaces import Compiled
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.selectable import CompoundSelect, Select

# Rows per chunk: large enough that a chunk's fixed costs vanish, small enough that it holds
# little (a message row is ~1 KB of JSON).
CHUNK_ROWS = 256

Processor = Callable[[Any], Any] | None


def stream_rows(connection: Connection, statement: Select[Any] | CompoundSelect[Any],
                parameters: Mapping[str, Any]) -> Generator[tuple[Any, ...], None, None]:
    """Yield ``statement``'s rows as plain tuples, each as it arrives, values unprocessed
    (see :func:`result_processors`). Run on a PostgreSQL (psycopg 3) connection in
    autocommit; the rows must be consumed, or the generator closed (which cancels what is
    left of the statement), before the connection runs anything else, its rollback
    included: until then the generator holds the connection's lock.

    ``Cursor.stream`` never uses a prepared statement, so the server would parse and plan
    the statement on every run (~1.7 ms for the job's snapshot, more than psycopg's
    prepared ``execute`` costs in all). It is prepared once per connection instead (SQL
    ``PREPARE``: one statement more on a connection's first run) and each run streams an
    ``EXECUTE`` of it, the values quoted as literals (the extended protocol binds no
    parameters to a utility statement). An engine that prepares nothing (behind a
    transaction pooler, ``db/engine.py``: psycopg's ``prepare_threshold`` is None) streams
    the plain statement; so does a connection whose prepared statement was lost (a pooler
    nobody told us of hands each statement to another server connection), from then on.
    """
    from psycopg.errors import InvalidSqlStatementName  # only ever run on psycopg

    compiled = _compile(statement, connection.dialect)
    bound = compiled.construct_params(dict(parameters)) or {}
    if connection.connection.driver_connection.prepare_threshold is None:  # type: ignore[union-attr]  # psycopg's
        yield from _stream(connection, compiled.string, bound, shown_as=compiled.string)
        return
    prepared = _prepared(compiled)
    usable: dict[str, bool] = connection.connection.info.setdefault(_PREPARED_INFO, {})
    if prepared.name not in usable:
        _prepare(connection, prepared)
        usable[prepared.name] = True
    if usable[prepared.name]:
        try:
            yield from _stream(connection, prepared.execute(bound), None,
                               shown_as=f"EXECUTE {prepared.name}")
            return
        except InvalidSqlStatementName:  # raised before any row
            usable[prepared.name] = False
    yield from _stream(connection, compiled.string, bound, shown_as=compiled.string)


def _stream(connection: Connection, statement: Any, bound: Mapping[str, Any] | None, *,
            shown_as: str) -> Iterator[tuple[Any, ...]]:
    """Stream ``statement`` between the cursor events, which see it as ``shown_as``; a
    driver error is raised as SQLAlchemy raises it, but for a lost prepared statement,
    raised as the driver's."""
    from psycopg.errors import InvalidSqlStatementName

    cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]  # psycopg's
    dispatch = connection.dispatch
    dispatch.before_cursor_execute(connection, cursor, shown_as, bound, None, False)
    try:
        yield from cursor.stream(statement, bound, size=CHUNK_ROWS)
    except InvalidSqlStatementName:
        raise
    except connection.dialect.loaded_dbapi.Error as error:
        raise _wrapped(connection, cursor, shown_as, bound, error) from error
    finally:
        cursor.close()
    dispatch.after_cursor_execute(connection, cursor, shown_as, bound, None, False)


def _prepare(connection: Connection, prepared: _Prepared) -> None:
    """``PREPARE`` ``prepared`` on the connection, between the cursor events; one the
    server already holds under its name (the same text: the name is its hash) will do."""
    from psycopg.errors import DuplicatePreparedStatement

    cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]  # psycopg's
    dispatch = connection.dispatch
    dispatch.before_cursor_execute(connection, cursor, prepared.prepare_sql, None, None, False)
    try:
        cursor.execute(prepared.prepare_sql)
    except DuplicatePreparedStatement:
        pass
    except connection.dialect.loaded_dbapi.Error as error:
        raise _wrapped(connection, cursor, prepared.prepare_sql, None, error) from error
    finally:
        cursor.close()
    dispatch.after_cursor_execute(connection, cursor, prepared.prepare_sql, None, None, False)


def result_processors(statement: Select[Any] | CompoundSelect[Any],
                      dialect: Dialect) -> tuple[Processor, ...]:
    """Each selected column's result processor on ``dialect`` (None: the value as the
    driver gives it), what ``Connection.execute`` applies to a row's values."""
    return _processors(statement, dialect)


# Bounded: each engine has a dialect of its own (a test run makes many).
@functools.lru_cache(maxsize=16)
def _compile(statement: Select[Any] | CompoundSelect[Any], dialect: Dialect) -> Compiled:
    return statement.compile(dialect=dialect)


@dataclass(frozen=True)
class _Prepared:
    """A compiled statement as a server-side prepared statement and its ``EXECUTE``."""

    name: str
    prepare_sql: str
    parameter_names: tuple[str, ...]

    def execute(self, bound: Mapping[str, Any]) -> Any:
        """``EXECUTE`` with ``bound``'s values, quoted by psycopg as literals (a
        ``psycopg.sql.Composed``)."""
        from psycopg import sql

        execute = sql.SQL("EXECUTE {}").format(sql.Identifier(self.name))
        if not self.parameter_names:  # "EXECUTE name()" is a syntax error
            return execute
        return execute + sql.SQL("({})").format(
            sql.SQL(", ").join(sql.Literal(bound[name]) for name in self.parameter_names))


_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
# The connection's info key: prepared statement name -> usable (False: lost, see above).
_PREPARED_INFO = "compactor_prepared_statements"


@functools.lru_cache(maxsize=16)
def _prepared(compiled: Compiled) -> _Prepared:
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    # pyformat's placeholders become $n, and its doubled % (a literal one) single again.
    body = _PLACEHOLDER.sub(number, compiled.string).replace("%%", "%")
    name = "compactor_" + hashlib.sha1(body.encode()).hexdigest()[:20]
    return _Prepared(name, f"PREPARE {name} AS {body}", tuple(names))


@functools.lru_cache(maxsize=16)
def _processors(statement: Select[Any] | CompoundSelect[Any],
                dialect: Dialect) -> tuple[Processor, ...]:
    return tuple(column.type.dialect_impl(dialect).result_processor(dialect, None)
                 for column in statement.selected_columns)


def _wrapped(connection: Connection, cursor: Any, sql: str, bound: Mapping[str, Any] | None,
             error: Any) -> BaseException:
    """The driver's error as SQLAlchemy raises it; on a disconnect the pooled connection
    is invalidated first, so that the pool never hands it out again."""
    dialect = connection.dialect
    invalidated = dialect.is_disconnect(error, connection.connection.dbapi_connection, cursor)
    if invalidated:
        connection.invalidate(error)
    wrapped: BaseException = DBAPIError.instance(
        sql, bound, error, dialect.loaded_dbapi.Error, hide_parameters=True,
        connection_invalidated=invalidated, dialect=dialect, ismulti=False)
    return wrapped
