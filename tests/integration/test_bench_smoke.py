"""The benchmark scripts run end to end in their tiny ``--quick`` mode and print their
figures, so they cannot rot. They start at once (each has its own database, Redis
prefix, queue and server port); the slowest one sets the wall time. The fidelity
benchmark runs on its own, and its figures are checked against the projection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.fidelity_figures import projection_text, visible_values
from bench.fidelity_sessions import SOURCES
from bench.fidelity_values import CODING_KINDS, CUSTOMER_KINDS
from tests.support.worker_process import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

QUICK_RUN_TIMEOUT_S = 150
# Per script: table columns that must hold positive numbers in every row.
FIGURES = {
    "job_cpu": ("CPU ms min", "CPU ms median", "wall ms min", "lease", "summarize", "swap"),
    "job_instructions": ("M instructions per job",),
    "job_cpu_paired": ("CPU ms min", "CPU ms median", "ratio median", "ratio of mins"),
    "job_overhead": ("per-job wall ms median", "x no-op min", "x no-op median", "median ms",
                     "SQL statements", "tokenizer calls"),
    "job_overhead_paired": ("no-op ms median", "per-job wall ms median", "x no-op median",
                            "ratio median"),
    "throughput": ("jobs/s steady", "ideal jobs/s", "worker CPU s/job"),
    "chunk_merge_bench": ("prompt tokens", "prompt / span", "calls", "chunks"),
    "incremental_bench": ("2nd job prompt tokens", "prompt / (span + prior)"),
    "memory_bench": ("child HWM peak MiB", "raw JSON MiB", "growth / raw", "child PSS",
                     "child private", "floor child RSS MiB", "floor child private MiB"),
    "projection_bench": ("min ms", "median ms", "p95 ms"),
    "metrics_bench": ("CPU us per event median", "scrape CPU ms median"),
    "startup_bench": ("wall min", "wall median"),
    "task_overhead": ("per-task ms median", "median"),
    "batch_night": ("batch", "synchronous"),
}


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Start every script with ``--quick``; yield each one's output file once all ended."""
    out_dir = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    runs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    try:
        for name in FIGURES:
            out_path = out_dir / f"{name}.txt"
            with out_path.open("wb") as out:
                runs[name] = (subprocess.Popen(
                    [sys.executable, "-m", f"bench.{name}", "--quick"], cwd=REPO_ROOT,
                    env=env, stdout=out, stderr=subprocess.STDOUT), out_path)
        for name, (process, out_path) in runs.items():
            code = process.wait(timeout=QUICK_RUN_TIMEOUT_S)
            assert code == 0, f"bench.{name} exited {code}:\n{out_path.read_text()[-6000:]}"
        yield {name: out_path for name, (_, out_path) in runs.items()}
    finally:
        for process, _ in runs.values():
            if process.poll() is None:
                process.kill()
                process.wait()


def table_column(output: str, header: str) -> list[str]:
    """The cells under ``header`` in the first printed table that has that column."""
    lines = output.splitlines()
    for index, line in enumerate(lines):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and header in cells:
            column = cells.index(header)
            rows = []
            for row in lines[index + 2:]:
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in row.strip().strip("|").split("|")][column])
            return rows
    raise AssertionError(f"no table with a {header!r} column in:\n{output}")


def as_number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("%"))


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_each_benchmark_runs_quick_and_prints_positive_figures(
    quick_runs: dict[str, Path], name: str
) -> None:
    output = quick_runs[name].read_text()
    assert "machine: nproc=" in output and f"command: python -m bench.{name}" in output
    for header in FIGURES[name]:
        cells = table_column(output, header)
        assert cells, f"{header!r} of bench.{name} has no rows"
        assert all(as_number(cell) > 0 for cell in cells), (header, cells)


@pytest.mark.parametrize("name", ["chunk_merge_bench", "incremental_bench", "memory_bench",
                                  "throughput"])
def test_every_job_a_benchmark_measures_is_compacted(quick_runs: dict[str, Path],
                                                     name: str) -> None:
    output = quick_runs[name].read_text()
    column = "outcomes" if name in ("incremental_bench", "throughput") else "outcome"
    outcomes = table_column(output, column)
    assert outcomes and all(set(o.split(", ")) == {"compacted"} for o in outcomes), outcomes



