"""Scheduling headers a producer may not set (docs/TRIGGER.md), sent raw to a real worker
whose LLM answers after 3 s: a far ``eta`` neither delays the job nor leaves it waiting
to be delivered again, a past ``expires`` does not drop it, and a 1 s ``timelimit`` does
not cut it short (nor count on the session's breaker): each job simply compacts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from db import Store
from tests.e2e.conftest import StartWorker
from tests.support.e2e import JobEnv, import_records, wait_until
from tests.support.generated import generated_session
from tests.support.raw_producer import build_raw_message, push_raw_message
from worker.broker.contract import job_kwargs

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

TURNS = 40  # over the trigger of tests/support/e2e.py
IN_A_DAY = (datetime.now(UTC) + timedelta(days=1)).isoformat()
AN_HOUR_AGO = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
FORBIDDEN_HEADERS: dict[str, dict[str, Any]] = {
    "far-eta": {"eta": IN_A_DAY},
    "forged-retry-eta": {"eta": IN_A_DAY, "retries": 1},
    "expired": {"expires": AN_HOUR_AGO},
    "one-second-limit": {"timelimit": [1, 1]},
    "countdown": {"countdown": 86_400},
}


def test_producer_scheduling_headers_are_ignored_and_every_job_compacts_now(
    pg_store: Store, job_env: JobEnv, redis_client: redis.Redis, start_worker: StartWorker,
) -> None:
    import_records(pg_store, [generated_session(name, TURNS) for name in FORBIDDEN_HEADERS])
    worker = start_worker()
    for name, headers in FORBIDDEN_HEADERS.items():
        message = build_raw_message(job_kwargs(name, "headers"), queue=job_env.queue,
                                    task_id=name)
        message["headers"].update(headers)
        push_raw_message(redis_client, job_env.prefix, job_env.queue, message)

    def outcomes() -> dict[str, str]:
        return {e["task_id"]: e["outcome"] for e in worker.events("compaction.job")}

    wait_until(lambda: set(outcomes()) >= set(FORBIDDEN_HEADERS), timeout_s=120)
    assert outcomes() == dict.fromkeys(FORBIDDEN_HEADERS, "compacted")
    for name in FORBIDDEN_HEADERS:
        session = pg_store.get_session(name)
        assert (session.breaker_state, session.breaker_failures) == ("closed", 0)
    assert redis_client.llen(f"{job_env.prefix}{job_env.queue}") == 0
    assert not redis_client.exists(f"{job_env.prefix}unacked"), "a job waits for its eta"
