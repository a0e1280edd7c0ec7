"""Invalid settings read as one line per problem (variable, value, what is allowed), and
unknown COMPACTOR_* variables are named with the closest real one."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest
from celery.schedules import crontab

from worker.settings.config import get_settings
from worker.settings.errors import InvalidSettings, load_settings, unknown_variables
from worker.settings.rules import (
    check_cron,
    check_database_url,
    check_http_url,
    check_redis_url,
)


@pytest.fixture(autouse=True)
def _fresh_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("COMPACTOR_LOG_LEVEL", "COMPACTOR_DATABASE_URL", "OPENAI_BASE_URL",
                 "COMPACTOR_LLM_BASE_URL", "COMPACTOR_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def problem_lines(monkeypatch: pytest.MonkeyPatch, **env: str) -> list[str]:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InvalidSettings) as invalid:
        load_settings()
    return [problem.line for problem in invalid.value.problems]


@pytest.mark.parametrize(("variable", "value", "line"), [
    ("COMPACTOR_TRIGGER_RATIO", "abc",
     "COMPACTOR_TRIGGER_RATIO='abc': Input should be a valid number, unable to parse string "
     "as a number; allowed: a number above 0 and at most 1"),
    ("COMPACTOR_LOG_LEVEL", "LOUD",
     "COMPACTOR_LOG_LEVEL='LOUD': 'LOUD' is not a log level; allowed: DEBUG, INFO, WARNING, "
     "ERROR, CRITICAL (any case)"),
    ("COMPACTOR_SUMMARIZER", "gpt",
     "COMPACTOR_SUMMARIZER='gpt': Input should be 'auto', 'llm' or 'extractive'; allowed: "
     "one of auto, llm, extractive"),
    ("COMPACTOR_SCAN_TOKEN_BUDGET", "0",
     "COMPACTOR_SCAN_TOKEN_BUDGET='0': Input should be greater than 0; allowed: a whole "
     "number above 0, or unset"),
    ("COMPACTOR_REDIS_URL", "localhost:6379",
     "COMPACTOR_REDIS_URL='localhost:6379': not a redis://, rediss://, unix:// or "
     "sentinel:// URL; allowed: a redis://HOST[:PORT]/DB, rediss://… or unix://PATH URL, or "
     "sentinel://HOST[:PORT][/DB] URLs joined by ';'"),
    ("COMPACTOR_DATABASE_URL", "mysql://app:s3cret@db/compactor",
     "COMPACTOR_DATABASE_URL='mysql://app:***@db/compactor': not a sqlite:/// or "
     "postgresql:// URL; allowed: a sqlite:///PATH or postgresql+psycopg://USER@HOST/DB URL"),
    ("OPENAI_BASE_URL", "localhost:8000/v1",
     "OPENAI_BASE_URL='localhost:8000/v1': not an http:// or https:// URL; allowed: an "
     "http:// or https:// URL with a host, e.g. https://api.openai.com/v1"),
])
def test_a_bad_value_is_one_line_naming_its_variable_value_and_what_is_allowed(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, line: str
) -> None:
    assert problem_lines(monkeypatch, **{variable: value}) == [line]


def test_every_bad_value_is_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = problem_lines(monkeypatch, COMPACTOR_TRIGGER_RATIO="abc",
                          COMPACTOR_LOG_LEVEL="LOUD", COMPACTOR_SCAN_CRON="0 2 * *")

    assert [line.split("=")[0] for line in lines] == [
        "COMPACTOR_TRIGGER_RATIO", "COMPACTOR_SCAN_CRON", "COMPACTOR_LOG_LEVEL"]


def test_a_rule_across_settings_names_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = problem_lines(monkeypatch, COMPACTOR_TASK_SOFT_TIME_LIMIT_S="2000")

    assert lines == ["settings: COMPACTOR_TASK_HARD_TIME_LIMIT_S must exceed "
                     "COMPACTOR_TASK_SOFT_TIME_LIMIT_S"]


def test_a_log_level_in_any_case_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTOR_LOG_LEVEL", "debug")

    assert load_settings().log_level == "DEBUG"


def test_unknown_variables_are_named_with_the_closest_setting() -> None:
    unknown = unknown_variables({"COMPACTOR_TRIGER_RATIO": "0.5", "COMPACTOR_NONSENSE": "1",
                                 "COMPACTOR_TRIGGER_RATIO": "0.5", "OPENAI_API_KEY": "k",
                                 "HOME": "/root"})

    assert [(u.variable, u.closest) for u in unknown] == [
        ("COMPACTOR_NONSENSE", None), ("COMPACTOR_TRIGER_RATIO", "COMPACTOR_TRIGGER_RATIO")]


@pytest.mark.parametrize("expression", [
    "0 2 * * *", "*/15 * * * *", "0 0-6/2 * * mon-fri", "30 1 1,15 * *", "0 3 * jan-mar sun",
    "5 4 * * 0", "0 0 31 12 6", "0 2 * * * *", "0 2 * *", "60 2 * * *", "0 24 * * *",
    "0 2 0 * *", "0 2 * 13 *", "0 2 * * 7", "0 2 * * funday", "0  2 * * *", "x 2 * * *",
    "0 2 * * */0", "", "@daily", "0 0 30 2 *", "0 0 31 4,6 *", "0 0 L * *", "0 0 * * 1#2",
    "0 0 ? * *", "0 0 * * monday", "0 0 * January *", "0 0 5-1 * *",
])
def test_the_cron_rule_accepts_what_celery_beat_reads_and_nothing_else(expression: str) -> None:
    assert _accepted(check_cron, expression) == _accepted(crontab.from_string, expression)


@pytest.mark.parametrize(("check", "url"), [
    (check_database_url, "sqlite:///data/compactor.db"),
    (check_database_url, "sqlite:////var/lib/compactor/compactor.db"),
    (check_database_url, "sqlite+pysqlite:///compactor.db"),
    (check_database_url, "postgresql+psycopg://app@db/compactor"),
    (check_database_url, "postgresql://app:s3cret@db:5432/compactor?sslmode=require"),
    (check_database_url, "postgres://app:s3cret@db/compactor"),
    (check_database_url, "postgresql+psycopg://app:pa/ss:w@db/compactor"),
    (check_database_url, "postgresql+psycopg://app:p%40ss@db/compactor"),
    (check_database_url, "postgresql+psycopg:///compactor?host=/run/postgresql"),
    (check_database_url, "postgresql+psycopg://app@[::1]:5432/compactor"),
    (check_redis_url, "redis://localhost:6379/0"),
    (check_redis_url, "rediss://user:s3cret@cache:6380/1"),
    (check_redis_url, "redis://cache"),
    (check_redis_url, "unix:///run/redis/redis.sock?db=1"),
    (check_redis_url, "sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26379"),
    (check_redis_url, "sentinel://:s3cret@sentinel-a/2;sentinel://sentinel-b:26380"),
    (check_http_url, "https://api.openai.com/v1"),
    (check_http_url, "http://user:secret@127.0.0.1:8000/v1?api-key=k"),
    (check_http_url, "https://[::1]:8443/openai/deployments/gpt"),
])
def test_every_url_form_accepted_before_is_accepted(check: Callable[[str], str],
                                                    url: str) -> None:
    assert check(url) == url


@pytest.mark.parametrize(("check", "url", "problem"), [
    (check_database_url, "mysql://app@db/compactor", "not a sqlite:/// or postgresql:// URL"),
    (check_database_url, "localhost:5432", "not a sqlite:/// or postgresql:// URL"),
    (check_database_url, "postgresql+psycopg://app@db:port/compactor",
     "the port is not a number"),
    (check_database_url, "postgresql+psycopg://app:p@ss@db/compactor",
     "an @ in the user name or password must be percent-encoded (%40)"),
    (check_redis_url, "redis:///0", "the URL names no host"),
    (check_redis_url, "redis://cache/zero", "the path must be the database number, e.g. /0"),
    (check_redis_url, "redis://cache:70000/0", "the port is not a number from 0 to 65535"),
    (check_redis_url, "redis://a:6379;redis://b:6379", "only sentinel:// URLs form a list"),
    (check_redis_url, "sentinel://a:26379;redis://b:6379",
     "every URL of a sentinel list is sentinel://HOST[:PORT]"),
    (check_redis_url, "sentinel://a:26379;sentinel:///0", "the URL names no host"),
    (check_redis_url, "sentinel://a:26379/zero", "the path must be the database number, e.g. /0"),
    (check_http_url, "http:///v1", "the URL names no host"),
    (check_http_url, "ftp://host/v1", "not an http:// or https:// URL"),
])
def test_a_url_its_reader_would_misread_is_refused_saying_why(
    check: Callable[[str], str], url: str, problem: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(problem)}$"):
        check(url)


def _accepted(parse: object, expression: str) -> bool:
    assert callable(parse)
    try:
        parse(expression)
    except (ValueError, TypeError, ZeroDivisionError):
        return False
    return True


def test_the_visibility_timeout_must_outlast_the_worst_case_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = problem_lines(monkeypatch, COMPACTOR_BROKER_VISIBILITY_TIMEOUT_S="1860")

    assert lines == ["settings: COMPACTOR_BROKER_VISIBILITY_TIMEOUT_S=1860 must exceed the "
                     "worst-case job, COMPACTOR_TASK_HARD_TIME_LIMIT_S=1860 (worst-case LLM "
                     "time 1560s is below the soft limit), or Redis redelivers a job that is "
                     "still running"]


@pytest.mark.parametrize("env", [
    {"COMPACTOR_REDIS_URL": "sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26379"},
    {"COMPACTOR_REDIS_SENTINEL_MASTER": "mymaster"},
])
def test_a_sentinel_master_is_named_exactly_with_sentinel_urls(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    assert problem_lines(monkeypatch, **env) == [
        "settings: COMPACTOR_REDIS_SENTINEL_MASTER names the Sentinel master, and is set "
        "exactly when COMPACTOR_REDIS_URL is sentinel://"]


def test_a_sentinel_password_needs_sentinel_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    assert problem_lines(monkeypatch, COMPACTOR_REDIS_SENTINEL_PASSWORD="s3cret") == [
        "settings: COMPACTOR_REDIS_SENTINEL_PASSWORD is the sentinels' password: set it only "
        "with a sentinel:// COMPACTOR_REDIS_URL"]


def test_the_lease_must_expire_before_redis_redelivers(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = problem_lines(monkeypatch, COMPACTOR_LEASE_TTL_S="3600")

    assert lines == ["settings: COMPACTOR_LEASE_TTL_S=3600 must be below "
                     "COMPACTOR_BROKER_VISIBILITY_TIMEOUT_S=3600, so that the reconciler "
                     "takes back a dead worker's job before Redis does"]
