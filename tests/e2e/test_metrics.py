"""What an operator's monitoring sees of a real worker (prefork, metrics on, ``-E``): its
``/metrics`` endpoint scraped over HTTP while jobs succeed, fail and are rejected, and
Celery's own task events (what Flower counts) read from the broker, where a failed or
rejected job is ``task-failed`` without a traceback or a retry. The worker's interpreter
imports prometheus_client before anything else (a ``sitecustomize``, as a plugin would),
and its metrics directory holds files that are not the worker's: both are survived."""

from __future__ import annotations

import socket
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from db import Store
from tests.support.e2e import (
    LONG_SESSION_ID,
    MEDIUM_SESSION_ID,
    REDIS_URL,
    JobEnv,
    JobPublisher,
    build_job_env,
    import_generated_sessions,
    wait_until,
)
from tests.support.openai_server import OpenAIServer
from tests.support.worker_process import (
    REPO_ROOT,
    CompactorWorker,
    WorkerProcess,
    parse_log_lines,
)
from worker.broker.celery_app import create_app
from worker.metrics import own_metrics_dirname

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def job_env(postgres_url: str, server: OpenAIServer) -> JobEnv:
    return build_job_env(postgres_url, server.base_url, metrics_port=free_port(),
                         metrics_host="127.0.0.1")


class TaskEvents:
    """Celery's task events from the broker, as Flower receives them (a plain Redis
    connection under the deployment's key prefix)."""

    def __init__(self, app: Celery, prefix: str) -> None:
        self.app, self.prefix = app, prefix
        self.received: list[dict[str, Any]] = []
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._capture, daemon=True)

    def _capture(self) -> None:
        # kombu's own Redis transport: the worker's inspects job items only.
        with self.app.connection(REDIS_URL, transport="redis",
                                 transport_options={"global_keyprefix": self.prefix}) as conn:
            self._receiver = self.app.events.Receiver(conn, handlers={"*": self.received.append})
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def start(self) -> TaskEvents:
        self._thread.start()
        wait_until(lambda: self._receiver is not None)
        return self

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(10)

    def types_of(self, task_id: str) -> list[str]:
        return [e["type"] for e in list(self.received) if e.get("uuid") == task_id]


@pytest.fixture
def task_events(job_env: JobEnv) -> Iterator[TaskEvents]:
    app = create_app(job_env.settings)
    events = TaskEvents(app, job_env.prefix).start()
    try:
        yield events
    finally:
        events.stop()
        app.close()


def import_prometheus_first(worker: WorkerProcess, site_dir: Path) -> Path:
    """Have every interpreter of ``worker`` import prometheus_client before anything else;
    the returned file gets a line per interpreter that did."""
    site_dir.mkdir()
    mark = site_dir / "imported"
    (site_dir / "sitecustomize.py").write_text(
        "import prometheus_client  # noqa: F401\n"
        f"open({str(mark)!r}, 'a').write('imported\\n')\n")
    worker.env["PYTHONPATH"] = f"{site_dir}:{REPO_ROOT}"
    return mark


