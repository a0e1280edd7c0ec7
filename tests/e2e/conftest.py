"""Fixtures of the job's end-to-end tests: an emptied PostgreSQL database, the
OpenAI-protocol test server, per-test settings under their own Redis prefix and queue,
a publisher, and real worker processes that are always stopped."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from db import Store
from tests.support.databases import open_store, truncate_store_tables
from tests.support.e2e import JobEnv, JobPublisher, build_job_env, redis_under_prefix
from tests.support.openai_server import OpenAIServer
from tests.support.worker_process import WorkerProcess

StartWorker = Callable[..., WorkerProcess]


@pytest.fixture
def postgres_url(migrated_postgres_url: str) -> str:
    """The run's migrated PostgreSQL database, emptied for this test."""
    truncate_store_tables(migrated_postgres_url)
    return migrated_postgres_url


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[Store]:
    with open_store(postgres_url) as store:
        yield store


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(latency_ms=3_000) as running:
        yield running


@pytest.fixture
def job_env(postgres_url: str, server: OpenAIServer) -> JobEnv:
    return build_job_env(postgres_url, server.base_url)


@pytest.fixture
def redis_client(job_env: JobEnv) -> Iterator[redis.Redis]:
    """A Redis client; the test's keys are deleted afterwards."""
    with redis_under_prefix(job_env.prefix) as client:
        yield client


@pytest.fixture
def publisher(job_env: JobEnv) -> Iterator[JobPublisher]:
    running = JobPublisher(job_env.settings)
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def start_worker(job_env: JobEnv, redis_client: redis.Redis,
                 tmp_path: Path) -> Iterator[StartWorker]:
    """Start a worker on this test's queue (stopped at teardown, even on failure)."""
    workers: list[WorkerProcess] = []

    def start(*, concurrency: int = 1) -> WorkerProcess:
        log_path = tmp_path / f"worker-{len(workers)}.log"
        worker = WorkerProcess(job_env.env, log_path, concurrency=concurrency,
                               queue=job_env.queue)
        workers.append(worker)
        return worker.start()

    try:
        yield start
    finally:
        for worker in workers:
            worker.stop()
