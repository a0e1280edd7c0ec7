"""A real worker refuses to start, and so to consume, with a broken configuration: it
exits fast with one JSON line per reason, and the queued job stays queued."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import redis

from db import Store
from tests.support.e2e import MEDIUM_SESSION_ID, JobEnv, JobPublisher, import_generated_sessions
from tests.support.openai_server import OpenAIServer
from tests.support.worker_process import CompactorWorker, WorkerProcess, parse_log_lines
from worker.settings.errors import EXIT_INVALID_SETTINGS

START_TIMEOUT_S = 60


def run_until_exit(worker: WorkerProcess) -> int:
    """Start the worker's command and wait for it to end by itself."""
    with worker.log_path.open("ab") as log, worker.stdout_path.open("ab") as out:
        done = subprocess.run(worker.argv(), env=worker.env, stdout=out, stderr=log,
                              timeout=START_TIMEOUT_S, check=False)
    return done.returncode


@pytest.mark.parametrize("worker_kind", [WorkerProcess, CompactorWorker])
def test_a_worker_with_a_bad_setting_exits_78_with_one_line_naming_it(
    job_env: JobEnv, tmp_path: Path, worker_kind: type[WorkerProcess]
) -> None:
    worker = worker_kind({**job_env.env, "COMPACTOR_LOG_LEVEL": "LOUD"},
                         tmp_path / "worker.log")

    exit_code = run_until_exit(worker)

    assert exit_code == EXIT_INVALID_SETTINGS
    [event] = parse_log_lines(worker.log_text())  # every line JSON, and only this one
    assert (event["event"], event["variable"], event["value"]) == (
        "settings.invalid", "COMPACTOR_LOG_LEVEL", "LOUD")
    assert "DEBUG, INFO, WARNING, ERROR, CRITICAL" in event["message"]


def test_a_worker_whose_api_key_is_refused_does_not_consume(
    pg_store: Store, job_env: JobEnv, publisher: JobPublisher, redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    import_generated_sessions(pg_store, MEDIUM_SESSION_ID)
    publisher.publish(MEDIUM_SESSION_ID)
    queued = redis_client.llen(job_env.prefix + job_env.queue)
    with OpenAIServer(latency_ms=0, api_key="sk-the-right-key") as keyed_server:
        env = {**job_env.env, "COMPACTOR_LLM_BASE_URL": keyed_server.base_url,
               "COMPACTOR_LLM_API_KEY": "sk-a-wrong-key", "COMPACTOR_WORKER_CHECK_LLM": "true"}
        worker = CompactorWorker(env, tmp_path / "worker.log")

        exit_code = run_until_exit(worker)

    events = parse_log_lines(worker.log_text())
    assert exit_code == 1
    failed = [e for e in events if e["event"] == "worker.check_failed"]
    assert [e["check"] for e in failed] == ["summarizer"]
    assert "refused the credentials" in failed[0]["message"]
    assert "COMPACTOR_LLM_API_KEY" in failed[0]["fix"]
    assert not {"worker.ready", "compaction.job"} & {e["event"] for e in events}
    assert queued == 1 and redis_client.llen(job_env.prefix + job_env.queue) == queued


def test_a_worker_starts_while_its_database_is_unreachable_and_says_so(
    job_env: JobEnv, tmp_path: Path,
) -> None:
    env = {**job_env.env,
           "COMPACTOR_DATABASE_URL": "postgresql+psycopg://app:s3cret@127.0.0.1:1/compactor"}
    worker = CompactorWorker(env, tmp_path / "worker.log")
    with worker:  # returns once the worker logged worker.ready
        pass
    events = parse_log_lines(worker.log_text())
    [unreachable] = [e for e in events if e["event"] == "worker.check_unreachable"]
    assert unreachable["check"] == "database"
    assert "app:***@127.0.0.1:1" in unreachable["message"]
    assert "s3cret" not in worker.log_text()
    assert not [e for e in events if e["event"] == "worker.check_failed"]
