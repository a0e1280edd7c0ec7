"""Throwaway test databases: SQLite files and uniquely named PostgreSQL databases.

PostgreSQL is reached through ``COMPACTOR_TEST_POSTGRES_URL`` (default: the ``test``
database of user postgres on 127.0.0.1:5432); each test run creates its own
``compactor_test_<random>`` database there and drops it at the end.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, exc, text
from sqlalchemy.engine import URL, make_url

from db import Store, create_db_engine

POSTGRES_URL_ENV = "COMPACTOR_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
# Children before parents; TRUNCATE ... CASCADE would also cope, this keeps it explicit.
STORE_TABLES = ("runs", "artifacts", "messages", "revisions", "sessions")


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def postgres_admin_url() -> URL:
    """The URL tests connect to for CREATE/DROP DATABASE."""
    url = make_url(os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL))
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url


def create_postgres_database() -> str:
    """Create an empty ``compactor_test_<random>`` database and return its URL.

    Fails the test (never skips it) with directions when PostgreSQL is unreachable.
    """
    admin_url = postgres_admin_url()
    name = f"compactor_test_{secrets.token_hex(6)}"
    _run_admin(admin_url, f'CREATE DATABASE "{name}"')
    # Commits need not wait for the disk in a throwaway database; visibility and locking
    # (what the tests check) are unchanged.
    _run_admin(admin_url, f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    return admin_url.set(database=name).render_as_string(hide_password=False)


def drop_postgres_database(url: str) -> None:
    name = make_url(url).database
    _run_admin(postgres_admin_url(), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def truncate_store_tables(url: str) -> None:
    """Empty every store table and restart the ids (the schema stays)."""
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            # A test that leaked a transaction would block TRUNCATE forever: fail fast.
            connection.execute(text("SET LOCAL lock_timeout = '10s'"))
            connection.execute(
                text(f"TRUNCATE {', '.join(STORE_TABLES)} RESTART IDENTITY CASCADE")
            )
    finally:
        engine.dispose()


def _run_admin(admin_url: URL, statement: str) -> None:
    engine = create_engine(
        admin_url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5}
    )
    try:
        with engine.connect() as connection:
            connection.execute(text(statement))
        return
    except exc.OperationalError as error:
        reason = str(error.orig).strip()
    finally:
        engine.dispose()
    # Outside the except block, so the report is the directions, not a chained traceback.
    pytest.fail(
        f"PostgreSQL is not reachable at {admin_url.render_as_string()}: {reason}\n"
        "The store tests run against PostgreSQL as well as SQLite. Start it with `.ci/run` "
        "(CI starts it there) or `pg_ctlcluster <version> main start`, or point "
        f"{POSTGRES_URL_ENV} at a server where user postgres may create databases.",
        pytrace=False,
    )


@contextmanager
def open_store(url: str) -> Iterator[Store]:
    """A store on ``url`` whose pooled connections are closed on exit."""
    store = Store(create_db_engine(url))
    try:
        yield store
    finally:
        store.close()
