"""The store's own error tree; ``db/store.py`` translates ``sqlalchemy.exc`` into it once.

::

    StoreError
    ├── SessionNotFound      no session has this external id
    ├── SessionExists        create/import of an id that is already stored
    ├── RevisionNotFound     no such revision (or not an ancestor of the active one)
    ├── RevisionConflict     compare-and-swap lost: the active revision changed
    ├── LeaseLost            the session's lease is no longer held by this owner
    ├── SessionLeased        an erase refused: a job holds the session's lease
    ├── MessagePinned        a message erase refused: not the newest, or a compaction read it
    ├── SchemaMissing        the database is not migrated to the packaged head
    └── StoreUnavailable     an infrastructure fault, never the data's: connection lost
        │                    or refused, pooler and protocol errors, prepared statements
        │                    lost or colliding, serialization failures and deadlocks,
        │                    shutdowns, timeouts; retrying may succeed
        ├── SchemaLockTimeout   an upgrade gave way to transactions holding its tables
        └── PoolerRefusedStartup  a transaction pooler refused the connection's startup
                                  options: a setting to fix, which start checks refuse

:func:`translate_errors` is the one place ``sqlalchemy.exc`` errors become these. The tree
itself does not import SQLAlchemy: a command that only reports a store error by name
(``compactor --help``, ``expected_errors``) does not load it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from sqlalchemy import exc as sa_exc


class StoreError(Exception):
    """Base of every error the store raises."""

    transient: ClassVar[bool] = False


class SessionNotFound(StoreError):
    """Raised when no session has the given external id."""


class SessionExists(StoreError):
    """Raised when creating or importing a session whose id is already stored."""


class RevisionNotFound(StoreError):
    """Raised when a revision does not exist, or is not an ancestor of the active one."""


class RevisionConflict(StoreError):
    """Raised when the active revision is not the one the caller expected (CAS lost)."""


class LeaseLost(StoreError):
    """Raised when the session's lease is no longer held by this owner, or has expired."""


class SessionLeased(StoreError):
    """Raised when an erase is refused because a job holds an unexpired lease on the
    session (an operator may force it; the job then ends without writing)."""


class MessagePinned(StoreError):
    """Raised when a message cannot be erased: it is no longer the newest, or the active
    revision's snapshot included it (a summary may already speak of it)."""


class SchemaMissing(StoreError):
    """Raised when the database's schema is not at the head of the packaged migrations."""


class StoreUnavailable(StoreError):
    """Raised on infrastructure faults (``is_infrastructure_fault``); retry later."""

    transient = True


class SchemaLockTimeout(StoreUnavailable):
    """Raised when a schema upgrade (or downgrade) could not take a table's lock within
    its lock timeout on any of its attempts: long transactions hold the table. Nothing
    was changed; run it again once they end."""


class PoolerRefusedStartup(StoreUnavailable):
    """Raised when a pooler in transaction mode refused the connection's startup options
    (the statement timeout a direct connection sends): COMPACTOR_DB_POOLER is not
    ``transaction``. Still an infrastructure fault for a job (retried, no breaker); the
    start checks refuse to start on it."""


@contextmanager
def translate_errors() -> Iterator[None]:
    """Re-raise SQLAlchemy errors as store errors (messages carry no bound values)."""
    from sqlalchemy import exc as sa_exc  # loaded by the store already; a dict lookup

    try:
        yield
    except sa_exc.SQLAlchemyError as error:
        if is_infrastructure_fault(error):
            described = _describe(error)
            if POOLER_HINT in described:
                raise PoolerRefusedStartup(described) from error
            raise StoreUnavailable(described) from error
        raise StoreError(_describe(error)) from error


# SQLSTATEs of faults that are not about the data a call touched, by class (two
# characters) or in full: a lost or refused connection and the pooler's own errors (08),
# a prepared statement the server connection lacks (26), serialization failures and
# deadlocks (40), exhausted server resources (53), shutdowns and cancels (57), the
# server's system errors (58), and a prepared statement another client left on a shared
# server connection (42P05).
INFRASTRUCTURE_SQLSTATES = frozenset({"08", "26", "40", "53", "57", "58", "42P05"})


def is_infrastructure_fault(error: sa_exc.SQLAlchemyError) -> bool:
    """Whether ``error`` is the database's or the network's, not the call's data: such a
    failure is ``StoreUnavailable`` (retried, never counted on a session's breaker)."""
    from sqlalchemy import exc as sa_exc

    if isinstance(error, (sa_exc.OperationalError, sa_exc.InterfaceError,
                          sa_exc.TimeoutError, sa_exc.DisconnectionError)):
        return True
    if isinstance(error, sa_exc.DBAPIError):
        if error.connection_invalidated:
            return True
        sqlstate = getattr(error.orig, "sqlstate", None) or ""
        return sqlstate in INFRASTRUCTURE_SQLSTATES or sqlstate[:2] in INFRASTRUCTURE_SQLSTATES
    return False


def _describe(error: sa_exc.SQLAlchemyError) -> str:
    from sqlalchemy import exc as sa_exc

    cause = error.orig if isinstance(error, sa_exc.DBAPIError) else error
    first_line = (str(cause).strip().splitlines() or [""])[0]
    if _STARTUP_REFUSED in first_line:
        first_line += POOLER_HINT
    return f"{type(cause).__name__}: {first_line}"


# PgBouncer's answer to a startup option it does not pass on (the statement timeout sent
# to a server reached directly); retrying never helps, the operator's setting does.
_STARTUP_REFUSED = "unsupported startup parameter"
POOLER_HINT = (" (a connection pooler in transaction mode, such as PgBouncer: set "
               "COMPACTOR_DB_POOLER=transaction, see RUNBOOK \"Behind PgBouncer\")")
