"""Two real worker processes whose every database call goes through a PgBouncer in
transaction mode (``COMPACTOR_DB_POOLER=transaction``), sharing its few server
connections with each other and with the platform's own store: every job compacts its
session, none fails."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from db import Store
from tests.support.databases import open_store, truncate_store_tables
from tests.support.e2e import (
    JobEnv,
    JobPublisher,
    build_job_env,
    import_records,
    redis_under_prefix,
)
from tests.support.generated import generated_session
from tests.support.pgbouncer import PgBouncer
from tests.support.worker_process import WorkerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SESSIONS = 200
# A smaller window than the job env's, so that short sessions (cheap to import) are over
# its trigger (0.7 x 3,000 = 2,100 tokens).
MODEL_CONTEXT_TOKENS = 3_000
TAIL_BUDGET_TOKENS = 400
TURNS = 20
WORKERS = 2
CONCURRENCY = 2
# Within the per-test timeout (pyproject.toml), with the import and the workers' start.
JOBS_TIMEOUT_S = 90.0


@pytest.fixture
def pooled_env(pgbouncer: PgBouncer, migrated_postgres_url: str) -> JobEnv:
    """The worker's settings: the database through PgBouncer, as an operator writes it,
    and the extractive summarizer (the jobs' database traffic is what is tested)."""
    truncate_store_tables(migrated_postgres_url)
    through = pgbouncer.url_for(migrated_postgres_url).split("?")[0]
    return build_job_env(through, None, db_pooler="transaction", summarizer="extractive",
                         model_context_tokens=MODEL_CONTEXT_TOKENS,
                         tail_budget_tokens=TAIL_BUDGET_TOKENS)


@pytest.fixture
def pooled_store(pooled_env: JobEnv) -> Iterator[Store]:
    with open_store(pooled_env.settings.effective_database_url) as store:
        yield store


@pytest.fixture
def pooled_redis(pooled_env: JobEnv) -> Iterator[redis.Redis]:
    with redis_under_prefix(pooled_env.prefix) as client:
        yield client


def test_two_workers_through_pgbouncer_compact_every_session_and_fail_no_job(
    pooled_env: JobEnv, pooled_store: Store, pooled_redis: redis.Redis, tmp_path: Path,
    pgbouncer: PgBouncer,
) -> None:
    workers = [WorkerProcess(pooled_env.env, tmp_path / f"worker-{n}.log",
                             concurrency=CONCURRENCY, queue=pooled_env.queue)
               for n in range(WORKERS)]
    publisher = JobPublisher(pooled_env.settings)
    # The workers start while the sessions are imported.
    starting = [threading.Thread(target=worker.start) for worker in workers]
    try:
        for thread in starting:
            thread.start()
        session_ids = import_records(
            pooled_store, (generated_session(f"pooled-{n}", TURNS) for n in range(SESSIONS)))
        for thread in starting:
            thread.join()
        assert all(worker.events("worker.ready") for worker in workers)
        started = time.monotonic()
        for session_id in session_ids:
            publisher.publish(session_id, reason="e2e-pooler")
        events = wait_for_jobs(workers, SESSIONS)
        elapsed_s = time.monotonic() - started
    finally:
        publisher.close()
        for thread in starting:
            thread.join()
        for worker in workers:
            worker.stop()

    outcomes = Counter(event["outcome"] for event in events)
    failures = Counter(event.get("reason") for event in events if event["outcome"] != "compacted")
    print(f"{SESSIONS} jobs through PgBouncer in {elapsed_s:.1f} s: {dict(outcomes)}")
    assert outcomes == {"compacted": SESSIONS}, failures
    assert all(len(worker.events("compaction.job")) > 0 for worker in workers)
    runs = pooled_store.runs(limit=10 * SESSIONS)
    assert Counter(run.outcome for run in runs) == {"compacted": SESSIONS}
    assert all(pooled_store.get_session(s).active_revision_id is not None for s in session_ids)
    assert "prepared statement" not in pgbouncer.log_text()


def wait_for_jobs(workers: list[WorkerProcess], count: int) -> list[dict[str, object]]:
    """Every worker's ``compaction.job`` events once they number ``count``."""
    deadline = time.monotonic() + JOBS_TIMEOUT_S
    while True:
        events = [event for worker in workers for event in worker.events("compaction.job")]
        if len(events) >= count or time.monotonic() > deadline:
            return events
        time.sleep(0.5)
