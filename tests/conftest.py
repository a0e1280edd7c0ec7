"""Fixtures shared by every test layer: databases of both kinds, the store; corpus tests skip
where the corpus is absent, and the run's summary says how many did and where it looked.

``database_url`` is parametrized over SQLite and PostgreSQL and yields a migrated
database with no rows: a fresh SQLite file per test, and one PostgreSQL database per
test run, migrated once and truncated before each test. Schemas always come from the
alembic migrations (``upgrade_database``), never from ``create_all``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from db import Store, create_db_engine, upgrade_database
from tests.support.corpus import count_corpus_skips, describe_corpus_skips, skip_without_corpus
from tests.support.databases import (
    create_postgres_database,
    drop_postgres_database,
    open_store,
    sqlite_url,
    truncate_store_tables,
)
from tests.support.pgbouncer import PgBouncer, start_pgbouncer

DATABASE_KINDS = ("sqlite", "postgresql")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("corpus") is not None:
        skip_without_corpus()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    terminalreporter.write_line(describe_corpus_skips(count_corpus_skips(skipped)))


@pytest.fixture(scope="session")
def migrated_postgres_url() -> Iterator[str]:
    """One migrated PostgreSQL database for the whole run, dropped at its end."""
    url = create_postgres_database()
    try:
        upgrade_database(url)
        yield url
    finally:
        drop_postgres_database(url)


@pytest.fixture(scope="session")
def pgbouncer() -> Iterator[PgBouncer]:
    """A PgBouncer in transaction mode for the whole run (fails with directions when the
    binary is missing)."""
    running = start_pgbouncer()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def pgbouncer_url(migrated_postgres_url: str, pgbouncer: PgBouncer) -> str:
    """The run's migrated PostgreSQL database through PgBouncer, marked as pooled."""
    return pgbouncer.url_for(migrated_postgres_url)


@pytest.fixture(params=DATABASE_KINDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated database without rows, of each kind."""
    if request.param == "sqlite":
        url = sqlite_url(tmp_path / "store.db")
        upgrade_database(url)
        return url
    url = str(request.getfixturevalue("migrated_postgres_url"))
    truncate_store_tables(url)
    return url


@pytest.fixture(params=DATABASE_KINDS)
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database that has never been migrated, of each kind."""
    if request.param == "sqlite":
        yield sqlite_url(tmp_path / "empty.db")
        return
    url = create_postgres_database()
    try:
        yield url
    finally:
        drop_postgres_database(url)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """An engine on the migrated database of each kind, disposed after the test."""
    engine = create_db_engine(database_url)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    with open_store(database_url) as store:
        yield store
