"""Hung dependencies time out: the PostgreSQL URL carries libpq's connect timeout, TCP
keepalives and a statement timeout from the settings, unless the operator's URL sets
them; the broker and Redis clients get socket timeouts and keepalive; a job past its
soft time limit ends with a record of its own."""

from __future__ import annotations

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from pydantic import ValidationError
from sqlalchemy.engine import make_url

from worker.broker.celery_app import create_app
from worker.errors import BreakerScope, JobTimedOut, to_job_error
from worker.settings.config import Settings


def test_a_postgresql_url_gets_the_timeouts_of_the_settings() -> None:
    settings = Settings(database_url="postgresql+psycopg://u:p@h/db", db_connect_timeout_s=7,
                        db_statement_timeout_s=90, db_keepalives_idle_s=20)
    query = make_url(settings.effective_database_url).query
    assert query == {"connect_timeout": "7", "keepalives": "1", "keepalives_idle": "20",
                     "keepalives_interval": "10", "keepalives_count": "3",
                     "options": "-c statement_timeout=90000"}
    assert make_url(settings.effective_database_url).password == "p"


def test_behind_a_transaction_pooler_the_statement_timeout_is_the_engines_not_a_startup_option(
) -> None:
    settings = Settings(database_url="postgresql+psycopg://u:p@h:6432/db", db_pooler="transaction",
                        db_statement_timeout_s=90)
    query = make_url(settings.effective_database_url).query
    assert "options" not in query
    assert (query["compactor_pooler"], query["compactor_statement_timeout_ms"]) == \
        ("transaction", "90000")
    marked = Settings(database_url="postgresql://u@h:6432/db?compactor_pooler=transaction")
    assert "options" not in make_url(marked.effective_database_url).query
    with pytest.raises(ValidationError, match="must not set options"):
        Settings(database_url="postgresql://u@h/db?options=-c%20x%3D1", db_pooler="transaction")


def test_the_operators_own_values_win_and_zero_means_no_statement_timeout() -> None:
    settings = Settings(database_url="postgresql://u@h/db?connect_timeout=3&options=-c%20x%3D1",
                        db_statement_timeout_s=0)
    query = make_url(settings.effective_database_url).query
    assert (query["connect_timeout"], query["options"]) == ("3", "-c x=1")
    bare = Settings(database_url="postgresql://u@h/db", db_statement_timeout_s=0)
    assert "options" not in make_url(bare.effective_database_url).query


def test_the_store_call_deadline_exceeds_the_statement_timeout_and_fits_the_soft_limit(
) -> None:
    with pytest.raises(ValidationError, match="must exceed COMPACTOR_DB_STATEMENT"):
        Settings(db_statement_timeout_s=300, db_call_timeout_s=300)
    with pytest.raises(ValidationError, match="below COMPACTOR_TASK_SOFT_TIME_LIMIT_S"):
        Settings(db_call_timeout_s=895, db_connect_timeout_s=5, task_soft_time_limit_s=1_800)
    # No statement timeout: any deadline that fits the soft limit.
    assert Settings(db_statement_timeout_s=0, db_call_timeout_s=30).db_call_timeout_s == 30


def test_sqlite_urls_are_left_alone() -> None:
    url = "sqlite:////tmp/x.db"
    assert Settings(database_url=url).effective_database_url == url


def test_the_broker_connection_times_out_and_keeps_alive() -> None:
    options = create_app(Settings(redis_socket_timeout_s=12)).conf.broker_transport_options
    assert (options["socket_timeout"], options["socket_connect_timeout"],
            options["socket_keepalive"]) == (12, 12, True)


def test_a_job_past_its_soft_time_limit_ends_as_a_recorded_time_limit_failure() -> None:
    error = to_job_error(SoftTimeLimitExceeded())
    assert (type(error), error.outcome.value, error.reason) == (JobTimedOut, "failed",
                                                                "time_limit")
    assert error.counts_on is BreakerScope.SESSION and not error.retryable


def test_a_lost_broker_connection_lets_jobs_finish_and_a_cold_shutdown_is_soft_first(
) -> None:
    conf = create_app(Settings(worker_soft_shutdown_s=45)).conf
    assert conf.worker_cancel_long_running_tasks_on_connection_loss is False
    assert (conf.worker_soft_shutdown_timeout, conf.worker_enable_soft_shutdown_on_idle) == (
        45, True)
    off = create_app(Settings(worker_soft_shutdown_s=0)).conf
    assert (off.worker_soft_shutdown_timeout, off.worker_enable_soft_shutdown_on_idle) == (
        0, False)
