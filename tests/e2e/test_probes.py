"""The worker's probes, read out of deploy/k8s/worker-deployment.yaml (liveness, readiness)
and deploy/compose.yml (the healthcheck) and run as written, with the environment and host
name the container would give them, against a real `compactor worker`: each passes while
the worker is healthy and fails while its main process is stopped (SIGSTOP); readiness
fails while the database or Redis is unreachable; and no probe leaves anything on the
dead-letter list (Celery's ping replies are not the service's queue items)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import yaml

from db import upgrade_database
from tests.support.chaos import PrivateRedis
from tests.support.e2e import JobEnv, build_job_env
from tests.support.private_postgres import PrivatePostgres
from tests.support.worker_process import REPO_ROOT, CompactorWorker, WorkerProcess
from tests.unit.test_deploy_drift import compose_duration_s
from worker.shared_state.dead_letters import DeadLetter, DeadLetters
from worker.shared_state.keys import RedisKeys

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

DEPLOY = REPO_ROOT / "deploy"
HEALTHY_ROUNDS = 10  # 10 x (compose healthcheck, k8s liveness): the 20 probes
FAILED = -1  # the exit status given to a probe its timeout cut off, as the kubelet counts it


@dataclass(frozen=True)
class Probe:
    """One probe command as the deploy file writes it, and how long it may take."""

    name: str
    argv: list[str]
    timeout_s: float


def k8s_probes() -> dict[str, Probe]:
    """The worker container's exec probes, by kind (``liveness``, ``readiness``)."""
    text = (DEPLOY / "k8s" / "worker-deployment.yaml").read_text(encoding="utf-8")
    [deployment] = [doc for doc in yaml.safe_load_all(text) if doc]
    [container] = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                   if c["name"] == "worker"]
    return {kind: Probe(f"k8s {kind}", container[f"{kind}Probe"]["exec"]["command"],
                        float(container[f"{kind}Probe"]["timeoutSeconds"]))
            for kind in ("liveness", "readiness")}


def compose_healthcheck() -> Probe:
    """The compose worker's healthcheck: CMD-SHELL runs ``/bin/sh -c``; ``$$`` is compose's
    escape for a ``$`` the shell sees."""
    services = yaml.safe_load((DEPLOY / "compose.yml").read_text(encoding="utf-8"))["services"]
    check = services["worker"]["healthcheck"]
    kind, command = check["test"]
    assert kind == "CMD-SHELL"
    return Probe("compose healthcheck", ["/bin/sh", "-c", command.replace("$$", "$")],
                 float(compose_duration_s(check["timeout"])))


def container_env(job_env: JobEnv) -> dict[str, str]:
    """The container's environment: its settings, its host name (the worker's node name is
    celery@<host name>), and the image's executables on PATH."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, **job_env.env, "COMPACTOR_LOG_FORMAT": "json",
            "HOSTNAME": socket.gethostname(), "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def run_probe(probe: Probe, env: dict[str, str]) -> int:
    try:
        done = subprocess.run(probe.argv, env=env, cwd=REPO_ROOT, capture_output=True,
                              timeout=probe.timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return FAILED
    return done.returncode


def exit_codes(probes: list[Probe], env: dict[str, str]) -> dict[str, int]:
    return {probe.name: run_probe(probe, env) for probe in probes}


@dataclass(frozen=True)
class Deployment:
    """A worker on its own Redis and PostgreSQL, and the environment its probes run in."""

    worker: WorkerProcess
    env: dict[str, str]
    job_env: JobEnv
    redis: PrivateRedis
    postgres: PrivatePostgres


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with PrivateRedis(tmp_path) as private_redis, PrivatePostgres() as postgres:
        upgrade_database(postgres.url)
        job_env = build_job_env(postgres.url, None, redis_url=private_redis.url,
                                summarizer="extractive")
        worker = CompactorWorker(job_env.env, tmp_path / "worker.log", concurrency=1)
        with worker:
            yield Deployment(worker, container_env(job_env), job_env, private_redis, postgres)


def dead_letters(deployment: Deployment) -> list[DeadLetter]:
    client = redis.Redis.from_url(deployment.redis.url)
    try:
        return DeadLetters(client, RedisKeys(deployment.job_env.prefix), 1_000).list()
    finally:
        client.close()


@pytest.mark.timeout(420)  # 20 probes, then three that wait out their 10 s ping
def test_probes_pass_on_a_healthy_worker_fail_on_a_stopped_one_and_leave_no_dead_letters(
    deployment: Deployment,
) -> None:
    k8s = k8s_probes()
    liveness = [compose_healthcheck(), k8s["liveness"]]
    every = [*liveness, k8s["readiness"]]

    healthy = [exit_codes(liveness, deployment.env) for _ in range(HEALTHY_ROUNDS)]
    assert healthy == [dict.fromkeys((p.name for p in liveness), 0)] * HEALTHY_ROUNDS
    assert exit_codes([k8s["readiness"]], deployment.env) == {"k8s readiness": 0}
    assert dead_letters(deployment) == []
    assert [e for e in deployment.worker.events("compaction.job")
            if e["outcome"] == "rejected"] == []

    assert deployment.worker.process is not None
    os.kill(deployment.worker.process.pid, signal.SIGSTOP)
    try:
        stopped = exit_codes(every, deployment.env)
    finally:
        os.kill(deployment.worker.process.pid, signal.SIGCONT)
    assert all(code != 0 for code in stopped.values()), stopped
    assert exit_codes(every, deployment.env) == dict.fromkeys((p.name for p in every), 0)


@pytest.mark.timeout(300)
def test_readiness_fails_while_the_database_or_redis_is_unreachable(
    deployment: Deployment,
) -> None:
    probes = k8s_probes()
    both = [probes["liveness"], probes["readiness"]]
    assert exit_codes(both, deployment.env) == {"k8s liveness": 0, "k8s readiness": 0}

    deployment.postgres.stop()
    without_database = exit_codes(both, deployment.env)
    deployment.postgres.start()
    back = exit_codes(both, deployment.env)
    deployment.redis.stop()
    without_redis = exit_codes([probes["readiness"]], deployment.env)

    assert without_database["k8s liveness"] == 0  # the worker lives: a restart cures nothing
    assert without_database["k8s readiness"] != 0
    assert back == {"k8s liveness": 0, "k8s readiness": 0}
    assert without_redis["k8s readiness"] != 0

