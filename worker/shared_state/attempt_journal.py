"""Every attempt leaves a run row and an event, even across a database outage or a kill.

Two records in Redis close the gaps a job cannot close itself:

- a run row the job could not write (``finish_job`` failed: the database was down, or
  the connection dropped before the commit's answer) is kept on a bounded list, and the
  reconciler writes it once the database is back; the worker process that kept it also
  writes it before its next job (a Redis restart without its data loses the list). It
  is written at most once (``Store.record_kept_run``: a commit whose answer was lost, or
  the other holder, wrote it already);
- an attempt is entered in a hash when it starts and removed once its ``compaction.job``
  event is out. An entry left behind whose run row exists (the worker was killed after
  the job's last transaction committed, before its event) is reported by the reconciler
  from the run row. A task sends the removal without waiting for Redis's answer
  (``close_unanswered``), and reads that answer before its process's next attempt
  opens (removing the entry again, with retries, when it did not come): a job's end
  waits for no round trip. Opening an entry also numbers the attempt: every delivery
  of a task, a redelivery after its worker died included, gets the next number.

Redis being unreachable loses no job: the journal fails open, loudly, like the fleet's
other shared state (``worker/shared_state/deliveries.py``).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import redis

from db import NewRun, Store, StoreError
from worker.logging import get_logger
from worker.shared_state.deliveries import DeliveryCounter, log_redis_unavailable
from worker.shared_state.keys import RedisKeys

# The list keeps at most this many unwritten runs (newest first): an outage of hours at
# fleet scale, without letting Redis grow without bound.
MAX_UNRECORDED_RUNS = 100_000
# Runs a worker process holds for itself (a long outage's excess is the reconciler's).
MAX_OWED_RUNS = 1_000
# A journal entry left open after its event went out would be reported twice: closing
# is retried across a short Redis restart.
CLOSE_TRIES = 3
CLOSE_RETRY_S = 1.0

# Count a delivery of its attempt (KEYS[2]) and of its task (KEYS[3]), and enter it under
# the task's count as its attempt number (never below Celery's, ARGV[2]'s): a Redis
# restarted empty restarts the count.
_OPEN_COUNTED = """
local deliveries = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[3])
local counted = redis.call('INCR', KEYS[3])
redis.call('EXPIRE', KEYS[3], ARGV[3])
local fields = cjson.decode(ARGV[2])
fields['attempt'] = math.max(counted, tonumber(fields['attempt']))
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(fields))
return {fields['attempt'], deliveries}
"""


@dataclass(frozen=True, slots=True)
class PendingAttempt:
    """An attempt whose event has not been seen go out (``entry``: its hash field; each
    delivery gets an entry, and an attempt number, of its own)."""

    entry: str
    task_id: str
    session_id: str
    attempt: int
    opened_at: datetime
    # A later delivery of the same task opened then (this one's worker died): runs
    # begun from then on are that delivery's.
    superseded_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class OpenedAttempt:
    """An attempt just entered: its hash field, how many deliveries of it have been
    counted (1 on the first; 0 when they were not counted), and its attempt number."""

    entry: str
    deliveries: int
    attempt: int


def run_to_json(run: NewRun) -> str:
    fields = dataclasses.asdict(run)
    for name in ("started_at", "finished_at"):
        value = fields[name]
        fields[name] = value.isoformat() if value is not None else None
    return json.dumps(fields, default=str)


def run_from_json(raw: str | bytes) -> NewRun:
    fields: dict[str, Any] = json.loads(raw)
    for name in ("started_at", "finished_at"):
        if fields[name] is not None:
            fields[name] = datetime.fromisoformat(fields[name])
    return NewRun(**fields)


def write_kept_run(store: Store, run: NewRun, dropped_event: str) -> bool | None:
    """Write one kept run: True when written, False when a run of the same attempt was
    stored already or the database refuses it for good (logged as ``dropped_event``),
    None while the database is down (keep it for a later try)."""
    try:
        return store.record_kept_run(run)
    except StoreError as exc:
        if exc.transient:
            return None
        get_logger().error(dropped_event, error_class=type(exc).__name__,
                           error=str(exc)[:500])
        return False


class AttemptJournal:
    """The two Redis records of one deployment (``redis_key_prefix``)."""

    def __init__(self, client: redis.Redis, keys: RedisKeys,
                 max_unrecorded: int = MAX_UNRECORDED_RUNS) -> None:
        self._client = client
        self._open_counted = client.register_script(_OPEN_COUNTED)
        self._keys = keys
        self._max_unrecorded = max_unrecorded
        # The same runs, held by the process that kept them: a Redis restart without its
        # data loses the list, and the process writes them itself before its next job.
        self.owed: deque[NewRun] = deque(maxlen=MAX_OWED_RUNS)
        # The removal sent last whose answer is still unread: its connection and entry.
        self._unanswered: tuple[redis.connection.Connection, str] | None = None

    def keep_unrecorded(self, run: NewRun) -> bool:
        """Keep a run row the database refused, in Redis for the reconciler and in this
        process (``owed``) for its own next job; False when Redis is unreachable."""
        self.owed.append(run)
        try:
            with self._client.pipeline() as pipe:
                pipe.lpush(self._keys.unrecorded_runs(), run_to_json(run))
                pipe.ltrim(self._keys.unrecorded_runs(), 0, self._max_unrecorded - 1)
                pipe.execute()
        except redis.RedisError as exc:
            log_redis_unavailable("unrecorded_runs", exc)
            return False
        return True

    def write_owed(self, store: Store) -> int:
        """Write the runs this process kept while the database was down (oldest first,
        until the database fails again), before its next job or sweep; the reconciler's
        copy in Redis is then skipped (``Store.record_kept_run`` writes a run once)."""
        written = 0
        while self.owed:
            stored = write_kept_run(store, self.owed[0], "worker.owed_run_dropped")
            if stored is None:
                break  # still down: the next job, or the reconciler, writes it
            written += stored
            self.owed.popleft()
        if written:
            get_logger().warning("worker.owed_runs_written", runs_written=written)
        return written

    def oldest_unrecorded(self) -> tuple[str | bytes, NewRun | None] | None:
        """The oldest kept run, left on the list (``drop_unrecorded`` once it is written:
        a sweep killed or timed out while writing it loses nothing), with its raw item;
        None as the run of an item that does not parse."""
        raw = self._client.lindex(self._keys.unrecorded_runs(), -1)
        if not isinstance(raw, (str, bytes)):
            return None
        try:
            return raw, run_from_json(raw)
        except (ValueError, KeyError, TypeError):
            return raw, None

    def drop_unrecorded(self, raw: str | bytes) -> None:
        """Remove a kept run (written, or unwritable), from the oldest end."""
        # redis-py's stub says str; bytes are sent as they are, matching the item exactly.
        self._client.lrem(self._keys.unrecorded_runs(), -1, cast(str, raw))

    def unrecorded_count(self) -> int:
        return int(self._client.llen(self._keys.unrecorded_runs()))

    def open(self, task_id: str, session_id: str, attempt: int, now: datetime,
             counter: DeliveryCounter | None = None) -> OpenedAttempt:
        """Enter a starting attempt, and with ``counter`` count its delivery and number
        it, in one round trip; returns its entry, for ``close``, the deliveries counted
        and its attempt number. ``attempt`` is Celery's (retries + 1): without a counter
        it is the number; with one, the number is the task's deliveries so far, never
        below it (a redelivered attempt gets a number of its own)."""
        self.settle_close()
        entry = f"{task_id}:{uuid.uuid4().hex}"
        fields = {"task_id": task_id, "session_id": session_id, "attempt": attempt,
                  "opened_at": now.isoformat()}
        opened = OpenedAttempt(entry, 0, attempt)
        try:
            if counter is None:
                self._client.hset(self._keys.pending_events(), entry, json.dumps(fields))
            else:
                deliveries_key, attempts_key = counter.keys_of(task_id, attempt - 1)
                numbered, deliveries = self._open_counted(
                    keys=[self._keys.pending_events(), deliveries_key, attempts_key],
                    args=[entry, json.dumps(fields), counter.ttl_s])
                opened = OpenedAttempt(entry, int(deliveries), int(numbered))
            # Only a redelivery (or one not counted) can find an earlier delivery's entry
            # open: the first skips reading every entry of the fleet.
            if opened.deliveries != 1:
                self._supersede(task_id, now, but=entry)
        except redis.RedisError as exc:
            log_redis_unavailable("pending_events", exc)
        return opened

    def _supersede(self, task_id: str, now: datetime, *, but: str) -> None:
        """Mark the open entries of the same task (deliveries whose worker died) as
        superseded from ``now``: runs begun from then on are the new delivery's."""
        for earlier in self.pending():
            if earlier.task_id == task_id and earlier.superseded_at is None \
                    and earlier.entry != but:
                self._client.hset(self._keys.pending_events(), earlier.entry, json.dumps(
                    {"task_id": task_id, "session_id": earlier.session_id,
                     "attempt": earlier.attempt, "opened_at": earlier.opened_at.isoformat(),
                     "superseded_at": now.isoformat()}))

    def close(self, entry: str, *, tries: int = CLOSE_TRIES) -> None:
        """The attempt's event is out (or recorded otherwise)."""
        for attempt in range(1, tries + 1):
            try:
                self._client.hdel(self._keys.pending_events(), entry)
                return
            except redis.RedisError as exc:
                if attempt == tries:
                    log_redis_unavailable("pending_events", exc)
                else:
                    time.sleep(CLOSE_RETRY_S)

    def close_unanswered(self, entry: str) -> None:
        """``close`` without waiting for Redis's answer: the removal is sent on a
        connection kept out of the pool until ``settle_close`` (the next ``open``) reads
        the answer. Sent, it is carried out even if this process dies next."""
        self.settle_close()
        pool = self._client.connection_pool
        try:
            connection = pool.get_connection()
        except redis.RedisError:
            self.close(entry)
            return
        try:
            # redis-py's Connection has no hints on these two.
            connection.send_command(  # type: ignore[no-untyped-call]
                "HDEL", self._keys.pending_events(), entry)
        except redis.RedisError:
            pool.release(connection)
            self.close(entry)
            return
        self._unanswered = (connection, entry)

    def settle_close(self) -> None:
        """Read the answer to the removal ``close_unanswered`` sent last; without one (the
        connection broke, Redis restarted), remove the entry again as ``close`` does."""
        if self._unanswered is None:
            return
        connection, entry = self._unanswered
        self._unanswered = None
        try:
            connection.read_response()
        except redis.RedisError:
            connection.disconnect()  # type: ignore[no-untyped-call]  # redis-py: no hints
            self.close(entry)
        finally:
            self._client.connection_pool.release(connection)

    def close_task(self, task_id: str) -> None:
        """Close every entry of a task (the reconciler recorded its lost attempt)."""
        for pending in self.pending():
            if pending.task_id == task_id:
                self.close(pending.entry, tries=1)

    def is_open(self, entry: str) -> bool:
        return bool(self._client.hexists(self._keys.pending_events(), entry))

    def run_seen_at(self, entry: str, now: datetime) -> datetime:
        """When a sweep first found this entry's run committed (``now`` on the first)."""
        key = f"{self._keys.pending_events()}:run-seen"
        self._client.hsetnx(key, entry, now.isoformat())
        seen = self._client.hget(key, entry)
        return datetime.fromisoformat(seen.decode() if isinstance(seen, bytes) else str(seen))

    def forget_seen(self, keep: set[str]) -> None:
        """Drop the first-seen times of entries no longer open."""
        key = f"{self._keys.pending_events()}:run-seen"
        gone = [f for f in self._client.hkeys(key)
                if (f.decode() if isinstance(f, bytes) else str(f)) not in keep]
        if gone:
            self._client.hdel(key, *gone)

    def pending(self) -> list[PendingAttempt]:
        entries: list[PendingAttempt] = []
        for field, raw in self._client.hgetall(self._keys.pending_events()).items():
            key = field.decode() if isinstance(field, bytes) else str(field)
            try:
                entry = json.loads(raw)
                superseded = entry.get("superseded_at")
                entries.append(PendingAttempt(
                    key, str(entry["task_id"]), str(entry["session_id"]), int(entry["attempt"]),
                    datetime.fromisoformat(entry["opened_at"]),
                    datetime.fromisoformat(superseded) if superseded else None))
            except (ValueError, KeyError, TypeError):
                self.close(key, tries=1)  # unreadable: nothing could be reported from it
        return entries
