"""The store's scheduling methods: the due-session scan, queued-job markers and what the
reconciler reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime

from db.queue import QueueMarkers
from db.reconcile import HeldSession, read_dead_leases, read_due_among, read_held_sessions
from db.scan import (
    DueCriteria,
    DueCursor,
    DuePage,
    DueRow,
    DueWhy,
    count_exclusions,
    read_due_page,
)
from db.store_base import StoreBase


class SchedulingStoreMethods(StoreBase):
    """What the scheduler and the reconciler ask of the store."""

    def due_sessions_page(
        self, why: DueWhy, criteria: DueCriteria, now: datetime, *, limit: int,
        after: DueCursor | None = None,
    ) -> DuePage:
        """Read one keyset page of ``why``'s tier of due sessions, most to gain first."""
        with self._read() as session:
            return read_due_page(session, why, criteria, now, limit=limit, after=after)

    def iter_due_sessions(
        self, criteria: DueCriteria, now: datetime, *, page_size: int
    ) -> Iterator[DueRow]:
        """Yield every due session once, tier by tier, one short read per page.

        No snapshot stays open between pages, so a session whose figures change
        meanwhile may be skipped or seen twice; the queue marker makes a second sighting
        harmless and the next scan picks up a skipped one.
        """
        for why in DueWhy:
            after: DueCursor | None = None
            while True:
                page = self.due_sessions_page(why, criteria, now, limit=page_size, after=after)
                yield from page.sessions
                if page.next_after is None:
                    break
                after = page.next_after

    def count_scan_exclusions(self, criteria: DueCriteria, now: datetime) -> dict[str, int]:
        """Sessions by the first reason a scan at ``now`` leaves them out (``db.Exclusion``),
        and ``eligible`` ones; a full read, for explaining a scan, not for running one."""
        with self._read() as session:
            return count_exclusions(session, criteria, now)

    @contextmanager
    def queue_markers(self) -> Iterator[QueueMarkers]:
        """One write transaction over queued-job markers: what is marked or cleared
        through it commits together on exit, or not at all."""
        with self._write() as session:
            yield QueueMarkers(session.connection())

    def held_sessions(self, *, queued_before: datetime, limit: int) -> list[HeldSession]:
        """Sessions with a marker set before ``queued_before`` or a lease (the reconciler)."""
        with self._read() as session:
            return read_held_sessions(session, queued_before=queued_before, limit=limit)

    def dead_leases(self, *, now: datetime, limit: int) -> list[HeldSession]:
        """Sessions whose lease expired before ``now`` (the reconciler's quick sweep)."""
        with self._read() as session:
            return read_dead_leases(session, now=now, limit=limit)

    def due_among(self, session_ids: Sequence[str], criteria: DueCriteria,
                  now: datetime) -> dict[str, tuple[DueWhy, int]]:
        """Of ``session_ids``, those the scan would take were their marker and lease free."""
        if not session_ids:
            return {}
        with self._read() as session:
            return read_due_among(session, session_ids, criteria, now)

    def clear_queue_marker(self, session_id: str, job_id: str) -> bool:
        """Clear the session's queued-job marker if it is still ``job_id``'s."""
        with self.queue_markers() as markers:
            return markers.clear(session_id, job_id)
