"""The benchmark scripts run end to end in their tiny ``--quick`` mode and print their
figures, so they cannot rot. The six start at once (each has its own database, Redis
prefix, queue and server port); the slowest one sets the wall time."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.worker_process import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

QUICK_RUN_TIMEOUT_S = 150
# Per script: table columns that must hold positive numbers in every row.
FIGURES = {
    "job_overhead": ("per-job wall ms", "x no-op", "median ms"),
    "throughput": ("jobs/s steady", "ideal jobs/s", "worker CPU s/job"),
    "chunk_merge_bench": ("prompt tokens", "prompt / span", "calls", "chunks"),
    "incremental_bench": ("2nd job prompt tokens", "prompt / (span + prior)"),
    "memory_bench": ("child HWM peak MiB", "raw JSON MiB", "growth / raw"),
    "projection_bench": ("min ms", "median ms", "p95 ms"),
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
