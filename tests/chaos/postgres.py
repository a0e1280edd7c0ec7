"""A PostgreSQL server of the chaos run's own (``initdb`` + ``pg_ctl`` on a free port and
a throwaway data directory), so that it can be restarted and hung without touching the
shared server other suites use. Run as user ``postgres`` when we are root (initdb
refuses root)."""

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

PG_BIN_ENV = "COMPACTOR_CHAOS_PG_BIN"
DEFAULT_PG_BIN = "/usr/lib/postgresql/15/bin"
DATABASE = "chaos"
# Enough for 3 workers x (master + 2 children) x pool, the driver's engines and the beat.
MAX_CONNECTIONS = 200


class PrivatePostgres:
    """One private server; ``restart`` is a crash (immediate stop) and a start, ``hang``
    freezes the postmaster and every backend (SIGSTOP) for a while, then thaws them."""

    def __init__(self, pg_bin: str | None = None) -> None:
        self.bin = Path(pg_bin or os.environ.get(PG_BIN_ENV, DEFAULT_PG_BIN))
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="chaos-pg-"))
        self.data_dir = self.root / "data"
        self.restarts = 0
        self.hangs = 0

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def _run(self, *argv: str, timeout_s: float = 120.0) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        result = subprocess.run([*prefix, *argv], capture_output=True, text=True,
                                timeout=timeout_s, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {result.stderr.strip()[-2000:]}")

    def setup(self) -> PrivatePostgres:
        """initdb and start. ``fsync = off`` is safe here (a crash of the server, never of
        the machine: the OS keeps what was written); ``synchronous_commit`` stays on, or
        a restart would lose commits the clients were told had happened."""
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
                  "--auth=trust", "--no-sync", "-E", "UTF8")
        settings = (f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                    f"unix_socket_directories = '{self.root}'\n"
                    f"max_connections = {MAX_CONNECTIONS}\nfsync = off\n"
                    "full_page_writes = off\n")
        with (self.data_dir / "postgresql.auto.conf").open("a") as conf:
            conf.write(settings)
        self.start()
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
        return self

    def dsn(self, database: str = DATABASE) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"

    def start(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data_dir), "-l",
                  str(self.root / "server.log"), "-w", "-t", "60", "start")

    def stop(self) -> None:
        """An immediate stop: every backend dies at once, nothing is flushed (a crash);
        the next start recovers from the WAL."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate",
                  "-w", "stop")

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()
        self.restarts += 1

    def server_pids(self) -> list[int]:
        """The postmaster and every process it forked (backends, checkpointer, ...)."""
        postmaster = int((self.data_dir / "postmaster.pid").read_text().split()[0])
        out = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True,
                             text=True, check=False).stdout
        return [postmaster, *(int(pid) for pid in out.split())]

    def hang(self, hung_s: float) -> None:
        """SIGSTOP the whole server for ``hung_s``: connections stay open, nothing
        answers (a stuck disk, a paused VM), then SIGCONT."""
        pids = self.server_pids()
        for pid in pids:
            _signal(pid, signal.SIGSTOP)
        try:
            time.sleep(hung_s)
        finally:
            for pid in self.server_pids():  # the same set: a stopped server forks nothing
                _signal(pid, signal.SIGCONT)
        self.hangs += 1

    def teardown(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PrivatePostgres:
        try:
            return self.setup()
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def __exit__(self, *_: object) -> None:
        self.teardown()


def _signal(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)
