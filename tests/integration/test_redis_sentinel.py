"""Every Redis client of the service on ``sentinel://`` URLs, against a private primary,
replica and sentinels: a fleet-state client follows the master through a failover; the
command line (check, scan, reconcile, dead letters, the demo) and the metrics' fleet-state
reader reach Redis through the sentinels."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.cli import Compactor
from tests.support.sentinel import MASTER_NAME, PrivateSentinel
from worker.metrics_state import FleetStateReader
from worker.settings.config import Settings
from worker.shared_state.connection import connect_redis
from worker.shared_state.keys import RedisKeys

pytestmark = [pytest.mark.integration]

FOLLOW_TIMEOUT_S = 30.0


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[PrivateSentinel]:
    with PrivateSentinel(tmp_path) as running:
        yield running


def sentinel_settings(sentinel: PrivateSentinel) -> Settings:
    return Settings(redis_url=sentinel.url, redis_sentinel_master=MASTER_NAME,
                    redis_key_prefix=f"sentinel-{uuid.uuid4().hex[:8]}:",
                    redis_socket_timeout_s=2)


def count_until_answered(client: redis.Redis, key: str, timeout_s: float) -> int:
    """The counter's next value, asked again while no master answers."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return int(client.incr(key))
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_fleet_state_client_follows_the_master_through_a_failover(
    sentinel: PrivateSentinel,
) -> None:
    settings = sentinel_settings(sentinel)
    first_master = sentinel.master_port()
    with connect_redis(settings) as client:
        key = RedisKeys(settings.redis_key_prefix).deliveries("task-1", 0)
        assert client.incr(key) == 1
        assert client.wait(1, 2_000) == 1  # the replica holds the count

        killed = time.monotonic()
        new_master = sentinel.kill_master()
        assert count_until_answered(client, key, FOLLOW_TIMEOUT_S) == 2
        followed_s = time.monotonic() - killed
        assert client.connection_pool.get_master_address() == ("127.0.0.1", new_master)

    assert new_master != first_master
    print(f"the client counted on the new master {followed_s:.1f} s after the kill")


def test_the_command_line_reaches_redis_through_the_sentinels(
    sentinel: PrivateSentinel, database_url: str, tmp_path: Path
) -> None:
    settings = sentinel_settings(sentinel)
    compactor = Compactor({
        "COMPACTOR_DATABASE_URL": database_url, "COMPACTOR_DATA_DIR": str(tmp_path),
        "COMPACTOR_REDIS_URL": settings.redis_url,
        "COMPACTOR_REDIS_SENTINEL_MASTER": MASTER_NAME,
        "COMPACTOR_REDIS_KEY_PREFIX": settings.redis_key_prefix,
    })

    checks = {check["check"]: check for check in
              compactor.json("check", "--no-llm")["checks"]}
    scan = compactor("scan", "--json")
    reconcile = compactor("reconcile", "--json")
    dead = compactor.json("dead", "list")

    assert checks["redis"]["status"] == "ok", checks["redis"]
    assert (scan.exit_code, reconcile.exit_code, dead) == (0, 0, []), (scan.output,
                                                                     reconcile.output)
    with connect_redis(settings) as client:  # the scan held its lock under the prefix
        assert client.exists(RedisKeys(settings.redis_key_prefix).scan_lock()) == 0


def test_the_metrics_read_the_queue_depth_through_the_sentinels(
    sentinel: PrivateSentinel, database_url: str
) -> None:
    settings = sentinel_settings(sentinel).model_copy(update={"database_url": database_url})
    with connect_redis(settings) as client:
        client.lpush(f"{settings.redis_key_prefix}{settings.queue_name}", b"a", b"b")
    reader = FleetStateReader(settings)
    try:
        state = reader()
    finally:
        reader.close()

    assert (state.queue_depth, state.provider_breaker) == (2, "closed")


def test_the_demo_runs_its_jobs_through_the_sentinels(
    sentinel: PrivateSentinel, tmp_path: Path
) -> None:
    compactor = Compactor({"COMPACTOR_DATA_DIR": str(tmp_path / "demo"),
                           "COMPACTOR_REDIS_URL": sentinel.url,
                           "COMPACTOR_REDIS_SENTINEL_MASTER": MASTER_NAME})

    done = compactor.subprocess("demo", "--count", "3")

    assert done.returncode == 0, done.stderr[-2000:]
    assert f"redis: {sentinel.url} " in done.stdout
    assert "compacting 1 of 3 sessions" in done.stdout
