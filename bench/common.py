"""Shared setup of the benchmarks: a private PostgreSQL database, a per-run Redis key
prefix and queue, real worker processes (any Celery app), job publishing, the OpenAI
test server, in-process jobs. Everything a benchmark creates is removed when it ends."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from pydantic import AliasChoices

from db import upgrade_database
from scheduler.enqueue import QueuedJob
from scheduler.publisher import RedisPublisher
from tests.support.databases import create_postgres_database, drop_postgres_database
from tests.support.worker_process import REPO_ROOT, WorkerProcess, parse_log_lines
from worker.broker.celery_app import create_app
from worker.broker.contract import job_kwargs
from worker.job import pipeline
from worker.job.values import JobRequest, JobResult
from worker.runtime import Runtime, build_runtime
from worker.settings.config import Settings

REDIS_URL = os.environ.get("COMPACTOR_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


# --- services ------------------------------------------------------------------------

@contextmanager
def private_database() -> Iterator[str]:
    """A migrated ``compactor_test_<random>`` PostgreSQL database, dropped at the end."""
    url = create_postgres_database()
    try:
        upgrade_database(url)
        yield url
    finally:
        drop_postgres_database(url)


@dataclass(frozen=True)
class Broker:
    """One run's Redis key prefix and queue, with the app that publishes to them."""

    settings: Settings
    app: Celery
    client: redis.Redis

    @property
    def env(self) -> dict[str, str]:
        """Worker environment naming this broker, prefix and queue."""
        return {"COMPACTOR_REDIS_URL": REDIS_URL,
                "COMPACTOR_REDIS_KEY_PREFIX": self.settings.redis_key_prefix,
                "COMPACTOR_QUEUE_NAME": self.settings.queue_name}

    def publish_jobs(self, session_ids: Iterable[str], *, force: bool = False) -> list[str]:
        """Queue one ``compactor.compact_session`` per session; return the task ids."""
        jobs = [QueuedJob(f"bench-{uuid.uuid4().hex}", job_kwargs(sid, "bench", force=force))
                for sid in session_ids]
        RedisPublisher(self.client, self.settings.redis_key_prefix,
                       self.settings.queue_name).publish(jobs)
        return [job.job_id for job in jobs]


