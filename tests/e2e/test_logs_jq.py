"""What the processes write is JSON lines that jq reads as they are, and the docs' jq
recipes work on it: a real `compactor worker` (its pool child included), `compactor
beat`, `compactor scan`, `compactor trigger` and `compactor rollback`, with compactions,
a rollback, a session failure that opens its breaker and a provider failure that opens
the provider breaker. Every `PRODUCER | jq ...` line of README.md's and RUNBOOK.md's
console blocks runs on that real output."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from db import Store
from tests.support.cli import REPO_ROOT, Compactor
from tests.support.e2e import (
    LONG_SESSION_ID,
    MEDIUM_SESSION_ID,
    JobEnv,
    JobPublisher,
    build_job_env,
    import_generated_sessions,
    import_records,
    wait_until,
)
from tests.support.generated import generated_session
from tests.support.openai_server import OpenAIServer
from tests.support.worker_process import CompactorWorker, WorkerProcess, parse_log_lines
from worker.broker.contract import SCAN_TASK_NAME

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

DOCS = (REPO_ROOT / "README.md", REPO_ROOT / "docs" / "RUNBOOK.md")
# One failure opens a session's breaker, one provider failure the provider's; no retries.
SCENARIO_SETTINGS: dict[str, Any] = {
    "breaker_threshold": 1, "provider_breaker_threshold": 1,
    "provider_breaker_cooldown_s": 3_600, "max_transient_retries": 0, "quiet_period_s": 0,
}
# Beat takes ~9 s to start on a loaded 2-core test machine.
BEAT_RUN_S = 15.0
# Imported after the scan, over the trigger; its summaries fail validation.
BROKEN_SESSION_ID = "summaries-fail"


@dataclass(frozen=True)
class Recipe:
    """One documented ``PRODUCER | jq ARGS`` line and the comment line above it."""

    doc: str
    title: str
    producer: str
    jq_args: str


INLINE_RECIPE = re.compile(r"`([^`]+ \| jq [^`]+)`")


def documented_recipes() -> list[Recipe]:
    """The recipes of console blocks (titled by their comment line) and of inline code."""
    recipes = []
    for doc in DOCS:
        in_console, title = False, ""
        for line in doc.read_text(encoding="utf-8").splitlines():
            if line.startswith("```"):
                in_console = not in_console and line.strip() == "```console"
            elif in_console and line.startswith("# "):
                title = line[2:].strip()
            commands = [line] if in_console else INLINE_RECIPE.findall(line)
            for command in (c for c in commands if " | jq " in c):
                producer, _, jq_args = command.partition(" | jq ")
                recipes.append(Recipe(doc.name, title if in_console else "", producer.strip(),
                                      jq_args))
    return recipes


@dataclass(frozen=True)
class Outputs:
    """The real output the recipes read: stderr of the worker and beat, scan's stdout."""

    worker_log: str
    beat_log: str
    scan_stdout: str


@pytest.fixture
def job_env(postgres_url: str, server: OpenAIServer) -> JobEnv:
    return build_job_env(postgres_url, server.base_url, **SCENARIO_SETTINGS)


@pytest.fixture
def compactor_worker(job_env: JobEnv, redis_client: redis.Redis,
                     tmp_path: Path) -> Iterator[WorkerProcess]:
    worker = CompactorWorker(job_env.env, tmp_path / "worker.log")
    try:
        yield worker.start()
    finally:
        worker.stop()


def run_command(job_env: JobEnv, *args: str) -> subprocess.CompletedProcess[str]:
    """`compactor ARGS` in a child process; it must succeed and log only JSON lines."""
    done = Compactor(job_env.env).subprocess(*args)
    assert done.returncode == 0, done.stderr
    parse_log_lines(done.stderr)
    return done


def job_event(worker: WorkerProcess, task_id: str) -> dict[str, Any]:
    def found() -> list[dict[str, Any]]:
        return [e for e in worker.events("compaction.job") if e["task_id"] == task_id]
    wait_until(lambda: bool(found()))
    return found()[0]


def trigger_and_wait(job_env: JobEnv, worker: WorkerProcess, session_id: str) -> dict[str, Any]:
    [queued] = json.loads(run_command(job_env, "trigger", session_id, "--force",
                                      "--json").stdout)
    return job_event(worker, queued["job_id"])


