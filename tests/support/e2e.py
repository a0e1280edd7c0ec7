"""Building blocks of the job's tests: per-test settings (and the worker's environment
built from them), a Celery publisher of job messages, generated sessions, and the checks
every compacted session must pass."""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from celery import Celery

from db import RevisionRecord, Store
from tests.support.chat_rules import find_chat_violations
from tests.support.generated import generated_session
from worker.broker.celery_app import create_app
from worker.broker.contract import TASK_NAME, job_kwargs
from worker.compaction.intake import IntakePolicy
from worker.compaction.messages import parse_message
from worker.compaction.tokens import TokenCounter
from worker.platform.ingest import ImportStatus, append_messages, import_sessions
from worker.settings.config import Settings
from worker.tokenizer.offline import load_encoding

REDIS_URL = "redis://127.0.0.1:6379/0"
# A small model window puts ordinary sessions over the trigger (0.7 x 6,000 =
# 4,200 tokens) and keeps every LLM prompt small.
MODEL_CONTEXT_TOKENS = 6_000
TAIL_BUDGET_TOKENS = 800
# Every limit short, and consistent with the settings validator: worst-case LLM time
# (2 + 20 s) x 1 attempt x ceil(4 calls / 2) = 44 s < soft 50 s < hard 55 s, and the
# soft limit < the 60 s visibility timeout.
JOB_DEFAULTS: dict[str, Any] = {
    "redis_url": REDIS_URL,
    "summarizer": "llm",
    "model_context_tokens": MODEL_CONTEXT_TOKENS,
    "tail_budget_tokens": TAIL_BUDGET_TOKENS,
    "llm_connect_timeout_s": 2,
    "llm_read_timeout_s": 20,
    "llm_max_retries": 0,
    # The test server counts requests and spends "fail N times" behaviours per request:
    # a worker's start probe would take one (tests/e2e/test_worker_start.py turns it on).
    "worker_check_llm": False,
    "llm_max_calls_per_job": 4,
    "llm_concurrency": 2,
    "task_soft_time_limit_s": 50,
    "task_hard_time_limit_s": 55,
    "broker_visibility_timeout_s": 60,
    "lease_ttl_s": 30,
    "retry_backoff_max_s": 2,
    "max_transient_retries": 1,
    "max_deliveries": 3,
    # Within the 50 s soft limit: a hung call and its failure's record both end first.
    "db_connect_timeout_s": 2,
    "db_statement_timeout_s": 20,
    "db_call_timeout_s": 22,
}
# Generated sessions (tests/support/generated.py), two over the trigger with the settings
# above and one under it, by their number of exchanges.
LONG_SESSION_ID = "gen-long"
MEDIUM_SESSION_ID = "gen-medium"
SHORT_SESSION_ID = "gen-short"
GENERATED_TURNS = {LONG_SESSION_ID: 60, MEDIUM_SESSION_ID: 40, SHORT_SESSION_ID: 10}
# Longest wait for a worker's job: start-up, the first job's imports, and the job.
EVENT_TIMEOUT_S = 45.0


@dataclass(frozen=True)
class JobEnv:
    """One test's settings, and the same values as the worker's ``COMPACTOR_*`` env."""

    settings: Settings
    env: dict[str, str]

    @property
    def prefix(self) -> str:
        return self.settings.redis_key_prefix

    @property
    def queue(self) -> str:
        return self.settings.queue_name


def build_job_env(database_url: str, llm_base_url: str | None, **overrides: Any) -> JobEnv:
    """Settings under a unique Redis key prefix and queue; ``overrides`` by field name."""
    tag = uuid.uuid4().hex[:10]
    values = {**JOB_DEFAULTS, "database_url": database_url,
              "redis_key_prefix": f"test-job-{tag}:", "queue_name": f"compaction-{tag}",
              **overrides}
    if llm_base_url is not None:
        values["llm_base_url"] = llm_base_url
    env = {f"COMPACTOR_{name.upper()}": str(value) for name, value in values.items()}
    return JobEnv(Settings(**{_init_name(name): value for name, value in values.items()}), env)


def _init_name(field: str) -> str:
    # A field with a validation alias (llm_base_url, ...) is only set through the alias.
    return f"COMPACTOR_{field.upper()}" if Settings.model_fields[field].validation_alias \
        else field


@contextmanager
def redis_under_prefix(prefix: str) -> Iterator[redis.Redis]:
    """A Redis client; every key under ``prefix`` is deleted afterwards."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        yield client
    finally:
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()


class JobPublisher:
    """Sends ``compactor.compact_session`` messages as the scheduler does (JSON)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app: Celery = create_app(settings)

    def publish(self, session_id: str, *, reason: str = "e2e", force: bool = False,
                task_id: str | None = None) -> str:
        """Send one job and return its task id."""
        return self.publish_kwargs(dict(job_kwargs(session_id, reason, force=force)),
                                   task_id=task_id)

    def publish_kwargs(self, kwargs: dict[str, Any], *, args: Sequence[Any] = (),
                       task_id: str | None = None, serializer: str = "json") -> str:
        """Send a message with any arguments at all (the contract is the worker's to check)."""
        if serializer != "json":
            # The producer may encode what the worker must refuse.
            self.app.conf.accept_content = ["json", serializer]
        result = self.app.send_task(TASK_NAME, args=list(args), kwargs=kwargs,
                                    task_id=task_id or str(uuid.uuid4()),
                                    queue=self.settings.queue_name, serializer=serializer)
        return str(result.id)

    def close(self) -> None:
        self.app.close()


@functools.cache
def token_counter() -> TokenCounter:
    return TokenCounter(load_encoding("o200k_base"))


def import_records(store: Store, records: Iterable[dict[str, Any]]) -> list[str]:
    """Import session records through the intake (as ``compactor import`` does)."""
    reports = list(import_sessions(records, store=store, counter=token_counter(),
                                   policy=IntakePolicy(), now=datetime.now(UTC)))
    stored = (ImportStatus.IMPORTED, ImportStatus.REPAIRED)
    assert all(r.status in stored for r in reports), [(r.session_id, r.status) for r in reports]
    return [r.session_id for r in reports]


def import_generated_sessions(store: Store, *session_ids: str) -> list[dict[str, Any]]:
    """Import the named generated sessions (sizes in ``GENERATED_TURNS``); return them."""
    records = [generated_session(session_id, GENERATED_TURNS[session_id])
               for session_id in session_ids]
    import_records(store, records)
    return records


def append_turns(store: Store, session_id: str, messages: Sequence[dict[str, Any]]) -> list[int]:
    """Append messages as the platform does (intake-checked); return their seqs."""
    return append_messages(store, token_counter(), IntakePolicy(), session_id, messages,
                           datetime.now(UTC))


def projection_violations(store: Store, session_id: str) -> list[str]:
    """Why the session's projection would be refused by the chat API (empty: valid)."""
    return find_chat_violations(parse_message(m) for m in store.projection(session_id))


def snapshot_keys(revisions: Iterable[RevisionRecord]) -> list[tuple[int | None, int]]:
    """Each revision's (parent, snapshot head): a second revision of one snapshot repeats one."""
    return [(r.parent_revision_id, r.snapshot_head_seq) for r in revisions]


def compacted_sessions(store: Store) -> set[str]:
    """The sessions with at least one ``compacted`` run."""
    return {run.session_id for run in store.runs(outcome="compacted", limit=10_000)}


def wait_until(condition: Callable[[], bool], *, timeout_s: float = EVENT_TIMEOUT_S) -> None:
    """Poll ``condition`` until it holds; TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met in {timeout_s}s")
        time.sleep(0.05)
