"""A client-side deadline on every PostgreSQL store call.

A frozen server (SIGSTOP, a stalled VM) trips none of libpq's or the server's timeouts:
its kernel still accepts connections and ACKs keepalives, and ``statement_timeout`` is
enforced by the stopped server itself, so a query waits for the resume however long.
One store call is one checkout of a pooled connection; a watchdog thread shuts down the
socket of a connection checked out longer than the deadline, the call's blocked read
then fails, SQLAlchemy discards the connection and the store raises ``StoreUnavailable``
(a job fails as ``store_unavailable`` and is retried, instead of waiting for its time
limit).

SQLAlchemy's ``pool_pre_ping`` runs before the pool's checkout event, out of the
deadline's reach (and a pooled connection to a frozen server hangs right there), so an
engine with a deadline pings in that event instead, once the deadline is armed; and only
a connection idle for ``PING_AFTER_IDLE_S`` or more: one checked in moments ago (a job's
three store calls follow each other within milliseconds) answered its last statement
then, and a ping would be one more round trip per call. Should the server have gone in
that moment, the call's statement fails instead of the ping: SQLAlchemy discards the
connection (and, on a disconnect, every connection pooled before it) and the call fails as
``StoreUnavailable``, a transient failure a job is retried on.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.exc import DisconnectionError

# A pooled connection idle this long (s) is pinged before use; a fresher one is not.
PING_AFTER_IDLE_S = 1.0
# The connection record's ``info`` key of its last checkin (``time.monotonic()``).
_CHECKED_IN_AT = "compactor_checked_in_at"


class CallWatchdog:
    """Shuts down the socket of any connection armed longer than ``timeout_s`` ago."""

    def __init__(self, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        self._tick_s = min(1.0, timeout_s / 4)
        self._lock = threading.Lock()
        # connection record -> (deadline on the monotonic clock, DBAPI connection)
        self._armed: dict[Any, tuple[float, Any]] = {}
        self._thread_pid: int | None = None  # a forked child starts a watchdog of its own
        self._last_armed = time.monotonic()
        self.fired = 0

    def arm(self, record: Any, dbapi_connection: Any) -> None:
        with self._lock:
            self._armed[record] = (time.monotonic() + self.timeout_s, dbapi_connection)
            self._last_armed = time.monotonic()
            if self._thread_pid != os.getpid():
                self._thread_pid = os.getpid()
                threading.Thread(target=self._watch, name="store-call-deadline",
                                 daemon=True).start()

    def disarm(self, record: Any) -> None:
        with self._lock:
            self._armed.pop(record, None)

    @property
    def watching(self) -> bool:
        """A watchdog thread runs in this process."""
        return self._thread_pid == os.getpid()

    def _watch(self) -> None:
        while True:
            time.sleep(self._tick_s)
            now = time.monotonic()
            with self._lock:
                if not self._armed and now - self._last_armed > self.timeout_s:
                    # Idle for a whole deadline (or the engine disposed): the thread ends,
                    # and the next checkout starts another.
                    self._thread_pid = None
                    return
                overdue = [(record, conn) for record, (deadline, conn) in self._armed.items()
                           if deadline <= now]
                for record, _conn in overdue:
                    del self._armed[record]
                    self.fired += 1
                # Under the lock: a disarmed connection (checked in, maybe closed and its
                # descriptor reused) is never shut down.
                for _record, conn in overdue:
                    shut_down(conn)


def shut_down(dbapi_connection: Any) -> None:
    """Shut the connection's socket down both ways: a read blocked on it returns EOF."""
    try:
        if dbapi_connection.closed:
            return
        duplicate = socket.socket(fileno=os.dup(dbapi_connection.fileno()))
    except (OSError, ValueError, AttributeError):
        return  # closed meanwhile: nothing is blocked on it
    try:
        duplicate.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        duplicate.close()


def bound_store_calls(engine: Engine, timeout_s: float) -> CallWatchdog:
    """Arm a deadline of ``timeout_s`` on every checkout from ``engine``'s pool (created
    without ``pool_pre_ping``: the checkout pings here, under the deadline, a connection
    idle for ``PING_AFTER_IDLE_S`` or more)."""
    watchdog = CallWatchdog(timeout_s)
    dialect = engine.dialect

    @event.listens_for(engine.pool, "checkout")
    def _arm_and_ping(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        watchdog.arm(record, dbapi_connection)
        checked_in_at = record.info.get(_CHECKED_IN_AT)
        if checked_in_at is not None and time.monotonic() - checked_in_at < PING_AFTER_IDLE_S:
            return
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as exc:
            # The pool discards the connection and checks out a fresh one (re-armed).
            raise DisconnectionError("the pooled connection failed its ping") from exc

    @event.listens_for(engine.pool, "checkin")
    def _disarm(_dbapi_connection: Any, record: Any) -> None:
        watchdog.disarm(record)
        record.info[_CHECKED_IN_AT] = time.monotonic()

    return watchdog
