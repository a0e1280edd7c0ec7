"""The shared corpus of real sessions, for tests that read it: ``<repo root>/../shared/corpus``,
or wherever ``COMPACTOR_TEST_CORPUS_DIR`` points. Those tests skip with a notice where it is
absent, and the run's summary counts them (``count_corpus_skips``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CORPUS_DIR_ENV = "COMPACTOR_TEST_CORPUS_DIR"
DEFAULT_CORPUS_DIR = REPO_ROOT.parent / "shared" / "corpus"
ABSENT_PREFIX = "shared corpus not found at "


def find_corpus_dir() -> Path:
    """Where the corpus is looked for; read at each call so a run can point it elsewhere."""
    return Path(os.environ.get(CORPUS_DIR_ENV) or DEFAULT_CORPUS_DIR)


def absent_notice() -> str:
    return f"{ABSENT_PREFIX}{find_corpus_dir()}; tests that read real sessions are skipped"


def corpus_path(name: str) -> Path:
    """Return the path of a corpus file: ``dev`` or ``dev.jsonl`` → ``<corpus>/dev.jsonl``."""
    return find_corpus_dir() / (name if name.endswith(".jsonl") else f"{name}.jsonl")


def load_corpus(name: str) -> list[dict[str, Any]]:
    """Return every session of a corpus file: ``{"session_id", "source", "messages"}``."""
    path = corpus_path(name)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {absent_notice()}")
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def skip_without_corpus() -> None:
    """Skip the calling test, with a notice, when the shared corpus is absent."""
    if not find_corpus_dir().is_dir():
        pytest.skip(absent_notice())


def count_corpus_skips(skipped: Iterable[pytest.TestReport | pytest.CollectReport]) -> int:
    """How many of a run's skip reports are skips for want of the corpus."""
    return sum(1 for report in skipped if ABSENT_PREFIX in str(report.longrepr))


def describe_corpus_skips(count: int) -> str:
    """The run summary's line about the corpus: where it was looked for, what it cost."""
    where = find_corpus_dir()
    if where.is_dir():
        return f"corpus: read from {where}"
    tests = "test" if count == 1 else "tests"
    return (f"corpus: not found at {where} (set {CORPUS_DIR_ENV} to point elsewhere); "
            f"{count} {tests} skipped for want of it")
