"""The due-session scan and de-duplicated enqueueing, on PostgreSQL and SQLite, with real
Redis under a per-test key prefix (no worker consumes here)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
import structlog
import typer
from sqlalchemy import Engine, text
from typer.testing import CliRunner, Result

from db import DueCursor, DueWhy, MarkStatus, Store, create_db_engine
from db.scan import due_page_query
from scheduler import enqueue
from scheduler.cli.schedule import register
from scheduler.enqueue import CeleryPublisher, Publisher, QueuedJob, run_scan, trigger_sessions
from scheduler.publisher import RedisPublisher
from scheduler.selection import (
    DueSession,
    ScanPolicy,
    StopReason,
    iter_due_sessions,
    preview_scan,
)
from tests.support.raw_producer import read_queue
from tests.support.scheduling import Broker, isolated_broker, put_session, scan_takes, session_row
from worker.settings.config import get_settings

pytestmark = pytest.mark.integration

NOW = datetime(2025, 6, 1, 2, 0, tzinfo=UTC)
POLICY = ScanPolicy(trigger_tokens=1_000, dirty_ratio=0.5, tail_budget_tokens=100,
                    quiet_period_s=600, breaker_cooldown_s=3_600, marker_ttl_s=7_200,
                    batch_size=1_000, max_jobs=1_000)
MINUTE = timedelta(minutes=1)


@pytest.fixture
def broker(database_url: str) -> Iterator[Broker]:
    with isolated_broker(database_url) as broker:
        yield broker


def put_mixed_fleet(store: Store, engine: Engine) -> list[tuple[str, DueWhy]]:
    """Sessions of every kind; return the due ones in the order the scan must take them."""
    put: dict[str, Any] = dict(store=store, engine=engine, now=NOW)
    put_session(session_id="over-5000", projection_tokens=5_000, **put)
    put_session(session_id="over-3000", projection_tokens=3_000, **put)
    put_session(session_id="dirty-700", projection_tokens=900, since_tokens=700, compacted=True,
                **put)
    put_session(session_id="dirty-600", projection_tokens=800, since_tokens=600, compacted=True,
                **put)
    put_session(session_id="small", projection_tokens=400, **put)
    # Grown as much as dirty-700, but never compacted: due only over the trigger.
    put_session(session_id="never-compacted-900", projection_tokens=900, since_tokens=900,
                **put)
    put_session(session_id="at-trigger", projection_tokens=1_000, since_tokens=100, **put)
    put_session(session_id="clean-900", projection_tokens=900, since_tokens=100, **put)
    put_session(session_id="active", projection_tokens=4_000,
                last_appended_at=NOW - MINUTE, **put)
    put_session(session_id="quiet-again", projection_tokens=3_900,
                last_appended_at=NOW - 11 * MINUTE, **put)
    put_session(session_id="leased", projection_tokens=4_100, lease_owner="w",
                lease_expires_at=NOW + MINUTE, **put)
    put_session(session_id="lease-expired", projection_tokens=3_500, lease_owner="w",
                lease_expires_at=NOW - MINUTE, **put)
    put_session(session_id="breaker-open", projection_tokens=4_500, breaker_state="open",
                breaker_opened_at=NOW - MINUTE, **put)
    put_session(session_id="breaker-cooled", projection_tokens=4_200, breaker_state="open",
                breaker_opened_at=NOW - 2 * timedelta(hours=1), **put)
    put_session(session_id="trial-out", projection_tokens=4_300, breaker_state="half_open",
                breaker_opened_at=NOW - MINUTE, **put)
    put_session(session_id="queued", projection_tokens=4_400, queued_at=NOW - MINUTE,
                queued_job_id="job-fresh", **put)
    put_session(session_id="queued-stale", projection_tokens=3_700,
                queued_at=NOW - 3 * timedelta(hours=1), queued_job_id="job-lost", **put)
    over, dirty = DueWhy.OVER_TRIGGER, DueWhy.DIRTY
    return [("over-5000", over), ("breaker-cooled", over), ("quiet-again", over),
            ("queued-stale", over), ("lease-expired", over), ("over-3000", over),
            ("dirty-700", dirty), ("dirty-600", dirty)]


def test_selection_picks_exactly_the_due_sessions_most_to_gain_first(
    store: Store, engine: Engine
) -> None:
    expected = put_mixed_fleet(store, engine)

    due, stopped = scan_takes(store, POLICY, NOW)

    assert [(d.session_id, d.why) for d in due] == expected
    assert stopped is StopReason.EXHAUSTED
    assert due[0] == DueSession("over-5000", 5_000, 5_000, DueWhy.OVER_TRIGGER, 4_900)
    assert due[-1] == DueSession("dirty-600", 800, 600, DueWhy.DIRTY, 700)
    # A dirty session's job is forced, so it must hold more than the verbatim tail.
    long_tail = replace(POLICY, tail_budget_tokens=850)
    assert [d.session_id for d in iter_due_sessions(store, long_tail, NOW)
            if d.why is DueWhy.DIRTY] == ["dirty-700"]


def test_keyset_pages_of_two_return_each_due_session_once(store: Store, engine: Engine) -> None:
    put: dict[str, Any] = dict(store=store, engine=engine, now=NOW)
    # Equal projections and equal dirty figures: the id breaks ties across page edges.
    for index in range(7):
        put_session(session_id=f"over-{index}", projection_tokens=2_000 + 100 * (index // 3),
                    **put)
    for index in range(5):
        put_session(session_id=f"dirty-{index}", projection_tokens=700, since_tokens=600,
                    compacted=True, **put)
    put_session(session_id="not-due", projection_tokens=100, **put)
    small_pages = replace(POLICY, batch_size=2)

    paged = [d.session_id for d in iter_due_sessions(store, small_pages, NOW)]
    whole = [d.session_id for d in iter_due_sessions(store, POLICY, NOW)]

    assert paged == whole
    assert sorted(paged) == sorted({*(f"over-{i}" for i in range(7)),
                                    *(f"dirty-{i}" for i in range(5))})


def test_a_preview_counts_every_session_left_out_by_its_first_reason(
    store: Store, engine: Engine
) -> None:
    put_mixed_fleet(store, engine)
    # dirty-600 (800 tokens) holds no more than an 800-token tail; the cap leaves 5 out.
    policy = replace(POLICY, tail_budget_tokens=800, max_jobs=2)

    preview = preview_scan(store, policy, NOW)

    assert [d.session_id for d in preview.sessions] == ["over-5000", "breaker-cooled"]
    assert preview.stopped is StopReason.MAX_JOBS
    assert preview.left_out == {
        "under_trigger": 4,  # small, never-compacted-900, at-trigger, clean-900
        "quiet_period": 1, "leased": 1, "already_queued": 1,
        "breaker_open": 2,  # open and half-open (a trial is out), both cooling down
        "tail_only": 1, "max_jobs": 5,
    }
    everyone = preview_scan(store, POLICY, NOW)
    assert len(everyone.sessions) == 8 and everyone.stopped is StopReason.EXHAUSTED
    assert "max_jobs" not in everyone.left_out and "tail_only" not in everyone.left_out


def test_scan_stops_at_the_job_cap_and_at_the_token_budget(store: Store, engine: Engine) -> None:
    put_mixed_fleet(store, engine)
    capped = replace(POLICY, max_jobs=3)
    # over-5000 (4900) + breaker-cooled (4100) fit; quiet-again (3800) would pass 10000.
    budgeted = replace(POLICY, token_budget=10_000)

    by_cap, cap_stop = scan_takes(store, capped, NOW)
    by_limit, limit_stop = scan_takes(store, POLICY, NOW, limit=2)
    by_budget, budget_stop = scan_takes(store, budgeted, NOW)

    assert [d.session_id for d in by_cap] == ["over-5000", "breaker-cooled", "quiet-again"]
    assert cap_stop is StopReason.MAX_JOBS
    assert [d.session_id for d in by_limit] == ["over-5000", "breaker-cooled"]
    assert limit_stop is StopReason.MAX_JOBS
    assert [d.session_id for d in by_budget] == ["over-5000", "breaker-cooled"]
    assert budget_stop is StopReason.TOKEN_BUDGET
    assert sum(d.estimated_tokens for d in by_budget) == 9_000


def publisher_of(kind: str, broker: Broker) -> Publisher:
    if kind == "celery":
        return CeleryPublisher(broker.app, broker.queue)
    return RedisPublisher(broker.client, broker.prefix, broker.queue)


@pytest.mark.parametrize("kind", ["celery", "redis"])
def test_scan_marks_then_publishes_one_job_per_due_session(
    store: Store, engine: Engine, broker: Broker, kind: str
) -> None:
    expected = put_mixed_fleet(store, engine)
    publisher = publisher_of(kind, broker)

    report = run_scan(store, publisher, POLICY, NOW)

    messages = read_queue(broker.client, broker.prefix, broker.queue)
    assert report.enqueued == len(expected) == len(messages)
    assert (report.over_trigger, report.dirty, report.lost_race) == (6, 2, 0)
    assert [m.kwargs for m in messages] == [
        {"session_id": sid, "reason": why.value, "force": why is DueWhy.DIRTY}
        for sid, why in expected
    ]
    for message in messages:
        row = session_row(engine, message.kwargs["session_id"])
        assert (row.queued_job_id, row.queued_at) == (message.task_id, NOW)
    assert session_row(engine, "queued").queued_job_id == "job-fresh"


def test_two_scans_and_triggers_at_once_queue_exactly_one_job_per_session(
    store: Store, engine: Engine, broker: Broker
) -> None:
    expected = put_mixed_fleet(store, engine)
    due_ids = [sid for sid, _ in expected]
    publisher = CeleryPublisher(broker.app, broker.queue)
    one_per_page = replace(POLICY, batch_size=1)
    start = threading.Barrier(3)
    results: dict[str, Any] = {}

    def scan(name: str) -> None:
        start.wait()
        results[name] = run_scan(store, publisher, one_per_page, NOW)

    def trigger() -> None:
        start.wait()
        results["trigger"] = trigger_sessions(store, publisher, due_ids, reason="ops",
                                              force=True, now=NOW, marker_ttl_s=7_200)

    threads = [threading.Thread(target=scan, args=(n,)) for n in ("a", "b")]
    threads.append(threading.Thread(target=trigger))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    messages = read_queue(broker.client, broker.prefix, broker.queue)
    assert Counter(m.kwargs["session_id"] for m in messages) == Counter(due_ids)
    triggered = sum(r.status is MarkStatus.ENQUEUED for r in results["trigger"])
    assert results["a"].enqueued + results["b"].enqueued + triggered == len(due_ids)
    for message in messages:
        assert session_row(engine, message.kwargs["session_id"]).queued_job_id == message.task_id
    rescan = run_scan(store, publisher, POLICY, NOW)
    assert rescan.enqueued == 0
    assert len(read_queue(broker.client, broker.prefix, broker.queue)) == len(due_ids)


def test_a_session_marked_by_another_enqueuer_meanwhile_frees_its_share_of_the_cap(
    store: Store, engine: Engine, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    for session_id, tokens in (("a", 5_000), ("b", 4_000), ("c", 3_000), ("d", 2_000)):
        put_session(store, engine, session_id, tokens, now=NOW)
    publisher = CeleryPublisher(broker.app, broker.queue)
    read_due = iter_due_sessions

    def racing_reads(*args: Any) -> Iterator[DueSession]:
        for due in read_due(*args):
            if due.session_id == "c":  # the page is read, not yet marked: a trigger wins "a"
                trigger_sessions(store, publisher, ["a"], reason="ops", force=False,
                                 now=NOW, marker_ttl_s=7_200)
            yield due

    monkeypatch.setattr(enqueue, "iter_due_sessions", racing_reads)
    report = run_scan(store, publisher, replace(POLICY, batch_size=3, max_jobs=2), NOW)

    assert (report.enqueued, report.lost_race, report.stopped) == (2, 1, StopReason.MAX_JOBS)
    queued = [m.kwargs["session_id"] for m in read_queue(broker.client, broker.prefix,
                                                         broker.queue)]
    assert queued == ["a", "b", "c"]


def test_trigger_reports_enqueued_already_queued_and_unknown_sessions(
    store: Store, engine: Engine, broker: Broker
) -> None:
    put_session(store, engine, "small", 10, now=NOW)
    put_session(store, engine, "queued", 10, now=NOW, queued_at=NOW - MINUTE,
                queued_job_id="job-fresh")
    publisher = CeleryPublisher(broker.app, broker.queue)

    results = trigger_sessions(store, publisher, ["small", "queued", "nobody"],
                               reason="ops", force=True, now=NOW, marker_ttl_s=7_200)

    assert [(r.session_id, r.status) for r in results] == [
        ("small", MarkStatus.ENQUEUED), ("queued", MarkStatus.ALREADY_QUEUED),
        ("nobody", MarkStatus.UNKNOWN_SESSION)]
    assert results[1].job_id == "job-fresh" and results[2].job_id is None
    [message] = read_queue(broker.client, broker.prefix, broker.queue)
    assert message.task_id == results[0].job_id
    assert message.kwargs == {"session_id": "small", "reason": "ops", "force": True}


def test_markers_set_in_one_transaction_are_kept_together_or_not_at_all(
    store: Store, engine: Engine
) -> None:
    for session_id in ("a", "b", "c"):
        put_session(store, engine, session_id, 5_000, now=NOW)

    with pytest.raises(RuntimeError), store.queue_markers() as markers:
        assert markers.mark_many(["a", "b"], "page-", now=NOW, marker_ttl_s=7_200)
        raise RuntimeError("the scan died before its page committed")
    with store.queue_markers() as markers:
        marked = markers.mark("c", "job-c", now=NOW, marker_ttl_s=7_200)
        again = markers.mark("c", "job-other", now=NOW, marker_ttl_s=7_200)

    assert [session_row(engine, sid).queued_job_id for sid in ("a", "b")] == [None, None]
    assert (marked.status, again.status, again.job_id) == (
        MarkStatus.ENQUEUED, MarkStatus.ALREADY_QUEUED, "job-c")


def test_a_stale_marker_counts_as_a_lost_message_and_is_sent_again(
    store: Store, engine: Engine, broker: Broker
) -> None:
    put_session(store, engine, "lost", 5_000, now=NOW, queued_at=NOW - timedelta(hours=3),
                queued_job_id="job-lost")
    publisher = CeleryPublisher(broker.app, broker.queue)

    report = run_scan(store, publisher, POLICY, NOW)

    [message] = read_queue(broker.client, broker.prefix, broker.queue)
    assert report.enqueued == 1 and message.task_id != "job-lost"
    assert session_row(engine, "lost").queued_job_id == message.task_id
    # The late original ending clears nothing: the marker is the new job's.
    assert not store.clear_queue_marker("lost", "job-lost")
    assert store.clear_queue_marker("lost", message.task_id)
    row = session_row(engine, "lost")
    assert (row.queued_at, row.queued_job_id) == (None, None)


def test_a_scan_whose_cap_is_spent_at_a_page_end_reads_no_further_page(
    store: Store, engine: Engine
) -> None:
    for index in range(4):
        put_session(store, engine, f"over-{index}", 5_000 + index, now=NOW)
    pages_read: list[int] = []
    read_page = store.due_sessions_page

    def counting_page(*args: Any, **kwargs: Any) -> Any:
        page = read_page(*args, **kwargs)
        pages_read.append(len(page.sessions))
        return page

    store.due_sessions_page = counting_page  # type: ignore[method-assign]  # a probe

    class Discarding:
        def publish(self, jobs: Sequence[QueuedJob]) -> None:
            return

    report = run_scan(store, Discarding(), replace(POLICY, batch_size=2, max_jobs=2), NOW)

    assert (report.enqueued, report.stopped) == (2, StopReason.MAX_JOBS)
    assert pages_read == [2]


def test_a_page_the_broker_refuses_releases_the_markers_of_the_whole_page(
    store: Store, engine: Engine
) -> None:
    put_session(store, engine, "big", 5_000, now=NOW)
    put_session(store, engine, "bigger", 6_000, now=NOW)
    # Nothing listens on port 1: the page's one write fails.
    unreachable = redis.Redis(port=1, socket_connect_timeout=1)
    publisher = RedisPublisher(unreachable, "test-refused:", "compaction")

    with pytest.raises(redis.ConnectionError):
        run_scan(store, publisher, POLICY, NOW)

    assert [session_row(engine, sid).queued_job_id for sid in ("big", "bigger")] == [None, None]
    retry, _ = scan_takes(store, POLICY, NOW + MINUTE)
    assert [due.session_id for due in retry] == ["bigger", "big"]


def test_a_page_is_published_only_after_all_its_markers_are_written(
    store: Store, engine: Engine
) -> None:
    put_session(store, engine, "big", 5_000, now=NOW)
    put_session(store, engine, "bigger", 6_000, now=NOW)
    markers_when_published: list[list[str | None]] = []

    class MarkerReadingPublisher:
        def publish(self, jobs: Sequence[QueuedJob]) -> None:
            markers_when_published.append(
                [session_row(engine, job.kwargs["session_id"]).queued_job_id for job in jobs])

    run_scan(store, MarkerReadingPublisher(), POLICY, NOW)

    [markers] = markers_when_published
    assert len(markers) == 2 and None not in markers


def test_postgres_can_read_each_scan_page_by_an_index_range_without_sorting(
    migrated_postgres_url: str,
) -> None:
    engine = create_db_engine(migrated_postgres_url)
    indexes = {DueWhy.OVER_TRIGGER: "ix_sessions_projection_tokens_id",
               DueWhy.DIRTY: "ix_sessions_tokens_since_compaction_id"}
    try:
        for why, index in indexes.items():
            query = due_page_query(why, POLICY.criteria, NOW, limit=POLICY.batch_size,
                                   after=DueCursor(5_000, 42))
            compiled = query.compile(engine)
            with engine.begin() as conn:
                # A near-empty table is cheapest read whole (bench/scan_bench.py shows the
                # plan PostgreSQL picks at a million rows): here, ask whether the index fits.
                conn.execute(text("SET LOCAL enable_seqscan = off"))
                conn.execute(text("SET LOCAL enable_bitmapscan = off"))
                rows = conn.exec_driver_sql(f"EXPLAIN {compiled}", compiled.params)
                plan = "\n".join(row[0] for row in rows)
            assert f"Index Scan Backward using {index}" in plan, plan
            assert "Sort" not in plan, plan
            assert "ROW(" in plan.split("Index Cond:")[1].splitlines()[0], plan
    finally:
        engine.dispose()


def run_cli(broker: Broker, *args: str) -> Result:
    """Run a scheduling command with this test's database, Redis prefix and queue."""
    cli = typer.Typer()
    register(cli)
    env = {"COMPACTOR_DATABASE_URL": str(broker.settings.database_url),
           "COMPACTOR_REDIS_KEY_PREFIX": broker.prefix,
           "COMPACTOR_QUEUE_NAME": broker.queue,
           # trigger = 0.7 x 10,000 = 7,000 tokens; dirty above 3,500.
           "COMPACTOR_MODEL_CONTEXT_TOKENS": "10000",
           "COMPACTOR_TAIL_BUDGET_TOKENS": "500",
           "COMPACTOR_LOG_FORMAT": "json"}
    get_settings.cache_clear()  # the commands must read this env, not a cached one
    try:
        return CliRunner().invoke(cli, list(args), env=env)
    finally:
        get_settings.cache_clear()
        # The command pointed structlog at the runner's stderr, which is closed now.
        structlog.reset_defaults()


