"""The lease heartbeat: a running job renews its session's lease every
``lease_heartbeat_s``, so the lease TTL can be short and a dead worker's lease expires
(and the reconciler takes its job back) within about a minute, however long jobs run.

One daemon thread per process beats every running heartbeat: a thread started and
joined per job cost ~0.3-1 ms of a short job's wall time (the start waits for the new
thread to be scheduled), more than the job's own database round trips."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from types import TracebackType

from db import StoreError
from worker.logging import get_logger


class LeaseHeartbeat:
    """Calls ``renew`` every ``period_s`` while the block runs, until ``renew`` answers
    False (another owner took the lease: nothing left to keep)."""

    def __init__(self, renew: Callable[[], bool], period_s: float) -> None:
        self._renew = renew
        self.period_s = period_s
        self.renewals = 0

    def __enter__(self) -> LeaseHeartbeat:
        if self.period_s > 0:
            _beater().add(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.period_s > 0:
            _beater().remove(self)

    def beat(self) -> bool:
        """Renew once; False once the lease is lost (no more beats)."""
        try:
            if not self._renew():
                get_logger().warning("lease.lost")
                return False
            self.renewals += 1
        except StoreError as exc:
            # The next beat tries again; the swap re-checks the lease in any case.
            get_logger().warning("lease.renewal_failed", error_class=type(exc).__name__)
        return True


class _Beater:
    """The process's heartbeat thread: beats each added heartbeat when it is due, one at
    a time (a renewal hung on the database delays the others' in a process running
    several jobs at once; a prefork pool child runs one)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._due: dict[LeaseHeartbeat, float] = {}  # heartbeat -> next beat (monotonic)
        self._beating: LeaseHeartbeat | None = None
        # When the thread's wait ends (monotonic; None: it waits for an add).
        self._wakes_at: float | None = None
        threading.Thread(target=self._run, name="lease-heartbeat", daemon=True).start()

    def add(self, heartbeat: LeaseHeartbeat) -> None:
        with self._changed:
            due = self._due[heartbeat] = time.monotonic() + heartbeat.period_s
            # Woken only when this beat comes before its wait ends: a job's start costs
            # no thread switch while an earlier job's beat is still ahead.
            if self._wakes_at is None or due < self._wakes_at:
                self._changed.notify_all()

    def remove(self, heartbeat: LeaseHeartbeat) -> None:
        """Stop beating ``heartbeat``; returns once no beat of it is under way, or after
        one period (a renewal hung on the database does not hold the job's end)."""
        with self._changed:
            self._due.pop(heartbeat, None)
            deadline = time.monotonic() + heartbeat.period_s
            while self._beating is heartbeat and (left_s := deadline - time.monotonic()) > 0:
                self._changed.wait(left_s)

    def _run(self) -> None:
        while True:
            with self._changed:
                heartbeat = self._next_due()
                self._due[heartbeat] = time.monotonic() + heartbeat.period_s
                self._beating = heartbeat
            keep = heartbeat.beat()
            with self._changed:
                self._beating = None
                if not keep:
                    self._due.pop(heartbeat, None)
                self._changed.notify_all()

    def _next_due(self) -> LeaseHeartbeat:
        """Wait (holding the condition) until a heartbeat is due; return it."""
        while True:
            if not self._due:
                self._wakes_at = None
                self._changed.wait()
                continue
            heartbeat, due = min(self._due.items(), key=lambda item: item[1])
            wait_s = due - time.monotonic()
            if wait_s <= 0:
                return heartbeat
            self._wakes_at = due
            self._changed.wait(wait_s)


_BEATERS: dict[int, _Beater] = {}  # pid -> its beater: a forked child starts its own
_BEATERS_LOCK = threading.Lock()


def _beater() -> _Beater:
    pid = os.getpid()
    beater = _BEATERS.get(pid)
    if beater is None:
        with _BEATERS_LOCK:
            beater = _BEATERS.get(pid) or _BEATERS.setdefault(pid, _Beater())
    return beater
