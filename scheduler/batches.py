"""The batch poller (beat's ``compactor.poll_batches``, ``compactor batches poll``):
each poll collects the batches that have finished (their answers stored on the parked
jobs), sends every answered job again (forced: its decision was taken when it parked;
the queue marker keeps one that is already queued from going twice), then puts the
requests parked since the last poll into new batches (``batch_max_requests`` each, a
job's requests never split). The poll interval is the batches' window.

A batch that has not finished is left alone; a batch that ended without answering some
requests (expired, cancelled, failed, an error line) still has those lines stored: the
job resumes and falls back as ``batch_line_fallback`` says.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis

from db import MarkStatus, ParkedJob, Store, StoreError
from scheduler.enqueue import Publisher, trigger_sessions
from scheduler.publisher import RedisPublisher
from worker.compaction import CompactionError, summary_json_schema
from worker.logging import get_logger
from worker.runtime import llm_config
from worker.settings.config import Settings, get_settings
from worker.shared_state.connection import connect_redis
from worker.summarizers.openai_batch import BatchRequest, BatchState, LLMBatches
from worker.summarizers.openai_client import LLMClient

RESUME_REASON = "batch_answered"
# A batch line's JSON around its messages and schema (custom id, method, URL, model,
# response format, token limit, cache key), with room to spare.
_LINE_FRAMING_BYTES = 1_024


@dataclass(frozen=True)
class PollPolicy:
    max_requests: int  # per batch
    marker_ttl_s: float
    max_file_bytes: int  # per batch's request file


@dataclass
class PollReport:
    """What one poll did: batches created and collected, those still open (their status),
    and the jobs sent again."""

    submitted: dict[str, int] = field(default_factory=dict)  # batch id -> requests
    collected: dict[str, str] = field(default_factory=dict)  # batch id -> final status
    open: dict[str, str] = field(default_factory=dict)  # batch id -> status
    resumed: int = 0


@dataclass(frozen=True)
class OpenBatch:
    """A batch parked jobs wait on (``batch_id`` None: the requests not sent yet)."""

    batch_id: str | None
    jobs: int
    requests: int
    status: str  # the provider's, or ``waiting`` (not sent), ``answered`` (collected)


def custom_id(session_id: str, key: str) -> str:
    """A request's id in a batch: its session, then its digest (which has no ``/``)."""
    return f"{session_id}/{key}"


def poll_batches(store: Store, batches: LLMBatches, publisher: Publisher,
                 policy: PollPolicy, now: datetime) -> PollReport:
    """One poll: collect what finished, then submit what waits."""
    report = PollReport()
    waiting: dict[str, list[ParkedJob]] = defaultdict(list)
    for park in store.parked_jobs(state="submitted"):
        waiting[str(park.batch_id)].append(park)
    for batch_id, parks in waiting.items():
        state = batches.state(batch_id)
        if not state.status.is_final:
            report.open[batch_id] = state.status.value
            continue
        _collect(store, batches, state, parks)
        report.collected[batch_id] = state.status.value
    # Every answered job, not only this poll's: one whose sending failed goes now (a job
    # already queued keeps its marker and is not sent twice).
    answered = [park.session_id for park in store.parked_jobs(state="answered")]
    results = trigger_sessions(store, publisher, answered, reason=RESUME_REASON, force=True,
                               now=now, marker_ttl_s=policy.marker_ttl_s)
    report.resumed += sum(result.status is MarkStatus.ENQUEUED for result in results)
    for parks_of_batch in batch_windows(store.parked_jobs(state="open"), policy):
        state = batches.submit(_requests(parks_of_batch), metadata={"compactor": "night"})
        store.mark_parks_submitted([park.session_id for park in parks_of_batch],
                                   state.batch_id)
        report.submitted[state.batch_id] = sum(len(park.requests) for park in parks_of_batch)
        get_logger().info("batch.submitted", batch_id=state.batch_id,
                          jobs=len(parks_of_batch), requests=report.submitted[state.batch_id])
    return report


