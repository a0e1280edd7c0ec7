"""An infrastructure fault is never the session's: every class of database error that is
not about the data a call touched becomes ``StoreUnavailable`` (a job's outcome
``store_unavailable``, retried, never counted on the session's breaker), each driven here
by the real server's (or PgBouncer's) own error; an error about the data stays a plain
``StoreError``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from sqlalchemy import Connection, Engine, text

from db import PoolerRefusedStartup, StoreError, StoreUnavailable, create_db_engine
from db.call_deadline import shut_down
from db.errors import translate_errors
from tests.support.databases import create_postgres_database, drop_postgres_database
from tests.support.pgbouncer import PgBouncer
from worker.errors import BreakerScope, InternalError, to_job_error

pytestmark = pytest.mark.integration

Step = Callable[[Connection], object]


@pytest.fixture(scope="module")
def scratch_url() -> Iterator[str]:
    """A database of its own holding one two-row table (not the store's schema)."""
    url = create_postgres_database()
    engine = create_db_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("CREATE TABLE probe (id int PRIMARY KEY, v int)"))
            connection.execute(text("INSERT INTO probe VALUES (1, 0), (2, 0)"))
        yield url
    finally:
        engine.dispose()
        drop_postgres_database(url)


@pytest.fixture
def engine(scratch_url: str) -> Iterator[Engine]:
    engine = create_db_engine(scratch_url)
    yield engine
    engine.dispose()


def raised_by(engine: Engine, step: Step) -> StoreError:
    """The store error ``step`` raises in a transaction of ``engine``."""
    with pytest.raises(StoreError) as caught, translate_errors(), engine.begin() as connection:
        step(connection)
    return caught.value


def assert_infrastructure(error: StoreError, sqlstate: str | None) -> None:
    """``error`` is StoreUnavailable from ``sqlstate``, and a job reports it as
    ``store_unavailable``: retried, not on the session's breaker."""
    assert isinstance(error, StoreUnavailable), error
    assert getattr(getattr(error.__cause__, "orig", None), "sqlstate", None) == sqlstate, error
    job_error = to_job_error(error)
    assert (job_error.reason, job_error.retryable) == ("store_unavailable", True)
    assert job_error.counts_on is not BreakerScope.SESSION


def in_a_while(action: Callable[[], None], delay_s: float = 0.3) -> threading.Thread:
    def run() -> None:
        time.sleep(delay_s)
        action()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def own_pid(connection: Connection) -> int:
    pid: int = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
    return pid


def test_a_backend_terminated_by_an_administrator_is_unavailable(engine: Engine,
                                                                 scratch_url: str) -> None:
    admin = create_db_engine(scratch_url)

    def terminate(connection: Connection) -> None:
        pid = own_pid(connection)
        with admin.connect() as other:
            thread = in_a_while(lambda: other.execute(
                text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).close())
            try:
                connection.execute(text("SELECT pg_sleep(5)"))
            finally:
                thread.join()

    try:
        assert_infrastructure(raised_by(engine, terminate), "57P01")
    finally:
        admin.dispose()


def test_a_connection_lost_mid_statement_is_unavailable(engine: Engine) -> None:
    def lose(connection: Connection) -> None:
        driver = connection.connection.dbapi_connection
        thread = in_a_while(lambda: shut_down(driver))
        try:
            connection.execute(text("SELECT pg_sleep(5)"))
        finally:
            thread.join()

    assert_infrastructure(raised_by(engine, lose), None)


def test_a_serialization_failure_between_two_transactions_is_unavailable(
    engine: Engine,
) -> None:
    def lose_the_race(connection: Connection) -> None:
        connection.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        connection.execute(text("SELECT v FROM probe WHERE id = 1")).all()
        with engine.begin() as other:
            other.execute(text("UPDATE probe SET v = v + 1 WHERE id = 1"))
        connection.execute(text("UPDATE probe SET v = v + 1 WHERE id = 1"))

    assert_infrastructure(raised_by(engine, lose_the_race), "40001")


