"""The benchmarks' worker reads its log incrementally and still sees every line once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.common import BenchWorker


def _line(event: str, n: int) -> bytes:
    return (json.dumps({"event": event, "n": n}) + "\n").encode()


def test_bench_worker_sees_each_log_line_once_and_waits_for_a_partial_one(
        tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    worker = BenchWorker({}, log)
    assert worker.events() == []
    log.write_bytes(_line("job", 1) + _line("ready", 2))
    assert [e["n"] for e in worker.events("job")] == [1]
    with log.open("ab") as out:
        out.write(_line("job", 3)[:7])  # a line still being written
    assert [e["n"] for e in worker.events()] == [1, 2]
    with log.open("ab") as out:
        out.write(_line("job", 3)[7:] + _line("job", 4))
    assert [e["n"] for e in worker.events("job")] == [1, 3, 4]
    assert [e["n"] for e in worker.events()] == [1, 2, 3, 4]
    assert worker.events("absent") == []


def test_bench_worker_fails_on_a_log_line_that_is_not_json(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_bytes(_line("job", 1) + b"Traceback (most recent call last):\n")
    worker = BenchWorker({}, log)
    for _ in range(2):
        with pytest.raises(AssertionError, match="not one JSON object"):
            worker.events()
