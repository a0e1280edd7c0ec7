"""Rows of one PostgreSQL statement as they arrive, never the whole result set at once.

psycopg's ``execute`` receives the whole result before it returns a row: libpq keeps it as
one block of C memory (a 1M-token session's snapshot: its 3.5 MiB of JSON plus a 16-byte
slot per column per row, ~7 MiB) beside the objects the rows become. ``Cursor.stream``
reads it in chunks of rows (libpq's chunked-rows mode): the same one query and one round
trip, with at most a chunk held at once.

The statement still goes through SQLAlchemy where it matters: compiled by its dialect,
announced to its cursor events (statement counters, tracing), result values processed by
its types, and a driver error wrapped (a disconnect invalidates the pooled connection) so
that ``translate_errors`` sees what ``Connection.execute`` would have raised.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
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
                parameters: Mapping[str, Any]) -> Iterator[tuple[Any, ...]]:
    """Yield ``statement``'s rows as plain tuples, each as it arrives, values unprocessed
    (see :func:`result_processors`). Run on a PostgreSQL (psycopg 3) connection; the rows
    must be consumed, or the generator closed, before the connection runs anything else."""
    compiled = _compile(statement, connection.dialect)
    sql, bound = compiled.string, compiled.construct_params(dict(parameters))
    cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]  # psycopg's
    dispatch = connection.dispatch
    dispatch.before_cursor_execute(connection, cursor, sql, bound, None, False)
    try:
        yield from cursor.stream(sql, bound, size=CHUNK_ROWS)
    except connection.dialect.loaded_dbapi.Error as error:
        raise _wrapped(connection, cursor, sql, bound, error) from error
    finally:
        cursor.close()
    dispatch.after_cursor_execute(connection, cursor, sql, bound, None, False)


def result_processors(statement: Select[Any] | CompoundSelect[Any],
                      dialect: Dialect) -> tuple[Processor, ...]:
    """Each selected column's result processor on ``dialect`` (None: the value as the
    driver gives it), what ``Connection.execute`` applies to a row's values."""
    return _processors(statement, dialect)


# Bounded: each engine has a dialect of its own (a test run makes many).
@functools.lru_cache(maxsize=16)
def _compile(statement: Select[Any] | CompoundSelect[Any], dialect: Dialect) -> Compiled:
    return statement.compile(dialect=dialect)


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