def test_a_deadlock_between_two_transactions_is_unavailable(engine: Engine) -> None:
    both_hold_one = threading.Barrier(2, timeout=10)
    errors: list[StoreError] = []

    def lock(first: int, second: int) -> None:
        try:
            with translate_errors(), engine.begin() as connection:
                connection.execute(text("SELECT v FROM probe WHERE id = :id FOR UPDATE"),
                                   {"id": first})
                both_hold_one.wait()
                connection.execute(text("SELECT v FROM probe WHERE id = :id FOR UPDATE"),
                                   {"id": second})
        except StoreError as error:
            errors.append(error)

    threads = [threading.Thread(target=lock, args=pair) for pair in ((1, 2), (2, 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    [error] = errors  # the server breaks the cycle by failing one of the two
    assert_infrastructure(error, "40P01")


def test_a_prepared_statement_the_server_connection_lacks_is_unavailable(
    engine: Engine,
) -> None:
    def execute_deallocated(connection: Connection) -> None:
        connection.exec_driver_sql("PREPARE compactor_probe AS SELECT v FROM probe")
        connection.exec_driver_sql("DEALLOCATE compactor_probe")
        connection.exec_driver_sql("EXECUTE compactor_probe")

    assert_infrastructure(raised_by(engine, execute_deallocated), "26000")


def test_a_prepared_statement_another_client_left_on_the_connection_is_unavailable(
    engine: Engine,
) -> None:
    def prepare_twice(connection: Connection) -> None:
        connection.exec_driver_sql("PREPARE compactor_probe AS SELECT v FROM probe")
        connection.exec_driver_sql("PREPARE compactor_probe AS SELECT v FROM probe")

    assert_infrastructure(raised_by(engine, prepare_twice), "42P05")


def test_pgbouncer_dropping_its_connections_mid_statement_is_unavailable(
    pgbouncer: PgBouncer, scratch_url: str,
) -> None:
    pooled = create_db_engine(pgbouncer.url_for(scratch_url))
    database = pooled.url.database

    def kill_database() -> None:
        with psycopg.connect(host="127.0.0.1", port=pgbouncer.port, user="postgres",
                             dbname="pgbouncer", autocommit=True) as console:
            console.execute(f"KILL {database}")
            console.execute(f"RESUME {database}")

    def killed(connection: Connection) -> None:
        thread = in_a_while(kill_database)
        try:
            connection.execute(text("SELECT pg_sleep(5)"))
        finally:
            thread.join()

    try:
        error = raised_by(pooled, killed)
        assert "database removed" in str(error)
        assert_infrastructure(error, "08P01")
    finally:
        pooled.dispose()


def test_pgbouncer_refusing_a_startup_option_is_unavailable_and_names_the_setting(
    pgbouncer: PgBouncer, scratch_url: str,
) -> None:
    direct_style = pgbouncer.url_for(scratch_url).split("?")[0] + \
        "?options=-c%20statement_timeout%3D1000"
    refusing = create_db_engine(direct_style)
    try:
        error = raised_by(refusing, lambda connection: connection.execute(text("SELECT 1")))
    finally:
        refusing.dispose()

    assert "unsupported startup parameter" in str(error)
    assert "COMPACTOR_DB_POOLER=transaction" in str(error)
    assert isinstance(error, PoolerRefusedStartup)  # a StoreUnavailable the checks refuse


@pytest.mark.parametrize(("statement", "sqlstate"), [
    ("SELECT 1 / 0", "22012"),
    ("INSERT INTO probe VALUES (1, 0)", "23505"),
    ("SELECT no_such_column FROM probe", "42703"),
])
def test_an_error_about_the_data_stays_the_calls_own(engine: Engine, statement: str,
                                                    sqlstate: str) -> None:
    error = raised_by(engine, lambda connection: connection.execute(text(statement)))

    assert not isinstance(error, StoreUnavailable), error
    assert getattr(getattr(error.__cause__, "orig", None), "sqlstate", None) == sqlstate
    assert isinstance(to_job_error(error), InternalError)