@contextmanager
def private_broker(database_url: str) -> Iterator[Broker]:
    """A unique key prefix and queue; every key under the prefix is deleted after."""
    tag = uuid.uuid4().hex[:10]
    settings = Settings(database_url=database_url, redis_url=REDIS_URL,
                        redis_key_prefix=f"bench-{tag}:", queue_name=f"bench-{tag}")
    app = create_app(settings)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        yield Broker(settings, app, client)
    finally:
        keys = list(client.scan_iter(match=f"{settings.redis_key_prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()
        app.close()


def settings_env(**values: object) -> dict[str, str]:
    """``COMPACTOR_*`` variables from settings field names (``llm_model=...``)."""
    return {f"COMPACTOR_{name.upper()}": str(value) for name, value in values.items()}


class BenchWorker(WorkerProcess):
    """A real prefork worker of any Celery app (``module:attribute``), log captured.

    Its log is read incrementally: each poll parses only the lines written since the
    last. Re-parsing the whole log every 0.25 s took the machine's cores from the worker
    it measures (1.7 ms of CPU per job over a 128-job level, 0.2 ms now).
    """

    def __init__(self, env: Mapping[str, str], log_path: Path, *, concurrency: int = 1,
                 app: str = "worker.broker.celery_app") -> None:
        super().__init__(env, log_path, concurrency=concurrency)
        self.app = app
        self._read_bytes = 0
        self._events_by_name: dict[str, list[dict[str, Any]]] = {}
        self._events: list[dict[str, Any]] = []

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every log line so far (optionally only events called ``name``), oldest first;
        fails on a line that is not one JSON object."""
        self._read_new_lines()
        return list(self._events if name is None else self._events_by_name.get(name, ()))

    def _read_new_lines(self) -> None:
        """Parse the complete lines written since the last read (a partial last line
        waits for its newline)."""
        if not self.log_path.exists():
            return
        with self.log_path.open("rb") as log:
            log.seek(self._read_bytes)
            fresh = log.read()
        complete = fresh[:fresh.rfind(b"\n") + 1]
        events = parse_log_lines(complete.decode(errors="replace"))
        self._read_bytes += len(complete)  # after parsing: a bad line fails every read
        for event in events:
            self._events.append(event)
            self._events_by_name.setdefault(str(event.get("event")), []).append(event)

    def argv(self) -> list[str]:
        # The flags of `compactor worker` (scheduler/cli/jobs.py), for either app.
        return [sys.executable, "-m", "celery", "-A", self.app, "worker", "--pool=prefork",
                f"--concurrency={self.concurrency}", f"--queues={self.queue}", "--loglevel=INFO",
                "-O", "fair", "--without-gossip", "--without-mingle",
                "-n", f"bench-{uuid.uuid4().hex[:8]}@%h"]

    def start(self, timeout_s: float = 60.0) -> BenchWorker:
        argv = self.argv()
        with self.log_path.open("ab") as log, self.stdout_path.open("ab") as out:
            self.process = subprocess.Popen(argv, env=self.env, stdout=out, stderr=log,
                                            cwd=REPO_ROOT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.events("worker.ready"):
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited early:\n{self.log_text()[-4000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"worker not ready in {timeout_s}s:\n{self.log_text()[-4000:]}")

    def __enter__(self) -> BenchWorker:
        return self.start()

    def wait_for(self, name: str, count: int, timeout_s: float) -> list[dict[str, Any]]:
        """Wait for ``count`` events called ``name``; fail loudly on a dead worker."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            events = self.events(name)
            if len(events) >= count:
                return events
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"worker died:\n{self.log_text()[-4000:]}")
            # Timings come from the events' own timestamps: polling slowly costs nothing.
            time.sleep(0.25)
        raise TimeoutError(f"{len(self.events(name))}/{count} {name} events after "
                           f"{timeout_s}s:\n{self.log_text()[-4000:]}")


def event_time_s(event: Mapping[str, Any]) -> float:
    """The event's timestamp (ISO UTC, as structlog writes it) as epoch seconds."""
    return datetime.fromisoformat(str(event["timestamp"])).timestamp()


@dataclass(frozen=True)
class ProcessMemory:
    """A process's memory (KiB): resident (shared pages counted in full), proportional
    (shared pages split among their sharers), and private (its own pages alone)."""

    rss_kib: int
    pss_kib: int
    uss_kib: int


def proc_memory(pid: int) -> ProcessMemory:
    """Read ``/proc/<pid>/smaps_rollup``: RSS overstates forked children, which share
    their parent's pages; PSS and USS do not."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="utf-8") as rollup:
        for line in rollup:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                fields[name] = int(rest.split()[0])
    return ProcessMemory(fields["Rss"], fields["Pss"],
                         fields["Private_Clean"] + fields["Private_Dirty"])


def settled_memory(pid: int, *, interval_s: float = 0.5, timeout_s: float = 30.0
                   ) -> ProcessMemory:
    """The process's memory once its RSS stops moving (a fresh pool child is still
    building its runtime when the worker reports ready)."""
    deadline = time.monotonic() + timeout_s
    previous = proc_memory(pid)
    while time.monotonic() < deadline:
        time.sleep(interval_s)
        current = proc_memory(pid)
        if current.rss_kib == previous.rss_kib:
            return current
        previous = current
    return previous


def proc_status_kib(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` memory field (``VmHWM``, ``VmRSS``) in KiB."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise KeyError(f"{field} not in /proc/{pid}/status")


# --- in-process jobs -------------------------------------------------------------------

def llm_settings(base_url: str, *, window_tokens: int, max_calls: int) -> dict[str, object]:
    """Settings of an LLM summarizer at ``base_url`` allowed ``max_calls`` calls per job.

    The time limits are raised to the worst case those calls imply, which the settings
    check insists on (a job of hundreds of calls is legitimate here, not in production).
    """
    values: dict[str, object] = {"summarizer": "llm", "llm_base_url": base_url,
                                 "llm_context_tokens": window_tokens,
                                 "llm_max_calls_per_job": max_calls}
    worst_case_s = int(bench_settings(**values, task_soft_time_limit_s=10**9,
                                      task_hard_time_limit_s=10**9 + 1,
                                      broker_visibility_timeout_s=10**9 + 2).worst_case_llm_s)
    soft_s = max(1_800, worst_case_s + 60)
    return {**values, "task_soft_time_limit_s": soft_s, "task_hard_time_limit_s": soft_s + 60,
            "broker_visibility_timeout_s": soft_s + 600}


def bench_settings(**values: object) -> Settings:
    """Settings from field names and nothing else (no environment, no defaults file).

    Aliased fields (``llm_base_url``) are passed by their ``COMPACTOR_`` alias: by field
    name pydantic-settings would drop them silently.
    """
    data: dict[str, object] = {}
    for name, value in values.items():
        alias = Settings.model_fields[name].validation_alias
        first = alias.choices[0] if isinstance(alias, AliasChoices) else name
        data[first if isinstance(first, str) else name] = value
    return Settings.model_validate(data)


@contextmanager
def inline_runtime(database_url: str, **settings: object) -> Iterator[Runtime]:
    """A worker process's runtime built in this process (no Redis: in-memory breaker)."""
    runtime = build_runtime(bench_settings(database_url=database_url, **settings),
                            use_redis=False)
    try:
        yield runtime
    finally:
        runtime.close()


def run_inline(runtime: Runtime, session_id: str, *, force: bool = False) -> JobResult:
    """Run one job through the real pipeline, in this process."""
    return pipeline.run(JobRequest(session_id, "bench", force=force), runtime.deps,
                        runtime.policy)


@dataclass(frozen=True)
class ServerProcess:
    """The OpenAI test server's process: where to call it, and its pid (for its CPU)."""

    base_url: str
    pid: int


@contextmanager
def openai_server(*, latency_ms: int = 0, context_window: int = 128_000
                  ) -> Iterator[ServerProcess]:
    """The OpenAI test server in its own process (its token counting must not share a
    process, or a GIL, with what is measured).

    ``latency_ms`` > 0 delays every answer by that much (behaviour ``latency``).
    """
    behaviour = "latency" if latency_ms > 0 else "ok"
    argv = [sys.executable, "-m", "tests.support.openai_server", "--port", "0",
            "--behaviour", behaviour, "--latency-ms", str(latency_ms),
            "--context-window", str(context_window)]
    process = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "listening on " not in line:
            raise RuntimeError(f"the OpenAI test server did not start: {line!r}")
        yield ServerProcess(line.rsplit("listening on ", 1)[1].strip(), process.pid)
    finally:
        process.terminate()
        process.wait(timeout=10)


def proc_cpu_s(pid: int) -> float:
    """CPU time (user + system) the process has used so far (s)."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    # Fields 14 and 15 of proc(5), counted after the ")" that ends the command name.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu_s() -> tuple[float, float]:
    """CPU time of all cores since boot: (busy, total) in seconds (``/proc/stat``)."""
    with open("/proc/stat", encoding="utf-8") as stat:
        ticks = [int(v) for v in stat.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle and iowait
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - idle) / hz, sum(ticks) / hz
