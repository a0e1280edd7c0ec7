"""What every area of the store shares: its engines and its transactions.

``db.Store`` (``db/store.py``) is the one door; it inherits this base through its
per-area classes (``db/store_jobs.py``, ``db/store_scheduling.py``). Each public method
is one transaction; ``sqlalchemy.exc`` errors are translated here, once, into
``db/errors.py`` (``translate_errors``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, Update
from sqlalchemy.orm import Session

from db import queries as q
from db.engine import SQLITE_BEGIN_OPTION, derive_read_engine
from db.errors import translate_errors
from db.models import SessionRow


class StoreBase:
    """The engines of one database and the store's transactions over them."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._read_engine = derive_read_engine(engine)
        # A single statement sees one snapshot by itself: on PostgreSQL it needs no
        # BEGIN and COMMIT, two round trips of the platform's hot read.
        self._statement_engine = self._read_engine if engine.dialect.name == "sqlite" \
            else engine.execution_options(isolation_level="AUTOCOMMIT")
        # A one-statement write is atomic by itself: no BEGIN and COMMIT round trips (on
        # SQLite the begin hook's own option, not pysqlite's AUTOCOMMIT, which would give
        # transaction control back to the driver once the connection returns to the pool).
        self._write_statement_engine = \
            engine.execution_options(**{SQLITE_BEGIN_OPTION: "AUTOCOMMIT"}) \
            if engine.dialect.name == "sqlite" \
            else engine.execution_options(isolation_level="AUTOCOMMIT")

    def _update_one(self, session_id: str, statement: Update) -> bool:
        """Run a conditional UPDATE of one session; SessionNotFound when it does not exist."""
        with self._write() as session:
            changed = session.execute(
                statement.returning(SessionRow.id), execution_options=q.NO_SYNC
            ).first()
            if changed is None:
                q.find_session(session, session_id)
            return changed is not None

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with translate_errors(), Session(self._engine) as session, session.begin():
            yield session

    @contextmanager
    def _read_statement(self) -> Iterator[Session]:
        with translate_errors(), Session(self._statement_engine) as session:
            yield session

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with translate_errors(), Session(self._read_engine) as session, session.begin():
            yield session


