"""The worker's main process records the attempt of a pool child that died running it,
against real Redis and PostgreSQL/SQLite: the attempt the child entered in the journal
gets its ``worker_lost`` run and event once, unless it recorded itself before dying."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine
from structlog.testing import capture_logs

from db import NewRun, Store
from tests.support.scheduling import Broker, isolated_broker, put_session
from worker.broker.lost_delivery import record_lost_delivery
from worker.shared_state.attempt_journal import AttemptJournal
from worker.shared_state.deliveries import DeliveryCounter
from worker.shared_state.keys import RedisKeys

pytestmark = pytest.mark.integration


@pytest.fixture
def broker(database_url: str) -> Iterator[Broker]:
    with isolated_broker(database_url) as broker:
        yield broker


def _journal(broker: Broker) -> AttemptJournal:
    return AttemptJournal(broker.client, RedisKeys(broker.prefix))


def _counter(broker: Broker) -> DeliveryCounter:
    return DeliveryCounter(broker.client, RedisKeys(broker.prefix), ttl_s=60)


def _lose(broker: Broker, task_id: str, *, retries: int = 0,
          accepted: datetime | None = None) -> list[MutableMapping[str, Any]]:
    """The main process's record of the task's lost delivery; the events it logged."""
    with capture_logs() as logs:
        record_lost_delivery(broker.settings, task_id, {"session_id": "s", "reason": "x"},
                             retries=retries,
                             accepted_at=accepted.timestamp() if accepted else None)
    return [e for e in logs if e["event"] == "compaction.job"]


def test_a_dead_child_s_journalled_attempt_gets_its_run_and_event_once(
    store: Store, engine: Engine, broker: Broker
) -> None:
    now = datetime.now(UTC)
    put_session(store, engine, "s", 8_000, now=now)
    journal = _journal(broker)
    journal.open("task-1", "s", 1, now - timedelta(seconds=9), _counter(broker))
    opened = journal.open("task-1", "s", 1, now - timedelta(seconds=5), _counter(broker))

    [event] = _lose(broker, "task-1")

    assert (event["outcome"], event["reason"], event["attempt"], event["will_retry"]) == (
        "failed", "worker_lost", 2, True)
    assert (event["session_id"], event["run_recorded"]) == ("s", True)
    [run] = store.runs(session_id="s")
    assert (run.task_id, run.attempt, run.outcome, run.failure_class) == (
        "task-1", 2, "failed", "AttemptLost")
    assert run.started_at == now - timedelta(seconds=5)  # when the child entered it
    assert not journal.is_open(opened.entry)


def test_an_attempt_that_recorded_itself_before_its_child_died_is_not_recorded_again(
    store: Store, engine: Engine, broker: Broker
) -> None:
    now = datetime.now(UTC)
    put_session(store, engine, "s", 8_000, now=now)
    journal = _journal(broker)
    opened = journal.open("task-1", "s", 1, now - timedelta(seconds=5), _counter(broker))
    store.record_run(NewRun(
        session_id="s", task_id="task-1", attempt=1, reason="x", outcome="compacted",
        failure_class=None, failure_message=None, figures={"outcome_reason": "over_trigger"},
        revision_id=None, started_at=now - timedelta(seconds=4), finished_at=now))

    assert _lose(broker, "task-1") == []

    assert [r.outcome for r in store.runs(session_id="s")] == ["compacted"]
    assert journal.is_open(opened.entry)  # its event is the reconciler's to report


def test_a_child_that_died_before_entering_its_attempt_is_recorded_from_celery_s_count(
    store: Store, engine: Engine, broker: Broker
) -> None:
    now = datetime.now(UTC)
    put_session(store, engine, "s", 8_000, now=now)

    [event] = _lose(broker, "task-1", retries=2, accepted=now - timedelta(seconds=3))

    [run] = store.runs(session_id="s")
    assert (event["attempt"], run.attempt, run.task_id) == (3, 3, "task-1")
    assert abs(run.started_at - (now - timedelta(seconds=3))) < timedelta(milliseconds=1)
