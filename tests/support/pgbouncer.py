"""A throwaway PgBouncer in transaction pooling mode, in front of the test PostgreSQL.

Its own config, log and pid files in a temporary directory, a free local port, trust
auth, and a server pool smaller than the clients' pools, so that pooled server
connections really are shared between client connections (where session state and named
prepared statements collide). Started once per test run by the ``pgbouncer`` fixture;
missing the binary fails with directions, never skips.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.support.databases import postgres_admin_url

BINARY_PATHS = ("pgbouncer", "/usr/sbin/pgbouncer")
# Fewer server connections than a test's clients hold: they must share them.
SERVER_POOL_SIZE = 4
START_TIMEOUT_S = 10.0
# The query key that tells the store's engine it talks to a transaction pooler
# (db/engine.py); the settings put it in the URL from COMPACTOR_DB_POOLER.
POOLER_QUERY = {"compactor_pooler": "transaction"}


class PgBouncer:
    """One pgbouncer process; ``url_for`` turns a direct database URL into one through it."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> PgBouncer:
        target = postgres_admin_url()
        ini = self.workdir / "pgbouncer.ini"
        (self.workdir / "userlist.txt").write_text(f'"{target.username or "postgres"}" ""\n')
        ini.write_text(
            "[databases]\n"
            f"* = host={target.host or '127.0.0.1'} port={target.port or 5432}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"logfile = {self.workdir / 'pgbouncer.log'}\n"
            f"pidfile = {self.workdir / 'pgbouncer.pid'}\n"
            f"auth_type = trust\nauth_file = {self.workdir / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {SERVER_POOL_SIZE}\nmin_pool_size = 0\n"
            "reserve_pool_size = 0\nmax_client_conn = 500\n"
            "admin_users = postgres\nstats_users = postgres\n"
            "server_lifetime = 3600\nserver_idle_timeout = 600\n"
        )
        argv = [self.binary, str(ini)]
        if os.geteuid() == 0:  # pgbouncer refuses to run as root
            argv[1:1] = ["-u", "postgres"]
            owner = pwd.getpwnam("postgres")
            os.chown(self.workdir, owner.pw_uid, owner.pw_gid)
            for path in self.workdir.iterdir():
                os.chown(path, owner.pw_uid, owner.pw_gid)
        with (self.workdir / "stderr.log").open("ab") as err:
            self.process = subprocess.Popen(argv, stdout=err, stderr=err,
                                            start_new_session=True)
        self._wait_until_listening()
        return self

    def url_for(self, database_url: str) -> str:
        """``database_url`` (a direct one) through this pooler, marked as pooled."""
        direct = make_url(database_url)
        through = direct.set(host="127.0.0.1", port=self.port)
        return through.update_query_dict(POOLER_QUERY).render_as_string(hide_password=False)

    def log_text(self) -> str:
        path = self.workdir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """Stop the process and remove its directory."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _wait_until_listening(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited at start:\n{self.log_text()[-2000:]}"
                                   f"{(self.workdir / 'stderr.log').read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"pgbouncer not listening in {START_TIMEOUT_S}s")


def find_pgbouncer() -> str:
    """The pgbouncer binary; fails the test with directions when it is not installed."""
    for candidate in BINARY_PATHS:
        found = shutil.which(candidate)
        if found:
            return found
    pytest.fail(
        "pgbouncer is not installed: the store's tests run through a PgBouncer in "
        "transaction mode as well as directly. Install it with `apt-get install -y "
        "pgbouncer` (`.ci/run` does), or put the binary on PATH.", pytrace=False)


def start_pgbouncer() -> PgBouncer:
    """Start a pgbouncer in its own temporary directory (the caller stops it)."""
    workdir = Path(tempfile.mkdtemp(prefix="compactor-pgbouncer-"))
    return PgBouncer(find_pgbouncer(), workdir).start()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
