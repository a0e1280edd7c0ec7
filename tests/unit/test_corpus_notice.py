"""A run says plainly what the corpus's absence cost: the summary counts the tests skipped for
want of it, and only those, and names where it looked (``COMPACTOR_TEST_CORPUS_DIR``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.corpus import CORPUS_DIR_ENV, REPO_ROOT

# Three tests that need the corpus, one skipped for another reason, one that needs nothing.
SAMPLE_TESTS = '''
import pytest

@pytest.mark.corpus
def test_reads_the_corpus() -> None:
    pass

@pytest.mark.corpus
@pytest.mark.parametrize("split", ["dev", "dev_long"])
def test_reads_each_split(split: str) -> None:
    pass

def test_skips_for_another_reason() -> None:
    pytest.skip("not today")

def test_needs_nothing() -> None:
    pass
'''


def run_sample(tmp_path: Path, corpus_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run the sample tests under the project's configuration and conftest hooks."""
    sample = tmp_path / "test_sample.py"
    sample.write_text(SAMPLE_TESTS, encoding="utf-8")
    command = [sys.executable, "-m", "pytest", "-c", str(REPO_ROOT / "pyproject.toml"),
               "--rootdir", str(REPO_ROOT), "-p", "tests.conftest", str(sample)]
    env = {**os.environ, CORPUS_DIR_ENV: str(corpus_dir)}
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_a_run_without_the_corpus_counts_only_the_tests_that_needed_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-corpus-here"
    run = run_sample(tmp_path, missing)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (f"corpus: not found at {missing} (set {CORPUS_DIR_ENV} to point elsewhere); "
            "3 tests skipped for want of it") in run.stdout.splitlines()
    assert "1 passed, 4 skipped" in run.stdout


def test_a_run_with_the_corpus_names_where_it_was_read(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    run = run_sample(tmp_path, corpus)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"corpus: read from {corpus}" in run.stdout.splitlines()
    assert "4 passed, 1 skipped" in run.stdout
