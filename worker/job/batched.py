"""A job in batch mode (``COMPACTOR_LLM_MODE=batch``): it plans from its snapshot as
today; its summarizer requests go to a batch and it parks, holding nothing (no lease, no
worker slot) but its ``parked_jobs`` row. The poller sends it again once a batch has
answered; it then reads the snapshot as of the head it parked at, replays the summarizer
over the answers, and ends through the same merge, validation and compare-and-swap as a
synchronous job, or parks again for the next round of chunk-and-merge.

A parked job whose session's active revision changed meanwhile (a rollback, another
compaction) is stale: its record is dropped and the job plans afresh (rescheduled),
never applying what it read. Appends after its snapshot stay in the tail.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

from db import JobSnapshot, ParkedJob, StoreError
from worker.errors import Outcome
from worker.job.admission import Admitted
from worker.job.planning import JobPlan, SnapshotMessage
from worker.job.ports import Batching, ReplayRunPort
from worker.job.values import JobDeps, JobResult, JobTrace, Skip
from worker.logging import get_logger
from worker.summarizers import BatchLineFailed, BatchPending, SummaryDraft, SummaryWork

log = get_logger()
AWAITING = "awaiting_batch"


def read_park(batching: Batching, snapshot: JobSnapshot[SnapshotMessage]
              ) -> tuple[JobSnapshot[SnapshotMessage], ParkedJob | None]:
    """The snapshot the job plans from and its parked record, if it resumes one: as of the
    head it parked at while its active revision is unchanged; a stale record is dropped.
    A job whose requests still wait for their batch skips (``awaiting_batch``)."""
    session = snapshot.session
    parks = batching.store.parked_jobs(session_id=session.session_id)
    if not parks:
        return snapshot, None
    park = parks[0]
    if park.revision_id != session.active_revision_id or park.head_seq > session.head_seq:
        batching.store.drop_parked_job(session.session_id)
        log.warning("batch.park_stale", session_id=session.session_id,
                    parked_revision_id=park.revision_id,
                    active_revision_id=session.active_revision_id, batch_id=park.batch_id)
        return snapshot, None
    if park.state != "answered":
        raise Skip(AWAITING)
    messages = [message for message in snapshot.messages if message.seq <= park.head_seq]
    return dataclasses.replace(
        snapshot, session=dataclasses.replace(session, head_seq=park.head_seq),
        messages=messages), park


def summarize(trace: JobTrace, deps: JobDeps, admitted: Admitted, plan: JobPlan,
              work: SummaryWork, park: ParkedJob | None
              ) -> tuple[Admitted, SummaryDraft] | JobResult:
    """The draft, through the batches' answers in batch mode; or the job parked."""
    if deps.batching is None or not admitted.summarizer.uses_provider:
        return admitted, admitted.summarizer.summarize(work)
    run = deps.batching.mode.replay(park.answers if park else {})
    try:
        return admitted, run.summarizer.summarize(work)
    except BatchPending:
        return _park(trace, deps, deps.batching, plan, run, park)
    except BatchLineFailed as exc:
        log.warning("batch.fallback", session_id=plan.session.session_id,
                    reason=exc.reason, error=str(exc.error))
        return (Admitted(deps.fallback, Outcome.FALLBACK, admitted.open_breaker),
                deps.fallback.summarize(work))


def _park(trace: JobTrace, deps: JobDeps, batching: Batching, plan: JobPlan,
          run: ReplayRunPort, park: ParkedJob | None) -> JobResult:
    """End the job parked: its requests for the next batch, and the answers so far."""
    now, session = deps.clock(), plan.session
    record = ParkedJob(session.session_id, session.active_revision_id, session.head_seq,
                       "open", run.pending_records(), None,
                       park.answers if park else {}, now)
    batching.store.park_job(trace.new_run(Outcome.PARKED, AWAITING, None, now), record,
                            lease_owner=deps.lease_owner(trace.request))
    result = trace.result(Outcome.PARKED, AWAITING, None)
    return dataclasses.replace(result, queue_marker_cleared=True)


@contextmanager
def dropped_on_failure(batching: Batching | None, park: ParkedJob | None,
                       session_id: str) -> Iterator[None]:
    """Drop the parked record a job resumed when the job fails: replaying its answers
    would fail the same way, so the next scan plans the session afresh."""
    try:
        yield
    except Exception:
        with contextlib.suppress(StoreError):  # the job's own error is the one to report
            drop_applied(batching, park, session_id)
        raise


def drop_applied(batching: Batching | None, park: ParkedJob | None, session_id: str) -> None:
    """Forget the parked record whose result the swap applied."""
    if batching is not None and park is not None:
        batching.store.drop_parked_job(session_id)
