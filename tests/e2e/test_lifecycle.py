"""The data lifecycle against a live worker: a session deleted while its job runs stays
deleted, and garbage collection sent as the beat task runs beside a job without
breaking its swap or the chain it builds on."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine, func, select, table

from db import SessionLeased, SessionNotFound, Store
from tests.e2e.conftest import StartWorker
from tests.support.e2e import (
    EVENT_TIMEOUT_S,
    JobEnv,
    JobPublisher,
    append_turns,
    build_job_env,
    import_records,
    wait_until,
)
from tests.support.generated import generated_session, generated_turns
from tests.support.openai_server import OpenAIServer
from worker.broker.contract import GC_TASK_NAME
from worker.platform.lifecycle import delete_session

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SESSION_ID = "gen-lifecycle"
TURNS = 40  # about 4,800 tokens: over the job env's 4,200-token trigger


@pytest.fixture
def job_env(postgres_url: str, server: OpenAIServer) -> JobEnv:
    # gc keeps the active revision alone and no retention: anything superseded goes.
    return build_job_env(postgres_url, server.base_url, gc_keep_revisions=0,
                         gc_revision_retention_s=0, gc_run_retention_s=86_400)


def count_rows(url: str, name: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return int(connection.scalar(select(func.count()).select_from(table(name))) or 0)
    finally:
        engine.dispose()


def test_a_session_deleted_while_its_job_runs_ends_the_job_and_nothing_comes_back(
    pg_store: Store, job_env: JobEnv, publisher: JobPublisher, start_worker: StartWorker,
    server: OpenAIServer, postgres_url: str,
) -> None:
    import_records(pg_store, [generated_session(SESSION_ID, TURNS)])
    with pg_store.queue_markers() as markers:
        markers.mark(SESSION_ID, "job-1", now=datetime.now(UTC), marker_ttl_s=600)
    server.set_behaviour("latency")  # the summarize call takes 3 s
    worker = start_worker()
    publisher.publish(SESSION_ID, task_id="job-1")
    wait_until(lambda: pg_store.get_session(SESSION_ID).lease_owner is not None)

    with pytest.raises(SessionLeased):
        delete_session(pg_store, SESSION_ID, force=False, now=datetime.now(UTC))
    deleted = delete_session(pg_store, SESSION_ID, force=True, now=datetime.now(UTC))
    [event] = worker.wait_for_events("compaction.job", 1, timeout_s=EVENT_TIMEOUT_S)

    assert deleted.removed["messages"] == 1 + 4 * TURNS and deleted.removed["sessions"] == 1
    assert deleted.queued_job_id == "job-1" and deleted.broken_lease_owner is not None
    assert (event["outcome"], event["reason"]) in {
        ("rejected", "unknown_session"), ("conflict", "lease_lost")}
    assert event["revision_id"] is None
    with pytest.raises(SessionNotFound):
        pg_store.get_session(SESSION_ID)
    assert [count_rows(postgres_url, t) for t in ("sessions", "messages", "revisions")] == \
        [0, 0, 0]
    # What is left is the interrupted job's own record of how it ended, nothing else.
    [run] = pg_store.runs(session_id=SESSION_ID)
    assert (run.task_id, run.outcome, run.revision_id) == ("job-1", event["outcome"], None)


def test_gc_sent_as_the_beat_task_runs_beside_a_job_and_keeps_the_chain_it_swaps_onto(
    pg_store: Store, publisher: JobPublisher, start_worker: StartWorker,
    server: OpenAIServer,
) -> None:
    import_records(pg_store, [generated_session(SESSION_ID, TURNS)])
    worker = start_worker(concurrency=2)
    revision_ids = []
    for round_index in range(2):
        publisher.publish(SESSION_ID, task_id=f"round-{round_index}")
        events = worker.wait_for_events("compaction.job", round_index + 1)
        assert events[-1]["outcome"] == "compacted", events[-1]
        revision_ids.append(events[-1]["revision_id"])
        append_turns(pg_store, SESSION_ID, generated_turns(f"more{round_index}", TURNS))

    server.set_behaviour("latency")  # the third job sits in summarize while gc runs
    publisher.publish(SESSION_ID, task_id="round-2")
    wait_until(lambda: pg_store.get_session(SESSION_ID).lease_owner is not None)
    publisher.app.send_task(GC_TASK_NAME, queue=publisher.settings.queue_name)
    [gc] = worker.wait_for_events("lifecycle.gc", 1)
    events = worker.wait_for_events("compaction.job", 3)

    assert gc["revisions"] == 1 and gc["dry_run"] is False
    assert events[-1]["outcome"] == "compacted", events[-1]
    assert events[-1]["parent_revision_id"] == revision_ids[1]
    chain = pg_store.revisions(SESSION_ID)
    assert [r.id for r in chain] == [events[-1]["revision_id"], revision_ids[1]]
    assert [r.parent_revision_id for r in chain] == [revision_ids[1], None]
