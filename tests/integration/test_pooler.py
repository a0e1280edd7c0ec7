"""The store behind a real PgBouncer in transaction mode (``db/engine.py``): clients that
share pooled server connections run every kind of call without prepared statement
collisions, timeouts live and die with each transaction, the settings send no startup
option, and migrations take their lock per transaction."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from db import (
    NewRun,
    Store,
    StoreUnavailable,
    check_schema,
    create_db_engine,
    upgrade_database,
)
from db.errors import translate_errors
from tests.support.databases import (
    create_postgres_database,
    drop_postgres_database,
    open_store,
    truncate_store_tables,
)
from tests.support.e2e import append_turns, import_records
from tests.support.generated import generated_session
from tests.support.pgbouncer import SERVER_POOL_SIZE, PgBouncer
from worker.settings.config import Settings

pytestmark = pytest.mark.integration

# More clients than PgBouncer has server connections, each with a pool of its own.
CLIENTS = 3 * SERVER_POOL_SIZE
# Rounds per client: well past psycopg's prepare threshold of repeated statements.
ROUNDS = 8


@pytest.fixture
def pooled_url(pgbouncer_url: str, migrated_postgres_url: str) -> str:
    truncate_store_tables(migrated_postgres_url)
    return pgbouncer_url


def run_a_client(store: Store, number: int) -> None:
    """What a worker and the platform do to a session, over and over."""
    session_id = f"pooled-{number}"
    import_records(store, [generated_session(session_id, 12)])
    now = datetime.now(UTC)
    for round_number in range(ROUNDS):
        owner = f"w{number}-{round_number}"
        snapshot = store.start_job_with_snapshot(session_id, owner, 30, now,
                                                 to_message=lambda message: message.seq)
        assert snapshot is not None and snapshot.messages
        store.finish_job(NewRun(session_id, owner, 1, "test", "skipped", "under_trigger",
                                None, {}, None, now, now), lease_owner=owner)
        append_turns(store, session_id, [{"role": "user", "content": f"r{round_number}"}])
        assert store.projection(session_id)
        assert store.get_session(session_id).lease_owner is None


def test_clients_sharing_pooled_server_connections_never_collide(pooled_url: str) -> None:
    stores = [Store.from_url(pooled_url) for _ in range(CLIENTS)]
    errors: list[BaseException] = []

    def client(number: int) -> None:
        try:
            run_a_client(stores[number], number)
        except BaseException as error:  # reported below, with the client's number
            errors.append(error)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for store in stores:
            store.close()

    assert not errors, [f"{type(e).__name__}: {e}" for e in errors]
    with open_store(pooled_url) as store:
        runs = store.runs(limit=10_000)
    assert len(runs) == CLIENTS * ROUNDS


def test_the_job_snapshot_is_streamed_as_a_plain_statement_behind_the_pooler(
    pooled_url: str,
) -> None:
    engine = create_db_engine(pooled_url)
    store = Store(engine)
    seen: list[str] = []

    def on_statement(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    try:
        import_records(store, [generated_session("pooled-stream", 12)])
        event.listen(engine, "before_cursor_execute", on_statement)
        for _ in range(3):
            snapshot = store.job_snapshot("pooled-stream", to_message=lambda m: m.seq)
            assert snapshot.messages
    finally:
        store.close()

    assert len(seen) == 3 and all("WITH h AS" in statement for statement in seen), seen


def test_the_statement_timeout_holds_in_each_transaction_and_nowhere_else(
    pgbouncer_url: str,
) -> None:
    timed = create_db_engine(pgbouncer_url + "&compactor_statement_timeout_ms=250")
    untimed = create_db_engine(pgbouncer_url).execution_options(isolation_level="AUTOCOMMIT")
    try:
        for _ in range(2 * SERVER_POOL_SIZE):
            with timed.begin() as connection:
                assert show_timeout(connection) == "250ms"
        for _ in range(2 * SERVER_POOL_SIZE):
            with untimed.connect() as connection:  # whichever server connection it gets
                assert show_timeout(connection) != "250ms"
        with pytest.raises(StoreUnavailable, match="statement timeout"), \
                translate_errors(), timed.begin() as connection:
            connection.execute(text("SELECT pg_sleep(2)"))
    finally:
        timed.dispose()
        untimed.dispose()


def show_timeout(connection: Any) -> str:
    value: str = connection.execute(text("SHOW statement_timeout")).scalar_one()
    return value


def test_settings_behind_a_transaction_pooler_reach_the_store_without_startup_options(
    pgbouncer: PgBouncer, migrated_postgres_url: str,
) -> None:
    through = pgbouncer.url_for(migrated_postgres_url).split("?")[0]
    pooled = Settings(database_url=through, db_pooler="transaction",
                      db_statement_timeout_s=7).effective_database_url
    direct = Settings(database_url=through).effective_database_url

    assert "options" not in pooled
    engine = create_db_engine(pooled)
    try:
        with engine.begin() as connection:
            assert show_timeout(connection) == "7s"
    finally:
        engine.dispose()
    with pytest.raises(StoreUnavailable, match="unsupported startup parameter"), \
            open_store(direct) as store:
        store.list_sessions()


def test_concurrent_migrations_through_the_pooler_take_their_lock_per_transaction(
    pgbouncer: PgBouncer,
) -> None:
    direct = create_postgres_database()
    url = pgbouncer.url_for(direct)
    errors: list[BaseException] = []

    def upgrade() -> None:
        try:
            upgrade_database(url)
        except BaseException as error:  # reported below
            errors.append(error)

    try:
        threads = [threading.Thread(target=upgrade) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        engine: Engine = create_db_engine(url)
        try:
            check_schema(engine)
        finally:
            engine.dispose()
    finally:
        drop_postgres_database(direct)
