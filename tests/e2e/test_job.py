"""The compaction job end to end: a real Celery worker process, Redis, PostgreSQL and the
OpenAI-protocol test server. A session over the trigger gets one valid, smaller
revision; duplicate deliveries make no second revision of a snapshot; messages appended
while a job runs are never lost."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from db import Store
from tests.e2e.conftest import StartWorker
from tests.support.e2e import (
    EVENT_TIMEOUT_S,
    JobEnv,
    JobPublisher,
    append_turns,
    import_records,
    projection_violations,
    snapshot_keys,
    wait_until,
)
from tests.support.generated import generated_session, generated_turns
from tests.support.openai_server import OpenAIServer
from tests.support.worker_process import WorkerProcess
from worker.job.outcome import event_field_docs

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

# Generated sessions over the job env's 4,200-token trigger (about 4,800 tokens each).
LONG_SESSION_ID = "gen-long"
MEDIUM_SESSION_ID = "gen-medium"
TURNS = 40

# The documented fields of the ``compaction.job`` event (README, "Outcome events").
EVENT_FIELDS = frozenset(event_field_docs())
JOB_STEPS = ("lease", "breaker", "plan", "summarize", "merge", "validate", "swap")


def events_by_task(worker: WorkerProcess, count: int) -> dict[str, dict[str, Any]]:
    """Wait for ``count`` outcome events; return the last one of each task."""
    events = worker.wait_for_events("compaction.job", count, timeout_s=EVENT_TIMEOUT_S)
    return {event["task_id"]: event for event in events}


def test_a_session_over_the_trigger_gets_a_valid_smaller_revision_and_one_event(
    pg_store: Store, job_env: JobEnv, publisher: JobPublisher, start_worker: StartWorker,
    server: OpenAIServer,
) -> None:
    import_records(pg_store, [generated_session(LONG_SESSION_ID, TURNS)])
    before = pg_store.get_session(LONG_SESSION_ID)
    history = pg_store.messages(LONG_SESSION_ID)
    assert before.projection_tokens > job_env.settings.trigger_tokens
    worker = start_worker()

    task_id = publisher.publish(LONG_SESSION_ID, reason="e2e-over-trigger")

    [event] = events_by_task(worker, 1).values()
    after = pg_store.get_session(LONG_SESSION_ID)
    [revision] = pg_store.revisions(LONG_SESSION_ID)
    assert set(event) >= EVENT_FIELDS, EVENT_FIELDS - set(event)
    assert (event["task_id"], event["session_id"], event["attempt"]) == \
        (task_id, LONG_SESSION_ID, 1)
    assert (event["outcome"], event["reason"]) == ("compacted", "over_trigger")
    assert (event["revision_id"], event["parent_revision_id"]) == (revision.id, None)
    assert after.active_revision_id == revision.id
    assert (event["breaker_state"], event["failure_class"], event["failure_message"]) == \
        ("closed", None, None)
    assert event["tokens_before"] == before.projection_tokens
    assert event["tokens_after"] == after.projection_tokens < before.projection_tokens
    assert event["span_tokens"] == revision.span_tokens > 0
    assert event["summary_tokens"] == revision.block_tokens > 0
    assert event["llm_calls"] == server.request_count == event["chunks"] >= 1
    assert event["prompt_tokens"] == sum(r.prompt_tokens for r in server.requests)
    assert event["completion_tokens"] > 0 and event["merge_rounds"] == 0
    assert set(JOB_STEPS) <= set(event["durations_ms"])
    assert projection_violations(pg_store, LONG_SESSION_ID) == []
    assert pg_store.messages(LONG_SESSION_ID) == history
    [run] = pg_store.runs(session_id=LONG_SESSION_ID)
    assert (run.task_id, run.outcome, run.revision_id) == (task_id, "compacted", revision.id)


@pytest.mark.parametrize("same_task_id", [True, False], ids=["same-task-id", "distinct-ids"])
def test_the_same_job_delivered_twice_at_once_makes_one_revision(
    pg_store: Store, publisher: JobPublisher, start_worker: StartWorker, server: OpenAIServer,
    same_task_id: bool,
) -> None:
    import_records(pg_store, [generated_session(LONG_SESSION_ID, TURNS)])
    server.set_behaviour("latency")  # a 3 s summarize: the two jobs overlap
    worker = start_worker(concurrency=2)
    task_id = str(uuid.uuid4())

    sent = [publisher.publish(LONG_SESSION_ID, task_id=task_id if same_task_id else None)
            for _ in range(2)]

    events = worker.wait_for_events("compaction.job", 2, timeout_s=EVENT_TIMEOUT_S)
    outcomes = sorted(event["outcome"] for event in events)
    revisions = pg_store.revisions(LONG_SESSION_ID)
    assert {event["task_id"] for event in events} == set(sent)
    assert len(revisions) == 1, outcomes
    assert outcomes.count("compacted") == 1
    assert set(outcomes) - {"compacted"} <= {"skipped", "conflict"}, events
    assert pg_store.get_session(LONG_SESSION_ID).active_revision_id == revisions[0].id
    assert projection_violations(pg_store, LONG_SESSION_ID) == []


def test_fifty_deliveries_in_a_loop_make_one_revision_per_snapshot(
    pg_store: Store, publisher: JobPublisher, start_worker: StartWorker,
    server: OpenAIServer,
) -> None:
    import_records(pg_store, [generated_session(MEDIUM_SESSION_ID, TURNS)])
    head_seq = pg_store.get_session(MEDIUM_SESSION_ID).head_seq
    worker = start_worker(concurrency=2)

    for _ in range(50):
        publisher.publish(MEDIUM_SESSION_ID, reason="duplicate-storm")

    events = worker.wait_for_events("compaction.job", 50, timeout_s=EVENT_TIMEOUT_S)
    revisions = pg_store.revisions(MEDIUM_SESSION_ID)
    keys = snapshot_keys(revisions)
    assert len(keys) == len(set(keys))
    # Nothing was appended: one snapshot, so one revision, and one LLM call for it.
    [revision] = revisions
    assert revision.snapshot_head_seq == head_seq
    assert server.request_count == 1
    outcomes = [event["outcome"] for event in events]
    assert outcomes.count("compacted") == 1
    assert set(outcomes) <= {"compacted", "skipped", "conflict"}
    assert len(pg_store.runs(session_id=MEDIUM_SESSION_ID, limit=100)) == 50


def test_messages_appended_while_the_job_summarizes_are_all_kept(
    pg_store: Store, publisher: JobPublisher, start_worker: StartWorker,
    server: OpenAIServer,
) -> None:
    import_records(pg_store, [generated_session(LONG_SESSION_ID, TURNS)])
    snapshot_head = pg_store.get_session(LONG_SESSION_ID).head_seq
    server.set_behaviour("latency")  # each summarize call takes 3 s
    worker = start_worker()
    appended: list[int] = []

    def append_while_summarizing() -> None:
        wait_until(lambda: server.request_count >= 1, timeout_s=EVENT_TIMEOUT_S)
        for batch in range(3):
            appended.extend(append_turns(pg_store, LONG_SESSION_ID,
                                         generated_turns(f"LIVE{batch}", 2)))

    appender = threading.Thread(target=append_while_summarizing)
    appender.start()
    publisher.publish(LONG_SESSION_ID)
    [event] = events_by_task(worker, 1).values()
    appender.join()

    [revision] = pg_store.revisions(LONG_SESSION_ID)
    assert event["outcome"] == "compacted", event
    assert len(appended) == 24 and min(appended) == snapshot_head + 1
    assert revision.snapshot_head_seq == snapshot_head < min(appended)
    assert revision.through_seq <= snapshot_head
    history = {m.seq: m.body for m in pg_store.messages(LONG_SESSION_ID)}
    projection = pg_store.projection(LONG_SESSION_ID)
    assert set(appended) <= set(history)
    assert [history[seq] for seq in appended] == projection[-len(appended):]
    assert projection_violations(pg_store, LONG_SESSION_ID) == []
