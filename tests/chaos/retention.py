"""Session retention under fire: idle sessions that the beat's gc (every minute, with a
session retention) may erase, appended to while it runs. gc erases in key order; as soon
as idle sessions start disappearing the appenders speed up and aim at the idle sessions
next in that order, so their appends meet gc's batches. Each append the store
acknowledged must still be stored at the end (an acknowledged append disappears only
through an explicit delete, and a chaos run makes none)."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, func, select

from db import NewMessage, SessionNotFound, Store, StoreError
from db.models import SessionRow
from worker.platform.lifecycle import GC_EVENT

IDLE_PREFIX = "chaos-idle-"
# The run's own sessions were last appended to a day ago: they are never idle for gc.
SESSION_RETENTION_S = int(timedelta(days=2).total_seconds())
IDLE_SINCE = timedelta(days=3)
GC_BATCH_SIZE = 10  # many short gc transactions, so that appends land between and in them
WATCH_PERIOD_S = 0.05
GC_QUIET_S = 1.0  # no idle session erased for this long: gc is not running
SLOW_PAUSE_S = 0.5  # between appends while gc is not running


@dataclass
class RetentionLedger:
    """The appends to idle sessions and what the store said of each."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    acknowledged: list[tuple[str, int, str]] = field(default_factory=list)
    during_gc: int = 0  # acknowledged while idle sessions were disappearing
    refused: int = 0  # SessionNotFound: gc erased the session first
    unsure: int = 0  # the append raised (an outage): never acknowledged, not checked


def import_idle_sessions(store: Store, count: int) -> list[str]:
    """``count`` one-message sessions last appended to ``IDLE_SINCE`` ago (far under the
    trigger: no scan sends them)."""
    at = datetime.now(UTC) - IDLE_SINCE
    ids = [f"{IDLE_PREFIX}{index:05d}" for index in range(count)]
    for session_id in ids:
        store.import_session(session_id, {}, [_user(f"{session_id} opens")], at)
    return ids


class GcWatch(threading.Thread):
    """Tells whether gc is erasing idle sessions (their count fell within GC_QUIET_S),
    and which never-appended idle session comes first in key order (gc's next)."""

    def __init__(self, engine: Engine, stop: threading.Event) -> None:
        super().__init__(name="gc-watch", daemon=True)
        self._engine, self._stop_event = engine, stop
        self._last_drop = -GC_QUIET_S
        self.remaining: int | None = None
        self.frontier: str | None = None
        self.seen_gc = False

    @property
    def running(self) -> bool:
        return time.monotonic() - self._last_drop < GC_QUIET_S

    def run(self) -> None:
        idle = SessionRow.session_id.startswith(IDLE_PREFIX)
        untouched = SessionRow.last_appended_at < datetime.now(UTC) - IDLE_SINCE / 2
        statement = select(func.count(), func.min(SessionRow.session_id).filter(untouched)
                           ).where(idle)
        while not self._stop_event.wait(WATCH_PERIOD_S):
            try:
                with self._engine.connect() as connection:
                    remaining, self.frontier = connection.execute(statement).one()
            except Exception:  # an outage of the run: the next poll tries again
                continue
            if self.remaining is not None and remaining < self.remaining:
                self._last_drop = time.monotonic()
                self.seen_gc = True
            self.remaining = remaining


