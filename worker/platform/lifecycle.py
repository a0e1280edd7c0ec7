"""The data lifecycle as operators run it: garbage collection and erasing a session,
each logged as one event (``lifecycle.gc``, ``lifecycle.delete``) of ids and counts."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from db import DeletedSession, GcBatch, GcPolicy, SessionLeased
from worker.logging import get_logger
from worker.settings.config import Settings

if TYPE_CHECKING:
    from db import Store

GC_EVENT = "lifecycle.gc"
DELETE_EVENT = "lifecycle.delete"


@dataclass(frozen=True)
class GcReport:
    """What one garbage collection removed (a dry run: would remove)."""

    sessions: int
    revisions: int
    runs: int
    batches: int
    dry_run: bool
    duration_ms: int


def gc_policy(settings: Settings) -> GcPolicy:
    """The plain garbage-collection values of the settings."""
    return GcPolicy(
        keep_revisions=settings.gc_keep_revisions,
        revision_retention_s=settings.gc_revision_retention_s,
        run_retention_s=settings.gc_run_retention_s,
        batch_size=settings.gc_batch_size,
        session_retention_s=settings.gc_session_retention_s,
    )


def collect_garbage(
    store: Store, policy: GcPolicy, now: datetime, *, dry_run: bool = False,
    on_batch: Callable[[GcBatch], None] | None = None,
) -> GcReport:
    """Remove superseded revisions and old runs in batches; log one ``lifecycle.gc``."""
    started = time.monotonic()
    batches = store.collect_garbage(policy, now, dry_run=dry_run, on_batch=on_batch)
    report = GcReport(
        sessions=sum(b.removed for b in batches if b.table == "sessions"),
        revisions=sum(b.removed for b in batches if b.table == "revisions"),
        runs=sum(b.removed for b in batches if b.table == "runs"),
        batches=len(batches), dry_run=dry_run,
        duration_ms=int((time.monotonic() - started) * 1000),
    )
    get_logger().info(GC_EVENT, sessions=report.sessions, revisions=report.revisions,
                      runs=report.runs,
                      batches=report.batches, dry_run=dry_run,
                      duration_ms=report.duration_ms, keep_revisions=policy.keep_revisions,
                      revision_retention_s=policy.revision_retention_s,
                      run_retention_s=policy.run_retention_s,
                      session_retention_s=policy.session_retention_s)
    return report


def delete_session(store: Store, session_id: str, *, force: bool,
                   now: datetime) -> DeletedSession:
    """Erase the session with all its rows; log one ``lifecycle.delete`` (a refusal
    too: SessionLeased while a job holds the lease and ``force`` is off)."""
    try:
        deleted = store.delete_session(session_id, force=force, now=now)
    except SessionLeased:
        get_logger().warning(DELETE_EVENT, session_id=session_id, outcome="refused",
                             reason="lease_held", forced=force)
        raise
    get_logger().info(DELETE_EVENT, session_id=session_id, outcome="deleted", forced=force,
                      removed=deleted.removed, queued_job_id=deleted.queued_job_id,
                      broken_lease_owner=deleted.broken_lease_owner)
    return deleted