@pytest.mark.parametrize(("skip", "last_step"), [("breaker_open", "breaker"),
                                                  ("under_trigger", "plan")])
def test_job_cpu_times_skipped_jobs(skip: str, last_step: str) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "bench.job_cpu", "--quick", "--skip", skip], cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, capture_output=True, text=True,
        timeout=QUICK_RUN_TIMEOUT_S, check=False)
    assert completed.returncode == 0, completed.stdout[-6000:] + completed.stderr[-6000:]
    output = completed.stdout
    assert f"jobs skipped ({skip})" in output
    for header in ("CPU ms min", "wall ms min", "lease", last_step):
        assert all(as_number(cell) > 0 for cell in table_column(output, header)), header
    # A skipped job stops at its last step: the summarizer never ran.
    assert {as_number(cell) for cell in table_column(output, "summarize")} == {0.0}

@pytest.fixture(scope="module")
def fidelity_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """``bench.fidelity --quick`` once: its JSON report and its printed tables."""
    report_path = tmp_path_factory.mktemp("fidelity") / "report.json"
    completed = subprocess.run(
        [sys.executable, "-m", "bench.fidelity", "--quick", "--json", str(report_path)],
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True, text=True, timeout=QUICK_RUN_TIMEOUT_S, check=False)
    assert completed.returncode == 0, completed.stderr[-6000:]
    return json.loads(report_path.read_text()), completed.stdout


@pytest.mark.parametrize("summarizer", ["extractive", "llm"])
def test_fidelity_reports_every_kind_source_and_round_for_each_summarizer(
    fidelity_run: tuple[dict[str, Any], str], summarizer: str
) -> None:
    report, output = fidelity_run
    figures = report["summarizers"][summarizer]

    assert {row["group"] for row in figures["by_kind"]} == {*CODING_KINDS, *CUSTOMER_KINDS}
    assert {row["group"] for row in figures["by_source"]} == set(SOURCES)
    assert [row["round"] for row in figures["per_round"]] == list(range(report["rounds"] + 1))
    assert all(row["not_compacted"] == 0 for row in figures["per_round"])
    # Each block within its own job's budget, and far smaller than what it covers.
    assert all(row["over_budget"] == 0 for row in figures["per_round"])
    assert all(0 < row["summary_pct_of_history"] < 50 for row in figures["per_round"])
    assert all(row["joined_goals_current"] in ("0/1", "1/1") for row in figures["per_round"])
    assert {row["session"].split("-")[0] for row in figures["sessions"]} == {
        "coding", "customer", "joined"}
    assert len(figures["targets"]) == 12
    # Every outcome a summary states matches the originals; nothing is open and done.
    assert all(row["false_outcome_lines"] == row["open_and_done"] == 0
               for row in figures["per_round"])
    # Whatever the summary leaves out is one recall away: every hidden fact is found.
    recall = figures["recall"]
    assert recall["recalled"] == recall["hidden"]
    assert f"== {summarizer} summarizer" in output


@pytest.mark.parametrize("summarizer", ["extractive", "llm"])
def test_fidelity_counts_a_fact_kept_only_in_the_verbatim_tail_as_visible(
    fidelity_run: tuple[dict[str, Any], str], summarizer: str
) -> None:
    sessions = fidelity_run[0]["summarizers"][summarizer]["sessions"]

    assert all(row["tail_facts"] > 0 for row in sessions)
    assert all(row["tail_visible"] == row["tail_facts"] for row in sessions)
    # The compacted figures are of facts the summary alone had to keep.
    assert all(row["compacted"] > 0 for row in sessions)


def test_a_value_in_a_tail_tool_call_is_visible_and_one_left_out_is_not() -> None:
    projection: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "[Summary] Relevant artifacts: - PROJ-1234"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "read_file", "arguments": '{"path": "src/a_1234.py"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "def a(): pass"},
    ]

    visible = visible_values(["PROJ-1234", "src/a_1234.py", "E1234-SCHEMA"],
                             projection_text(projection))

    assert visible == {"PROJ-1234", "src/a_1234.py"}
