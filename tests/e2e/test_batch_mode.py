"""Batch mode end to end: a real Celery worker, Redis, PostgreSQL and the HTTP test
server's Batch API. Every due session's job parks while its batch is held in progress
(more jobs than worker processes: a parked job holds no slot), the poller sends the
batch, collects it and sends the jobs again through Redis, and the worker finishes them
(chunk-and-merge one round per batch) at the Batch API's price. An expired batch, or one
that failed some of its lines, ends each job by the fallback setting, loudly; a session
rolled back while its request was in a batch is planned afresh, its stale result never
applied."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from db import Store
from scheduler.batches import run_scheduled_poll
from tests.e2e.conftest import StartWorker
from tests.support.batch_api import BatchKnobs
from tests.support.batch_night import MODEL, PRICE, WINDOW_TOKENS
from tests.support.e2e import (
    EVENT_TIMEOUT_S,
    JobEnv,
    JobPublisher,
    append_turns,
    build_job_env,
    import_records,
)
from tests.support.generated import generated_session
from tests.support.openai_server import OpenAIServer
from tests.support.worker_process import WorkerProcess
from worker.compaction import dump_price_table, price_calls

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(model=MODEL, context_window=WINDOW_TOKENS, latency_ms=0) as running:
        yield running


@pytest.fixture
def job_env(postgres_url: str, server: OpenAIServer) -> JobEnv:
    return build_job_env(postgres_url, server.base_url, llm_mode="batch", llm_model=MODEL,
                         llm_context_tokens=WINDOW_TOKENS, llm_max_output_tokens=1_024,
                         batch_sync_max_prompt_tokens=0, quiet_period_s=0,
                         llm_max_calls_per_job=8, llm_concurrency=4,
                         llm_prices=dump_price_table({MODEL: PRICE}))


def wait_parked(store: Store, session_id: str) -> None:
    """Wait until the session's job parked requests not yet sent."""
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    while [p.state for p in store.parked_jobs(session_id=session_id)] != ["open"]:
        assert time.monotonic() < deadline, store.parked_jobs(session_id=session_id)
        time.sleep(0.2)


def newest_outcomes(store: Store, session_ids: list[str]) -> dict[str, str]:
    newest = {run.session_id: run.outcome for run in reversed(store.runs(limit=1_000))}
    return {sid: newest.get(sid, "") for sid in session_ids}


def poll_until_compacted(store: Store, job_env: JobEnv, session_ids: list[str]) -> int:
    """Poll as beat would until every session's newest run compacted; the polls it took."""
    return poll_until_compacted_or(store, job_env, session_ids, {"compacted"})


def poll_until_compacted_or(store: Store, job_env: JobEnv, session_ids: list[str],
                            outcomes: set[str]) -> int:
    """Poll as beat would until every session's newest run ended in ``outcomes``."""
    deadline, polls = time.monotonic() + EVENT_TIMEOUT_S, 0
    while not set(newest_outcomes(store, session_ids).values()) <= outcomes:
        assert time.monotonic() < deadline, newest_outcomes(store, session_ids)
        run_scheduled_poll(job_env.settings, datetime.now(UTC))
        polls += 1
        time.sleep(0.5)
    return polls


def test_a_night_in_batch_mode_parks_every_job_without_holding_a_worker_and_finishes_them(
        pg_store: Store, job_env: JobEnv, publisher: JobPublisher, start_worker: StartWorker,
        server: OpenAIServer) -> None:
    rng = random.Random(36)
    sessions = [generated_session(f"bn{index}", rng.choice((70, 90, 300)))
                for index in range(8)]
    ids = [session["session_id"] for session in sessions]
    import_records(pg_store, sessions)
    server.set_batch_knobs(BatchKnobs(in_progress_s=3_600))  # held until all have parked
    worker = start_worker(concurrency=2)

    for sid in ids:
        publisher.publish(sid, reason="nightly")
    worker.wait_for_events("compaction.job", len(ids), timeout_s=EVENT_TIMEOUT_S)
    parked = {event["session_id"]: event["outcome"] for event in worker.events("compaction.job")}
    first = run_scheduled_poll(job_env.settings, datetime.now(UTC))
    held = run_scheduled_poll(job_env.settings, datetime.now(UTC))
    leases = {sid: pg_store.get_session(sid).lease_owner for sid in ids}
    server.set_batch_knobs(BatchKnobs())
    polls = poll_until_compacted(pg_store, job_env, ids)
    runs = [run for run in pg_store.runs(limit=1_000) if run.outcome == "compacted"]

    assert parked == dict.fromkeys(ids, "parked")  # 8 jobs, 2 processes: none held one
    assert leases == dict.fromkeys(ids)
    assert len(first.submitted) == 1 and list(held.open.values()) == ["in_progress"]
    assert pg_store.parked_jobs() == [] and len(runs) == len(ids) and polls >= 2
    assert any(run.figures["merge_rounds"] > 0 for run in runs)
    for session in sessions:
        assert len(pg_store.messages(session["session_id"])) == len(session["messages"])
    for run in runs:
        figures = run.figures
        assert figures["cost_usd"] == pytest.approx(price_calls(
            PRICE, prompt_tokens=figures["prompt_tokens"], cached_tokens=figures["cached_tokens"],
            completion_tokens=figures["completion_tokens"], batch=True), abs=1e-9)


