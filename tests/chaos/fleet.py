"""The worker fleet under fire: real worker processes that are SIGKILLed (one pool
child, or a whole worker with its children) and restarted, and the sniper that kills
the process holding an open swap transaction, found through ``pg_stat_activity``."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Engine, exc, text

from tests.support.worker_process import WorkerProcess

WORKER_APP_NAME = "chaos-worker"
# A worker connection inside a transaction whose last statement belongs to the swap
# (``db/revisions.py``, ``db/job_swap.py``): the row lock, the new revision,
# pointing the session at it, or the whole swap in one statement (a job's, on PostgreSQL,
# whose lock is its first CTE's FOR UPDATE).
_OPEN_SWAPS = text(
    "SELECT client_port, backend_xid::text AS xid FROM pg_stat_activity "
    "WHERE application_name = :app AND xact_start IS NOT NULL AND client_port IS NOT NULL "
    "AND (query LIKE '%FOR UPDATE%' OR query LIKE 'INSERT INTO revisions%' "
    "OR query LIKE 'UPDATE sessions SET active_revision_id%')"
)
# txid_status wants the 64-bit id: the 32-bit xid plus the current epoch.
_TRANSACTION_STATUS = text(
    "SELECT txid_status(((pg_snapshot_xmax(pg_current_snapshot())::text::bigint >> 32) << 32)"
    " + :xid)"
)


@dataclass(frozen=True)
class Death:
    """One SIGKILL: when it landed, its kind, and the pool children (job processes) it
    ended; their leases name the jobs that must run again."""

    at: datetime
    kind: str
    pids: tuple[int, ...]


@dataclass(frozen=True)
class SwapKill:
    """A process killed inside a swap, and its transaction id (None: none assigned yet)."""

    xid: int | None


class Fleet:
    """Several workers on one queue; every kill and restart is counted."""

    def __init__(self, env: Mapping[str, str], log_dir: Path, *, workers: int,
                 concurrency: int, rng: random.Random) -> None:
        self._env = dict(env)
        self._log_dir = log_dir
        self._concurrency = concurrency
        self._rng = rng
        self._lock = threading.Lock()
        self._slots: list[WorkerProcess | None] = [None] * workers
        self._restarts: list[threading.Thread] = []
        self._stopping = False
        self._starts = 0
        self.kills: Counter[str] = Counter()
        self.deaths: list[Death] = []  # each kill: when, and the job processes it ended
        self.crashes: list[Path] = []  # logs of workers that exited without being killed

    def start_all(self) -> None:
        threads = [threading.Thread(target=self._start_slot, args=(slot,))
                   for slot in range(len(self._slots))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if not all(self._slots):
            raise RuntimeError("a worker did not start; see the logs in " + str(self._log_dir))

    def _start_slot(self, slot: int) -> None:
        with self._lock:
            self._starts += 1
            log_path = self._log_dir / f"worker-{slot}-{self._starts}.log"
        worker = WorkerProcess(self._env, log_path, concurrency=self._concurrency)
        worker.start(timeout_s=90)
        with self._lock:
            self._slots[slot] = worker
            stopping = self._stopping
        if stopping:  # started while the fleet was being stopped
            worker.stop()

    def alive(self) -> list[WorkerProcess]:
        with self._lock:
            return [w for w in self._slots if w is not None and w.process is not None
                    and w.process.poll() is None]

    def kill_child(self) -> bool:
        """SIGKILL one pool child of a random worker (its master forks a new one)."""
        children = [pid for worker in self.alive() for pid in worker.child_pids()]
        if not children:
            return False
        return self._kill_pid(self._rng.choice(children), "pool_child")

    def kill_worker(self) -> bool:
        """SIGKILL a random whole worker (master and children), then start another."""
        with self._lock:
            live = [(slot, w) for slot, w in enumerate(self._slots)
                    if w is not None and w.process is not None and w.process.poll() is None]
            if not live:
                return False
            slot, worker = self._rng.choice(live)
            self._slots[slot] = None
        assert worker.process is not None
        children = worker.child_pids()
        os.killpg(worker.process.pid, signal.SIGKILL)
        worker.process.wait(10)
        self.kills["whole_worker"] += 1
        self.deaths.append(Death(datetime.now(UTC), "whole_worker", tuple(children)))
        self._restart_slot(slot)
        return True

    def kill_in_swap(self, engine: Engine, *, watch_s: float, freeze: bool) -> str | None:
        """Watch for a worker inside a swap transaction and SIGKILL the process holding
        that connection. With ``freeze``, a lock on the revisions table held meanwhile
        stops each swap at its INSERT, inside its transaction, until the kill (without,
        the kill lands wherever the swap got to: mostly just after its commit).

        Returns how the killed transaction ended (``aborted``: the kill landed inside it;
        ``committed``: after its commit; ``unknown``), or None when no swap was seen.
        """
        with engine.connect() as holder:
            if freeze:
                holder.begin()
                holder.execute(text("LOCK TABLE revisions IN EXCLUSIVE MODE"))
            killed = self._kill_first_swap(engine, watch_s)
            holder.rollback()  # releases the lock: the killed backend finds its client gone
        return None if killed is None else transaction_end(engine, killed.xid)

    def _kill_first_swap(self, engine: Engine, watch_s: float) -> SwapKill | None:
        """SIGKILL the first process seen in a swap (None: none seen in ``watch_s``)."""
        deadline = time.monotonic() + watch_s
        while time.monotonic() < deadline:
            try:
                xids = open_swaps(engine)
            except exc.DBAPIError:  # our own connection was dropped too: look again
                time.sleep(0.05)
                continue
            found = self._pid_on_ports(set(xids)) if xids else None
            if found is not None and self._kill_pid(found[0], "in_swap"):
                return SwapKill(xids[found[1]])
            time.sleep(0.005)
        return None

    def _pid_on_ports(self, ports: set[int]) -> tuple[int, int] | None:
        """The pool child holding a connection from one of ``ports``, and that port."""
        for port in ports:
            inodes = socket_inodes({port})
            for worker in self.alive():
                for pid in worker.child_pids():
                    if inodes & open_socket_inodes(pid):
                        return pid, port
        return None

    def _kill_pid(self, pid: int, kind: str) -> bool:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self.kills[kind] += 1
        self.deaths.append(Death(datetime.now(UTC), kind, (pid,)))
        return True

    def restart_crashed(self) -> None:
        """Count and restart every worker that exited although nothing killed it."""
        with self._lock:
            crashed = [(slot, w) for slot, w in enumerate(self._slots)
                       if w is not None and w.process is not None
                       and w.process.poll() is not None]
            for slot, worker in crashed:
                self._slots[slot] = None
                self.crashes.append(worker.log_path)
        for slot, _ in crashed:
            self._restart_slot(slot)

    def _restart_slot(self, slot: int) -> None:
        restart = threading.Thread(target=self._start_slot, args=(slot,), daemon=True)
        with self._lock:
            self._restarts.append(restart)
        restart.start()

    def wait_all_alive(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.alive()) < len(self._slots):
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.alive())}/{len(self._slots)} workers up")
            time.sleep(0.2)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            restarts = list(self._restarts)
        for restart in restarts:
            restart.join(120)
        with self._lock:
            workers = [w for w in self._slots if w is not None]
        for worker in workers:
            worker.stop()


def open_swaps(engine: Engine) -> dict[int, int | None]:
    """Client ports of worker connections inside a swap, with their transaction ids."""
    with engine.connect() as conn:
        rows = conn.execute(_OPEN_SWAPS, {"app": WORKER_APP_NAME})
        return {row.client_port: int(row.xid) if row.xid else None for row in rows}


def transaction_end(engine: Engine, xid: int | None, timeout_s: float = 5.0) -> str:
    """Wait until transaction ``xid`` (of this epoch) is over; return how it ended."""
    if xid is None:
        return "unknown"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with engine.connect() as conn:
                status = conn.execute(_TRANSACTION_STATUS, {"xid": xid}).scalar_one()
        except exc.DBAPIError:
            status = None
        if status in ("committed", "aborted"):
            return str(status)
        time.sleep(0.05)
    return "unknown"


def socket_inodes(local_ports: set[int]) -> set[str]:
    """Inodes of this host's TCP sockets bound to one of ``local_ports`` (Linux /proc)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) in local_ports:
                inodes.add(fields[9])
    return inodes


def open_socket_inodes(pid: int) -> set[str]:
    """Inodes of the sockets process ``pid`` holds open."""
    found: set[str] = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                found.add(target[len("socket:["):-1])
    except OSError:  # the process is gone, or a descriptor closed while we looked
        pass
    return found
