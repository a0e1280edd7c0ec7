"""The schema and the engine: alembic migrations on empty databases of both kinds, the
models matching them, a PostgreSQL upgrade that gives way to long transactions, SQLite's
connection settings, and errors from an absent server."""

from __future__ import annotations

import importlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import IntegrityError

from db import (
    NewMessage,
    SchemaLockTimeout,
    SchemaMissing,
    Store,
    StoreUnavailable,
    check_schema,
    current_revision,
    downgrade_database,
    head_revision,
    upgrade_database,
)
from db.engine import create_db_engine, derive_read_engine
from db.models import INSTRUCTION_ROLES, SEARCH_OBJECT_PREFIXES, Base
from tests.integration.test_store import T0
from tests.support.cli import compactor_for
from tests.support.corpus import load_corpus
from tests.support.databases import create_postgres_database, drop_postgres_database, open_store
from worker.compaction.messages import INSTRUCTION_ROLES as MODEL_INSTRUCTION_ROLES

pytestmark = pytest.mark.integration

STORE_TABLES = {"sessions", "messages", "revisions", "runs", "artifacts",
                "parked_jobs"}
LZ4_MIGRATION = importlib.import_module("db.migrations.versions.0005_lz4_toast")
LARGE_COLUMNS: tuple[tuple[str, str], ...] = LZ4_MIGRATION.LARGE_COLUMNS


def is_search_object(name: str | None) -> bool:
    """Recall's text index (migration 0003) lives outside the models."""
    return bool(name) and str(name).startswith(SEARCH_OBJECT_PREFIXES)


def table_names(url: str) -> set[str]:
    engine = create_db_engine(url)
    try:
        names = set(inspect(engine).get_table_names()) - {"alembic_version"}
        return {name for name in names if not is_search_object(name)}
    finally:
        engine.dispose()


def test_upgrade_of_an_empty_database_reaches_head(empty_database_url: str) -> None:
    assert current_revision(empty_database_url) is None
    upgrade_database(empty_database_url)
    assert current_revision(empty_database_url) == head_revision()
    assert table_names(empty_database_url) == STORE_TABLES
    upgrade_database(empty_database_url)  # idempotent
    assert current_revision(empty_database_url) == head_revision()


def test_downgrade_to_base_drops_every_table_and_upgrade_restores_them(
    empty_database_url: str,
) -> None:
    upgrade_database(empty_database_url)
    downgrade_database(empty_database_url, "base")
    assert current_revision(empty_database_url) is None
    assert table_names(empty_database_url) == set()
    upgrade_database(empty_database_url)
    assert table_names(empty_database_url) == STORE_TABLES


def test_the_migrated_schema_matches_the_models(database_url: str) -> None:
    engine = create_db_engine(database_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={
                "compare_type": True,
                "include_name": lambda name, *_: not is_search_object(name),
            })
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_check_schema_refuses_a_database_that_was_never_migrated(
    empty_database_url: str,
) -> None:
    engine = create_db_engine(empty_database_url)
    try:
        with pytest.raises(SchemaMissing, match="never migrated"):
            check_schema(engine)
        upgrade_database(empty_database_url)
        check_schema(engine)
    finally:
        engine.dispose()


def test_sqlite_connections_use_wal_foreign_keys_and_the_busy_timeout(tmp_path: Path) -> None:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'x.db'}", sqlite_busy_timeout_ms=1234)
    try:
        with engine.connect() as connection:
            pragma = {name: connection.exec_driver_sql(f"PRAGMA {name}").scalar()
                      for name in ("journal_mode", "foreign_keys", "busy_timeout")}
        assert pragma == {"journal_mode": "wal", "foreign_keys": 1, "busy_timeout": 1234}
    finally:
        engine.dispose()


