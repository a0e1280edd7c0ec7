"""A real Celery worker in a subprocess, for end-to-end and chaos tests: started with
per-test settings in its environment, read through its log: stderr, where every line is
one JSON object (stdout, kept apart, stays empty)."""

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


def parse_log_lines(text: str) -> list[dict[str, Any]]:
    """Every complete line of a log as one JSON object; a line that is not one fails.

    The text after the last newline is a line still being written: left for later.
    """
    events = []
    for line in text.split("\n")[:-1]:
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if not isinstance(event, dict):
            raise AssertionError(f"a log line is not one JSON object: {line[:500]!r}")
        events.append(event)
    return events


class WorkerProcess:
    """``celery -A worker.broker.celery_app worker``, its stderr captured to ``log_path`` and its
    stdout to ``stdout_path``."""

    def __init__(self, env: Mapping[str, str], log_path: Path, *, concurrency: int = 1,
                 queue: str | None = None, send_events: bool = False) -> None:
        self.env = {**os.environ, **env, "COMPACTOR_LOG_FORMAT": "json",
                    "PYTHONPATH": str(REPO_ROOT)}
        self.log_path = log_path
        self.stdout_path = log_path.with_name(f"{log_path.name}.stdout")
        self.concurrency = concurrency
        self.queue = queue or self.env.get("COMPACTOR_QUEUE_NAME", "compaction")
        self.send_events = send_events  # -E: Celery's task events, as Flower needs them
        self.process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", "worker.broker.celery_app", "worker",
                "--pool", "prefork", "--concurrency", str(self.concurrency), "-Q", self.queue,
                "-n", f"test-{uuid.uuid4().hex[:8]}@%h", "--without-gossip",
                "--without-mingle", "--loglevel", "INFO", *(["-E"] if self.send_events else [])]

    def start(self, timeout_s: float = 60.0) -> WorkerProcess:
        argv = self.argv()
        # The child keeps its own descriptors.
        with self.log_path.open("ab") as log, self.stdout_path.open("ab") as out:
            self.process = subprocess.Popen(argv, env=self.env, stdout=out, stderr=log,
                                            cwd=REPO_ROOT, start_new_session=True)
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

    def stdout_text(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every log line (optionally only events called ``name``); fails on a line that
        is not one JSON object."""
        return [event for event in parse_log_lines(self.log_text())
                if name is None or event.get("event") == name]

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
        """SIGTERM (a warm shutdown: the running job finishes), SIGKILL after ``timeout_s``."""
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


class CompactorWorker(WorkerProcess):
    """``compactor worker`` as an operator starts it (its queue from the environment)."""

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "scheduler", "worker", "--concurrency",
                str(self.concurrency), *(["-E"] if self.send_events else [])]
