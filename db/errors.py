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
    └── StoreUnavailable     connection or operational failure; retrying may succeed
        └── SchemaLockTimeout   an upgrade gave way to transactions holding its tables

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
    """Raised on connection and operational errors (locks, timeouts); retry later."""

    transient = True


class SchemaLockTimeout(StoreUnavailable):
    """Raised when a schema upgrade (or downgrade) could not take a table's lock within
    its lock timeout on any of its attempts: long transactions hold the table. Nothing
    was changed; run it again once they end."""


@contextmanager
def translate_errors() -> Iterator[None]:
    """Re-raise SQLAlchemy errors as store errors (messages carry no bound values)."""
    from sqlalchemy import exc as sa_exc  # loaded by the store already; a dict lookup

    try:
        yield
    except (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError,
            sa_exc.DisconnectionError) as error:
        raise StoreUnavailable(_describe(error)) from error
    except sa_exc.SQLAlchemyError as error:
        raise StoreError(_describe(error)) from error


def _describe(error: sa_exc.SQLAlchemyError) -> str:
    from sqlalchemy import exc as sa_exc

    cause = error.orig if isinstance(error, sa_exc.DBAPIError) else error
    first_line = (str(cause).strip().splitlines() or [""])[0]
    return f"{type(cause).__name__}: {first_line}"
