"""The real beat of a chaos run: ``python -m scheduler beat`` (``compactor beat``) with
the run's settings, sending ``compactor.scan`` (and any other entry its schedule has) on
the workers' queue through the Redis the monkey restarts. A beat that exits by itself
is counted and started again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.support.worker_process import REPO_ROOT


class BeatProcess:
    def __init__(self, env: Mapping[str, str], log_path: Path) -> None:
        self.env = {**os.environ, **env, "COMPACTOR_LOG_FORMAT": "json",
                    "PYTHONPATH": str(REPO_ROOT)}
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.crashes = 0
        self._stopped = False

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "scheduler", "beat"], env=self.env, cwd=REPO_ROOT,
                stdout=log, stderr=log, start_new_session=True)

    def restart_crashed(self) -> None:
        if self._stopped or self.process is None or self.process.poll() is None:
            return
        self.crashes += 1
        self.start()

    def stop(self) -> None:
        self._stopped = True
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