def _collect(store: Store, batches: LLMBatches, state: BatchState,
             parks: Sequence[ParkedJob]) -> None:
    """Store a finished batch's lines on the parked jobs they answer."""
    owners = {custom_id(park.session_id, request["key"]): (park.session_id, request["key"])
              for park in parks for request in park.requests}
    answers: dict[str, dict[str, Any]] = defaultdict(dict)
    for request_id, line in batches.lines(state, owners).items():
        session_id, key = owners[request_id]
        answers[session_id][key] = line
    store.add_park_answers(dict(answers))
    unanswered = state.total - state.completed
    log = get_logger().warning if unanswered or state.status.value != "completed" else \
        get_logger().info
    log("batch.collected", batch_id=state.batch_id, status=state.status.value,
        jobs=len(parks), requests=len(owners), completed=state.completed,
        failed=state.failed, errors=list(state.errors))


def batch_windows(parks: Sequence[ParkedJob], policy: PollPolicy) -> Iterator[list[ParkedJob]]:
    """The parked jobs in order, in groups of at most ``max_requests`` requests and a
    request file of at most ``max_file_bytes`` (a job whole: one larger than a batch
    goes alone)."""
    group: list[ParkedJob] = []
    requests = size = 0
    per_line = _line_overhead_bytes()
    for park in parks:
        park_bytes = request_file_bytes(park, per_line)
        if group and (requests + len(park.requests) > policy.max_requests
                      or size + park_bytes > policy.max_file_bytes):
            yield group
            group, requests, size = [], 0, 0
        group.append(park)
        requests += len(park.requests)
        size += park_bytes
    if group:
        yield group


def request_file_bytes(park: ParkedJob, per_line: int | None = None) -> int:
    """An upper bound of what the job's requests add to a batch's request file: their
    messages as JSON, and per line ``per_line`` (the output schema and the line's own
    framing; measured when not given)."""
    overhead = _line_overhead_bytes() if per_line is None else per_line
    return sum(len(json.dumps(request["messages"])) + overhead for request in park.requests)


def _line_overhead_bytes() -> int:
    return len(json.dumps(summary_json_schema())) + _LINE_FRAMING_BYTES


def _requests(parks: Sequence[ParkedJob]) -> list[BatchRequest]:
    schema = summary_json_schema()
    return [BatchRequest(custom_id(park.session_id, request["key"]), request["messages"],
                         schema, request["max_output_tokens"])
            for park in parks for request in park.requests]


def list_open_batches(store: Store, batches: LLMBatches) -> list[OpenBatch]:
    """The batches parked jobs wait on, with the provider's status of each."""
    groups: dict[tuple[str, str | None], list[ParkedJob]] = defaultdict(list)
    for park in store.parked_jobs():
        groups[(park.state, park.batch_id)].append(park)
    listed = []
    for (state, batch_id), parks in groups.items():
        status = {"open": "waiting", "answered": "answered"}.get(state)
        if status is None:
            status = batches.state(str(batch_id)).status.value
        listed.append(OpenBatch(batch_id if state != "open" else None, len(parks),
                                sum(len(park.requests) for park in parks), status))
    return listed


def run_scheduled_poll(settings: Settings, now: datetime) -> PollReport:
    """One poll with connections made from ``settings`` (beat's task and the command)."""
    store = Store.from_url(settings.effective_database_url,
                           sqlite_busy_timeout_ms=settings.sqlite_busy_timeout_ms,
                           call_timeout_s=settings.db_call_timeout_s)
    client = connect_redis(settings)
    try:
        with LLMClient(llm_config(settings)) as llm:
            publisher = RedisPublisher(client, settings.redis_key_prefix, settings.queue_name)
            return poll_batches(store, LLMBatches(llm), publisher,
                                PollPolicy(settings.batch_max_requests,
                                           settings.enqueue_marker_ttl_s,
                                           settings.batch_max_file_bytes), now)
    finally:
        client.close()
        store.close()


def poll_and_report() -> str:
    """One poll, its failure logged rather than raised (the ``compactor.poll_batches``
    task): the next poll does what this one could not."""
    try:
        report = run_scheduled_poll(get_settings(), datetime.now(UTC))
    except (StoreError, CompactionError, redis.RedisError) as exc:
        get_logger().warning("batch.poll_failed", error_class=type(exc).__name__,
                             error=str(exc)[:500])
        return "failed"
    get_logger().info("batch.polled", submitted=len(report.submitted),
                      collected=len(report.collected), open=len(report.open),
                      resumed=report.resumed)
    return "polled"
