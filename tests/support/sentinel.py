"""A private Redis with Sentinel on loopback: a primary, one replica and sentinels, each a
real ``redis-server`` process (``--sentinel`` for the sentinels) on a free port, all
stopped afterwards; ``kill_master`` crashes the primary for the sentinels to promote the
replica."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis

from tests.support.chaos import free_port, redis_server_binary

MASTER_NAME = "compactor-test"
UP_TIMEOUT_S = 30.0


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``condition`` (a Redis error counts as not yet); TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except redis.RedisError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{what} not in {timeout_s}s")


class PrivateSentinel:
    """Primary, replica and ``sentinels`` sentinels (quorum 1) watching ``MASTER_NAME``."""

    def __init__(self, work_dir: Path, *, sentinels: int = 3,
                 password: str | None = None) -> None:
        self.work_dir = work_dir
        self.password = password  # the sentinels' requirepass
        self.data_ports = [free_port(), free_port()]
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """kombu's Sentinel syntax: every sentinel, database 0."""
        return ";".join(f"sentinel://127.0.0.1:{port}/0" for port in self.sentinel_ports)

    def master_port(self) -> int:
        """The port of the master the first sentinel names now."""
        with self._sentinel(self.sentinel_ports[0]) as sentinel:
            _, port = sentinel.sentinel_get_master_addr_by_name(MASTER_NAME)
        return int(port)

    def start(self) -> PrivateSentinel:
        primary, replica = self.data_ports
        self._spawn("--port", str(primary))
        self._spawn("--port", str(replica), "--replicaof", "127.0.0.1", str(primary))
        wait_for(lambda: self._replica_synced(replica), UP_TIMEOUT_S, "replica in sync")
        for port in self.sentinel_ports:
            config = self.work_dir / f"sentinel-{port}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.work_dir}\n"
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} 1\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} 1000\n"
                # A split vote is tried again after twice this: soon, in a test.
                f"sentinel failover-timeout {MASTER_NAME} 2000\n"
                + (f"requirepass {self.password}\n" if self.password else ""))
            self._spawn_sentinel(config)
        for port in self.sentinel_ports:
            wait_for(lambda port=port: self._sees_replica(port), UP_TIMEOUT_S,  # type: ignore[misc]
                     f"sentinel {port} watching the replica")
        return self

    def kill_master(self) -> int:
        """Kill the master's process (a crash: its clients' connections drop), so that the
        sentinels find it down and promote the replica; the new master's port once every
        sentinel names it and it takes writes."""
        old = self.master_port()
        process = self.processes[self.data_ports.index(old)]
        process.kill()
        process.wait(10)
        return self._wait_for_master(next(port for port in self.data_ports if port != old))

    def _wait_for_master(self, new: int) -> int:
        wait_for(lambda: all(self._names(port) == new for port in self.sentinel_ports),
                 UP_TIMEOUT_S, "every sentinel naming the new master")
        wait_for(lambda: self._is_master(new), UP_TIMEOUT_S, "the new master")
        return new

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)

    def __enter__(self) -> PrivateSentinel:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _spawn(self, *args: str) -> None:
        argv = [redis_server_binary(), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                "no", "--dir", str(self.work_dir), *args]
        self.processes.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))

    def _spawn_sentinel(self, config: Path) -> None:
        self.processes.append(subprocess.Popen(
            [redis_server_binary(), str(config), "--sentinel"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def _sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, password=self.password, socket_timeout=2)

    def _replica_synced(self, port: int) -> bool:
        with redis.Redis(port=port, socket_timeout=2) as client:
            return bool(client.info("replication").get("master_link_status") == "up")

    def _sees_replica(self, port: int) -> bool:
        with self._sentinel(port) as sentinel:
            return bool(sentinel.sentinel_slaves(MASTER_NAME))

    def _names(self, port: int) -> int:
        with self._sentinel(port) as sentinel:
            return int(sentinel.sentinel_get_master_addr_by_name(MASTER_NAME)[1])

    def _is_master(self, port: int) -> bool:
        with redis.Redis(port=port, socket_timeout=2) as client:
            return bool(client.info("replication").get("role") == "master")