@pytest.mark.parametrize(("knobs", "fallback"), [
    (BatchKnobs(expire=True, answered_before_expiry=1), "sync"),
    (BatchKnobs(expire=True, answered_before_expiry=1), "deterministic"),
    (BatchKnobs(fail_every=2), "sync"),
], ids=["expired-sync", "expired-deterministic", "partial-failure-sync"])
def test_a_batch_that_leaves_lines_unanswered_ends_each_job_loudly_by_the_fallback_setting(
        pg_store: Store, postgres_url: str, server: OpenAIServer, start_worker: StartWorker,
        knobs: BatchKnobs, fallback: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    sessions = [generated_session(f"bx{index}", 70) for index in range(3)]
    ids = [session["session_id"] for session in sessions]
    import_records(pg_store, sessions)
    server.set_batch_knobs(knobs)
    env = build_job_env(postgres_url, server.base_url, llm_mode="batch", llm_model=MODEL,
                        llm_context_tokens=WINDOW_TOKENS, llm_max_output_tokens=1_024,
                        llm_max_calls_per_job=8, llm_concurrency=4, quiet_period_s=0,
                        batch_line_fallback=fallback,
                        llm_prices=dump_price_table({MODEL: PRICE}))
    worker = WorkerProcess(env.env, tmp_path_factory.mktemp("w") / "worker.log",
                           concurrency=2, queue=env.queue).start()
    publisher = JobPublisher(env.settings)
    try:
        for sid in ids:
            publisher.publish(sid, reason="nightly")
        worker.wait_for_events("compaction.job", len(ids), timeout_s=EVENT_TIMEOUT_S)
        poll_until_compacted_or(pg_store, env, ids, {"compacted", "fallback"})
        failed_lines = worker.events("batch.line_failed")
    finally:
        publisher.close()
        worker.stop()

    expected = "compacted" if fallback == "sync" else "fallback"
    assert set(newest_outcomes(pg_store, ids).values()) == {expected}
    reasons = {e["reason"] for e in failed_lines}
    assert failed_lines and (reasons == {"batch_expired"}) == knobs.expire, reasons
    assert {e["fallback"] for e in failed_lines} == {fallback}
    assert pg_store.parked_jobs() == []


def test_a_session_rolled_back_while_its_request_is_in_a_batch_is_never_applied_stale(
        pg_store: Store, job_env: JobEnv, publisher: JobPublisher, start_worker: StartWorker,
        server: OpenAIServer) -> None:
    session = generated_session("brb", 140)
    half = len(session["messages"]) // 2 // 4 * 4 + 1  # the system prompt, whole exchanges
    import_records(pg_store, [{"session_id": "brb", "messages": session["messages"][:half]}])
    worker = start_worker(concurrency=2)
    publisher.publish("brb", reason="nightly", force=True)
    worker.wait_for_events("compaction.job", 1, timeout_s=EVENT_TIMEOUT_S)
    poll_until_compacted(pg_store, job_env, ["brb"])
    first = pg_store.get_session("brb").active_revision_id
    append_turns(pg_store, "brb", session["messages"][half:])
    server.set_batch_knobs(BatchKnobs(in_progress_s=3_600))

    publisher.publish("brb", reason="nightly", force=True)
    wait_parked(pg_store, "brb")
    run_scheduled_poll(job_env.settings, datetime.now(UTC))  # its requests go in a batch
    parked_on = pg_store.parked_jobs(session_id="brb")[0].revision_id
    pg_store.rollback("brb")  # while the batch holds its requests
    server.set_batch_knobs(BatchKnobs())
    poll_until_compacted(pg_store, job_env, ["brb"])
    active = pg_store.get_session("brb").active_revision_id
    revisions = {revision.id: revision for revision in pg_store.revisions("brb")}

    assert first is not None and parked_on == first
    assert [e["parked_revision_id"] for e in worker.events("batch.park_stale")] == [first]
    assert active is not None and active != first
    assert revisions[active].parent_revision_id is None  # planned on the rolled-back state
    assert pg_store.parked_jobs() == []
