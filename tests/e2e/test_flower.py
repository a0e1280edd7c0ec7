"""Flower, started as deploy/Dockerfile's flower target starts it (``celery --app
worker.broker.celery_app flower``), against a real worker sending task events: through
its HTTP API the worker is listed with its configuration (the Config tab), the worker's
page answers, and a job that ends rejected shows as a failed task."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.e2e import JobEnv, JobPublisher, wait_until
from tests.support.worker_process import REPO_ROOT, WorkerProcess
from worker.broker.transport import ITEM_POLICY_OPTION

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

FLOWER_START_S = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def get_json(url: str) -> Any:
    status, body = http_get(url)
    assert status == 200, body[:500]
    return json.loads(body)


@pytest.fixture
def flower_url(job_env: JobEnv, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, **job_env.env, "COMPACTOR_LOG_FORMAT": "json",
           "PYTHONPATH": str(REPO_ROOT), "FLOWER_UNAUTHENTICATED_API": "true"}
    argv = [sys.executable, "-m", "celery", "--app", "worker.broker.celery_app", "flower",
            f"--port={port}", "--address=127.0.0.1"]
    with (tmp_path / "flower.log").open("wb") as log:
        flower = subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdout=log, stderr=log,
                                  start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + FLOWER_START_S
        while http_get_or_none(f"{url}/healthcheck") != 200:
            assert flower.poll() is None, (tmp_path / "flower.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "Flower did not answer"
            time.sleep(0.3)
        yield url
    finally:
        flower.terminate()
        flower.wait(20)


def http_get_or_none(url: str) -> int | None:
    try:
        return http_get(url)[0]
    except OSError:
        return None


@pytest.fixture
def worker(job_env: JobEnv, redis_client: redis.Redis, tmp_path: Path
           ) -> Iterator[WorkerProcess]:
    """A worker sending task events (``-E``), as Flower needs; the test's keys are deleted
    afterwards (``redis_client``)."""
    with WorkerProcess(job_env.env, tmp_path / "worker.log", queue=job_env.queue,
                       send_events=True) as running:
        yield running


def task_state(flower_url: str, task_id: str) -> str:
    return str(get_json(f"{flower_url}/api/tasks")[task_id]["state"])


def test_flower_lists_the_worker_with_its_config_and_shows_a_rejected_job_as_failed(
    job_env: JobEnv, worker: WorkerProcess, flower_url: str, publisher: JobPublisher,
) -> None:
    wait_until(lambda: bool(get_json(f"{flower_url}/api/workers?refresh=1")),
               timeout_s=60)
    workers = get_json(f"{flower_url}/api/workers")
    [name] = list(workers)
    conf = workers[name]["conf"]
    status, page = http_get(f"{flower_url}/worker/{name}")

    assert conf["task_default_queue"] == job_env.queue
    assert conf["broker_transport_options"][ITEM_POLICY_OPTION]["queues"] == [job_env.queue]
    assert status == 200 and ITEM_POLICY_OPTION.encode() in page

    task_id = publisher.publish("no-such-session", reason="flower")
    wait_until(lambda: task_id in get_json(f"{flower_url}/api/tasks"), timeout_s=60)
    wait_until(lambda: task_state(flower_url, task_id) not in ("RECEIVED", "STARTED"),
               timeout_s=60)
    task = get_json(f"{flower_url}/api/tasks")[task_id]
    assert (task["state"], task["worker"]) == ("FAILURE", name)
