"""Beat's scheduler: Celery's persistent one, except that each send is one JSON event
(``beat.sent``: the entry, its task and the message's id), and an entry it cannot send
(Redis is down) is one JSON error line, not a traceback, and is sent again every few
seconds until Redis takes it, so a scan missed during an outage still runs once Redis is
back (Celery's own scheduler logs the failure and waits for the next due time: with a
nightly scan, a day)."""

from __future__ import annotations

from typing import Any

from celery.beat import PersistentScheduler, ScheduleEntry

from worker.logging import get_logger

# How often a missed entry is sent again while Redis is down (s).
CATCH_UP_RETRY_S = 5.0


class CatchUpScheduler(PersistentScheduler):  # type: ignore[misc]
    """Remembers each entry whose send failed and sends it again until it goes out (at
    most once per entry: a second miss of the same entry is the same catch-up)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.missed: dict[str, ScheduleEntry] = {}
        super().__init__(*args, **kwargs)

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        if not self._send(entry, producer):
            self.missed[entry.name] = entry

    def tick(self, *args: Any, **kwargs: Any) -> float:
        for name, entry in list(self.missed.items()):
            if self._send(entry, self.producer):
                del self.missed[name]
                get_logger().warning("beat.caught_up", entry=name, task=entry.task)
        delay = float(super().tick(*args, **kwargs))
        return min(delay, CATCH_UP_RETRY_S) if self.missed else delay

    def _send(self, entry: ScheduleEntry, producer: Any) -> bool:
        try:
            sent = self.apply_async(entry, producer=producer, advance=False)
        except Exception as exc:  # Celery wraps every send failure in SchedulingError
            get_logger().error("beat.send_failed", entry=entry.name, task=entry.task,
                               error_class=type(exc.__cause__ or exc).__name__,
                               error=str(exc)[:300], will_catch_up=True)
            return False
        get_logger().info("beat.sent", entry=entry.name, task=entry.task, task_id=sent.id)
        return True
