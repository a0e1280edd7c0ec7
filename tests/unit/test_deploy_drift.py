"""deploy/ stays true to the code: every COMPACTOR_* name is a setting, every `compactor`
command it runs exists and parses, every file parses, and the services the docs promise
are there (one beat, a migration before the workers). The worker's probes are run as
written against a real worker by tests/e2e/test_probes.py."""

from __future__ import annotations

import configparser
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.cli.config_table import ENV_EXAMPLE_PATH, render_env_example, setting_rows
from tests.unit.cli_tree import check_invocation
from worker.settings.config import Settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = DEPLOY / "compose.yml"
K8S = DEPLOY / "k8s"
SYSTEMD = DEPLOY / "systemd"
OUR_IMAGE = "session-compactor"
# A `compactor` command inside a shell string, up to the next shell operator.
SHELL_INVOCATION = re.compile(r"(?<![\w./-])(?:/\S*/)?compactor(?=\s|$)(?P<rest>[^|;&)\n]*)")


def deploy_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file())


def yaml_files() -> list[Path]:
    return sorted(p for p in deploy_files() if p.suffix in (".yml", ".yaml"))


def yaml_documents(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def known_env_names() -> set[str]:
    return {name for row in setting_rows() for name in row.env_names}


def test_every_compactor_variable_in_deploy_files_is_a_setting() -> None:
    known = known_env_names()
    found = {(path.relative_to(DEPLOY).as_posix(), name) for path in deploy_files()
             for name in re.findall(r"\bCOMPACTOR_[A-Z0-9_]+", path.read_text("utf-8"))}
    assert found, "no COMPACTOR_ variable found under deploy/"
    assert sorted((where, name) for where, name in found if name not in known) == []


def test_env_example_lists_every_setting_at_its_default() -> None:
    text = ENV_EXAMPLE_PATH.read_text(encoding="utf-8")
    for row in setting_rows():
        assert f"#{row.env_names[0]}={row.default or ''}\n" in text, row.name
    assert text == render_env_example(), \
        "deploy/env.example drifted: run `python -m scheduler.cli.config_table write`"


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_every_yaml_file_parses_into_mappings(path: Path) -> None:
    documents = yaml_documents(path)
    assert documents and all(isinstance(doc, dict) for doc in documents)


# --- the `compactor` commands the deploy files run -----------------------------------

def shell_invocations(script: str) -> Iterator[list[str]]:
    for match in SHELL_INVOCATION.finditer(script):
        yield shlex.split(match.group("rest"))


def container_invocations(container: dict[str, Any]) -> Iterator[list[str]]:
    """A Kubernetes container's `compactor` argv (the image's entrypoint is compactor)."""
    command, args = container.get("command"), list(container.get("args") or [])
    if command is None and container.get("image") == OUR_IMAGE:
        yield args
    elif command and Path(command[0]).name == "compactor":
        yield [*command[1:], *args]
    elif command and command[0] in ("sh", "/bin/sh", "bash") and "-c" in command:
        yield from shell_invocations(command[-1])


def k8s_containers() -> Iterator[dict[str, Any]]:
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml_documents(path):
            spec = doc.get("spec", {}).get("template", {}).get("spec", {})
            yield from spec.get("initContainers", [])
            yield from spec.get("containers", [])


def compose_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = yaml_documents(COMPOSE)[0]["services"]
    return services


def compose_invocations() -> Iterator[list[str]]:
    for service in compose_services().values():
        runs_compactor = (service.get("build", {}).get("target") == "service"
                          and "entrypoint" not in service)
        if runs_compactor and isinstance(service.get("command"), list):
            yield service["command"]


class UnitParser(configparser.ConfigParser):
    """A systemd unit's parser: keys keep their case (``ExecStart``), repeats are allowed."""

    def __init__(self) -> None:
        super().__init__(strict=False, interpolation=None)

    def optionxform(self, optionstr: str) -> str:
        return optionstr


def systemd_units() -> dict[str, configparser.ConfigParser]:
    units: dict[str, configparser.ConfigParser] = {}
    for path in sorted(SYSTEMD.glob("*.service")):
        parser = UnitParser()
        parser.read_string(path.read_text(encoding="utf-8"))
        units[path.name] = parser
    return units


def systemd_invocations() -> Iterator[list[str]]:
    for unit in systemd_units().values():
        argv = shlex.split(unit["Service"]["ExecStart"])
        assert Path(argv[0]).name == "compactor", argv
        yield argv[1:]


def all_invocations() -> dict[str, list[list[str]]]:
    return {
        "compose": list(compose_invocations()),
        "k8s": [argv for c in k8s_containers() for argv in container_invocations(c)],
        "systemd": list(systemd_invocations()),
    }


def test_every_compactor_command_the_deploy_files_run_exists_and_parses() -> None:
    for where, invocations in all_invocations().items():
        for argv in invocations:
            check_invocation(argv)  # raises on an unknown command or option
        paths = {" ".join(argv[:2]) if argv[:1] == ["db"] else argv[0] for argv in invocations}
        assert {"db upgrade", "worker", "beat"} <= paths, where


def test_the_shell_pattern_finds_commands_and_ignores_look_alikes() -> None:
    script = ("until /opt/x/bin/compactor db current --json | grep -q up; do sleep 5; done; "
              "echo session-compactor compactor-cli compactor:")
    assert list(shell_invocations(script)) == [["db", "current", "--json"]]


def test_a_wrong_command_in_a_deploy_file_would_be_caught() -> None:
    with pytest.raises(LookupError):
        check_invocation(["db", "migrate"])
    with pytest.raises(Exception, match="No such option"):
        check_invocation(["worker", "--threads", "4"])


# --- the shape of each deployment -------------------------------------------------------

def dockerfile_stages() -> list[dict[str, Any]]:
    stages: list[dict[str, Any]] = []
    for line in (DEPLOY / "Dockerfile").read_text(encoding="utf-8").splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "FROM":
            name = words[3] if len(words) > 3 and words[2].upper() == "AS" else None
            stages.append({"base": words[1], "name": name, "user": None, "lines": []})
        elif words[0] == "USER":
            stages[-1]["user"] = words[1]
        if stages:
            stages[-1]["lines"].append(line)
    return stages


def lineage(stages: list[dict[str, Any]], stage: dict[str, Any]) -> list[dict[str, Any]]:
    """The stage and the stages it is built FROM, nearest first."""
    parent = next((s for s in stages if s["name"] == stage["base"]), None)
    return [stage, *(lineage(stages, parent) if parent else [])]


def test_dockerfile_builds_in_stages_and_runs_compactor_as_non_root() -> None:
    stages = dockerfile_stages()
    names = {stage["name"] for stage in stages}
    assert len(stages) >= 2
    assert all(s["base"].startswith("python:3.11-slim") or s["base"] in names for s in stages)
    final = lineage(stages, stages[-1])
    user = next(s["user"] for s in final if s["user"] is not None)
    assert user.split(":")[0] not in ("root", "0")
    lines = [line for stage in final for line in stage["lines"]]
    entrypoint = next(line for line in lines if line.startswith("ENTRYPOINT"))
    assert entrypoint == 'ENTRYPOINT ["compactor"]'
    assert not any("build-essential" in line or "pip wheel" in line for line in lines)


def test_systemd_units_parse_and_run_the_service_commands() -> None:
    units = systemd_units()
    assert set(units) == {"compactor-worker.service", "compactor-beat.service",
                          "compactor-migrate.service"}
    for name, unit in units.items():
        service = unit["Service"]
        assert service["User"] == "compactor", name
        env_file = service["EnvironmentFile"].lstrip("-")
        assert Path(env_file).name == "compactor.env", name
        assert unit.has_section("Install"), name
    assert units["compactor-migrate.service"]["Service"]["Type"] == "oneshot"
    for name in ("compactor-worker.service", "compactor-beat.service"):
        assert "compactor-migrate.service" in units[name]["Unit"]["Requires"]


def test_systemd_environment_file_sets_only_known_settings() -> None:
    known = known_env_names()
    for line in (SYSTEMD / "compactor.env").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, _ = line.partition("=")
            assert name in known, line


def test_compose_runs_migration_first_workers_scalable_and_one_beat() -> None:
    services = compose_services()
    assert {"redis", "postgres", "migrate", "worker", "beat", "flower"} <= set(services)
    assert services["migrate"]["command"] == ["db", "upgrade"]
    assert services["migrate"]["restart"] == "no"
    for name in ("worker", "beat"):
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully"
    assert "replicas" not in services["worker"].get("deploy", {})  # scaled with --scale
    assert services["beat"]["deploy"]["replicas"] == 1
    assert services["flower"]["profiles"] == ["monitoring"]


def k8s_objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {(doc["kind"], doc["metadata"]["name"]): doc
            for path in sorted(K8S.glob("*.yaml")) for doc in yaml_documents(path)
            if "kind" in doc and "metadata" in doc}


def test_k8s_has_one_recreated_beat_and_a_migration_job() -> None:
    objects = k8s_objects()
    beat = objects[("Deployment", "compactor-beat")]["spec"]
    assert beat["replicas"] == 1 and beat["strategy"]["type"] == "Recreate"
    job = objects[("Job", "compactor-migrate")]["spec"]["template"]["spec"]
    assert job["containers"][0]["args"] == ["db", "upgrade"]
    secret = objects[("Secret", "compactor-secrets")]["stringData"]
    assert set(secret) == {"COMPACTOR_DATABASE_URL", "COMPACTOR_LLM_API_KEY"}
    settings = objects[("ConfigMap", "compactor-settings")]["data"]
    assert set(settings) <= known_env_names()
    assert not set(settings) & set(secret), "a secret setting is in the ConfigMap"


def test_every_k8s_container_has_requests_and_limits_and_runs_as_non_root() -> None:
    containers = list(k8s_containers())
    assert containers
    for container in containers:
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]) & set(resources["limits"])
        assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_compose_and_k8s_workers_serve_metrics_where_their_scrape_labels_point() -> None:
    worker = compose_services()["worker"]
    port = worker["environment"]["COMPACTOR_METRICS_PORT"]
    assert worker["environment"]["COMPACTOR_QUEUE_NAME"] == "compaction"  # the anchor merged
    assert worker["expose"] == [port]
    assert worker["labels"] == {"prometheus.io/scrape": "true", "prometheus.io/port": port,
                                "prometheus.io/path": "/metrics"}
    pod = k8s_objects()[("Deployment", "compactor-worker")]["spec"]["template"]
    [container] = pod["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    [metrics_port] = [p for p in container["ports"] if p["name"] == "metrics"]
    assert str(metrics_port["containerPort"]) == env["COMPACTOR_METRICS_PORT"]
    assert pod["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/port": env["COMPACTOR_METRICS_PORT"],
        "prometheus.io/path": "/metrics"}


# A warm shutdown waits for the running job; the grace must outlast the longest one.
SHUTDOWN_MARGIN_S = 60


def compose_duration_s(value: str) -> int:
    """A compose duration such as ``32m`` or ``1m30s`` in seconds."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", value)
    assert parts and value, f"unreadable duration {value!r}"
    hours, minutes, seconds = (int(p or 0) for p in parts.groups())
    return hours * 3600 + minutes * 60 + seconds


def worker_grace_periods_s() -> dict[str, int]:
    [compose_worker] = [s for s in compose_services().values() if s.get("command") == ["worker"]]
    k8s_worker = k8s_objects()[("Deployment", "compactor-worker")]["spec"]["template"]["spec"]
    systemd_worker = systemd_units()["compactor-worker.service"]["Service"]
    return {"compose stop_grace_period": compose_duration_s(compose_worker["stop_grace_period"]),
            "k8s terminationGracePeriodSeconds": int(k8s_worker["terminationGracePeriodSeconds"]),
            "systemd TimeoutStopSec": int(systemd_worker["TimeoutStopSec"])}


def deployed_hard_time_limit_s() -> int:
    """The hard time limit the deploy files run with: the default unless one sets it."""
    name = "COMPACTOR_TASK_HARD_TIME_LIMIT_S"
    values = {int(m.group(1)) for path in deploy_files() if path.suffix != ".example"
              for m in re.finditer(rf"^\s*{name}\s*[=:]\s*\"?(\d+)", path.read_text(
                  encoding="utf-8"), re.MULTILINE)}
    assert len(values) <= 1, f"the deploy files disagree on {name}: {values}"
    return values.pop() if values else Settings().task_hard_time_limit_s


def test_every_worker_grace_period_outlasts_the_worst_case_job() -> None:
    hard_s = deployed_hard_time_limit_s()
    settings = Settings()
    assert settings.worst_case_llm_s < settings.task_soft_time_limit_s < hard_s
    too_short = {name: grace for name, grace in worker_grace_periods_s().items()
                 if grace < hard_s + SHUTDOWN_MARGIN_S}
    assert too_short == {}, (f"a warm shutdown must outlast the hard time limit {hard_s}s "
                             f"+ {SHUTDOWN_MARGIN_S}s")


def test_compose_durations_read_as_compose_does() -> None:
    assert [compose_duration_s(v) for v in ("2m", "32m", "1m30s", "1h")] == [
        120, 1920, 90, 3600]


# --- reproducible installs ------------------------------------------------------------

REPO = DEPLOY.parent
CONSTRAINTS = REPO / "constraints.txt"


def pinned_versions() -> dict[str, str]:
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version.strip(), f"constraints.txt: not a pin: {line!r}"
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_constraints_pin_every_dependency_within_pyproject_and_not_the_project() -> None:
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = pinned_versions()
    assert canonicalize_name(project["name"]) not in pins
    declared = [*project["dependencies"], *(requirement for extra in
                project["optional-dependencies"].values() for requirement in extra)]
    for text in declared:
        requirement = Requirement(text)
        pinned = pins.get(canonicalize_name(requirement.name))
        assert pinned is not None, f"constraints.txt does not pin {requirement.name}"
        assert requirement.specifier.contains(pinned, prereleases=True), (text, pinned)


def test_the_venv_and_the_image_install_with_the_constraints() -> None:
    make_installs = [line for line in (REPO / "Makefile").read_text().splitlines()
                     if "pip install" in line and "-e '.[" in line and "CONSTRAINTS" not in line]
    assert make_installs and all("-c constraints.txt" in line for line in make_installs)
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    wheel_builds = [line for line in dockerfile.splitlines() if "pip wheel" in line]
    assert wheel_builds and all("-c constraints.txt" in line for line in wheel_builds)
    assert "!constraints.txt" in (DEPLOY / "Dockerfile.dockerignore").read_text()
    assert "MIT License" in (REPO / "LICENSE").read_text(encoding="utf-8")
