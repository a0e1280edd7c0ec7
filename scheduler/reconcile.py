"""The reconciler: the periodic sweep that makes the database's record of queued and
running jobs agree with the broker's (beat's ``compactor.reconcile``; ``compactor
reconcile``).

A session's queue marker names a job; Redis holds that job's message while it is queued
(the queue's lists) and while a worker has it (kombu's ``unacked`` hash, until the late
ack). When Redis loses the message (a restart without its data, a killed worker whose
message was acknowledged by a hard time limit), the marker would keep the session out of
every scan until its TTL. The sweep finds

- a **lost job**: a marker older than ``reconcile_grace_s`` whose job Redis holds in
  neither place, or whose delivery died with its lease (below). The session is sent a
  new job when the scan would take it (marker and lease aside), else its marker is
  cleared;
- a **dead lease**: a lease past its expiry, left by a job whose worker died or was
  killed. It is released, and the attempt that held it gets the run row and the
  ``compaction.job`` event (``failed``, ``worker_lost``) it never wrote, unless it wrote
  them before dying.

Dead leases are also the quick sweep's (``sweep_dead_leases``, which beat sends every
lease heartbeat): with running jobs renewing their lease every ``lease_ttl_s / 3``, a dead
worker's job is sent again within ``lease_ttl_s`` and one heartbeat of its death.

Every repair logs one ``compaction.reconcile`` event. Two sweeps at once are harmless:
each repair is a conditional UPDATE that only one of them wins.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from db import DueCriteria, DueWhy, HeldSession, Store, StoreError
from scheduler.beat import REDIS_TIMEOUT_S, scan_policy
from scheduler.enqueue import Publisher, QueuedJob, publish_or_release
from scheduler.journal_replay import (
    JournalReplay,
    report_missing_events,
    write_unrecorded_runs,
)
from scheduler.publisher import RedisPublisher
from worker.broker.contract import job_kwargs, queue_list_key
from worker.job.lost_attempt import LostAttempt, record_lost_attempt
from worker.logging import get_logger
from worker.runtime import current_runtime
from worker.settings.config import Settings, get_settings
from worker.shared_state.attempt_journal import AttemptJournal
from worker.shared_state.connection import connect_redis
from worker.shared_state.keys import RedisKeys

RECONCILE_EVENT = "compaction.reconcile"
# kombu's Redis transport: the hash of delivered, unacknowledged messages (under the
# transport's global_keyprefix), and the separator and steps of its priority lists.
UNACKED_KEY = "unacked"
PRIORITY_SEPARATOR = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)
_READ_CHUNK = 1_000
# A lease owner is "host:pid:task_id" (worker/job/values.py); "inline" jobs have no message.
INLINE_TASK_ID = "inline"


@dataclass(frozen=True, slots=True)
class ReconcilePolicy:
    """The plain values a sweep needs; built from settings by the entrypoints."""

    grace_s: float  # a marker younger than this may be a job still being published
    lease_ttl_s: float
    max_sessions: int  # held sessions read per sweep
    criteria: DueCriteria
    tail_budget_tokens: int


@dataclass(frozen=True, slots=True)
class Repair:
    """One repair (or, on a dry run, one that would be made)."""

    session_id: str
    problem: str  # lost_job | dead_lease
    action: str  # requeued | cleared | released
    job_id: str | None
    new_job_id: str | None = None
    lease_owner: str | None = None
    attempt_recorded: bool = False

    def event_fields(self, *, dry_run: bool) -> dict[str, Any]:
        return {"session_id": self.session_id, "problem": self.problem,
                "action": self.action, "job_id": self.job_id, "new_job_id": self.new_job_id,
                "lease_owner": self.lease_owner, "attempt_recorded": self.attempt_recorded,
                "dry_run": dry_run}


@dataclass(frozen=True)
class BrokerJobs:
    """Reads the ids of the jobs Redis holds for one queue: queued or delivered."""

    client: redis.Redis
    key_prefix: str
    queue: str

    def job_ids(self) -> set[str]:
        ids = set(_ids_of(self._queued_items()))
        unacked = f"{self.key_prefix}{UNACKED_KEY}"
        for _tag, raw in self.client.hscan_iter(unacked, count=_READ_CHUNK):
            ids.update(_ids_of([raw], delivered=True))
        return ids

    def _queued_items(self) -> Iterator[bytes | str]:
        base = queue_list_key(self.key_prefix, self.queue)
        for step in PRIORITY_STEPS:
            key = base if step == 0 else f"{base}{PRIORITY_SEPARATOR}{step}"
            start = 0
            while items := self.client.lrange(key, start, start + _READ_CHUNK - 1):
                yield from items
                start += len(items)


def _ids_of(items: Iterable[bytes | str], *, delivered: bool = False) -> Iterator[str]:
    """The task ids of the items that parse (a poison item names no job)."""
    for raw in items:
        try:
            message = json.loads(raw)
            if delivered:  # kombu stores [message, exchange, routing_key]
                message = message[0]
            task_id = message["headers"]["id"]
        except (ValueError, TypeError, KeyError, IndexError, RecursionError):
            continue
        if isinstance(task_id, str):
            yield task_id


def owner_task_id(lease_owner: str) -> str:
    """The task id that ends a lease owner ``host:pid:task_id``."""
    return lease_owner.split(":", 2)[-1]


def reconcile(store: Store, broker: BrokerJobs, publisher: Publisher, policy: ReconcilePolicy,
              now: datetime, *, dry_run: bool = False,
              journal: AttemptJournal | None = None) -> list[Repair]:
    """One sweep; returns (and logs) its repairs.

    Redis is read before and after the database, and a job counts as lost only when
    absent from both reads: a message moving from the queue to the unacked hash, or a
    retry replacing its delivery, is in one of them. With a ``journal``, the run rows
    kept while the database was down are written first (so a dead lease whose attempt
    kept its run is not recorded twice), and killed attempts' missing events reported.
    """
    replayed = JournalReplay()
    if journal is not None and not dry_run:
        replayed = JournalReplay(runs_written=write_unrecorded_runs(store, journal))
    before = broker.job_ids()
    held = store.held_sessions(queued_before=now - timedelta(seconds=policy.grace_s),
                               limit=policy.max_sessions)
    live = before | broker.job_ids()
    repairs = [repair for session in held
               if (repair := _repair_lease(store, session, policy, now, dry_run, journal))
               is not None]
    # A job whose lease died was delivered to a worker that is gone: its message waits
    # in the unacked hash for the visibility timeout (an hour); a new job runs now.
    dead = {r.job_id for r in repairs}
    lost = [s for s in held if s.queued_job_id is not None and not _running(s, now)
            and (s.queued_job_id not in live or s.queued_job_id in dead)]
    repairs += _send_again(store, publisher, lost, policy, now, dry_run)
    logger = get_logger()
    for repair in repairs:
        logger.warning(RECONCILE_EVENT, **repair.event_fields(dry_run=dry_run))
    if journal is not None and not dry_run:
        replayed = replace(replayed, events_reported=report_missing_events(
            store, journal, now, policy.grace_s))
    if replayed.runs_written or replayed.events_reported:
        logger.warning("reconcile.attempts_recorded", runs_written=replayed.runs_written,
                       events_reported=replayed.events_reported)
    return repairs


def sweep_dead_leases(store: Store, publisher: Publisher, policy: ReconcilePolicy,
                      now: datetime, *, journal: AttemptJournal | None = None) -> list[Repair]:
    """The quick sweep (beat's, every lease heartbeat): release the leases past their
    expiry, record their attempts, and send their jobs again; returns (and logs) its
    repairs. It reads no Redis list: a job whose attempt died with its lease unrecorded
    is lost wherever its message waits (``reconcile``'s full sweep finds the rest). One
    whose attempt was recorded (by its worker's main process, as its pool child died)
    is only released: Celery requeued its message."""
    held = store.dead_leases(now=now, limit=policy.max_sessions)
    repairs = [repair for session in held
               if (repair := _repair_lease(store, session, policy, now, False, journal))
               is not None]
    dead = {r.job_id for r in repairs if r.attempt_recorded}
    lost = [s for s in held if s.queued_job_id is not None and s.queued_job_id in dead]
    repairs += _send_again(store, publisher, lost, policy, now, False)
    for repair in repairs:
        get_logger().warning(RECONCILE_EVENT, **repair.event_fields(dry_run=False))
    return repairs


def _send_again(store: Store, publisher: Publisher, lost: list[HeldSession],
                policy: ReconcilePolicy, now: datetime, dry_run: bool) -> list[Repair]:
    """Send each lost job again, or clear its marker when the scan would not take it."""
    due = store.due_among([s.session_id for s in lost], policy.criteria, now)
    return [_repair_marker(store, publisher, session, due.get(session.session_id), policy,
                           now, dry_run) for session in lost]


def _running(session: HeldSession, now: datetime) -> bool:
    """The marker's own job holds a lease that has not expired: it is running."""
    owner, expires = session.lease_owner, session.lease_expires_at
    return (owner is not None and expires is not None and expires > now
            and owner_task_id(owner) == session.queued_job_id)


def _repair_lease(store: Store, session: HeldSession, policy: ReconcilePolicy, now: datetime,
                  dry_run: bool, journal: AttemptJournal | None) -> Repair | None:
    owner, expires = session.lease_owner, session.lease_expires_at
    if owner is None or (expires is not None and expires > now):
        return None
    repair = Repair(session.session_id, "dead_lease", "released", owner_task_id(owner),
                    lease_owner=owner)
    if dry_run or not store.release_lease(session.session_id, owner):
        return None if not dry_run else repair
    started = (expires or now) - timedelta(seconds=policy.lease_ttl_s)
    recorded = _record_lost_attempt(store, session.session_id, owner_task_id(owner),
                                    started, now)
    if recorded and journal is not None:  # its event is out now
        journal.close_task(owner_task_id(owner))
    return replace(repair, attempt_recorded=recorded)


def _record_lost_attempt(store: Store, session_id: str, task_id: str, started: datetime,
                         now: datetime) -> bool:
    """Write the run row and event of an attempt that died holding its lease; False when
    it recorded itself (its lease release alone failed) or has no message to speak of."""
    if task_id == INLINE_TASK_ID:
        return False
    earlier = [run.attempt for run in store.runs(session_id=session_id, limit=50)
               if run.task_id == task_id]
    lost = LostAttempt(session_id, task_id, max(earlier, default=0) + 1, started,
                       found_by="the reconciler")
    return record_lost_attempt(store, lost, now)


def _repair_marker(store: Store, publisher: Publisher, session: HeldSession,
                   due: tuple[DueWhy, int] | None, policy: ReconcilePolicy, now: datetime,
                   dry_run: bool) -> Repair:
    stale_job = str(session.queued_job_id)
    if due is not None and (due[0] is DueWhy.OVER_TRIGGER or due[1] > policy.tail_budget_tokens):
        why = due[0]
        # A dirty session is under the trigger: like the scan's, its job must be forced.
        job = QueuedJob(f"reconcile-{uuid.uuid4()}",
                        job_kwargs(session.session_id, why.value, force=why is DueWhy.DIRTY))
        repair = Repair(session.session_id, "lost_job", "requeued", stale_job,
                        new_job_id=job.job_id)
        if dry_run:
            return repair
        with store.queue_markers() as markers:
            replaced = markers.replace(session.session_id, stale_job, job.job_id, now=now)
        if replaced:
            publish_or_release(store, publisher, [job])
            return repair
        return replace(repair, action="superseded", new_job_id=None)
    repair = Repair(session.session_id, "lost_job", "cleared", stale_job)
    if not dry_run:
        with store.queue_markers() as markers:
            if not markers.clear(session.session_id, stale_job):
                return replace(repair, action="superseded")
    return repair


def is_job_lost(store: Store, broker: BrokerJobs, session_id: str, job_id: str,
                now: datetime) -> bool:
    """True when ``job_id``, the job a session's marker names, is neither queued,
    delivered nor running (``trigger --force`` then replaces the marker)."""
    if job_id in broker.job_ids():
        return False
    session = store.get_session(session_id)
    held = HeldSession(session_id, job_id, session.queued_at, session.lease_owner,
                       session.lease_expires_at)
    return not _running(held, now) and job_id not in broker.job_ids()


@contextmanager
def broker_jobs(settings: Settings) -> Iterator[BrokerJobs]:
    """A reader of the jobs Redis holds for the settings' queue, its client closed after."""
    client = connect_redis(settings, timeout_s=REDIS_TIMEOUT_S)
    try:
        yield BrokerJobs(client, settings.redis_key_prefix, settings.queue_name)
    finally:
        client.close()


def reconcile_policy(settings: Settings) -> ReconcilePolicy:
    """The sweep's values from the settings."""
    return ReconcilePolicy(grace_s=settings.reconcile_grace_s,
                           lease_ttl_s=settings.lease_ttl_s,
                           max_sessions=settings.reconcile_max_sessions,
                           criteria=scan_policy(settings).criteria,
                           tail_budget_tokens=settings.tail_budget_tokens)


def run_scheduled_reconcile(settings: Settings, now: datetime, *, dry_run: bool = False,
                            leases_only: bool = False) -> list[Repair]:
    """One sweep with connections made from ``settings`` (beat's tasks and ``compactor
    reconcile``); ``leases_only``: the quick sweep of dead leases."""
    store = Store.from_url(settings.effective_database_url,
                           sqlite_busy_timeout_ms=settings.sqlite_busy_timeout_ms,
                           call_timeout_s=settings.db_call_timeout_s)
    try:
        if not leases_only:
            store.check_schema()
        with broker_jobs(settings) as broker:
            publisher = RedisPublisher(broker.client, settings.redis_key_prefix,
                                       settings.queue_name)
            journal = AttemptJournal(broker.client, RedisKeys(settings.redis_key_prefix))
            if leases_only:
                return sweep_dead_leases(store, publisher, reconcile_policy(settings), now,
                                         journal=journal)
            return reconcile(store, broker, publisher, reconcile_policy(settings), now,
                             dry_run=dry_run, journal=journal)
    finally:
        store.close()


def reconcile_and_report(*, leases_only: bool = False) -> str:
    """One sweep, its failure logged rather than raised (the ``compactor.reconcile``
    task; ``leases_only``: the quick sweep)."""
    try:
        runtime = current_runtime()
        if runtime is not None and runtime.journal is not None:  # this child's kept runs
            runtime.journal.write_owed(runtime.store)
        repairs = run_scheduled_reconcile(get_settings(), datetime.now(UTC),
                                          leases_only=leases_only)
    except (StoreError, redis.RedisError) as exc:
        # The next sweep repairs what this one could not reach; no traceback.
        get_logger().warning("reconcile.failed", error_class=type(exc).__name__,
                             error=str(exc)[:500])
        return "failed"
    if repairs or not leases_only:  # the quick sweep is quiet while there is nothing
        get_logger().info("reconcile.finished", repairs=len(repairs), leases_only=leases_only)
    return "reconciled"