def test_scan_dry_run_lists_the_due_sessions_in_order_and_enqueues_nothing(
    store: Store, engine: Engine, broker: Broker
) -> None:
    now = datetime.now(UTC)
    put_session(store, engine, "big", 9_000, now=now)
    put_session(store, engine, "bigger", 12_000, now=now)
    put_session(store, engine, "dirty", 6_000, now=now, since_tokens=4_000,
                compacted=True)
    put_session(store, engine, "small", 1_000, now=now)

    result = run_cli(broker, "scan", "--dry-run", "--json")

    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert [(s["session_id"], s["why"], s["estimated_tokens"]) for s in shown["sessions"]] == [
        ("bigger", "over_trigger", 11_500), ("big", "over_trigger", 8_500),
        ("dirty", "dirty", 5_500)]
    assert (shown["count"], shown["stopped"]) == (3, "exhausted")
    assert read_queue(broker.client, broker.prefix, broker.queue) == []
    table = run_cli(broker, "scan", "--dry-run", "--limit", "1")
    assert "bigger" in table.stdout and "big " not in table.stdout
    assert "stopped: max_jobs" in table.stdout


def test_a_dry_run_that_finds_nothing_says_why_each_session_was_left_out(
    store: Store, engine: Engine, broker: Broker
) -> None:
    now = datetime.now(UTC)
    put_session(store, engine, "busy", 9_000, now=now, last_appended_at=now)
    put_session(store, engine, "grown-never-compacted", 6_000, now=now, since_tokens=6_000)
    put_session(store, engine, "failing", 9_000, now=now, breaker_state="open",
                breaker_opened_at=now)

    shown = json.loads(run_cli(broker, "scan", "--dry-run", "--json").stdout)
    table = run_cli(broker, "scan", "--dry-run")

    assert shown["count"] == 0
    assert shown["left_out"] == {"under_trigger": 1, "quiet_period": 1, "breaker_open": 1}
    assert table.exit_code == 0, table.output
    assert table.stdout.splitlines()[-2:] == [
        "0 sessions, 0 estimated summarizer tokens; stopped: exhausted",
        "left out: 1 under_trigger, 1 quiet_period, 1 breaker_open"]


def test_scan_and_trigger_commands_enqueue_once_and_report_per_session(
    store: Store, engine: Engine, broker: Broker
) -> None:
    now = datetime.now(UTC)
    put_session(store, engine, "big", 9_000, now=now)
    put_session(store, engine, "small", 1_000, now=now)

    scanned = run_cli(broker, "scan", "--json")
    triggered = run_cli(broker, "trigger", "big", "small", "nobody", "--reason", "ops",
                        "--json")

    assert scanned.exit_code == 0, scanned.output
    assert json.loads(scanned.stdout)["enqueued"] == 1
    assert triggered.exit_code == 3, triggered.output
    statuses = {r["session_id"]: r["status"] for r in json.loads(triggered.stdout)}
    assert statuses == {"big": "already_queued", "small": "enqueued",
                        "nobody": "unknown_session"}
    queued = read_queue(broker.client, broker.prefix, broker.queue)
    assert [(m.kwargs["session_id"], m.kwargs["reason"]) for m in queued] == [
        ("big", "over_trigger"), ("small", "ops")]
