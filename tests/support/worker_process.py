"""A real Celery worker in a subprocess, for end-to-end and chaos tests: started with
per-test settings in its environment, read through its JSON log lines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """``celery -A worker.celery_app worker`` with its log captured to a file."""

    def __init__(self, env: Mapping[str, str], log_path: Path, *, concurrency: int = 1,
                 queue: str | None = None) -> None:
        self.env = {**os.environ, **env, "COMPACTOR_LOG_FORMAT": "json",
                    "PYTHONPATH": str(REPO_ROOT)}
        self.log_path = log_path
        self.concurrency = concurrency
        self.queue = queue or self.env.get("COMPACTOR_QUEUE_NAME", "compaction")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> WorkerProcess:
        argv = [sys.executable, "-m", "celery", "-A", "worker.celery_app", "worker",
                "--pool", "prefork", "--concurrency", str(self.concurrency), "-Q", self.queue,
                "-n", f"test-{uuid.uuid4().hex[:8]}@%h", "--without-gossip",
                "--without-mingle", "--loglevel", "INFO"]
        with self.log_path.open("ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(argv, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(e.get("event") == "worker.ready" for e in self.events()):
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited early:\n{self.log_text()[-4000:]}")
            time.sleep(0.2)
        raise TimeoutError(f"worker not ready in {timeout_s}s:\n{self.log_text()[-4000:]}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every JSON log line (optionally only events called ``name``)."""
        found = []
        for line in self.log_text().splitlines():
            start = line.find("{")
            if start < 0:
                continue
            try:
                event = json.loads(line[start:])
            except ValueError:
                continue
            if isinstance(event, dict) and (name is None or event.get("event") == name):
                found.append(event)
        return found

    def child_pids(self) -> list[int]:
        """The pool's child processes (the ones that run jobs)."""
        assert self.process is not None
        out = subprocess.run(["pgrep", "-P", str(self.process.pid)], capture_output=True,
                             text=True, check=False).stdout
        return [int(pid) for pid in out.split()]

    def wait_for_events(self, name: str, count: int,
                        timeout_s: float = 60.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            events = self.events(name)
            if len(events) >= count:
                return events
            time.sleep(0.2)
        raise TimeoutError(f"{len(self.events(name))}/{count} {name} events after {timeout_s}s:"
                           f"\n{self.log_text()[-4000:]}")

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout_s)

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