def run_beat(job_env: JobEnv, tmp_path: Path) -> tuple[str, str]:
    """`compactor beat` for a few seconds, then SIGTERM: its (stdout, stderr)."""
    env = os.environ | job_env.env | {"COMPACTOR_DATA_DIR": str(tmp_path / "beat")}
    with subprocess.Popen([sys.executable, "-m", "scheduler", "beat"], env=env, cwd=REPO_ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as beat:
        time.sleep(BEAT_RUN_S)
        assert beat.poll() is None, beat.communicate()
        os.killpg(beat.pid, signal.SIGTERM)
        stdout, stderr = beat.communicate(timeout=30)
    return stdout, stderr


def play_scenario(job_env: JobEnv, store: Store, worker: WorkerProcess,
                  publisher: JobPublisher, server: OpenAIServer) -> dict[str, dict[str, Any]]:
    """Compact two sessions through the nightly scan task, roll one back, fail another
    for good and the rolled-back one on the provider; return each session's last event."""
    publisher.app.send_task(SCAN_TASK_NAME, queue=job_env.queue)  # what beat sends
    worker.wait_for_events("scan.finished", 1)
    events = {e["session_id"]: e for e in worker.wait_for_events("compaction.job", 2)}
    run_command(job_env, "rollback", MEDIUM_SESSION_ID)
    import_records(store, [generated_session(BROKEN_SESSION_ID, 40)])
    server.set_behaviour("wrong_schema")
    events[BROKEN_SESSION_ID] = trigger_and_wait(job_env, worker, BROKEN_SESSION_ID)
    server.set_behaviour("error_500")
    events[MEDIUM_SESSION_ID] = trigger_and_wait(job_env, worker, MEDIUM_SESSION_ID)
    return events


def producer_output(recipe: Recipe, outputs: Outputs, job_env: JobEnv, tmp_path: Path) -> str:
    """What the recipe's producer writes, from the real processes of this test."""
    producer = recipe.producer
    if producer == "compactor worker 2>&1" or producer.startswith("journalctl -u compactor-worker"):
        return outputs.worker_log
    if producer == "compactor beat 2>&1":
        return outputs.beat_log
    if producer == "compactor scan --json":
        return outputs.scan_stdout
    if producer == "compactor reconcile --dry-run --json":
        # The stopped worker left the scan's jobs queued; lose them as a Redis restart would.
        with redis.Redis.from_url(job_env.settings.redis_url) as client:
            client.delete(f"{job_env.prefix}{job_env.queue}")
        done = run_command(job_env, "reconcile", "--dry-run", "--json")
        assert json.loads(done.stdout)["dry_run"] is True
        return done.stdout
    if re.fullmatch(r"compactor projection [-\w]+ --json", producer):
        # The README's session stands for one this test compacted.
        done = run_command(job_env, "projection", LONG_SESSION_ID, "--json")
        assert json.loads(done.stdout)["session_id"] == LONG_SESSION_ID
        return done.stdout
    if re.fullmatch(r"compactor (runs|sessions|gc|cost) --json[-\w ]*", producer):
        return run_command(job_env, *producer.split()[1:]).stdout
    if producer == "compactor import FILE --json":
        records = tmp_path / "import.jsonl"
        records.write_text(json.dumps(generated_session("imported", 2)) + "\n"
                           + json.dumps({"session_id": "no-messages"}) + "\n")
        # A rejected record makes the import exit 1; the pipe reads its stdout all the same.
        done = Compactor(job_env.env).subprocess("import", str(records), "--json")
        assert done.returncode == 1, done.stderr
        return done.stdout
    if producer.startswith("redis-cli "):
        command = producer.replace('"$COMPACTOR_REDIS_URL"', job_env.settings.redis_url) \
            .replace(" compactor:", f" {job_env.prefix}")
        done = subprocess.run(command, shell=True, capture_output=True, text=True, check=True)
        return done.stdout
    raise AssertionError(f"{recipe.doc}: no real output for the producer {producer!r}")


def run_jq(recipe: Recipe, text: str) -> list[Any]:
    """Run the recipe's jq on ``text``; return the JSON values it printed."""
    done = subprocess.run(f"jq {recipe.jq_args}", shell=True, input=text, capture_output=True,
                          text=True, check=False)
    assert (done.returncode, done.stderr) == (0, ""), (recipe, done.stderr)
    decoder, output, values, position = json.JSONDecoder(), done.stdout, [], 0
    while output[position:].strip():
        position += len(output[position:]) - len(output[position:].lstrip())
        value, position = decoder.raw_decode(output, position)
        values.append(value)
    return values


def test_every_line_is_json_and_every_documented_jq_recipe_works_on_real_output(
    pg_store: Store, compactor_worker: WorkerProcess, publisher: JobPublisher,
    server: OpenAIServer, job_env: JobEnv, tmp_path: Path,
) -> None:
    import_generated_sessions(pg_store, LONG_SESSION_ID, MEDIUM_SESSION_ID)
    events = play_scenario(job_env, pg_store, compactor_worker, publisher, server)
    compactor_worker.stop()  # before the scan: its job would add a third failure
    beat_stdout, beat_stderr = run_beat(job_env, tmp_path)
    scan = run_command(job_env, "scan", "--json")
    outputs = Outputs(compactor_worker.log_text(), beat_stderr, scan.stdout)

    for name, text in [("worker", outputs.worker_log), ("beat", beat_stderr),
                       ("scan", scan.stderr)]:
        parsed = parse_log_lines(text)  # json.loads, line by line
        jq = subprocess.run(["jq", "-c", "."], input=text, capture_output=True, text=True,
                            check=False)
        assert (jq.returncode, jq.stderr) == (0, ""), (name, jq.stderr)
        assert len(jq.stdout.splitlines()) == len(parsed) == len(text.splitlines()), name
    assert (compactor_worker.stdout_text(), beat_stdout) == ("", "")
    worker_loggers = {e["logger"] for e in parse_log_lines(outputs.worker_log)}
    assert {"compactor", "celery.apps.worker", "celery.app.trace", "httpx2"} <= worker_loggers
    assert "beat: Starting..." in {e["event"] for e in parse_log_lines(beat_stderr)}

    recipes = documented_recipes()
    assert len(recipes) >= 2 + len(RECIPE_CHECKS), recipes
    checked = set()
    for recipe in recipes:
        values = run_jq(recipe, producer_output(recipe, outputs, job_env, tmp_path))
        check = RECIPE_CHECKS.get(recipe.title)
        if check is not None:
            check(values, events)
            checked.add(recipe.title)
    assert checked == set(RECIPE_CHECKS), set(RECIPE_CHECKS) - checked


def saved_tokens(event: dict[str, Any]) -> int:
    return int(event["tokens_before"]) - int(event["tokens_after"])


def check_failed_last_night(values: list[Any], events: dict[str, dict[str, Any]]) -> None:
    assert {(v["session_id"], v["reason"]) for v in values} == {
        (BROKEN_SESSION_ID, events[BROKEN_SESSION_ID]["reason"]),
        (MEDIUM_SESSION_ID, "server_error")}


def check_tokens_saved(values: list[Any], events: dict[str, dict[str, Any]]) -> None:
    # The medium session's compaction was rolled back: only the long one's counts.
    assert values == [saved_tokens(events[LONG_SESSION_ID])]


def check_open_session_breakers(values: list[Any], events: dict[str, dict[str, Any]]) -> None:
    assert [(v["session_id"], v["breaker_state"]) for v in values] == [(BROKEN_SESSION_ID,
                                                                         "open")]


def check_provider_breaker(values: list[Any], events: dict[str, dict[str, Any]]) -> None:
    assert [(v["state"], v["failures"]) for v in values] == [("open", 1)]


def check_every_outcome(values: list[Any], events: dict[str, dict[str, Any]]) -> None:
    outcomes = sorted((v["session_id"], v["outcome"]) for v in values)
    assert outcomes == sorted([(LONG_SESSION_ID, "compacted"), (MEDIUM_SESSION_ID, "compacted"),
                               (BROKEN_SESSION_ID, "failed"), (MEDIUM_SESSION_ID, "failed")])


def check_scans(values: list[Any], events: dict[str, dict[str, Any]]) -> None:
    assert [v["enqueued"] for v in values] == [2]


RECIPE_CHECKS: dict[str, Callable[[list[Any], dict[str, dict[str, Any]]], None]] = {
    "which sessions failed last night, and why (each job's last attempt only)":
        check_failed_last_night,
    "tokens saved by the last 1000 jobs, rolled-back revisions not counted": check_tokens_saved,
    "which session breakers are open (or half-open, on their trial)":
        check_open_session_breakers,
    "the provider breaker (no output: closed and never tripped)": check_provider_breaker,
    "every job's outcome": check_every_outcome,
    "what each nightly scan enqueued (the scan runs as a task on a worker)": check_scans,
}
