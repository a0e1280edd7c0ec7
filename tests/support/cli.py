"""Running the `compactor` command line in tests: in process through typer's CliRunner,
or as a real `python -m scheduler` subprocess, against the database in ``env``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result

from scheduler.cli.main import app
from tests.support.logs import preserved_logging
from worker.settings.config import get_settings

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Compactor:
    """The command line with ``env`` (COMPACTOR_DATABASE_URL, COMPACTOR_DATA_DIR) set."""

    env: dict[str, str]

    def __call__(self, *args: str) -> Result:
        return self.run_with_input(None, *args)

    def run_with_input(self, stdin: str | None, *args: str) -> Result:
        """Run with ``stdin`` as the command's standard input."""
        # get_settings() is cached per process: each run must read this run's env. The
        # logging a command configures is process-wide too: later tests get theirs back.
        get_settings.cache_clear()
        try:
            with preserved_logging():
                return CliRunner().invoke(app, list(args), input=stdin, env=self.env)
        finally:
            get_settings.cache_clear()

    def json(self, *args: str) -> Any:
        """Run a reading command with --json; it must succeed."""
        result = self(*args, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    def subprocess(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run `python -m scheduler ARGS` in a child process."""
        return subprocess.run(
            [sys.executable, "-m", "scheduler", *args], env=os.environ | self.env,
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
        )


def compactor_for(database_url: str, data_dir: Path) -> Compactor:
    return Compactor({"COMPACTOR_DATABASE_URL": database_url,
                      "COMPACTOR_DATA_DIR": str(data_dir)})


def write_jsonl(path: Path, lines: list[Any]) -> Path:
    """Write records as JSONL; a ``str`` item is written as the raw line it is."""
    text = "".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in lines)
    path.write_text(text, encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
