"""`compactor demo` as an operator runs it: a real `python -m scheduler demo` process with
its own data dir, queue and key prefix, against the system Redis and against a private
embedded one. It compacts the due sessions, a second run finds nothing to do, and nothing
it started is left running, after a Ctrl-C too."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine, select

from db import Store, create_db_engine
from db.models import SessionRow
from tests.support.openai_server import OpenAIServer
from tests.support.worker_process import parse_log_lines

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

REPO_ROOT = Path(__file__).resolve().parents[2]
SYSTEM_REDIS_URL = "redis://127.0.0.1:6379/0"
# Settings the demo must choose itself, and an LLM the test must not reach.
CLEARED_ENV = ("COMPACTOR_DATABASE_URL", "COMPACTOR_MODEL_CONTEXT_TOKENS",
               "COMPACTOR_QUIET_PERIOD_S", "COMPACTOR_QUEUE_NAME", "COMPACTOR_REDIS_KEY_PREFIX",
               "COMPACTOR_LLM_BASE_URL", "COMPACTOR_LLM_API_KEY", "COMPACTOR_SUMMARIZER",
               "OPENAI_API_KEY", "OPENAI_BASE_URL")
WORKER_PID = re.compile(r"worker: `compactor worker` pid (\d+) ready")
ENQUEUED = re.compile(r"scan: enqueued (\d+) due sessions")
EMBEDDED_PID = re.compile(r"embedded redis-server \(pid (\d+)\) at (redis://\S+)")
PRINTED_JQ = re.compile(r"^ +(jq .+ (\S+demo-worker\.log))$", re.MULTILINE)


class Demo:
    """Runs the demo in a subprocess with one data dir, queue and key prefix."""

    def __init__(self, data_dir: Path) -> None:
        tag = uuid.uuid4().hex[:10]
        self.prefix = f"test-demo-{tag}:"
        self.args = ["--queue", f"demo-{tag}", "--key-prefix", self.prefix]
        self.data_dir = data_dir
        self.env = {key: value for key, value in os.environ.items() if key not in CLEARED_ENV}
        self.env |= {"COMPACTOR_DATA_DIR": str(data_dir), "COMPACTOR_REDIS_URL": SYSTEM_REDIS_URL,
                     "PYTHONUNBUFFERED": "1"}

    def argv(self, *extra: str) -> list[str]:
        return [sys.executable, "-m", "scheduler", "demo", *self.args, *extra]

    def run(self, *extra: str) -> str:
        done = subprocess.run(self.argv(*extra), env=self.env, cwd=REPO_ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=150,
                              check=False)
        assert done.returncode == 0, done.stdout
        return done.stdout

    def queue_markers(self) -> dict[str, str | None]:
        """Each session's queued-job marker (the job id, or None)."""
        with self._engine() as engine, engine.connect() as conn:
            rows = conn.execute(select(SessionRow.session_id, SessionRow.queued_job_id))
            return {row.session_id: row.queued_job_id for row in rows}

    def jobs_that_ran(self) -> set[str]:
        with self._engine() as engine:
            return {run.task_id for run in Store(engine).runs(limit=1000) if run.task_id}

    @contextmanager
    def _engine(self) -> Iterator[Engine]:
        engine = create_db_engine(f"sqlite:///{self.data_dir / 'compactor.db'}")
        try:
            yield engine
        finally:
            engine.dispose()


def assert_group_gone(pid: int) -> None:
    """Neither the process nor any process of its group (pool children) is alive."""
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def redis_keys(prefix: str) -> list[bytes]:
    client = redis.Redis.from_url(SYSTEM_REDIS_URL)
    try:
        return list(client.scan_iter(match=f"{prefix}*"))
    finally:
        client.close()


def assert_compacted_and_saved(output: str) -> None:
    assert re.search(r"^ ?demo-s7-01-\S+\s+\d+\s+compacted", output, re.MULTILINE), output
    saved = re.search(r"Saved ([\d,]+) tokens \((\d+)%\) by compacting (\d+) of 6 sessions",
                      output)
    assert saved is not None, output
    assert int(saved.group(1).replace(",", "")) > 10_000 and int(saved.group(3)) >= 2
    assert "summary block" in output and "Where to look next" in output


def assert_nothing_left(output: str) -> None:
    assert "0 imported, 0 repaired, 0 rejected, 6 exists" in output, output
    assert "Nothing left to do" in output, output
    assert WORKER_PID.search(output) is None, "a second run started a worker"


def assert_printed_jq_reads_the_worker_log(output: str) -> None:
    """The jq line the demo prints runs as printed, on a log of JSON lines only."""
    printed = PRINTED_JQ.search(output)
    assert printed is not None, output
    command, log = printed.groups()
    parse_log_lines(Path(log).read_text(encoding="utf-8"))
    done = subprocess.run(command, shell=True, capture_output=True, text=True, check=False)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    outcomes = [json.loads(line)["outcome"] for line in done.stdout.splitlines()]
    assert outcomes and "compacted" in outcomes, done.stdout


