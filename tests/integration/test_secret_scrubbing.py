"""No secret leaves through a provider's error text: an endpoint that echoes the API key
in its 401 message, called by the real LLM client through the pipeline, leaves the key in
neither the job's event, its runs row, nor the logged line (both databases)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import SecretStr
from structlog.testing import capture_logs

from db import Store
from tests.support.chaos import build_base_runtime, generate_session, runtime_for_case
from tests.support.openai_behaviours import ECHOED_API_KEY, Behaviour
from tests.support.openai_server import OpenAIServer
from worker.compaction.intake import IntakePolicy
from worker.errors import Outcome
from worker.job import pipeline
from worker.job.outcome import emit_job_event
from worker.job.values import JobRequest
from worker.logging import get_logger
from worker.platform.ingest import ImportStatus, import_sessions
from worker.runtime import Runtime

pytestmark = pytest.mark.integration

NOW = datetime.now(UTC) - timedelta(days=1)


@pytest.fixture(scope="module")
def base_runtime() -> Runtime:
    return build_base_runtime(model_context_tokens=3_000, tail_budget_tokens=300,
                              llm_read_timeout_s=10.0, llm_max_retries=0)


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(behaviour=Behaviour.ECHO_KEY_401, latency_ms=10) as running:
        yield running


def test_a_key_the_endpoint_echoes_reaches_neither_event_nor_runs_row(
    base_runtime: Runtime, store: Store, server: OpenAIServer
) -> None:
    case = runtime_for_case(base_runtime, store, server.base_url,
                            llm_api_key=SecretStr(ECHOED_API_KEY))
    runtime = case.runtime
    [report] = import_sessions([{"session_id": "echo", "messages": generate_session(5, 9)}],
                               store=store, counter=runtime.deps.counter,
                               policy=IntakePolicy(), now=NOW)
    assert report.status is ImportStatus.IMPORTED

    result = pipeline.run(JobRequest("echo", "secrets", force=True), runtime.deps,
                          runtime.policy)
    with capture_logs() as events:
        emit_job_event(get_logger(), result)

    assert [r.headers["authorization"] for r in server.requests] == [
        f"Bearer {ECHOED_API_KEY}"]
    assert (result.outcome, result.reason) == (Outcome.FAILED, "auth_failed")
    assert "Incorrect API key provided: [redacted]" in str(result.failure_message)
    [run] = store.runs(session_id="echo")
    assert run.failure_message == result.failure_message
    assert ECHOED_API_KEY not in json.dumps(dataclasses.asdict(run), default=str)
    assert ECHOED_API_KEY not in json.dumps(events, default=str)
