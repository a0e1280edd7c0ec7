"""A night in batch mode (``COMPACTOR_LLM_MODE=batch``) on PostgreSQL against the real
HTTP test server: each job parks (no lease held), the poller submits the window's
requests as one batch, collects it and sends the jobs again, which finish through the
same validation and compare-and-swap (chunk-and-merge one round per batch) at the Batch
API's price. Expired and partly failed batches fall back loudly; a session rolled back
while its request waited is planned afresh, its stale result never applied."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from db import Store, upgrade_database
from tests.support.batch_api import BatchKnobs
from tests.support.batch_night import (
    MODEL,
    PRICE,
    WINDOW_TOKENS,
    batch_night,
    compacted_costs,
    import_all,
    night_sessions,
    run_jobs,
    runtime_for,
)
from tests.support.cli import Compactor, compactor_for
from tests.support.databases import truncate_store_tables
from tests.support.openai_server import OpenAIServer
from worker.compaction import price_calls
from worker.compaction.intake import IntakePolicy
from worker.errors import Outcome
from worker.job.values import JobRequest
from worker.platform.ingest import append_messages

pytestmark = pytest.mark.integration


@pytest.fixture
def postgres_url(migrated_postgres_url: str) -> str:
    truncate_store_tables(migrated_postgres_url)
    return migrated_postgres_url


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(model=MODEL, context_window=WINDOW_TOKENS, latency_ms=0) as running:
        yield running


def test_a_night_in_batch_mode_compacts_every_due_session_through_batches_at_half_price(
        postgres_url: str, server: OpenAIServer, tmp_path: Path) -> None:
    sessions = night_sessions(seed=5, count=12)
    ids = [session["session_id"] for session in sessions]
    batch_runtime = runtime_for(postgres_url, server, "batch")
    import_all(batch_runtime, sessions)
    try:
        results, batches = batch_night(batch_runtime, server, ids)
        batched = compacted_costs(batch_runtime.store, ids)
        stored = {sid: len(batch_runtime.store.messages(sid)) for sid in ids}
        parked_left = batch_runtime.store.parked_jobs()
    finally:
        batch_runtime.close()
    with OpenAIServer(model=MODEL, context_window=WINDOW_TOKENS, latency_ms=0) as sync_server:
        sync_url = f"sqlite:///{tmp_path}/sync.db"
        upgrade_database(sync_url)
        sync_runtime = runtime_for(sync_url, sync_server, "sync")
        import_all(sync_runtime, sessions)
        try:
            sync_results = run_jobs(sync_runtime, [JobRequest(sid, "nightly") for sid in ids])
            synchronous = compacted_costs(sync_runtime.store, ids)
        finally:
            sync_runtime.close()

    assert {result.outcome for result in sync_results} == {Outcome.COMPACTED}
    assert {sid: [r.outcome for r in rs][-1] for sid, rs in results.items()} == dict.fromkeys(
        ids, Outcome.COMPACTED)
    assert all(r.outcome is Outcome.PARKED for rs in results.values() for r in rs[:-1])
    merged = [sid for sid in ids if synchronous[sid]["merge_rounds"] > 0]
    assert merged and all(len(results[sid]) == 2 + synchronous[sid]["merge_rounds"]
                          for sid in merged)
    assert batches == 1 + max(synchronous[sid]["merge_rounds"] for sid in ids)
    assert parked_left == [] and stored == {
        session["session_id"]: len(session["messages"]) for session in sessions}
    for kind in ("llm_calls", "prompt_tokens", "completion_tokens", "chunks"):
        assert {sid: batched[sid][kind] for sid in ids} == {
            sid: synchronous[sid][kind] for sid in ids}, kind
    for sid in ids:
        figures = batched[sid]
        assert figures["cost_usd"] == pytest.approx(price_calls(
            PRICE, prompt_tokens=figures["prompt_tokens"],
            cached_tokens=figures["cached_tokens"],
            completion_tokens=figures["completion_tokens"], batch=True), abs=1e-9)
    night_cost = sum(batched[sid]["cost_usd"] for sid in ids)
    sync_cost = sum(synchronous[sid]["cost_usd"] for sid in ids)
    assert night_cost == pytest.approx(sync_cost / 2, rel=0.02)


@pytest.mark.parametrize(("knobs", "fallback", "outcome"), [
    (BatchKnobs(expire=True, answered_before_expiry=1), "sync", Outcome.COMPACTED),
    (BatchKnobs(fail_every=2), "sync", Outcome.COMPACTED),
    (BatchKnobs(expire=True, answered_before_expiry=0), "deterministic", Outcome.FALLBACK),
], ids=["expired-sync", "partial-sync", "expired-deterministic"])
def test_lines_a_batch_did_not_answer_fall_back_as_the_setting_says(
        postgres_url: str, server: OpenAIServer, knobs: BatchKnobs, fallback: str,
        outcome: Outcome) -> None:
    sessions = night_sessions(seed=6, count=4)
    ids = [session["session_id"] for session in sessions]
    runtime = runtime_for(postgres_url, server, "batch", batch_line_fallback=fallback)
    import_all(runtime, sessions)
    server.set_batch_knobs(knobs)
    try:
        results, _ = batch_night(runtime, server, ids)
        direct = [r for r in server.requests if r.path != "/v1/batches"]
        left = runtime.store.parked_jobs()
    finally:
        runtime.close()

    finals = {sid: rs[-1] for sid, rs in results.items()}
    assert {r.outcome for r in finals.values()} == {outcome}
    assert (fallback == "sync") is bool(direct) and left == []


def test_a_session_rolled_back_while_parked_is_planned_again_never_applied_stale(
        postgres_url: str, server: OpenAIServer) -> None:
    session = night_sessions(seed=7, count=1)[0]
    sid, messages = session["session_id"], session["messages"]
    half = len(messages) // 2 // 4 * 4 + 1  # the system prompt and whole exchanges
    runtime = runtime_for(postgres_url, server, "sync")
    import_all(runtime, [{"session_id": sid, "messages": messages[:half]}])
    first = run_jobs(runtime, [JobRequest(sid, "first", force=True)])[0]
    append_messages(runtime.store, runtime.deps.counter, IntakePolicy(), sid, messages[half:],
                    datetime.now(UTC))
    runtime.close()
    runtime = runtime_for(postgres_url, server, "batch")
    stale: list[int | None] = []

    def roll_back(store: Store) -> None:
        stale.append(store.parked_jobs(session_id=sid)[0].revision_id)
        store.rollback(sid)

    try:
        results, _ = batch_night(runtime, server, [sid], on_parked=roll_back)
        active = runtime.store.get_session(sid).active_revision_id
        revisions = {revision.id: revision for revision in runtime.store.revisions(sid)}
    finally:
        runtime.close()

    assert first.outcome is Outcome.COMPACTED and stale == [first.revision_id]
    assert results[sid][0].outcome is Outcome.PARKED
    assert results[sid][-1].outcome is Outcome.COMPACTED
    # Planned again on the rolled-back state: the new revision is not built on the stale one.
    assert active is not None and revisions[active].parent_revision_id is None


def test_compactor_batches_lists_what_parked_jobs_wait_on_and_polls(
        postgres_url: str, server: OpenAIServer, tmp_path: Path) -> None:
    sessions = night_sessions(seed=8, count=3)
    runtime = runtime_for(postgres_url, server, "batch")
    import_all(runtime, sessions)
    server.set_batch_knobs(BatchKnobs(in_progress_s=3_600))
    try:
        run_jobs(runtime, [JobRequest(s["session_id"], "nightly") for s in sessions])
        requests = sum(len(park.requests) for park in runtime.store.parked_jobs())
    finally:
        runtime.close()
    base = compactor_for(postgres_url, tmp_path / "data")
    compactor = Compactor({**base.env, "COMPACTOR_LLM_BASE_URL": server.base_url,
                           "COMPACTOR_LLM_MODEL": MODEL})

    waiting = compactor.json("batches", "list")
    polled = compactor.json("batches", "poll")
    sent = compactor.json("batches", "list")

    assert waiting == [{"batch_id": None, "status": "waiting", "jobs": 3, "requests": requests}]
    assert list(polled["submitted"].values()) == [requests] and polled["resumed"] == 0
    assert sent == [{"batch_id": next(iter(polled["submitted"])), "status": "in_progress",
                     "jobs": 3, "requests": requests}]


def test_a_job_whose_batch_answers_fail_validation_ends_and_leaves_no_parked_record(
        postgres_url: str, server: OpenAIServer) -> None:
    sessions = night_sessions(seed=9, count=2)
    ids = [session["session_id"] for session in sessions]
    runtime = runtime_for(postgres_url, server, "batch")
    import_all(runtime, sessions)
    server.set_behaviour("malformed_json")  # every line answered, none a summary
    try:
        results, batches = batch_night(runtime, server, ids)
        left = runtime.store.parked_jobs()
    finally:
        runtime.close()

    finals = {sid: rs[-1] for sid, rs in results.items()}
    assert batches == 1 and left == []  # not replayed again and again
    assert {r.outcome for r in finals.values()} == {Outcome.FAILED}
    assert {r.reason for r in finals.values()} == {"malformed_json"}
