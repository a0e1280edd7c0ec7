"""The shared corpus of real sessions (``<repo root>/../shared/corpus``), for tests that
read it; they skip with a notice where it is absent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CORPUS_DIR = REPO_ROOT.parent / "shared" / "corpus"
ABSENT_NOTICE = (
    f"shared corpus not found at {CORPUS_DIR}; tests that read real sessions are skipped"
)


def corpus_path(name: str) -> Path:
    """Return the path of a corpus file: ``dev`` or ``dev.jsonl`` → ``CORPUS_DIR/dev.jsonl``."""
    return CORPUS_DIR / (name if name.endswith(".jsonl") else f"{name}.jsonl")


def load_corpus(name: str) -> list[dict[str, Any]]:
    """Return every session of a corpus file: ``{"session_id", "source", "messages"}``."""
    path = corpus_path(name)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {ABSENT_NOTICE}")
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def skip_without_corpus() -> None:
    """Skip the calling test, with a notice, when the shared corpus is absent."""
    if not CORPUS_DIR.is_dir():
        pytest.skip(ABSENT_NOTICE)
