"""How a job's retries end, with a real worker against the OpenAI-protocol test server:
the configured retry count is honoured and the last attempt says so, a refused key fails
at once on neither breaker, and every terminal outcome frees the session's queue marker
so that `compactor trigger` and the next scan take it again."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest
import redis

from db import Store
from scheduler.beat import scan_policy
from tests.e2e.conftest import StartWorker
from tests.support.cli import Compactor
from tests.support.e2e import (
    LONG_SESSION_ID,
    MEDIUM_SESSION_ID,
    SHORT_SESSION_ID,
    JobEnv,
    build_job_env,
    import_generated_sessions,
    wait_until,
)
from tests.support.openai_behaviours import Behaviour
from tests.support.openai_server import OpenAIServer
from tests.support.scheduling import scan_takes
from tests.support.worker_process import WorkerProcess
from worker.shared_state.keys import RedisKeys

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

# Above Celery's own default of 3, so that only the setting can explain five retries;
# the provider breaker stays closed throughout (threshold above the attempts).
RETRIES = 5
RETRY_SETTINGS: dict[str, Any] = {"max_transient_retries": RETRIES, "retry_backoff_max_s": 1,
                                  "provider_breaker_threshold": RETRIES + 5,
                                  "quiet_period_s": 0}


@pytest.fixture
def job_env(postgres_url: str, server: OpenAIServer) -> JobEnv:
    return build_job_env(postgres_url, server.base_url, **RETRY_SETTINGS)


@pytest.fixture
def compactor(job_env: JobEnv) -> Compactor:
    return Compactor(job_env.env)


def trigger(compactor: Compactor, session_id: str, *, force: bool = True) -> dict[str, Any]:
    """`compactor trigger SESSION [--force] --json` in a child process: its one result."""
    done = compactor.subprocess("trigger", session_id, *(["--force"] if force else []),
                                "--json")
    assert done.returncode == 0, done.stderr
    [result] = json.loads(done.stdout)
    return dict(result)


def attempts_of(worker: WorkerProcess, task_id: str, count: int) -> list[dict[str, Any]]:
    """Wait for ``count`` outcome events of ``task_id``; return them by attempt."""
    def events() -> list[dict[str, Any]]:
        return [e for e in worker.events("compaction.job") if e["task_id"] == task_id]
    wait_until(lambda: len(events()) >= count, timeout_s=90)
    return sorted(events(), key=lambda e: int(e["attempt"]))


def is_due_at_the_next_scan(store: Store, job_env: JobEnv, session_id: str) -> bool:
    due, _ = scan_takes(store, scan_policy(job_env.settings), datetime.now(UTC))
    return session_id in {session.session_id for session in due}


def is_marker_cleared(store: Store, session_id: str) -> bool:
    return store.get_session(session_id).queued_job_id is None


def test_a_job_failing_every_attempt_is_retried_exactly_as_configured_then_frees_its_session(
    pg_store: Store, start_worker: StartWorker, server: OpenAIServer, job_env: JobEnv,
    compactor: Compactor,
) -> None:
    import_generated_sessions(pg_store, LONG_SESSION_ID)
    server.set_behaviour("error_500")
    worker = start_worker()

    queued = trigger(compactor, LONG_SESSION_ID)
    attempts = attempts_of(worker, queued["job_id"], RETRIES + 1)

    assert [e["attempt"] for e in attempts] == list(range(1, RETRIES + 2))
    assert [e["will_retry"] for e in attempts] == [True] * RETRIES + [False]
    assert {(e["outcome"], e["reason"]) for e in attempts} == {("failed", "server_error")}
    assert attempts[-1]["level"] == "error" and attempts[0]["level"] == "info"
    assert server.request_count == RETRIES + 1
    assert "MaxRetriesExceeded" not in worker.log_text()
    assert len(pg_store.runs(session_id=LONG_SESSION_ID)) == RETRIES + 1
    wait_until(lambda: pg_store.get_session(LONG_SESSION_ID).queued_job_id is None)
    assert is_due_at_the_next_scan(pg_store, job_env, LONG_SESSION_ID)
    assert trigger(compactor, LONG_SESSION_ID)["status"] == "enqueued"


@pytest.mark.parametrize("refusal", ["unauthorized_401", "forbidden_403"])
def test_a_refused_key_fails_at_once_as_auth_failed_on_neither_breaker(
    refusal: str, pg_store: Store, start_worker: StartWorker, server: OpenAIServer,
    compactor: Compactor, job_env: JobEnv, redis_client: redis.Redis,
) -> None:
    import_generated_sessions(pg_store, LONG_SESSION_ID)
    server.set_behaviour(refusal)
    worker = start_worker()

    queued = trigger(compactor, LONG_SESSION_ID)
    [event] = attempts_of(worker, queued["job_id"], 1)

    assert (event["outcome"], event["reason"]) == ("failed", "auth_failed")
    assert (event["failure_class"], event["will_retry"]) == ("ProviderAuthFailed", False)
    session = pg_store.get_session(LONG_SESSION_ID)
    assert (session.breaker_state, session.breaker_failures) == ("closed", 0)
    assert redis_client.get(RedisKeys(job_env.prefix).provider_breaker()) is None
    assert server.request_count == 1
    wait_until(lambda: pg_store.get_session(LONG_SESSION_ID).queued_job_id is None)
    assert len(worker.events("compaction.job")) == 1  # and no retry comes later


# Three of the garbage kinds (the fault matrix runs them all, in process): a page, bytes
# that are no text, and JSON that is no completion.
@pytest.mark.parametrize("garbage", [Behaviour.HTML_PAGE, Behaviour.RANDOM_BYTES,
                                     Behaviour.WRONG_TYPES], ids=str)
def test_garbage_from_the_endpoint_is_retried_and_counted_on_the_provider_breaker_alone(
    garbage: Behaviour, pg_store: Store, start_worker: StartWorker, server: OpenAIServer,
    compactor: Compactor, job_env: JobEnv, redis_client: redis.Redis,
) -> None:
    import_generated_sessions(pg_store, LONG_SESSION_ID)
    server.set_behaviour(garbage)
    worker = start_worker()

    queued = trigger(compactor, LONG_SESSION_ID)
    attempts = attempts_of(worker, queued["job_id"], RETRIES + 1)

    assert {(e["outcome"], e["reason"], e["failure_class"]) for e in attempts} == {
        ("failed", "invalid_response", "ProviderError")}
    assert [e["will_retry"] for e in attempts] == [True] * RETRIES + [False]
    session = pg_store.get_session(LONG_SESSION_ID)
    assert (session.breaker_state, session.breaker_failures) == ("closed", 0)
    breaker = json.loads(redis_client.get(RedisKeys(job_env.prefix).provider_breaker()) or "{}")
    assert (breaker["state"], breaker["failures"]) == ("closed", RETRIES + 1)
    assert "Traceback" not in worker.log_text()


def test_every_terminal_outcome_clears_the_queue_marker(
    pg_store: Store, start_worker: StartWorker, server: OpenAIServer, job_env: JobEnv,
    compactor: Compactor,
) -> None:
    import_generated_sessions(pg_store, LONG_SESSION_ID, MEDIUM_SESSION_ID, SHORT_SESSION_ID)
    worker = start_worker()
    outcomes: dict[str, str] = {}

    # Compacted, skipped (under the trigger, not forced), failed for good.
    for session_id, behaviour, force in [(LONG_SESSION_ID, "ok", True),
                                         (SHORT_SESSION_ID, "ok", False),
                                         (MEDIUM_SESSION_ID, "wrong_schema", True)]:
        server.set_behaviour(behaviour)
        queued = trigger(compactor, session_id, force=force)
        assert queued["status"] == "enqueued"
        [event] = attempts_of(worker, queued["job_id"], 1)
        outcomes[session_id] = event["outcome"]
        wait_until(partial(is_marker_cleared, pg_store, session_id))

    assert outcomes == {LONG_SESSION_ID: "compacted", SHORT_SESSION_ID: "skipped",
                        MEDIUM_SESSION_ID: "failed"}