class IdleAppender(threading.Thread):
    """Appends once to each idle session it draws: a random one every SLOW_PAUSE_S while
    gc is not running, and while it is, as fast as the store takes them, one of the
    next ``2 * GC_BATCH_SIZE`` in gc's order."""

    def __init__(self, name: str, store: Store, ids: list[str], pool: set[str],
                 pool_lock: threading.Lock, ledger: RetentionLedger, watch: GcWatch,
                 stop: threading.Event, rng: random.Random) -> None:
        super().__init__(name=name, daemon=True)
        self._store, self._ids, self._pool, self._pool_lock = store, ids, pool, pool_lock
        self._ledger, self._watch, self._stop_event, self._rng = ledger, watch, stop, rng

    def run(self) -> None:
        turn = 0
        while not self._stop_event.wait(0 if self._watch.running else SLOW_PAUSE_S):
            session_id = self._draw()
            if session_id is None:
                return
            turn += 1
            self._append(session_id, f"{session_id}: {self.name} turn {turn}")

    def _draw(self) -> str | None:
        frontier = self._watch.frontier
        with self._pool_lock:
            if not self._pool:
                return None
            if self._watch.running and frontier is not None:
                start = int(frontier.removeprefix(IDLE_PREFIX))
                near = [session_id for session_id in self._ids[start:start + 2 * GC_BATCH_SIZE]
                        if session_id in self._pool]
                if near:
                    session_id = self._rng.choice(near)
                    self._pool.discard(session_id)
                    return session_id
            session_id = self._rng.choice(sorted(self._pool))
            self._pool.discard(session_id)
            return session_id

    def _append(self, session_id: str, text: str) -> None:
        during_gc = self._watch.running
        try:
            [seq] = self._store.append_messages(session_id, [_user(text)],
                                                now=datetime.now(UTC))
        except SessionNotFound:
            with self._ledger.lock:
                self._ledger.refused += 1
            return
        except StoreError:
            with self._ledger.lock:
                self._ledger.unsure += 1
            return
        with self._ledger.lock:
            self._ledger.acknowledged.append((session_id, seq, text))
            self._ledger.during_gc += int(during_gc or self._watch.running)


def start_idle_traffic(store: Store, engine: Engine, ids: list[str], ledger: RetentionLedger,
                       stop: threading.Event, *, appenders: int, seed: int
                       ) -> tuple[GcWatch, list[threading.Thread]]:
    """Start the watch and ``appenders`` appenders over ``ids``; return the watch and
    every thread started."""
    pool, pool_lock = set(ids), threading.Lock()
    watch = GcWatch(engine, stop)
    threads: list[threading.Thread] = [watch]
    threads += [IdleAppender(f"idle-appender{n}", store, ids, pool, pool_lock, ledger, watch,
                             stop, random.Random(seed * 100 + n))
                for n in range(appenders)]
    for thread in threads:
        thread.start()
    return watch, threads


def wait_for_gc(watch: GcWatch, timeout_s: float) -> None:
    """Return once the watch has seen a gc run erase idle sessions and end (or after
    ``timeout_s``): the appenders keep meeting it until then."""
    deadline = time.monotonic() + timeout_s
    while (not watch.seen_gc or watch.running) and time.monotonic() < deadline:
        time.sleep(WATCH_PERIOD_S)


def find_erased_appends(store: Store, ledger: RetentionLedger) -> list[str]:
    """The acknowledged appends to idle sessions that are no longer stored as sent."""
    erased: list[str] = []
    for session_id, seq, text in ledger.acknowledged:
        try:
            stored = {m.seq: m.body.get("content") for m in store.messages(session_id)}
        except SessionNotFound:
            erased.append(f"{session_id}: gone with its acknowledged seq {seq}")
            continue
        if stored.get(seq) != text:
            erased.append(f"{session_id}: acknowledged seq {seq} not stored as sent")
    return erased


def count_idle_left(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(SessionRow).where(
            SessionRow.session_id.startswith(IDLE_PREFIX))).scalar_one())


def count_gc_runs(log_dir: Path) -> int:
    """The beat's gc runs that ended (their ``lifecycle.gc`` event) in the worker logs."""
    runs = 0
    for path in sorted(log_dir.glob("worker-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if GC_EVENT not in line:
                continue
            with contextlib.suppress(ValueError):
                runs += json.loads(line).get("event") == GC_EVENT
    return runs


def _user(text: str) -> NewMessage:
    return NewMessage({"role": "user", "content": text}, "user", None, len(text) // 4 + 4)
