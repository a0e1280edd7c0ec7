"""The nightly scan entrypoint under its Redis lock, its beat schedule, and the beat
process itself; PostgreSQL and SQLite, real Redis under a per-test key prefix."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pydantic
import pytest
from celery.schedules import crontab
from sqlalchemy import Engine
from structlog.testing import capture_logs

from db import Store
from scheduler.beat import (
    BEAT_SCHEDULE_FILENAME,
    GC_ENTRY_NAME,
    LEASE_SWEEP_ENTRY_NAME,
    POLL_BATCHES_ENTRY_NAME,
    RECONCILE_ENTRY_NAME,
    SCAN_ENTRY_NAME,
    beat_schedule,
    run_scheduled_scan,
    scan_crontab,
    scan_lock,
)
from scheduler.enqueue import ScanReport
from tests.support.raw_producer import read_queue
from tests.support.scheduling import Broker, isolated_broker, put_session
from tests.support.worker_process import WorkerProcess
from worker.broker.contract import (
    GC_TASK_NAME,
    POLL_BATCHES_TASK_NAME,
    RECONCILE_TASK_NAME,
    SCAN_TASK_NAME,
)
from worker.settings.config import Settings
from worker.shared_state.keys import RedisKeys

pytestmark = pytest.mark.integration

NOW = datetime(2025, 6, 1, 2, 0, tzinfo=UTC)
# trigger = 0.7 x 10,000 = 7,000 tokens; dirty above 3,500 appended since compaction.
CONTEXT_TOKENS = 10_000
DUE = [f"due-{index}" for index in range(12)]


@pytest.fixture
def broker(database_url: str) -> Iterator[Broker]:
    # One page per due session, so two concurrent scans interleave page by page.
    with isolated_broker(database_url, model_context_tokens=CONTEXT_TOKENS,
                         scan_batch_size=1) as broker:
        yield broker


@pytest.fixture
def fleet(store: Store, engine: Engine) -> list[str]:
    for index, session_id in enumerate(DUE):
        put_session(store, engine, session_id, 8_000 + index, now=NOW)
    put_session(store, engine, "small", 1_000, now=NOW)
    return DUE


def test_two_scans_started_at_once_enqueue_each_due_session_once(
    broker: Broker, fleet: list[str]
) -> None:
    start = threading.Barrier(2)
    reports: list[ScanReport | None] = []

    def scan() -> None:
        start.wait()
        reports.append(run_scheduled_scan(broker.settings, NOW))

    threads = [threading.Thread(target=scan) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    messages = read_queue(broker.client, broker.prefix, broker.queue)
    assert Counter(m.kwargs["session_id"] for m in messages) == Counter(fleet)
    assert sum(report.enqueued for report in reports if report is not None) == len(fleet)
    assert broker.client.exists(RedisKeys(broker.prefix).scan_lock()) == 0


def test_a_scan_while_another_holds_the_lock_enqueues_nothing_and_leaves_its_lock(
    broker: Broker, fleet: list[str]
) -> None:
    lock_key = RedisKeys(broker.prefix).scan_lock()
    broker.client.set(lock_key, "another-scanner", px=60_000)

    skipped = run_scheduled_scan(broker.settings, NOW)

    assert skipped is None
    assert read_queue(broker.client, broker.prefix, broker.queue) == []
    assert broker.client.get(lock_key) == b"another-scanner"
    broker.client.delete(lock_key)
    report = run_scheduled_scan(broker.settings, NOW)
    assert report is not None and report.enqueued == len(fleet)


def test_a_killed_scanners_lock_expires_after_its_ttl_and_the_next_scan_runs(
    broker: Broker, fleet: list[str]
) -> None:
    keys = RedisKeys(broker.prefix)
    # A scanner killed after taking the lock never frees it.
    assert scan_lock(broker.client, keys, ttl_s=3.0).acquire()
    assert 0 < broker.client.pttl(keys.scan_lock()) <= 3_000

    assert run_scheduled_scan(broker.settings, NOW) is None
    deadline = time.monotonic() + 10
    while broker.client.exists(keys.scan_lock()) and time.monotonic() < deadline:
        time.sleep(0.1)
    report = run_scheduled_scan(broker.settings, NOW)

    assert report is not None and report.enqueued == len(fleet)


def test_a_scan_whose_lock_was_taken_over_warns_and_leaves_the_new_owners_lock(
    broker: Broker, fleet: list[str]
) -> None:
    lock_key = RedisKeys(broker.prefix).scan_lock()

    def take_over(report: ScanReport) -> None:  # as if ours expired and another took it
        broker.client.set(lock_key, "another-scanner", px=60_000)

    with capture_logs() as logs:
        report = run_scheduled_scan(broker.settings, NOW, on_progress=take_over)

    assert report is not None and report.enqueued == len(fleet)
    lost = [log for log in logs if log["event"] == "scan.lock_lost"]
    assert len(lost) == len(fleet) - 1  # after every page but the first
    assert broker.client.get(lock_key) == b"another-scanner"


@pytest.mark.e2e
def test_the_scan_task_runs_in_a_real_worker_and_each_job_it_enqueues_is_consumed(
    broker: Broker, fleet: list[str], tmp_path: Path
) -> None:
    env = {"COMPACTOR_DATABASE_URL": str(broker.settings.database_url),
           "COMPACTOR_REDIS_KEY_PREFIX": broker.prefix, "COMPACTOR_QUEUE_NAME": broker.queue,
           "COMPACTOR_MODEL_CONTEXT_TOKENS": str(CONTEXT_TOKENS),
           "COMPACTOR_SUMMARIZER": "extractive"}
    with WorkerProcess(env, tmp_path / "worker.log", queue=broker.queue) as worker:
        # What beat sends at scan_cron (beat_schedule's options route it to this queue).
        broker.app.send_task(SCAN_TASK_NAME, queue=broker.queue)
        [finished] = worker.wait_for_events("scan.finished", 1)
        jobs = worker.wait_for_events("compaction.job", len(fleet))

    assert (finished["enqueued"], finished["stopped"]) == (len(fleet), "exhausted")
    assert sorted(job["session_id"] for job in jobs) == sorted(fleet)
    assert {job["trigger"] for job in jobs} == {"over_trigger"}


def test_the_nightly_schedule_sends_the_scan_at_scan_cron_utc_on_the_jobs_queue() -> None:
    settings = Settings(scan_cron="30 3 * * 1", queue_name="nightly")

    entry = beat_schedule(settings)[SCAN_ENTRY_NAME]

    assert entry["task"] == SCAN_TASK_NAME
    assert entry["schedule"] == crontab(minute=30, hour=3, day_of_week=1)
    assert entry["options"] == {"queue": "nightly"}
    assert scan_crontab("0 2 * * *") == crontab(minute=0, hour=2)


@pytest.mark.parametrize("expression", ["0 2 * *", "61 2 * * *", "0 2 * * * *", "nightly"])
def test_an_invalid_scan_cron_is_refused_with_the_expression_named(expression: str) -> None:
    with pytest.raises(ValueError, match="invalid scan_cron"):
        scan_crontab(expression)


def test_the_beat_process_starts_with_its_schedule_file_under_data_dir(tmp_path: Path) -> None:
    env = {**os.environ, "COMPACTOR_DATA_DIR": str(tmp_path / "state"),
           "COMPACTOR_LOG_FORMAT": "json", "PYTHONPATH": str(Path.cwd())}
    code = ("from scheduler.beat import start_beat; from worker.broker.celery_app import app; "
            "from worker.settings.config import get_settings; start_beat(app, get_settings())")
    beat = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and beat.poll() is None:
            if list((tmp_path / "state").glob(f"{BEAT_SCHEDULE_FILENAME}*")):
                break
            time.sleep(0.2)
        assert beat.poll() is None, beat.stdout.read().decode() if beat.stdout else ""
        assert list((tmp_path / "state").glob(f"{BEAT_SCHEDULE_FILENAME}*"))
    finally:
        beat.terminate()
        output, _ = beat.communicate(timeout=20)
    assert b"beat: Starting" in output


def test_garbage_collection_is_scheduled_only_when_gc_cron_is_set() -> None:
    assert GC_ENTRY_NAME not in beat_schedule(Settings())
    settings = Settings(gc_cron="15 4 * * 0", queue_name="nightly")

    entry = beat_schedule(settings)[GC_ENTRY_NAME]

    assert entry["task"] == GC_TASK_NAME
    assert entry["schedule"] == crontab(minute=15, hour=4, day_of_week=0)
    assert entry["options"] == {"queue": "nightly"}
    with pytest.raises(pydantic.ValidationError, match="a cron expression has 5 fields"):
        Settings(gc_cron="weekly")  # refused with the settings, before beat starts


def test_the_quick_lease_sweep_runs_every_heartbeat_while_the_reconciler_is_on() -> None:
    schedule = beat_schedule(Settings(queue_name="nightly"))

    sweep, full = schedule[LEASE_SWEEP_ENTRY_NAME], schedule[RECONCILE_ENTRY_NAME]
    assert (sweep["task"], full["task"]) == (RECONCILE_TASK_NAME, RECONCILE_TASK_NAME)
    assert (sweep["kwargs"], sweep["options"]) == ({"leases_only": True}, {"queue": "nightly"})
    assert sweep["schedule"] == timedelta(seconds=10)  # a third of the 30 s lease
    assert full["schedule"] == timedelta(seconds=300)
    assert LEASE_SWEEP_ENTRY_NAME not in beat_schedule(Settings(reconcile_interval_s=0))


def test_the_batch_poller_is_scheduled_only_in_batch_mode() -> None:
    assert POLL_BATCHES_ENTRY_NAME not in beat_schedule(Settings())
    settings = Settings(llm_mode="batch", batch_poll_interval_s=120, queue_name="nightly")

    entry = beat_schedule(settings)[POLL_BATCHES_ENTRY_NAME]

    assert entry["task"] == POLL_BATCHES_TASK_NAME == "compactor.poll_batches"
    assert entry["schedule"] == timedelta(seconds=120)
    assert entry["options"] == {"queue": "nightly"}