def tree_of(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (a directory as None), with each file's content."""
    return {str(path.relative_to(root)): None if path.is_dir() else path.read_bytes()
            for path in sorted(root.rglob("*"))}


@pytest.fixture
def metrics_worker(job_env: JobEnv, tmp_path: Path, redis_client: Any,
                   task_events: TaskEvents) -> Iterator[WorkerProcess]:
    """``compactor worker -E`` with metrics on, in an interpreter that imported
    prometheus_client first; its metrics directory holds other programs' files and
    folders and another worker's live samples, which it must leave alone, and its own
    subdirectory a stale sample file from an earlier run, which the start must remove."""
    metrics_dir = tmp_path / "metrics"
    port = job_env.settings.metrics_port
    assert port is not None
    own_name = own_metrics_dirname(port)
    neighbour = metrics_dir / own_metrics_dirname(port + 1)
    neighbour.mkdir(parents=True)
    (neighbour / "counter_3.db").write_bytes(b"a neighbouring worker's live samples")
    (metrics_dir / "other" / "deeper").mkdir(parents=True)
    (metrics_dir / "notes.txt").write_text("not the worker's")
    (metrics_dir / "counter_1.db").write_bytes(b"another program's samples")
    (metrics_dir / "other" / "gauge_all_2.db").write_bytes(b"another program's samples")
    (metrics_dir / "other" / "deeper" / "keep.txt").write_text("not the worker's")
    own = metrics_dir / own_name
    own.mkdir()
    (own / "counter_1.db").write_bytes(b"stale")
    (own / "README").write_text("not a sample file")
    others = {path: content for path, content in tree_of(metrics_dir).items()
              if not path.startswith(f"{own_name}/")}
    env = {**job_env.env, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    worker = CompactorWorker(env, tmp_path / "worker.log", concurrency=2, send_events=True)
    mark = import_prometheus_first(worker, tmp_path / "site")
    try:
        yield worker.start()
        assert mark.read_text().count("imported") >= 1
    finally:
        worker.stop()
    after = tree_of(metrics_dir)
    assert {path: content for path, content in after.items()
            if not path.startswith(f"{own_name}/")} == others
    assert f"{own_name}/counter_1.db" not in after
    assert after[f"{own_name}/README"] == b"not a sample file"


def scrape(job_env: JobEnv) -> Samples:
    """GET /metrics; the body must parse as the Prometheus text format."""
    url = f"http://127.0.0.1:{job_env.settings.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def jobs(samples: Samples, outcome: str, reason: str) -> float:
    return samples.get(("compactor_jobs_total", (("outcome", outcome), ("reason", reason))), 0)


def event_of(worker: WorkerProcess, task_id: str) -> dict[str, Any]:
    wait_until(lambda: any(e.get("task_id") == task_id for e in worker.events("compaction.job")))
    [event] = [e for e in worker.events("compaction.job") if e.get("task_id") == task_id]
    return event


def test_metrics_and_celery_events_follow_a_success_a_failure_and_a_rejection(
    pg_store: Store, publisher: JobPublisher, server: OpenAIServer, job_env: JobEnv,
    metrics_worker: WorkerProcess, task_events: TaskEvents,
) -> None:
    import_generated_sessions(pg_store, LONG_SESSION_ID, MEDIUM_SESSION_ID)
    before = scrape(job_env)
    assert jobs(before, "compacted", "over_trigger") == 0

    compacted = publisher.publish(LONG_SESSION_ID)
    assert event_of(metrics_worker, compacted)["outcome"] == "compacted"
    server.set_behaviour("wrong_schema")
    failed = publisher.publish(MEDIUM_SESSION_ID)
    failure = event_of(metrics_worker, failed)
    rejected = publisher.publish("no-such-session")
    assert event_of(metrics_worker, rejected)["outcome"] == "rejected"

    # The failed job's cost, in its event and its runs row.
    assert (failure["outcome"], failure["reason"]) == ("failed", "schema_mismatch")
    assert failure["llm_calls"] == 1 and failure["prompt_tokens"] > 0
    [run] = pg_store.runs(session_id=MEDIUM_SESSION_ID, outcome="failed")
    assert run.figures["prompt_tokens"] == failure["prompt_tokens"]

    samples = scrape(job_env)
    assert jobs(samples, "compacted", "over_trigger") == 1
    assert jobs(samples, "failed", "schema_mismatch") == 1
    assert jobs(samples, "rejected", "unknown_session") == 1
    assert samples[("compactor_llm_calls_total", ())] == 2
    saved = samples[("compactor_tokens_saved_total", ())]
    assert saved > 0
    assert samples[("compactor_job_step_duration_seconds_count", (("step", "summarize"),))] == 2
    assert samples[("compactor_queue_depth", (("queue", job_env.queue),))] == 0
    assert samples[("compactor_provider_breaker", (("state", "closed"),))] == 1
    assert ("compactor_session_breakers", (("state", "open"),)) in samples

    # Flower's view: the success is task-succeeded, the failure and the rejection
    # task-failed, never retried.
    assert "task-succeeded" in task_events.types_of(compacted)
    for task_id in (failed, rejected):
        wait_until(lambda: "task-failed" in task_events.types_of(task_id))  # noqa: B023  # waited for here
        assert "task-retried" not in task_events.types_of(task_id)
        assert len([e for e in metrics_worker.events("compaction.job")
                    if e["task_id"] == task_id]) == 1
    log = metrics_worker.events()  # every line is one JSON object
    assert not [e for e in log if "Traceback" in str(e) or e.get("exc_info")]


def test_a_worker_whose_prometheus_client_was_imported_single_process_refuses_to_start(
    job_env: JobEnv, tmp_path: Path,
) -> None:
    """``celery -A ... worker`` in an interpreter that imported prometheus_client before
    ``PROMETHEUS_MULTIPROC_DIR`` was set: one error line and exit 78, not a worker whose
    endpoint would show no job."""
    env = {key: value for key, value in job_env.env.items() if key != "PROMETHEUS_MULTIPROC_DIR"}
    worker = WorkerProcess(env, tmp_path / "worker.log", queue=job_env.queue)
    worker.env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    import_prometheus_first(worker, tmp_path / "site")
    result = subprocess.run(worker.argv(), env=worker.env, cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 78, result.stderr[-2000:]
    [refusal] = [event for event in parse_log_lines(result.stderr)
                 if event.get("event") == "metrics.refused"]
    assert "PROMETHEUS_MULTIPROC_DIR" in refusal["message"]
    assert "\n" not in refusal["message"]
    assert "Traceback" not in result.stderr
