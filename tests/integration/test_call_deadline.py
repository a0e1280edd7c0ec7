"""A store call to PostgreSQL ends at its client-side deadline (``db/call_deadline.py``):
against a frozen private server (SIGSTOP: its kernel still accepts connections and ACKs,
its own statement_timeout never fires) and against a live one whose statement outlasts
the deadline. The call fails as StoreUnavailable; the store works again afterwards."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from db import Store, StoreUnavailable, call_deadline, upgrade_database
from db.call_deadline import CallWatchdog
from db.engine import with_postgres_timeouts
from tests.support.private_postgres import PrivatePostgres

pytestmark = [pytest.mark.integration]

DEADLINE_S = 1.5
CONNECT_TIMEOUT_S = 2
# The deadline, a fresh connection's connect timeout and the watchdog's tick, with room
# for a loaded machine.
BOUND_S = DEADLINE_S + CONNECT_TIMEOUT_S + 3.0


@pytest.fixture(scope="module")
def private_postgres() -> Iterator[PrivatePostgres]:
    with PrivatePostgres() as postgres:
        upgrade_database(postgres.url)
        yield postgres


def open_bounded_store(url: str) -> Store:
    return Store.from_url(with_postgres_timeouts(url, connect_timeout_s=CONNECT_TIMEOUT_S,
                                                 statement_timeout_s=60, keepalives_idle_s=1),
                          call_timeout_s=DEADLINE_S)


def test_a_call_on_a_pooled_connection_to_a_frozen_server_fails_at_the_deadline(
    private_postgres: PrivatePostgres
) -> None:
    store = open_bounded_store(private_postgres.url)
    try:
        assert store.list_sessions() == []  # a pooled connection, alive
        private_postgres.hang()
        try:
            began = time.monotonic()
            with pytest.raises(StoreUnavailable):
                store.list_sessions()
            waited_s = time.monotonic() - began
        finally:
            private_postgres.resume()
        assert DEADLINE_S <= waited_s < BOUND_S
        assert store.list_sessions() == []  # a fresh connection once the server is back
    finally:
        store.close()


def test_a_statement_in_flight_when_the_server_freezes_fails_at_the_deadline(
    private_postgres: PrivatePostgres
) -> None:
    store = open_bounded_store(private_postgres.url)
    engine = store._engine
    try:
        began = time.monotonic()
        with pytest.raises(Exception) as raised, engine.connect() as connection:
            private_postgres.hang()
            connection.execute(text("SELECT 1"))
        waited_s = time.monotonic() - began
    finally:
        private_postgres.resume()
    try:
        assert "closed" in str(raised.value) or "EOF" in str(raised.value), raised.value
        assert DEADLINE_S <= waited_s < BOUND_S
        assert store.list_sessions() == []
    finally:
        store.close()


def test_a_live_server_is_cut_off_too_when_a_statement_outlasts_the_deadline(
    private_postgres: PrivatePostgres
) -> None:
    store = open_bounded_store(private_postgres.url)
    try:
        began = time.monotonic()
        with pytest.raises(StoreUnavailable), store._write() as session:
            session.execute(text("SELECT pg_sleep(10)"))
        assert time.monotonic() - began < DEADLINE_S + 3.0
        assert store.list_sessions() == []
    finally:
        store.close()


def test_the_watchdog_thread_ends_once_its_store_is_idle_for_a_deadline(
    private_postgres: PrivatePostgres
) -> None:
    # The scheduler opens a store per sweep: a thread per store would pile up.
    watchdog = CallWatchdog(0.4)
    store = Store.from_url(private_postgres.url)
    try:
        with store._engine.connect() as connection:
            watchdog.arm("record", connection.connection.dbapi_connection)
            assert watchdog.watching
            watchdog.disarm("record")
    finally:
        store.close()
    deadline = time.monotonic() + 5
    while watchdog.watching and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not watchdog.watching
    assert watchdog.fired == 0


def test_without_a_deadline_the_pool_pings_as_before(private_postgres: PrivatePostgres) -> None:
    store = Store.from_url(private_postgres.url)
    try:
        assert store._engine.pool._pre_ping
        assert store.list_sessions() == []
    finally:
        store.close()


def test_only_a_connection_idle_for_a_while_is_pinged_and_a_stale_fresh_one_fails_once(
    private_postgres: PrivatePostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A job's store calls follow each other within milliseconds: a ping each would be a
    # round trip each, on a connection that answered moments ago.
    store = open_bounded_store(private_postgres.url)
    dialect = store._engine.dialect
    ping = dialect.do_ping
    pings: list[object] = []

    def counted_ping(dbapi_connection: Any) -> bool:
        pings.append(dbapi_connection)
        return ping(dbapi_connection)

    monkeypatch.setattr(dialect, "do_ping", counted_ping)
    try:
        store.list_sessions()  # a new connection
        store.list_sessions()  # checked in moments ago: no ping
        assert len(pings) == 1
        monkeypatch.setattr(call_deadline, "PING_AFTER_IDLE_S", 0.0)
        store.list_sessions()  # idle "long enough": pinged
        assert len(pings) == 2
        monkeypatch.setattr(call_deadline, "PING_AFTER_IDLE_S", 3600.0)
        # The server restarts right after a call: the next one, unpinged, fails as a
        # transient StoreUnavailable (a job is retried) and discards the connection...
        private_postgres.stop()
        private_postgres.start()
        with pytest.raises(StoreUnavailable):
            store.list_sessions()
        assert store.list_sessions() == []  # ... and the one after works on a new one
    finally:
        store.close()
