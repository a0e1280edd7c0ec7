"""A PostgreSQL server of our own (initdb in a temporary directory, a free loopback
port) that a test may stop, hang and start again without touching the shared one."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.support.chaos import free_port


def _as_postgres() -> list[str]:
    """PostgreSQL refuses to run as root: run its tools as ``postgres`` then."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not on PATH: PostgreSQL's server binaries are needed")
    return found


class PrivatePostgres:
    """``initdb`` + ``pg_ctl`` in a temporary directory; ``stop`` is an immediate shutdown (a
    crash: connections drop), ``hang`` freezes the server (SIGSTOP: connections stay
    open and nothing answers)."""

    def __init__(self) -> None:
        self.port = free_port()
        # Its own directory: a test's tmp_path may be closed to the postgres user.
        self.work_dir = Path(tempfile.mkdtemp(prefix="compactor-pg-"))
        self.work_dir.chmod(0o755)
        self.data_dir = self.work_dir / "pgdata"
        self.socket_dir = self.work_dir / "pgsocket"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def init(self) -> PrivatePostgres:
        for folder in (self.data_dir, self.socket_dir):
            folder.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                shutil.chown(folder, "postgres", "postgres")
        subprocess.run([*_as_postgres(), _binary("initdb"), "-D", str(self.data_dir),
                        "-U", "postgres", "--auth=trust", "--no-sync"],
                       check=True, capture_output=True)
        return self.start()

    def start(self, timeout_s: float = 30.0) -> PrivatePostgres:
        options = (f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off")
        subprocess.run([*_as_postgres(), _binary("pg_ctl"), "-D", str(self.data_dir), "-o",
                        options, "-l", str(self.data_dir / "server.log"), "-w",
                        "-t", str(int(timeout_s)), "start"], check=True, capture_output=True)
        deadline = time.monotonic() + timeout_s
        while not self.is_up():
            if time.monotonic() > deadline:
                raise TimeoutError(f"PostgreSQL on port {self.port} not up in {timeout_s}s")
            time.sleep(0.1)
        return self

    def is_up(self) -> bool:
        try:
            with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                                 dbname="postgres", connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def stop(self) -> None:
        subprocess.run([*_as_postgres(), _binary("pg_ctl"), "-D", str(self.data_dir), "-m",
                        "immediate", "-w", "stop"], check=False, capture_output=True)

    def _postmaster_pid(self) -> int:
        return int((self.data_dir / "postmaster.pid").read_text().split()[0])

    def hang(self) -> None:
        os.kill(self._postmaster_pid(), signal.SIGSTOP)
        for pid in self._backend_pids():
            os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in [self._postmaster_pid(), *self._backend_pids()]:
            os.kill(pid, signal.SIGCONT)

    def _backend_pids(self) -> list[int]:
        children = subprocess.run(["pgrep", "-P", str(self._postmaster_pid())],
                                  capture_output=True, text=True, check=False).stdout
        return [int(pid) for pid in children.split()]

    def __enter__(self) -> PrivatePostgres:
        return self.init()

    def __exit__(self, *_: object) -> None:
        with contextlib.suppress(OSError, ValueError):  # not hung, or already stopped
            self.resume()
        self.stop()
        shutil.rmtree(self.work_dir, ignore_errors=True)
