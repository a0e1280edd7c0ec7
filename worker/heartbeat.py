"""The lease heartbeat: a running job renews its session's lease every
``lease_heartbeat_s``, so the lease TTL can be short and a dead worker's lease expires
(and the reconciler takes its job back) within about a minute, however long jobs run."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType

from db import StoreError
from worker.logging import get_logger


class LeaseHeartbeat:
    """A daemon thread calling ``renew`` every ``period_s`` until the block ends or
    ``renew`` answers False (another owner took the lease: nothing left to keep)."""

    def __init__(self, renew: Callable[[], bool], period_s: float) -> None:
        self._renew = renew
        self._period_s = period_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self.renewals = 0

    def __enter__(self) -> LeaseHeartbeat:
        if self._period_s > 0:
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._period_s)

    def _beat(self) -> None:
        while not self._stopped.wait(self._period_s):
            try:
                if not self._renew():
                    get_logger().warning("lease.lost")
                    return
                self.renewals += 1
            except StoreError as exc:
                # The next beat tries again; the swap re-checks the lease in any case.
                get_logger().warning("lease.renewal_failed", error_class=type(exc).__name__)
