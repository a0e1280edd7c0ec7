"""`compactor check` against the real things it checks: PostgreSQL, Redis, the tokenizer,
and the project's OpenAI-protocol test server (good key, wrong key, no endpoint)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import Compactor
from tests.support.e2e import REDIS_URL
from tests.support.openai_server import OpenAIServer
from tests.support.pgbouncer import PgBouncer

GOOD_KEY = "sk-check-good-key-0123456789"
UNREACHABLE_LLM = "http://probe-user:probe-secret@127.0.0.1:9/v1"


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(latency_ms=0, api_key=GOOD_KEY, model="summarizer-x") as running:
        yield running


def check(env: dict[str, str], *args: str) -> tuple[int, Any, str]:
    result = Compactor(env)("check", *args)
    return result.exit_code, result.stdout, result.stderr


def checks_by_name(env: dict[str, str]) -> tuple[int, dict[str, dict[str, Any]]]:
    exit_code, stdout, _ = check(env, "--json")
    report = json.loads(stdout)
    assert report["ok"] is (exit_code == 0)
    return exit_code, {entry["check"]: entry for entry in report["checks"]}


def llm_env(database_url: str, tmp_path: Path, base_url: str, key: str) -> dict[str, str]:
    return {"COMPACTOR_DATABASE_URL": database_url, "COMPACTOR_DATA_DIR": str(tmp_path),
            "COMPACTOR_REDIS_URL": REDIS_URL, "COMPACTOR_LLM_BASE_URL": base_url,
            "COMPACTOR_LLM_API_KEY": key, "COMPACTOR_LLM_MODEL": "summarizer-x",
            "COMPACTOR_SUMMARIZER": "llm"}


def test_a_ready_configuration_passes_every_check_with_one_tiny_llm_request(
    migrated_postgres_url: str, server: OpenAIServer, tmp_path: Path
) -> None:
    env = llm_env(migrated_postgres_url, tmp_path, server.base_url, GOOD_KEY)

    exit_code, checks = checks_by_name(env)

    assert exit_code == 0, checks
    assert [c["status"] for c in checks.values()] == ["ok"] * 5
    assert list(checks) == ["settings", "database", "redis", "tokenizer", "summarizer"]
    assert "schema at head" in checks["database"]["detail"]
    assert "accepted the key and answered with model summarizer-x" in \
        checks["summarizer"]["detail"]
    [probe] = server.requests
    assert probe.body["model"] == "summarizer-x" and probe.body["max_completion_tokens"] == 16


def test_without_the_llm_request_the_summarizer_settings_alone_are_checked(
    migrated_postgres_url: str, server: OpenAIServer, tmp_path: Path
) -> None:
    env = llm_env(migrated_postgres_url, tmp_path, server.base_url, GOOD_KEY)

    exit_code, stdout, _ = check(env, "--no-llm", "--json")

    assert exit_code == 0, stdout
    assert [c["status"] for c in json.loads(stdout)["checks"]] == ["ok"] * 5
    assert server.requests == []  # the readiness probe's form spends nothing


def test_a_wrong_api_key_is_a_problem_saying_which_variable_to_set(
    migrated_postgres_url: str, server: OpenAIServer, tmp_path: Path
) -> None:
    env = llm_env(migrated_postgres_url, tmp_path, server.base_url, "sk-wrong-key-987654321")

    exit_code, checks = checks_by_name(env)
    _, table, _ = check(env)

    assert exit_code == 1
    summarizer = checks["summarizer"]
    assert summarizer["status"] == "problem"
    assert "refused the credentials for model summarizer-x" in summarizer["detail"]
    assert "(401)" in summarizer["detail"]
    assert "COMPACTOR_LLM_API_KEY" in summarizer["fix"]
    assert "sk-wrong-key" not in summarizer["detail"] + table
    assert "problem" in table and "1 problem(s)" in table


def test_an_unreachable_endpoint_is_named_with_its_credentials_masked(
    migrated_postgres_url: str, tmp_path: Path
) -> None:
    env = llm_env(migrated_postgres_url, tmp_path, UNREACHABLE_LLM, GOOD_KEY)

    exit_code, checks = checks_by_name(env)

    assert exit_code == 1
    assert checks["summarizer"]["status"] == "unreachable"
    assert checks["summarizer"]["detail"] == \
        "could not reach the LLM endpoint http://probe-user:***@127.0.0.1:9/v1"
    assert "COMPACTOR_LLM_BASE_URL" in checks["summarizer"]["fix"]


def test_an_unmigrated_database_is_a_problem_and_a_down_redis_unreachable_with_their_fixes(
    empty_database_url: str, tmp_path: Path
) -> None:
    env = {"COMPACTOR_DATABASE_URL": empty_database_url, "COMPACTOR_DATA_DIR": str(tmp_path),
           "COMPACTOR_REDIS_URL": "redis://:redis-secret@127.0.0.1:1/0",
           "COMPACTOR_SUMMARIZER": "extractive"}

    exit_code, checks = checks_by_name(env)

    assert exit_code == 1
    assert {name: c["status"] for name, c in checks.items()} == {
        "settings": "ok", "database": "problem", "redis": "unreachable", "tokenizer": "ok",
        "summarizer": "ok"}
    assert "never migrated" in checks["database"]["detail"]
    assert checks["database"]["fix"] == "run `compactor db upgrade`"
    assert checks["redis"]["detail"].startswith(
        "cannot reach Redis at redis://:***@127.0.0.1:1/0")
    assert checks["redis"]["fix"] == "start Redis or fix COMPACTOR_REDIS_URL"
    assert checks["summarizer"]["detail"].startswith("extractive")


def test_pgbouncer_in_transaction_mode_without_the_pooler_setting_is_a_problem_naming_it(
    pgbouncer: PgBouncer, migrated_postgres_url: str, tmp_path: Path,
) -> None:
    through = pgbouncer.url_for(migrated_postgres_url).split("?")[0]
    env = {"COMPACTOR_DATABASE_URL": through, "COMPACTOR_DATA_DIR": str(tmp_path),
           "COMPACTOR_REDIS_URL": REDIS_URL, "COMPACTOR_SUMMARIZER": "extractive"}

    exit_code, checks = checks_by_name(env)
    _, pooled = checks_by_name({**env, "COMPACTOR_DB_POOLER": "transaction"})

    assert exit_code == 1
    assert checks["database"]["status"] == "problem"
    assert "unsupported startup parameter: options" in checks["database"]["detail"]
    assert checks["database"]["fix"] == "set COMPACTOR_DB_POOLER=transaction"
    assert pooled["database"]["status"] == "ok", pooled["database"]


def test_an_unknown_variable_is_warned_and_shown_with_the_closest_name(
    migrated_postgres_url: str, tmp_path: Path
) -> None:
    env = {"COMPACTOR_DATABASE_URL": migrated_postgres_url, "COMPACTOR_DATA_DIR": str(tmp_path),
           "COMPACTOR_SUMMARIZER": "extractive", "COMPACTOR_TRIGER_RATIO": "0.5"}

    exit_code, checks = checks_by_name(env)

    assert exit_code == 0
    assert checks["settings"]["detail"] == ("valid; ignored unknown variables: "
                                            "COMPACTOR_TRIGER_RATIO (did you mean "
                                            "COMPACTOR_TRIGGER_RATIO?)")


@pytest.mark.parametrize("args", [["--help"], ["scan", "--help"], ["db", "current", "--help"]])
def test_help_works_whatever_the_settings(args: list[str]) -> None:
    result = Compactor({"COMPACTOR_TRIGGER_RATIO": "abc"})(*args)

    assert result.exit_code == 0, result.output
    assert "Usage: compactor" in result.stdout and result.stderr == ""


def test_scan_with_redis_down_ends_in_one_line_naming_the_url(
    migrated_postgres_url: str, tmp_path: Path
) -> None:
    env = {"COMPACTOR_DATABASE_URL": migrated_postgres_url, "COMPACTOR_DATA_DIR": str(tmp_path),
           "COMPACTOR_REDIS_URL": "redis://:redis-secret@127.0.0.1:1/0"}

    done = Compactor(env).subprocess("scan")

    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("error: broker unreachable at "
                           "COMPACTOR_REDIS_URL=redis://:***@127.0.0.1:1/0: ")
    assert line.endswith("; start Redis or fix the URL, then run the command again")