def test_sqlite_write_transactions_take_the_write_lock_at_begin(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    upgrade_database(url)
    writer = create_db_engine(url)
    impatient = create_db_engine(url, sqlite_busy_timeout_ms=0)
    try:
        with writer.begin() as held:
            held.execute(text("SELECT 1"))  # nothing written yet, but BEGIN IMMEDIATE ran
            with pytest.raises(Exception, match="database is locked"), impatient.begin() as c:
                c.execute(text("SELECT 1"))
            # Readers are not blocked: a deferred read transaction sees the last commit.
            with derive_read_engine(impatient).begin() as reader:
                assert reader.execute(text("SELECT count(*) FROM sessions")).scalar() == 0
    finally:
        writer.dispose()
        impatient.dispose()


def test_plain_postgresql_urls_use_psycopg_3() -> None:
    engine = create_db_engine("postgresql://postgres@127.0.0.1:5432/test")
    try:
        assert engine.dialect.driver == "psycopg"
    finally:
        engine.dispose()


@pytest.mark.parametrize("url", [
    "postgresql://postgres@127.0.0.1:1/nothing_listens_here",
    "sqlite:////nonexistent-dir/store.db",
])
def test_an_unreachable_database_raises_store_unavailable(url: str) -> None:
    engine = create_db_engine(url)
    try:
        with pytest.raises(StoreUnavailable):
            Store(engine).get_session("s1")
    finally:
        engine.dispose()


def test_the_store_agrees_with_the_message_model_on_instruction_roles() -> None:
    assert set(INSTRUCTION_ROLES) == {role.value for role in MODEL_INSTRUCTION_ROLES}


@pytest.mark.corpus
def test_real_sessions_round_trip_exactly_through_import_and_export(store: Store) -> None:
    sessions = load_corpus("dev")[:15]
    for recorded in sessions:
        messages = [NewMessage(body=body, role=body["role"],
                               tool_call_id=body.get("tool_call_id"), tokens=len(str(body)))
                    for body in recorded["messages"]]
        store.import_session(recorded["session_id"], {"source": recorded["source"]}, messages,
                             T0)
    for recorded in sessions:
        exported = [record.body for record in store.messages(recorded["session_id"])]
        assert json.dumps(exported) == json.dumps(recorded["messages"])
        assert store.projection(recorded["session_id"]) == recorded["messages"]


def test_postgresql_compresses_large_values_with_lz4_and_downgrade_restores_the_default(
) -> None:
    url = create_postgres_database()
    try:
        upgrade_database(url)
        engine = create_db_engine(url)
        try:
            skip_without_lz4(engine)
            assert column_compressions(engine) == {column: "l" for column in LARGE_COLUMNS}
            # A tool result well over the ~2 KB at which PostgreSQL compresses a value.
            output = " ".join(f"line {n}: order ORD-{n:05d} shipped" for n in range(400))
            body = {"role": "tool", "tool_call_id": "call_1", "content": output}
            with open_store(url) as store:
                store.import_session("s-lz4", {}, [NewMessage(
                    body=body, role="tool", tool_call_id="call_1", tokens=3_000,
                    search_text=output)], T0)
                assert [message.body for message in store.messages("s-lz4")] == [body]
            with engine.connect() as connection:
                assert connection.execute(text(
                    "SELECT pg_column_compression(body), pg_column_compression(search_text) "
                    "FROM messages")).one() == ("lz4", "lz4")
            downgrade_database(url, "0004")
            assert column_compressions(engine) == {column: "" for column in LARGE_COLUMNS}
        finally:
            engine.dispose()
    finally:
        drop_postgres_database(url)


def skip_without_lz4(engine: Engine) -> None:
    """Skip where the server has no lz4: 0005 then changes nothing and takes no lock."""
    with engine.connect() as connection:
        if not connection.execute(LZ4_MIGRATION.LZ4_AVAILABLE).scalar():
            pytest.skip("this PostgreSQL server has no lz4 (14+, --with-lz4): 0005 changes "
                        "nothing")


def column_compressions(engine: Engine) -> dict[tuple[str, str], str]:
    """Each large column's compression method ('l': lz4, '': the server's default)."""
    with engine.connect() as connection:
        rows = connection.execute(text(
            "SELECT c.relname, a.attname, a.attcompression FROM pg_attribute AS a "
            "JOIN pg_class AS c ON c.oid = a.attrelid "
            "WHERE c.relname IN ('messages', 'revisions') AND a.attnum > 0"))
        found = {(table, column): method for table, column, method in rows}
    return {column: found[column] for column in LARGE_COLUMNS}


@contextmanager
def migration_blocked(url: str) -> Iterator[Connection]:
    """A database at 0004 whose ``messages`` table an open transaction reads (ACCESS
    SHARE, which 0005's ALTER must wait for); the holder's connection, to end it."""
    upgrade_database(url, "0004")
    engine = create_db_engine(url)
    try:
        skip_without_lz4(engine)
        with engine.connect() as holder:
            holder.execute(text("SELECT count(*) FROM messages"))
            yield holder
    finally:
        engine.dispose()


def test_an_upgrade_blocked_by_a_long_transaction_gives_way_and_changes_nothing(
    tmp_path: Path,
) -> None:
    url = create_postgres_database()
    try:
        with migration_blocked(url):
            reads: list[float] = []

            def read_messages_meanwhile() -> None:
                """What the service does on ``messages`` while the upgrade waits."""
                time.sleep(0.3)
                engine = create_db_engine(url)
                try:
                    with engine.connect() as reader:
                        reader.execute(text("SET statement_timeout = '20s'"))
                        began = time.monotonic()
                        reader.execute(text("SELECT count(*) FROM messages"))
                        reads.append(time.monotonic() - began)
                finally:
                    engine.dispose()

            reader = threading.Thread(target=read_messages_meanwhile)
            reader.start()
            with pytest.raises(SchemaLockTimeout, match="1 s for a table's lock on each of 2"):
                upgrade_database(url, lock_timeout_s=1.0, lock_attempts=2)
            reader.join()
            # Queued behind the waiting ALTER only until it gave way (~0.7 s), not until
            # the long transaction ends.
            assert len(reads) == 1 and reads[0] < 5
            assert current_revision(url) == "0004"
            failed = compactor_for(url, tmp_path).subprocess(
                "db", "upgrade", "--lock-timeout", "0.2", "--lock-attempts", "2")
        assert failed.returncode == 1
        assert "schema not changed: waited 0.2 s for a table's lock on each of 2" in (
            failed.stderr)
        assert current_revision(url) == "0004"
    finally:
        drop_postgres_database(url)


class EndsTheHolderWhenTheUpgradeGivesWay(logging.Handler):
    """Ends the long transaction when the upgrade logs that it gave way (in the pause
    before its next attempt); keeps what it logged."""

    def __init__(self, holder: Connection) -> None:
        super().__init__(logging.WARNING)
        self.holder = holder
        self.warnings: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.warnings.append(record.getMessage())
        self.holder.rollback()


def test_an_upgrade_tries_again_and_goes_through_once_the_transaction_ends() -> None:
    url = create_postgres_database()
    migration_log = logging.getLogger("alembic.runtime.migration")
    try:
        with migration_blocked(url) as holder:
            handler = EndsTheHolderWhenTheUpgradeGivesWay(holder)
            migration_log.addHandler(handler)
            try:
                upgrade_database(url, lock_timeout_s=0.3, lock_attempts=3)
            finally:
                migration_log.removeHandler(handler)
        assert handler.warnings == ["a table's lock was not free within 0.3 s (attempt 1 of "
                                    "3): nothing changed; trying again in 0.3 s"]
        assert current_revision(url) == head_revision()
    finally:
        drop_postgres_database(url)


def test_sessions_stored_before_0006_are_chat_sessions_and_downgrade_drops_the_format(
    empty_database_url: str,
) -> None:
    upgrade_database(empty_database_url, "0005")
    engine = create_db_engine(empty_database_url)
    try:
        with engine.begin() as connection:
            connection.execute(text(
                "INSERT INTO sessions (session_id, metadata, head_seq, total_tokens, "
                "projection_tokens, tokens_since_compaction, created_at, breaker_state, "
                "breaker_failures) VALUES ('old', '{}', 0, 0, 0, 0, :now, 'closed', 0)"),
                {"now": T0.replace(tzinfo=None)})
        upgrade_database(empty_database_url)
        with open_store(empty_database_url) as store:
            assert store.get_session("old").session_format == "chat"
        with engine.begin() as connection, pytest.raises(IntegrityError):
            connection.execute(text("UPDATE sessions SET format = 'gemini'"))
        downgrade_database(empty_database_url, "0005")
        with engine.connect() as connection:
            assert "format" not in {c["name"] for c in inspect(connection).get_columns(
                "sessions")}
            assert connection.execute(text("SELECT session_id FROM sessions")).all() == [
                ("old",)]
    finally:
        engine.dispose()


def test_sessions_stored_before_0009_count_no_system_prompt_and_downgrade_drops_the_count(
    empty_database_url: str,
) -> None:
    upgrade_database(empty_database_url, "0008")
    engine = create_db_engine(empty_database_url)
    try:
        with engine.begin() as connection:
            connection.execute(text(
                "INSERT INTO sessions (session_id, metadata, format, head_seq, total_tokens, "
                "projection_tokens, tokens_since_compaction, created_at, breaker_state, "
                "breaker_failures) VALUES ('old', '{\"system\": \"policy\"}', 'anthropic', "
                "0, 0, 0, 0, :now, 'closed', 0)"), {"now": T0.replace(tzinfo=None)})
        upgrade_database(empty_database_url)
        with open_store(empty_database_url) as store:
            assert store.get_session("old").system_tokens == 0
            store.create_session("new", {}, T0, session_format="anthropic", system_tokens=7)
            assert store.get_session("new").projection_tokens == 7
        downgrade_database(empty_database_url, "0008")
        with engine.connect() as connection:
            assert "system_tokens" not in {c["name"] for c in inspect(connection).get_columns(
                "sessions")}
            assert connection.execute(text(
                "SELECT session_id, projection_tokens FROM sessions ORDER BY session_id")
            ).all() == [("new", 7), ("old", 0)]
    finally:
        engine.dispose()
