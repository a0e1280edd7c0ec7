"""The reconciler against real Redis and PostgreSQL/SQLite: markers whose job Redis lost
are re-sent or cleared, dead leases released with their attempt recorded, and live jobs
(queued, delivered, running) left alone; ``trigger --force`` replaces a lost job's marker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, update
from structlog.testing import capture_logs

from db import MarkStatus, NewRun, Store
from db.models import SessionRow
from scheduler.enqueue import run_scan, trigger_sessions
from scheduler.journal_replay import write_unrecorded_runs
from scheduler.publisher import RedisPublisher
from scheduler.reconcile import (
    RECONCILE_EVENT,
    BrokerJobs,
    Repair,
    is_job_lost,
    reconcile,
    reconcile_policy,
    sweep_dead_leases,
)
from scheduler.selection import ScanPolicy
from tests.support.raw_producer import build_raw_message, read_queue
from tests.support.scheduling import Broker, isolated_broker, put_session, session_row
from worker.shared_state.attempt_journal import AttemptJournal
from worker.shared_state.deliveries import DeliveryCounter
from worker.shared_state.keys import RedisKeys

pytestmark = pytest.mark.integration

NOW = datetime(2025, 6, 1, 2, 0, tzinfo=UTC)
LATER = NOW + timedelta(minutes=5)  # past the 60 s grace
CONTEXT_TOKENS = 10_000  # trigger 7,000 tokens; dirty above 3,500 appended


@pytest.fixture
def broker(database_url: str) -> Iterator[Broker]:
    with isolated_broker(database_url, model_context_tokens=CONTEXT_TOKENS,
                         quiet_period_s=0, tail_budget_tokens=500) as broker:
        yield broker


def _jobs(broker: Broker) -> BrokerJobs:
    return BrokerJobs(broker.client, broker.prefix, broker.queue)


def _publisher(broker: Broker) -> RedisPublisher:
    return RedisPublisher(broker.client, broker.prefix, broker.queue)


def _scan(store: Store, broker: Broker) -> dict[str, str]:
    """Scan at NOW; return {session_id: job_id} of the messages it queued."""
    settings = broker.settings
    policy = ScanPolicy(trigger_tokens=settings.trigger_tokens, dirty_ratio=0.5,
                        tail_budget_tokens=500, quiet_period_s=0, breaker_cooldown_s=3600,
                        marker_ttl_s=7200, batch_size=100, max_jobs=100)
    run_scan(store, _publisher(broker), policy, NOW)
    return {m.kwargs["session_id"]: m.task_id
            for m in read_queue(broker.client, broker.prefix, broker.queue)}


def _reconcile(store: Store, broker: Broker, *, now: datetime = LATER,
               dry_run: bool = False) -> list[Repair]:
    return reconcile(store, _jobs(broker), _publisher(broker),
                     reconcile_policy(broker.settings), now, dry_run=dry_run)


def _lose_queue(broker: Broker) -> None:
    broker.client.delete(f"{broker.prefix}{broker.queue}")


def test_jobs_redis_lost_are_resent_when_due_and_cleared_when_not(
    store: Store, engine: Engine, broker: Broker
) -> None:
    put_session(store, engine, "over", 8_000, now=NOW)
    put_session(store, engine, "dirty", 5_000, now=NOW, since_tokens=4_000, compacted=True)
    put_session(store, engine, "compacted-since", 8_000, now=NOW)
    queued = _scan(store, broker)
    assert set(queued) == {"over", "dirty", "compacted-since"}
    _lose_queue(broker)
    # Compacted by some other path meanwhile: no longer due, so its marker is just cleared.
    with engine.begin() as conn:
        conn.execute(update(SessionRow).where(SessionRow.session_id == "compacted-since")
                     .values(projection_tokens=1_000, tokens_since_compaction=0))

    with capture_logs() as logs:
        repairs = _reconcile(store, broker)

    by_session = {r.session_id: r for r in repairs}
    assert {s: r.action for s, r in by_session.items()} == {
        "over": "requeued", "dirty": "requeued", "compacted-since": "cleared"}
    resent = {m.kwargs["session_id"]: m for m in
              read_queue(broker.client, broker.prefix, broker.queue)}
    assert resent["over"].kwargs == {"session_id": "over", "reason": "over_trigger",
                                     "force": False}
    assert resent["dirty"].kwargs == {"session_id": "dirty", "reason": "dirty", "force": True}
    assert "compacted-since" not in resent
    for session_id in ("over", "dirty"):
        assert session_row(engine, session_id).queued_job_id == resent[session_id].task_id
        assert by_session[session_id].job_id == queued[session_id]
    assert session_row(engine, "compacted-since").queued_job_id is None
    events = [e for e in logs if e["event"] == RECONCILE_EVENT]
    assert sorted(e["session_id"] for e in events) == ["compacted-since", "dirty", "over"]
    # Repaired: the next sweep finds the re-sent jobs queued and has nothing to do.
    assert _reconcile(store, broker, now=LATER + timedelta(minutes=5)) == []


def test_queued_delivered_running_and_young_jobs_are_left_alone(
    store: Store, engine: Engine, broker: Broker
) -> None:
    for session_id in ("queued", "delivered", "running", "young"):
        put_session(store, engine, session_id, 8_000, now=NOW)
    queued = _scan(store, broker)
    _lose_queue(broker)
    # Back on the list; in kombu's unacked hash as [message, exchange, routing_key].
    broker.client.lpush(f"{broker.prefix}{broker.queue}", json.dumps(
        build_raw_message({"session_id": "queued"}, queue=broker.queue,
                          task_id=queued["queued"])))
    broker.client.hset(f"{broker.prefix}unacked", "tag-1", json.dumps(
        [build_raw_message({"session_id": "delivered"}, queue=broker.queue,
                           task_id=queued["delivered"]), "", broker.queue]))
    # Acknowledged by a hard time limit, but its lease is fresh: taken for running.
    put_lease(engine, "running", f"host:1:{queued['running']}", LATER + timedelta(minutes=1))
    with engine.begin() as conn:
        conn.execute(update(SessionRow).where(SessionRow.session_id == "young")
                     .values(queued_at=LATER - timedelta(seconds=10)))

    assert _reconcile(store, broker) == []
    # Garbage on the queue names no job and stops nothing.
    broker.client.lpush(f"{broker.prefix}{broker.queue}", b"\x00not json", b"[[[[")
    assert _reconcile(store, broker) == []


def put_lease(engine: Engine, session_id: str, owner: str, expires: datetime) -> None:
    with engine.begin() as conn:
        conn.execute(update(SessionRow).where(SessionRow.session_id == session_id)
                     .values(lease_owner=owner, lease_expires_at=expires))


def test_a_dead_lease_is_released_and_its_attempt_recorded_once(
    store: Store, engine: Engine, broker: Broker
) -> None:
    put_session(store, engine, "killed", 8_000, now=NOW)
    queued = _scan(store, broker)
    _lose_queue(broker)
    job_id = queued["killed"]
    put_lease(engine, "killed", f"host:42:{job_id}", LATER - timedelta(seconds=1))

    with capture_logs() as logs:
        repairs = _reconcile(store, broker)

    assert [(r.problem, r.action, r.attempt_recorded) for r in repairs] == [
        ("dead_lease", "released", True), ("lost_job", "requeued", False)]
    row = session_row(engine, "killed")
    assert row.lease_owner is None
    [run] = store.runs(session_id="killed")
    assert (run.task_id, run.outcome, run.attempt, run.failure_class) == (
        job_id, "failed", 1, "AttemptLost")
    assert run.figures["outcome_reason"] == "worker_lost"
    [job_event] = [e for e in logs if e["event"] == "compaction.job"]
    assert (job_event["task_id"], job_event["outcome"], job_event["reason"]) == (
        job_id, "failed", "worker_lost")
    assert job_event["duration_ms"] > 0
    assert _reconcile(store, broker, now=LATER + timedelta(minutes=5)) == []
    assert len(store.runs(session_id="killed")) == 1


def test_a_dry_run_reports_and_changes_nothing(
    store: Store, engine: Engine, broker: Broker
) -> None:
    put_session(store, engine, "over", 8_000, now=NOW)
    queued = _scan(store, broker)
    _lose_queue(broker)
    put_lease(engine, "over", "host:1:gone", NOW)

    repairs = _reconcile(store, broker, dry_run=True)

    assert [(r.problem, r.action) for r in repairs] == [
        ("dead_lease", "released"), ("lost_job", "requeued")]
    row = session_row(engine, "over")
    assert (row.queued_job_id, row.lease_owner) == (queued["over"], "host:1:gone")
    assert read_queue(broker.client, broker.prefix, broker.queue) == []
    assert store.runs(session_id="over") == []


def test_trigger_force_replaces_a_marker_whose_job_was_lost(
    store: Store, engine: Engine, broker: Broker
) -> None:
    put_session(store, engine, "s", 1_000, now=NOW)
    jobs, publisher = _jobs(broker), _publisher(broker)

    def trigger(force: bool) -> tuple[MarkStatus, str | None]:
        [result] = trigger_sessions(
            store, publisher, ["s"], reason="trigger", force=force, now=NOW,
            marker_ttl_s=7200,
            is_lost=lambda sid, job: is_job_lost(store, jobs, sid, job, NOW))
        return result.status, result.job_id

    status, first = trigger(force=False)
    assert status is MarkStatus.ENQUEUED
    # Its message is queued: --force finds the job alive and does not send a second one.
    assert trigger(force=True) == (MarkStatus.ALREADY_QUEUED, first)
    _lose_queue(broker)
    assert trigger(force=False) == (MarkStatus.ALREADY_QUEUED, first)
    status, second = trigger(force=True)
    assert status is MarkStatus.ENQUEUED and second != first
    assert session_row(engine, "s").queued_job_id == second
    [message] = read_queue(broker.client, broker.prefix, broker.queue)
    assert (message.task_id, message.kwargs["force"]) == (second, True)


def test_a_job_delivered_to_a_worker_that_died_is_sent_again_once_its_lease_expires(
    store: Store, engine: Engine, broker: Broker
) -> None:
    put_session(store, engine, "killed", 8_000, now=NOW)
    queued = _scan(store, broker)
    _lose_queue(broker)
    job_id = queued["killed"]
    # Its worker was SIGKILLed mid-job: the message stays in kombu's unacked hash until
    # the visibility timeout, and the lease, no longer renewed, expires.
    broker.client.hset(f"{broker.prefix}unacked", "tag-1", json.dumps(
        [build_raw_message({"session_id": "killed"}, queue=broker.queue, task_id=job_id),
         "", broker.queue]))
    put_lease(engine, "killed", f"host:42:{job_id}", LATER + timedelta(seconds=30))
    assert _reconcile(store, broker) == []  # renewed recently: still running

    repairs = _reconcile(store, broker, now=LATER + timedelta(minutes=1))

    assert [(r.problem, r.action) for r in repairs] == [
        ("dead_lease", "released"), ("lost_job", "requeued")]
    [message] = read_queue(broker.client, broker.prefix, broker.queue)
    assert session_row(engine, "killed").queued_job_id == message.task_id != job_id


def test_the_quick_sweep_sends_a_dead_lease_s_job_again_and_leaves_the_rest_alone(
    store: Store, engine: Engine, broker: Broker
) -> None:
    for session_id in ("killed", "running", "lost-in-redis", "requeued"):
        put_session(store, engine, session_id, 8_000, now=NOW)
    queued = _scan(store, broker)
    _lose_queue(broker)  # every message gone: only the full sweep may conclude from that
    put_lease(engine, "killed", f"host:42:{queued['killed']}", LATER - timedelta(seconds=1))
    put_lease(engine, "running", f"host:7:{queued['running']}", LATER + timedelta(seconds=9))
    # Its pool child died: the main process recorded the attempt and requeued the message.
    put_lease(engine, "requeued", f"host:8:{queued['requeued']}", LATER - timedelta(seconds=1))
    store.record_run(replace(_run("requeued", queued["requeued"], "failed",
                                  LATER - timedelta(seconds=60)),
                             finished_at=LATER - timedelta(seconds=20)))

    with capture_logs() as logs:
        repairs = sweep_dead_leases(store, _publisher(broker),
                                    reconcile_policy(broker.settings), LATER,
                                    journal=_journal(broker))

    assert [(r.session_id, r.problem, r.action, r.attempt_recorded) for r in repairs] == [
        ("killed", "dead_lease", "released", True),
        ("requeued", "dead_lease", "released", False),
        ("killed", "lost_job", "requeued", False)]
    assert session_row(engine, "requeued").lease_owner is None
    assert session_row(engine, "requeued").queued_job_id == queued["requeued"]
    [message] = read_queue(broker.client, broker.prefix, broker.queue)
    assert message.kwargs["session_id"] == "killed" and message.task_id != queued["killed"]
    assert session_row(engine, "killed").lease_owner is None
    assert session_row(engine, "running").lease_owner == f"host:7:{queued['running']}"
    assert session_row(engine, "lost-in-redis").queued_job_id == queued["lost-in-redis"]
    [run] = store.runs(session_id="killed")
    assert (run.task_id, run.outcome, run.figures["outcome_reason"]) == (
        queued["killed"], "failed", "worker_lost")
    assert [e["reason"] for e in logs if e["event"] == "compaction.job"] == ["worker_lost"]


def _journal(broker: Broker) -> AttemptJournal:
    return AttemptJournal(broker.client, RedisKeys(broker.prefix))


def _journal_reconcile(store: Store, broker: Broker, now: datetime) -> list[Repair]:
    return reconcile(store, _jobs(broker), _publisher(broker),
                     reconcile_policy(broker.settings), now, journal=_journal(broker))


def _run(session_id: str, task_id: str, outcome: str, started: datetime,
         **figures: object) -> NewRun:
    return NewRun(session_id=session_id, task_id=task_id, attempt=1, reason="over_trigger",
                  outcome=outcome, failure_class=None, failure_message=None,
                  figures={"outcome_reason": outcome, "tokens_before": 8_000, **figures},
                  revision_id=None, started_at=started,
                  finished_at=started + timedelta(seconds=3))


def test_runs_kept_while_the_database_was_down_are_written_once_and_not_taken_for_lost(
    store: Store, engine: Engine, broker: Broker
) -> None:
    put_session(store, engine, "outage", 8_000, now=NOW)
    job_id = _scan(store, broker)["outage"]
    # The attempt's finish_job failed: its run went to Redis, its lease was never released.
    put_lease(engine, "outage", f"host:42:{job_id}", LATER - timedelta(seconds=1))
    kept = replace(_run("outage", job_id, "failed", LATER - timedelta(seconds=30)),
                   failure_class="StoreUnavailable", failure_message="database down")
    journal = _journal(broker)
    assert journal.keep_unrecorded(kept)

    with capture_logs() as logs:
        repairs = _journal_reconcile(store, broker, LATER)

    [run] = store.runs(session_id="outage")
    assert (run.task_id, run.attempt, run.outcome, run.failure_class) == (
        job_id, 1, "failed", "StoreUnavailable")
    assert run.started_at == kept.started_at
    # The dead lease's attempt recorded itself (from Redis): released, not recorded again.
    assert [(r.problem, r.action, r.attempt_recorded) for r in repairs
            if r.problem == "dead_lease"] == [("dead_lease", "released", False)]
    assert not [e for e in logs if e["event"] == "compaction.job"]
    [recorded] = [e for e in logs if e["event"] == "reconcile.attempts_recorded"]
    assert recorded["runs_written"] == 1
    assert journal.unrecorded_count() == 0
    _journal_reconcile(store, broker, LATER + timedelta(minutes=5))
    assert len(store.runs(session_id="outage")) == 1


def test_a_kept_run_stays_in_redis_while_the_database_is_still_down(
    broker: Broker, tmp_path: Path
) -> None:
    down = Store.from_url(f"sqlite:///{tmp_path / 'missing' / 'db.sqlite'}")
    journal = _journal(broker)
    journal.keep_unrecorded(_run("s", "t", "failed", NOW))

    assert write_unrecorded_runs(down, journal) == 0
    assert journal.unrecorded_count() == 1


def test_a_kept_run_whose_commit_went_through_unanswered_is_not_written_twice(
    store: Store, broker: Broker
) -> None:
    # finish_job's connection dropped after the server committed: the run is stored and
    # kept in Redis both.
    run = _run("s", "t", "failed", NOW)
    store.record_run(run)
    journal = _journal(broker)
    journal.keep_unrecorded(run)

    assert write_unrecorded_runs(store, journal) == 0

    assert len(store.runs(session_id="s")) == 1
    assert journal.unrecorded_count() == 0


def test_a_sweep_killed_while_writing_a_kept_run_loses_nothing(
    store: Store, broker: Broker
) -> None:
    journal = _journal(broker)
    journal.keep_unrecorded(_run("s", "t", "failed", NOW))
    journal.keep_unrecorded(replace(_run("s", "t", "failed", NOW + timedelta(seconds=10)),
                                    attempt=2))

    class Killed(BaseException):
        """The pool child running the sweep, killed as it writes."""

    class KilledWhileWriting(Store):
        def record_kept_run(self, run: NewRun) -> bool:
            raise Killed

    with pytest.raises(Killed):
        write_unrecorded_runs(KilledWhileWriting(store._engine), journal)
    assert journal.unrecorded_count() == 2

    assert write_unrecorded_runs(store, journal) == 2
    assert sorted(r.attempt for r in store.runs(session_id="s")) == [1, 2]
    assert journal.unrecorded_count() == 0


def test_a_kept_item_that_can_never_be_written_is_dropped_loudly(
    store: Store, broker: Broker
) -> None:
    journal = _journal(broker)
    broker.client.lpush(RedisKeys(broker.prefix).unrecorded_runs(), "not a run")
    journal.keep_unrecorded(_run("s", "t", "failed", NOW))

    with capture_logs() as logs:
        assert write_unrecorded_runs(store, journal) == 1

    assert [e["event"] for e in logs if e["log_level"] == "error"] == [
        "reconcile.unrecorded_run_dropped"]
    assert journal.unrecorded_count() == 0


def test_a_worker_writes_the_runs_it_kept_itself_when_a_redis_restart_lost_them(
    store: Store, broker: Broker
) -> None:
    journal = _journal(broker)
    journal.keep_unrecorded(_run("s", "lost", "failed", NOW))
    broker.client.delete(RedisKeys(broker.prefix).unrecorded_runs())  # restarted, no data
    journal.keep_unrecorded(_run("s", "kept", "failed", NOW + timedelta(seconds=5)))

    assert journal.write_owed(store) == 2  # before the process's next job

    assert journal.write_owed(store) == 0
    # The reconciler's copy of the second is not written again.
    assert write_unrecorded_runs(store, journal) == 0
    assert sorted(r.task_id or "" for r in store.runs(session_id="s")) == ["kept", "lost"]
    assert journal.unrecorded_count() == 0


def test_the_event_of_an_attempt_killed_after_its_commit_is_reported_once(
    store: Store, engine: Engine, broker: Broker
) -> None:
    put_session(store, engine, "swapped", 8_000, now=NOW)
    journal = _journal(broker)
    opened = LATER - timedelta(minutes=2)
    journal.open("task-killed", "swapped", 1, opened)
    store.record_run(_run("swapped", "task-killed", "compacted", opened, llm_calls=2))
    with capture_logs() as first:  # the first sweep to see the run gives its worker time
        _journal_reconcile(store, broker, LATER)
    assert not [e for e in first if e["event"] == "compaction.job"]
    journal.open("task-running", "swapped", 1, LATER + timedelta(seconds=119))

    with capture_logs() as logs:
        _journal_reconcile(store, broker, LATER + timedelta(minutes=2))

    [event] = [e for e in logs if e["event"] == "compaction.job"]
    assert (event["task_id"], event["attempt"], event["outcome"], event["reason"]) == (
        "task-killed", 1, "compacted", "compacted")
    assert (event["llm_calls"], event["tokens_before"], event["run_recorded"]) == (
        2, 8_000, True)
    assert event["duration_ms"] == 3_000
    # The running attempt (no run yet) stays journalled; the reported one is gone.
    assert [p.task_id for p in journal.pending()] == ["task-running"]
    with capture_logs() as again:
        _journal_reconcile(store, broker, LATER + timedelta(minutes=5))
    assert not [e for e in again if e["event"] == "compaction.job"]


def test_an_event_emitted_between_two_sweeps_is_not_reported_again(
    store: Store, engine: Engine, broker: Broker
) -> None:
    put_session(store, engine, "stalled", 8_000, now=NOW)
    journal = _journal(broker)
    # A commit stalled by a hung database: its run's times are long past when it lands.
    entry = journal.open("task-stalled", "stalled", 1, LATER - timedelta(minutes=5)).entry
    store.record_run(_run("stalled", "task-stalled", "compacted", LATER - timedelta(minutes=5)))

    with capture_logs() as logs:
        _journal_reconcile(store, broker, LATER)
        journal.close(entry)  # the worker, its commit back, emits its event
        _journal_reconcile(store, broker, LATER + timedelta(minutes=2))

    assert not [e for e in logs if e["event"] == "compaction.job"]
    assert broker.client.hlen(f"{RedisKeys(broker.prefix).pending_events()}:run-seen") == 0


def test_a_journalled_attempt_whose_worker_died_holding_its_lease_is_recorded_once(
    store: Store, engine: Engine, broker: Broker
) -> None:
    put_session(store, engine, "held", 8_000, now=NOW)
    job_id = _scan(store, broker)["held"]
    journal = _journal(broker)
    journal.open(job_id, "held", 1, LATER - timedelta(minutes=2))
    put_lease(engine, "held", f"host:42:{job_id}", LATER - timedelta(seconds=1))

    with capture_logs() as logs:
        _journal_reconcile(store, broker, LATER)
        _journal_reconcile(store, broker, LATER + timedelta(minutes=5))

    assert [e["reason"] for e in logs if e["event"] == "compaction.job"] == ["worker_lost"]
    assert journal.pending() == []


def test_a_redelivered_attempt_leaves_the_killed_delivery_s_event_to_the_reconciler(
    store: Store, engine: Engine, broker: Broker
) -> None:
    put_session(store, engine, "again", 8_000, now=NOW)
    journal = _journal(broker)
    first = LATER - timedelta(minutes=3)
    journal.open("task-1", "again", 1, first)  # killed after its commit
    store.record_run(_run("again", "task-1", "compacted", first))
    second = journal.open("task-1", "again", 1, LATER - timedelta(minutes=2)).entry
    store.record_run(_run("again", "task-1", "skipped", LATER - timedelta(minutes=2)))
    journal.close(second)  # the redelivery emitted its own event
    journal.open("task-2", "again", 1, LATER - timedelta(minutes=2))  # died before its lease

    with capture_logs() as logs:
        _journal_reconcile(store, broker, LATER)
        _journal_reconcile(store, broker, LATER + timedelta(minutes=2))

    assert [(e["task_id"], e["outcome"]) for e in logs if e["event"] == "compaction.job"
            ] == [("task-1", "compacted")]
    assert journal.pending() == []


def test_a_redelivery_s_own_run_is_never_reported_for_the_delivery_it_replaced(
    store: Store, engine: Engine, broker: Broker
) -> None:
    put_session(store, engine, "retaken", 8_000, now=NOW)
    journal = _journal(broker)
    journal.open("task-1", "retaken", 1, LATER - timedelta(minutes=4))  # killed mid-job
    second = journal.open("task-1", "retaken", 1, LATER - timedelta(minutes=3)).entry
    store.record_run(_run("retaken", "task-1", "compacted", LATER - timedelta(minutes=3)))
    journal.close(second)  # the redelivery took the lease over, committed, emitted

    with capture_logs() as logs:
        _journal_reconcile(store, broker, LATER)
        _journal_reconcile(store, broker, LATER + timedelta(minutes=2))

    assert not [e for e in logs if e["event"] == "compaction.job"]
    assert journal.pending() == []


def test_opening_an_attempt_counts_its_delivery_and_a_redelivery_supersedes_the_first(
    broker: Broker,
) -> None:
    journal = _journal(broker)
    counter = DeliveryCounter(broker.client, RedisKeys(broker.prefix), ttl_s=60)
    first = journal.open("task-1", "s", 1, LATER - timedelta(minutes=3), counter)
    other = journal.open("task-2", "s", 1, LATER - timedelta(minutes=3), counter)
    again = journal.open("task-1", "s", 1, LATER - timedelta(minutes=2), counter)

    assert (first.deliveries, other.deliveries, again.deliveries) == (1, 1, 2)
    superseded = {p.entry: p.superseded_at for p in journal.pending()}
    assert superseded == {first.entry: LATER - timedelta(minutes=2), other.entry: None,
                          again.entry: None}


def test_each_delivery_of_a_task_is_numbered_the_next_attempt_a_redelivery_included(
    broker: Broker,
) -> None:
    journal = _journal(broker)
    counter = DeliveryCounter(broker.client, RedisKeys(broker.prefix), ttl_s=60)
    first = journal.open("task-1", "s", 1, LATER - timedelta(minutes=3), counter)
    redelivered = journal.open("task-1", "s", 1, LATER - timedelta(minutes=2), counter)
    retried = journal.open("task-1", "s", 2, LATER - timedelta(minutes=1), counter)  # retries=1
    other = journal.open("task-2", "s", 1, LATER, counter)

    assert [o.attempt for o in (first, redelivered, retried, other)] == [1, 2, 3, 1]
    assert [o.deliveries for o in (first, redelivered, retried, other)] == [1, 2, 1, 1]
    entered = {p.entry: p.attempt for p in journal.pending()}
    assert entered == {first.entry: 1, redelivered.entry: 2, retried.entry: 3, other.entry: 1}
    broker.client.delete(RedisKeys(broker.prefix).attempts("task-2"))  # Redis lost the count
    assert journal.open("task-2", "s", 2, LATER, counter).attempt == 2  # never below Celery's
