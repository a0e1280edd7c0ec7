"""The job's snapshot streamed from PostgreSQL (``db/row_stream.py``): prepared once per
connection, it reaches the cursor events like any statement, its rows come in chunks
rather than as one result set, a lost prepared statement falls back to the plain one, and
a connection lost mid-stream fails as the store's error and leaves the pool usable."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, Select, event, literal_column, select, text
from sqlalchemy.exc import DBAPIError

from db import Store, StoreUnavailable, create_db_engine
from db.row_stream import CHUNK_ROWS, stream_rows
from tests.support.databases import truncate_store_tables
from tests.support.e2e import import_records
from tests.support.generated import generated_session

pytestmark = pytest.mark.integration

SESSION = "generated-stream"


@pytest.fixture
def engine(migrated_postgres_url: str) -> Any:
    truncate_store_tables(migrated_postgres_url)
    engine = create_db_engine(migrated_postgres_url)
    yield engine
    engine.dispose()


def test_the_snapshot_is_prepared_once_per_connection_and_reads_every_active_message(
    engine: Engine,
) -> None:
    store = Store(engine)
    import_records(store, [generated_session(SESSION, 40)])
    seen: list[str] = []

    def on_statement(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", on_statement)
    try:
        first = store.job_snapshot(SESSION, to_message=lambda message: message.seq)
        again = store.job_snapshot(SESSION, to_message=lambda message: message.seq)
    finally:
        event.remove(engine, "before_cursor_execute", on_statement)

    prepare, *executes = seen
    assert prepare.startswith("PREPARE compactor_") and "WITH h AS" in prepare, seen
    name = prepare.split()[1]
    assert executes == [f"EXECUTE {name}"] * 2
    state = store.get_session(SESSION)
    assert first.messages == again.messages == list(range(1, state.head_seq + 1))
    assert first.session == state
    assert first.session.created_at.tzinfo is not None


def test_a_connection_that_lost_the_prepared_statement_streams_the_plain_one(
    engine: Engine,
) -> None:
    store = Store(engine)
    import_records(store, [generated_session(SESSION, 40)])
    expected = store.job_snapshot(SESSION, to_message=lambda message: message.seq)
    # What a pooler that moves statements between server connections looks like.
    with engine.connect() as connection:
        connection.exec_driver_sql("DEALLOCATE ALL")
        connection.commit()
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute",
                 lambda _c, _cur, statement, *_a: seen.append(statement))
    snapshots = [store.job_snapshot(SESSION, to_message=lambda message: message.seq)
                 for _ in range(2)]
    assert [s.messages for s in snapshots] == [expected.messages] * 2
    # The lost one is tried once; then the plain statement, from then on.
    assert seen[0].startswith("EXECUTE compactor_")
    assert [statement[:9] for statement in seen[1:]] == ["WITH h AS"] * 2, seen


def test_rows_arrive_in_chunks_not_as_the_whole_result_set(
    engine: Engine, monkeypatch: pytest.MonkeyPatch,
) -> None:
    statement: Select[Any] = select(literal_column("n")).select_from(
        text(f"generate_series(1, {CHUNK_ROWS * 4}) AS n"))
    held: list[int] = []
    stream = psycopg.Cursor.stream

    def recording_stream(cursor: psycopg.Cursor[Any], *args: Any, **kwargs: Any) -> Any:
        for row in stream(cursor, *args, **kwargs):
            held.append(cursor.pgresult.ntuples if cursor.pgresult else 0)
            yield row

    monkeypatch.setattr(psycopg.Cursor, "stream", recording_stream)
    with engine.connect() as connection:
        rows = [n for (n,) in stream_rows(connection, statement, {})]
    assert rows == list(range(1, CHUNK_ROWS * 4 + 1))
    assert 0 < max(held) <= CHUNK_ROWS


def test_an_error_mid_stream_is_raised_as_sqlalchemy_raises_it_and_the_connection_is_reusable(
    engine: Engine,
) -> None:
    failing: Select[Any] = select(literal_column(f"1 / (n - {CHUNK_ROWS * 2})")).select_from(
        text(f"generate_series(1, {CHUNK_ROWS * 4}) AS n"))
    # Autocommit, as the store runs the snapshot: no transaction is left aborted.
    with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as connection:
        received: list[Any] = []
        with pytest.raises(DBAPIError) as raised:
            received.extend(stream_rows(connection, failing, {}))
        assert isinstance(raised.value.orig, psycopg.errors.DivisionByZero)
        assert not raised.value.connection_invalidated
        assert connection.execute(text("SELECT 1")).scalar_one() == 1


def test_a_lost_connection_fails_as_unavailable_and_leaves_the_pool_usable(
    migrated_postgres_url: str,
) -> None:
    # With a call deadline a connection checked in moments ago is not pinged on checkout
    # (``db/call_deadline.py``): the snapshot's own statement meets the lost connection.
    engine = create_db_engine(migrated_postgres_url, call_timeout_s=60)
    try:
        store = Store(engine)
        import_records(store, [generated_session(SESSION, 40)])
        with engine.connect() as victim, engine.connect() as other:
            pid = victim.execute(text("SELECT pg_backend_pid()")).scalar_one()
            victim.commit()
            victim.close()  # back to the pool: the job's next checkout
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            with pytest.raises(StoreUnavailable):
                store.job_snapshot(SESSION, to_message=lambda message: message.seq)
        assert store.job_snapshot(SESSION, to_message=lambda m: m.seq).messages[0] == 1
    finally:
        engine.dispose()
