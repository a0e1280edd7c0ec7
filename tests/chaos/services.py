"""The services a chaos run owns and throws away: a private redis-server, a private
PostgreSQL server (restarted and hung by the monkey), and the OpenAI-protocol test
server in a process of its own (so its work does not contend with the driver's threads
for one interpreter)."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from db import upgrade_database
from tests.chaos.postgres import PrivatePostgres
from tests.support.chaos import PrivateRedis, free_port
from tests.support.worker_process import REPO_ROOT


@dataclass(frozen=True)
class Services:
    redis: PrivateRedis
    postgres: PrivatePostgres
    llm_base_url: str

    @property
    def database_url(self) -> str:
        return self.postgres.url

    def database_url_as(self, application_name: str) -> str:
        """The database URL whose connections show up under ``application_name``."""
        url = make_url(self.database_url).update_query_dict(
            {"application_name": application_name})
        return url.render_as_string(hide_password=False)


@contextmanager
def start_services(work_dir: Path, *, llm_latency_ms: int) -> Iterator[Services]:
    """Start every service; each is stopped or dropped on the way out."""
    with PrivateRedis(work_dir) as private_redis, PrivatePostgres() as postgres, \
            llm_server(llm_latency_ms) as llm_url:
        upgrade_database(postgres.url)
        yield Services(private_redis, postgres, llm_url)


@contextmanager
def llm_server(latency_ms: int, timeout_s: float = 30.0) -> Iterator[str]:
    """``python -m tests.support.openai_server`` answering every call after ``latency_ms``."""
    port = free_port()
    argv = [sys.executable, "-m", "tests.support.openai_server", "--port", str(port),
            "--behaviour", "latency", "--latency-ms", str(latency_ms)]
    process = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + timeout_s
        while not is_serving(f"{base_url}/models"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the OpenAI test server did not start on port {port}")
            time.sleep(0.1)
        yield base_url
    finally:
        process.terminate()
        process.wait(10)


def is_serving(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return int(response.status) == 200
    except OSError:
        return False


def drop_connections(admin: Engine) -> int:
    """Terminate every other backend of the run's database; return how many."""
    with admin.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalar_one())


def admin_engine(database_url: str) -> Engine:
    return create_engine(database_url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
