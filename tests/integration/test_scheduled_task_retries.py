"""The scan and gc tasks, run through Celery's own task machinery (eager), meet a
database that does not answer: each tries again with backoff, as often as its retry
policy says, and then fails with the store's typed error (a worker runs the same code;
the short chaos run meets it with a real PostgreSQL restart)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery.signals import task_retry

from db import StoreUnavailable
from scheduler.tasks import OUTAGE_RETRIES, collect_garbage, scan_due_sessions
from worker.broker.celery_app import app
from worker.settings.config import get_settings

pytestmark = pytest.mark.integration


@pytest.fixture
def unreachable_database(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Settings whose database refuses every connection (nothing listens on port 1)."""
    monkeypatch.setenv("COMPACTOR_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:1/x")
    monkeypatch.setenv("COMPACTOR_DB_CONNECT_TIMEOUT_S", "1")
    monkeypatch.setenv("COMPACTOR_RETRY_BACKOFF_MAX_S", "1")
    get_settings.cache_clear()
    eager = app.conf.task_always_eager
    app.conf.task_always_eager = True
    try:
        yield
    finally:
        app.conf.task_always_eager = eager
        get_settings.cache_clear()


@pytest.mark.parametrize("task", [collect_garbage, scan_due_sessions], ids=["gc", "scan"])
def test_a_scheduled_task_that_meets_an_outage_tries_again_then_fails_typed(
    unreachable_database: None, task: Any,
) -> None:
    retries: list[float] = []

    def count(request: Any = None, **_: Any) -> None:
        retries.append(request.retries)

    task_retry.connect(count)
    try:
        result = task.apply()
    finally:
        task_retry.disconnect(count)

    assert result.state == "FAILURE"
    assert isinstance(result.result, StoreUnavailable)
    assert len(retries) == OUTAGE_RETRIES
