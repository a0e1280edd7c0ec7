"""Long operator commands report as they go, on stderr, in real processes: `compact
--inline --all` logs each job's compaction.job event as that job ends (not all of them
at the end), and `export` logs its count so far (export.progress) while it writes."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from db import upgrade_database
from tests.support.cli import REPO_ROOT, Compactor, compactor_for, write_jsonl
from tests.support.generated import generated_session
from tests.support.openai_server import OpenAIServer

pytestmark = pytest.mark.integration

SESSIONS = ("first", "second", "third")
LLM_LATENCY_MS = 1_000


def timed_stderr_lines(argv: list[str], env: dict[str, str]) -> tuple[list[tuple[float, Any]],
                                                                       float, int]:
    """Run ``argv``; each JSON line of its stderr with when it arrived (the command's own
    closing line is not JSON), when the process ended, and its exit status."""
    lines = []
    with subprocess.Popen(argv, env=os.environ | env | {"COMPACTOR_LOG_FORMAT": "json"},
                          cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True) as process:
        assert process.stderr is not None
        for line in process.stderr:
            if line.startswith("{"):
                lines.append((time.monotonic(), json.loads(line)))
        status = process.wait(120)
    return lines, time.monotonic(), status


@pytest.fixture
def compactor(tmp_path: Path) -> Compactor:
    url = f"sqlite:///{tmp_path / 'compactor.db'}"
    upgrade_database(url)
    compactor = compactor_for(url, tmp_path / "data")
    records = write_jsonl(tmp_path / "in.jsonl",
                          [generated_session(session_id, 60) for session_id in SESSIONS])
    assert compactor("import", str(records)).exit_code == 0
    return compactor


def test_compact_inline_all_logs_each_job_as_it_ends(compactor: Compactor) -> None:
    with OpenAIServer(behaviour="latency", latency_ms=LLM_LATENCY_MS) as server:
        env = {**compactor.env, "COMPACTOR_LLM_BASE_URL": server.base_url,
               "COMPACTOR_SUMMARIZER": "llm", "COMPACTOR_MODEL_CONTEXT_TOKENS": "8000",
               "COMPACTOR_TAIL_BUDGET_TOKENS": "500"}
        lines, ended_at, status = timed_stderr_lines(
            [sys.executable, "-m", "scheduler", "compact", "--inline", "--all"], env)
    assert status == 0, lines
    jobs = [(at, event) for at, event in lines if event.get("event") == "compaction.job"]
    assert sorted(event["session_id"] for _, event in jobs) == sorted(SESSIONS)
    assert all(event["outcome"] == "compacted" for _, event in jobs), jobs
    # Each event leaves as its job ends: a slow LLM call apart, the first long before the end.
    arrivals = [at for at, _ in jobs]
    gaps_s = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert min(gaps_s) >= 0.8 * LLM_LATENCY_MS / 1000, (arrivals, ended_at)
    assert ended_at - arrivals[0] >= 2 * 0.8 * LLM_LATENCY_MS / 1000, (arrivals, ended_at)


def test_export_logs_its_count_while_it_writes(compactor: Compactor, tmp_path: Path) -> None:
    # The report interval at zero: one count per session written, as the export goes.
    out = tmp_path / "out.jsonl"
    script = ("import scheduler.cli.data as data; data.EXPORT_PROGRESS_EVERY_S = 0.0; "
              "from scheduler.cli.main import app; "
              f"app(['export', '-o', {str(out)!r}], prog_name='compactor')")
    lines, _, status = timed_stderr_lines([sys.executable, "-c", script], compactor.env)
    assert status == 0, lines
    counts = [event["sessions"] for _, event in lines if event.get("event") == "export.progress"]
    assert counts == [1, 2, 3], lines
    assert len(out.read_text().splitlines()) == len(SESSIONS)
