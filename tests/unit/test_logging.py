"""Logging configuration: our events and other libraries' records leave as one JSON object
per line on stderr, with their levels (Celery's records of a task received or succeeded at
DEBUG); console lines on request; configured twice, one handler."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from celery.app.trace import LOG_FAILURE, LOG_RECEIVED, LOG_RETRY, LOG_SUCCESS
from celery.app.trace import info as trace_info
from structlog.contextvars import bind_contextvars, clear_contextvars

from tests.support.logs import preserved_logging
from worker.broker.celery_app import ROUTINE_TASK_RECORDS, configure_process_logging
from worker.logging import JOB_EVENT, configure_logging, get_logger
from worker.scrub import remember_secrets


@pytest.fixture(autouse=True)
def restored_logging() -> Iterator[None]:
    with preserved_logging():
        yield
    clear_contextvars()


def stderr_lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """Every stderr line, each parsed as one JSON object (fails on any other line)."""
    return [json.loads(line) for line in capsys.readouterr().err.splitlines()]


def test_our_events_and_foreign_records_are_json_lines_with_their_own_levels(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("json", "INFO")
    bind_contextvars(task_id="t-1", session_id="s-1")

    get_logger().info(JOB_EVENT, outcome="compacted")
    logging.getLogger("celery.worker.consumer").warning("lost connection to %s", "redis")
    logging.getLogger("httpx2").info("HTTP Request: POST /v1/chat/completions")
    logging.getLogger("alembic.runtime.migration").debug("below the configured level")

    ours, celery, http = stderr_lines(capsys)
    assert (ours["event"], ours["level"], ours["logger"], ours["outcome"]) == \
        (JOB_EVENT, "info", "compactor", "compacted")
    assert (celery["event"], celery["level"]) == ("lost connection to redis", "warning")
    assert (http["logger"], http["session_id"], http["task_id"]) == ("httpx2", "s-1", "t-1")
    assert all(line["timestamp"].endswith("Z") for line in (ours, celery, http))


class RecordList(logging.Handler):
    """Keeps the records it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_records_gather_no_caller_thread_or_process_which_no_line_shows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("json")
    recorder = RecordList()
    logging.getLogger().addHandler(recorder)

    get_logger().info(JOB_EVENT, outcome="compacted")
    logging.getLogger("celery.app.trace").warning("Task %s retry", "t-1")

    assert [(r.funcName, r.thread, r.process, r.processName) for r in recorder.records] == \
        [("(unknown function)", None, None, None)] * 2
    assert [sorted(line) for line in stderr_lines(capsys)] == [
        ["event", "level", "logger", "outcome", "timestamp"],
        ["event", "level", "logger", "timestamp"]]


def test_the_prefork_pools_own_logger_is_json_too_though_it_does_not_propagate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("json")
    pool = logging.getLogger("multiprocessing")
    pool.propagate = False  # as billiard leaves it

    pool.error("Process %r pid:%r exited with %r", "ForkPoolWorker-1", 42, "signal 9")

    [line] = stderr_lines(capsys)
    assert (line["logger"], line["level"]) == ("multiprocessing", "error")


def test_a_traceback_stays_inside_its_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("celery.app.trace").exception("Task failed")

    [line] = stderr_lines(capsys)
    assert line["level"] == "error" and "RuntimeError: boom" in line["exception"]


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_every_record_is_scrubbed_its_arguments_fields_and_traceback_included(
    log_format: str, capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging(log_format, "DEBUG")
    remember_secrets(["configured-key-0042"])
    try:
        url = "http://u:url-pass-77@llm/v1/chat/completions?api-key=query-key-99"
        logging.getLogger("httpx2").info('HTTP Request: POST %s "%s"', url, "200 OK")
        get_logger().warning("check.failed", detail=f"{url} refused configured-key-0042")
        try:
            raise ConnectionError(f"cannot reach {url}")
        except ConnectionError:
            logging.getLogger("kombu").exception("connection lost")
    finally:
        remember_secrets([])

    err = capsys.readouterr().err
    assert [err.count(secret) for secret in ("url-pass-77", "query-key-99",
                                             "configured-key-0042")] == [0, 0, 0]
    assert err.count("http://u:***@llm/v1/chat/completions?api-key=***") == 3
    assert "ConnectionError: cannot reach" in err


def test_console_lines_show_control_characters_escaped_and_keep_their_own_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("console")

    get_logger().warning("scan.enqueued", session_id="abc\x1b[2J\u202e")
    try:
        raise ValueError("bad id abc\x1b[2J")
    except ValueError:
        logging.getLogger("celery").exception("job failed for %s", "abc\x9b31m")

    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x9b" not in err and "\u202e" not in err
    assert "abc\\x1b[2J\\u202e" in err and "abc\\x9b31m" in err
    assert "ValueError: bad id abc\\x1b[2J" in err.splitlines()


def test_the_console_format_renders_readable_lines(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("console")

    get_logger().warning("worker.runtime_deferred", error_class="OperationalError")

    [line] = capsys.readouterr().err.splitlines()
    assert "worker.runtime_deferred" in line and "error_class=OperationalError" in line
    with pytest.raises(ValueError):
        json.loads(line)


def test_configuring_again_replaces_its_handler_instead_of_doubling_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("console")
    configure_logging("json", "WARNING")

    get_logger().info("scan.finished")
    get_logger().warning("scan.lock_lost")

    assert [line["event"] for line in stderr_lines(capsys)] == ["scan.lock_lost"]


@pytest.fixture
def celery_task_loggers() -> Iterator[None]:
    """Restore the filters and levels the worker's logging sets on Celery's loggers."""
    loggers = [logging.getLogger(name) for name in ("celery", *ROUTINE_TASK_RECORDS)]
    saved = [(list(logger.filters), logger.level) for logger in loggers]
    yield
    for logger, (filters, level) in zip(loggers, saved, strict=True):
        logger.filters[:] = filters
        logger.setLevel(level)


def log_task_records(name: str) -> None:
    """The records Celery writes for a task received, retried, succeeded and failed."""
    context = {"id": "t-1", "name": name, "args": "()", "kwargs": "{}", "eta": None,
               "runtime": 0.01, "return_value": "None", "exc": "boom",
               "description": "raised unexpected"}
    if logging.getLogger("celery.worker.strategy").isEnabledFor(logging.INFO):
        logging.getLogger("celery.worker.strategy").info(LOG_RECEIVED, context)
    trace_info(LOG_RETRY, context)
    trace_info(LOG_SUCCESS, context)
    logging.getLogger("celery.app.trace").log(logging.ERROR, LOG_FAILURE, context)


@pytest.mark.parametrize(("loglevel", "expected"), [
    ("INFO", [("retry", "info"), ("raised", "error")]),
    ("DEBUG", [("received", "debug"), ("retry", "info"), ("succeeded", "debug"),
               ("raised", "error")]),
])
def test_celerys_received_and_succeeded_records_are_debug_and_failures_keep_their_level(
    loglevel: str, expected: list[tuple[str, str]], celery_task_loggers: None,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COMPACTOR_LOG_FORMAT", "json")
    monkeypatch.setenv("COMPACTOR_LOG_LEVEL", loglevel)
    configure_process_logging(loglevel)
    configure_process_logging(loglevel)  # idempotent: one filter each

    log_task_records("compactor.compact_session")

    lines = [line for line in stderr_lines(capsys) if line["logger"].startswith("celery")]
    assert [(line["event"].split()[2].rstrip(":"), line["level"]) for line in lines] == expected
