"""No configured secret reaches any output: a real `compactor worker` (its LLM start
check included), `compactor beat`, `compactor scan` and `compactor check` (table and
--json), all configured with a secret in every URL and key (the LLM base URL with a
user:password and an ``?api-key=``, the API key, the database URL's password, the
password of a private Redis that requires one), drive a job through the OpenAI-protocol
test server at INFO and at DEBUG; every byte they write is searched for each secret."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import make_url

from db import Store
from tests.support.chaos import PrivateRedis
from tests.support.cli import REPO_ROOT, Compactor
from tests.support.e2e import LONG_SESSION_ID, JobEnv, build_job_env, import_generated_sessions
from tests.support.openai_server import OpenAIServer
from tests.support.worker_process import CompactorWorker, parse_log_lines

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

LLM_PASSWORD = "llm-pass/W0rd@9e0b"  # '/' and '@': written percent-encoded in the URL
QUERY_KEY = "query-KEY-4d6e15a7"
API_KEY = "sk-test-APIKEY-2b8c33d1e0"
PG_PASSWORD = "pg-PASSWORD-7f3a91"
REDIS_PASSWORD = "redis-PASS-c81d22"
SECRETS = {"LLM URL password": LLM_PASSWORD,
           "LLM URL password (encoded)": quote(LLM_PASSWORD, safe=""),
           "query key": QUERY_KEY, "API key": API_KEY, "database password": PG_PASSWORD,
           "Redis password": REDIS_PASSWORD}
BEAT_RUN_S = 15.0  # long enough for beat to start and log on a loaded test machine


class LeveledWorker(CompactorWorker):
    """``compactor worker`` with Celery's own log level as the settings' level."""

    def __init__(self, *args: object, loglevel: str, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]  # the parent's own
        self.loglevel = loglevel

    def argv(self) -> list[str]:
        return [*super().argv(), "--loglevel", self.loglevel]


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    with PrivateRedis(tmp_path, password=REDIS_PASSWORD) as running:
        yield running


CRASHING_COMMAND = """
from scheduler.cli.main import app

def boom() -> None:
    raise RuntimeError("cannot reach postgresql://app:{password}@db/c?api-key={key} now")

app.command("boom")(boom)
app(prog_name="compactor", args=["boom"])
"""


def secret_env(postgres_url: str, server: OpenAIServer, redis_url: str, level: str) -> JobEnv:
    host = server.base_url.removeprefix("http://")
    llm_url = f"http://llm-user:{quote(LLM_PASSWORD, safe='')}@{host}?api-key={QUERY_KEY}"
    database_url = make_url(postgres_url).set(password=PG_PASSWORD).render_as_string(
        hide_password=False)
    return build_job_env(database_url, llm_url, redis_url=redis_url, llm_api_key=API_KEY,
                         log_level=level, worker_check_llm=True, quiet_period_s=0)


def run_compactor(job_env: JobEnv, *args: str) -> subprocess.CompletedProcess[str]:
    done = Compactor(job_env.env).subprocess(*args)
    assert done.returncode == 0, (done.stdout, done.stderr)
    parse_log_lines(done.stderr)
    return done


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_no_secret_of_any_url_or_key_reaches_any_process_output(
    level: str, pg_store: Store, postgres_url: str, server: OpenAIServer,
    private_redis: PrivateRedis, tmp_path: Path,
) -> None:
    job_env = secret_env(postgres_url, server, private_redis.url, level)
    import_generated_sessions(pg_store, LONG_SESSION_ID)
    env = os.environ | job_env.env | {"COMPACTOR_DATA_DIR": str(tmp_path / "beat")}
    beat = subprocess.Popen([sys.executable, "-m", "scheduler", "beat"], env=env,
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    started = time.monotonic()
    worker = LeveledWorker(job_env.env, tmp_path / "worker.log", loglevel=level)
    try:
        worker.start()
        commands = [run_compactor(job_env, *args) for args in
                    (["check"], ["check", "--json"], ["scan", "--json"])]
        [job] = worker.wait_for_events("compaction.job", 1)
        time.sleep(max(0.0, BEAT_RUN_S - (time.monotonic() - started)))
    finally:
        worker.stop()
        os.killpg(beat.pid, signal.SIGTERM)
        beat_out, beat_err = beat.communicate(timeout=30)
    outputs = {"check": commands[0], "check --json": commands[1], "scan": commands[2]}
    texts = {f"{name} {stream}": getattr(done, stream) for name, done in outputs.items()
             for stream in ("stdout", "stderr")}
    texts |= {"worker stderr": worker.log_text(), "worker stdout": worker.stdout_text(),
              "beat stdout": beat_out.decode(), "beat stderr": beat_err.decode()}

    assert job["outcome"] == "compacted", job
    events = parse_log_lines(worker.log_text())
    assert any(e["logger"] == "httpx2" and "HTTP Request" in e["event"] for e in events)
    assert json.loads(commands[1].stdout)["ok"] is True
    assert "beat: Starting..." in beat_err.decode()
    if level == "DEBUG":
        assert any(e["level"] == "debug" for e in events)
    leaks = {(source, name): text.count(secret) for source, text in texts.items()
             for name, secret in SECRETS.items() if secret in text}
    assert leaks == {}, f"{sum(map(len, texts.values()))} characters searched: {leaks}"


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_an_unexpected_command_error_leaves_as_one_scrubbed_record(
    log_format: str, tmp_path: Path
) -> None:
    script = CRASHING_COMMAND.format(password=PG_PASSWORD, key=QUERY_KEY)
    env = os.environ | {"COMPACTOR_DATA_DIR": str(tmp_path), "COMPACTOR_LOG_FORMAT": log_format}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60, check=False)

    assert done.returncode == 1
    assert "cli.crashed" in done.stderr and "RuntimeError: cannot reach" in done.stderr
    assert "postgresql://app:***@db/c?api-key=*** now" in done.stderr
    assert (done.stderr + done.stdout).count(PG_PASSWORD) == 0
    assert (done.stderr + done.stdout).count(QUERY_KEY) == 0
    if log_format == "json":
        [record] = parse_log_lines(done.stderr)
        assert record["level"] == "critical"
