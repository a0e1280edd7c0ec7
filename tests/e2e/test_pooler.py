"""Two real worker processes whose every database call goes through a PgBouncer in
transaction mode (``COMPACTOR_DB_POOLER=transaction``), sharing its few server
connections with each other and with the platform's own store: every job compacts its
session, none fails; and when PgBouncer drops every connection mid-run, the jobs it hits
fail only as ``store_unavailable``, are retried, and count on no session's breaker."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from sqlalchemy.engine import make_url

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
# Sessions of the run that PgBouncer's KILL interrupts, twice, moments apart.
KILLED_SESSIONS = 60
KILLS = 2
KILL_EVERY_S = 0.4
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
    events, elapsed_s = run_jobs(pooled_env, pooled_store, tmp_path, SESSIONS)

    outcomes = Counter(event["outcome"] for event in events)
    failures = Counter(event.get("reason") for event in events if event["outcome"] != "compacted")
    print(f"{SESSIONS} jobs through PgBouncer in {elapsed_s:.1f} s: {dict(outcomes)}")
    assert outcomes == {"compacted": SESSIONS}, failures
    runs = pooled_store.runs(limit=10 * SESSIONS)
    assert Counter(run.outcome for run in runs) == {"compacted": SESSIONS}
    assert all(pooled_store.get_session(f"pooled-{n}").active_revision_id is not None
               for n in range(SESSIONS))
    assert "prepared statement" not in pgbouncer.log_text()


def test_pgbouncer_dropping_every_connection_mid_run_fails_jobs_as_store_unavailable_only(
    pooled_env: JobEnv, pooled_store: Store, pooled_redis: redis.Redis, tmp_path: Path,
    pgbouncer: PgBouncer, migrated_postgres_url: str,
) -> None:
    database = make_url(migrated_postgres_url).database

    def kill_twice() -> None:
        for _ in range(KILLS):
            time.sleep(KILL_EVERY_S)
            with psycopg.connect(host="127.0.0.1", port=pgbouncer.port, user="postgres",
                                 dbname="pgbouncer", autocommit=True) as console:
                console.execute(f"KILL {database}")
                console.execute(f"RESUME {database}")

    events, _ = run_jobs(pooled_env, pooled_store, tmp_path, KILLED_SESSIONS,
                         during=kill_twice)

    # A retry finds its session under the trigger when the swap it failed on had
    # committed (its answer lost with the connection).
    ended = {(e["outcome"], e["reason"]) for e in events}
    assert ended <= {("compacted", "over_trigger"), ("failed", "store_unavailable"),
                     ("skipped", "under_trigger")}, ended
    assert ("failed", "store_unavailable") in ended  # the KILLs did hit running jobs
    states = [pooled_store.get_session(f"pooled-{n}") for n in range(KILLED_SESSIONS)]
    assert all(state.breaker_failures == 0 for state in states)
    # A session whose last attempt failed too is left to the reconciler, as in any outage.
    given_up = {e["session_id"] for e in events
                if e["outcome"] == "failed" and not e["will_retry"]}
    assert all(state.active_revision_id is not None for state in states
               if state.session_id not in given_up)
    print(f"{KILLED_SESSIONS} sessions, PgBouncer KILLed {KILLS} times: "
          f"{dict(Counter((e['outcome'], e['reason']) for e in events))}")


def run_jobs(env: JobEnv, store: Store, tmp_path: Path, sessions: int, *,
             during: Callable[[], None] | None = None) -> tuple[list[dict[str, Any]], float]:
    """Import ``sessions`` sessions while two workers start, send one job each (``during``
    runs beside them), and return every job event and the seconds the jobs took."""
    workers = [WorkerProcess(env.env, tmp_path / f"worker-{n}.log", concurrency=CONCURRENCY,
                             queue=env.queue) for n in range(WORKERS)]
    publisher = JobPublisher(env.settings)
    starting = [threading.Thread(target=worker.start) for worker in workers]
    try:
        for thread in starting:
            thread.start()
        session_ids = import_records(
            store, (generated_session(f"pooled-{n}", TURNS) for n in range(sessions)))
        for thread in starting:
            thread.join()
        assert all(worker.events("worker.ready") for worker in workers)
        side = threading.Thread(target=during) if during else None
        started = time.monotonic()
        if side:
            side.start()
        for session_id in session_ids:
            publisher.publish(session_id, reason="e2e-pooler")
        events = wait_for_jobs(workers, sessions)
        if side:
            side.join()
        elapsed_s = time.monotonic() - started
    finally:
        publisher.close()
        for thread in starting:
            thread.join()
        for worker in workers:
            worker.stop()
    assert all(worker.events("compaction.job") for worker in workers)
    return events, elapsed_s


def wait_for_jobs(workers: list[WorkerProcess], sessions: int) -> list[dict[str, Any]]:
    """Every worker's ``compaction.job`` events once each of ``sessions`` sessions has had
    its last (an event that is not followed by a retry)."""
    deadline = time.monotonic() + JOBS_TIMEOUT_S
    while True:
        events = [event for worker in workers for event in worker.events("compaction.job")]
        ended = {e["session_id"] for e in events if not e.get("will_retry")}
        if len(ended) >= sessions or time.monotonic() > deadline:
            return events
        time.sleep(0.5)