def test_demo_compacts_with_the_system_redis_then_finds_nothing_left(tmp_path: Path) -> None:
    demo = Demo(tmp_path / "data")
    first = demo.run("--count", "6")
    assert f"redis: {SYSTEM_REDIS_URL} (queue" in first, first
    assert "6 imported" in first
    assert_compacted_and_saved(first)
    assert_printed_jq_reads_the_worker_log(first)
    worker = WORKER_PID.search(first)
    assert worker is not None, first
    assert_group_gone(int(worker.group(1)))
    assert redis_keys(demo.prefix) == []

    assert_nothing_left(demo.run("--count", "6"))


def test_demo_runs_on_a_private_embedded_redis_and_stops_it(tmp_path: Path) -> None:
    demo = Demo(tmp_path / "data")
    first = demo.run("--count", "6", "--embedded-redis")
    embedded = EMBEDDED_PID.search(first)
    assert embedded is not None, first
    assert embedded.group(2) != SYSTEM_REDIS_URL
    assert_compacted_and_saved(first)
    worker = WORKER_PID.search(first)
    assert worker is not None, first
    assert_group_gone(int(worker.group(1)))
    assert_group_gone(int(embedded.group(1)))

    second = demo.run("--count", "6", "--embedded-redis")
    assert_nothing_left(second)
    again = EMBEDDED_PID.search(second)
    assert again is not None
    assert_group_gone(int(again.group(1)))


def test_ctrl_c_stops_the_worker_and_frees_unfinished_sessions(tmp_path: Path) -> None:
    demo = Demo(tmp_path / "data")
    with subprocess.Popen(demo.argv("--count", "16"), env=demo.env, cwd=REPO_ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as process:
        assert process.stdout is not None
        seen = []
        for line in process.stdout:
            seen.append(line)
            if WORKER_PID.search(line):
                process.send_signal(signal.SIGINT)
                break
        output = "".join(seen) + process.stdout.read()
        assert process.wait(timeout=60) == 130, output
    assert "interrupted" in output and "Saved" not in output, output
    worker, enqueued = WORKER_PID.search(output), ENQUEUED.search(output)
    assert worker is not None and enqueued is not None, output
    assert_group_gone(int(worker.group(1)))
    assert redis_keys(demo.prefix) == []
    finished = demo.jobs_that_ran()
    # A session still marked as queued is one whose job ran; the others were freed.
    assert set(demo.queue_markers().values()) - {None} <= finished

    rest = demo.run("--count", "16")
    assert "0 imported" in rest and "16 exists" in rest, rest
    again = ENQUEUED.search(rest)
    assert again is not None, rest
    assert int(again.group(1)) == int(enqueued.group(1)) - len(finished), rest


RUN_QUEUE = re.compile(r"\(queue '(?P<queue>[^']+)', key prefix '(?P<prefix>[^']+)'\)")


def test_two_demos_started_together_on_one_redis_both_compact(tmp_path: Path) -> None:
    """With the default queue and key prefix, two runs on the system Redis at once: each
    takes only its own jobs and deletes only its own keys."""
    demos = [Demo(tmp_path / f"data-{index}") for index in range(2)]
    for demo in demos:
        demo.args = []  # each run chooses its own queue and key prefix
    runs = [subprocess.Popen(demo.argv("--count", "6"), env=demo.env, cwd=REPO_ROOT,
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for demo in demos]
    try:
        outputs = [run.communicate(timeout=150)[0] for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                run.send_signal(signal.SIGINT)  # the demo stops what it started
                run.wait(60)
    assert [run.returncode for run in runs] == [0, 0], outputs
    names = [RUN_QUEUE.search(output) for output in outputs]
    assert names[0] is not None and names[1] is not None, outputs
    assert names[0]["queue"] != names[1]["queue"]
    assert names[0]["prefix"] != names[1]["prefix"]
    for output, name in zip(outputs, names, strict=True):
        assert name is not None and name["queue"].startswith("compactor-demo-")
        assert_compacted_and_saved(output)
        assert redis_keys(name["prefix"]) == []


NIGHT_COST = re.compile(r"the night cost \$([\d.]+) through the Batch API "
                        r"\(synchronous calls: \$([\d.]+)\)")


def test_demo_in_batch_mode_runs_its_due_sessions_through_a_batch_and_prices_the_night(
        tmp_path: Path) -> None:
    demo = Demo(tmp_path / "data")
    with OpenAIServer(latency_ms=0) as server:
        demo.env |= {"OPENAI_BASE_URL": server.base_url, "COMPACTOR_LLM_MODE": "batch"}
        output = demo.run("--seed", "7", "--count", "6")
        batches = server.batch_ids
        # The worker's start check makes the one direct call (a tiny request).
        summaries = [r for r in server.requests if r.prompt_tokens > 100]

    assert_compacted_and_saved(output)
    assert batches and {r.path for r in summaries} == {"/v1/batches"}, output
    cost = NIGHT_COST.search(output)
    assert cost is not None, output
    night, synchronous = float(cost.group(1)), float(cost.group(2))
    assert night > 0 and night == pytest.approx(synchronous / 2, abs=1e-4)
