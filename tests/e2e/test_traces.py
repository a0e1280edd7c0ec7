"""Traces end to end: a real worker process with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing
at a real OTLP/HTTP receiver served in the test, the LLM summarizer against the OpenAI
test server. One job is one trace: the Celery task's span (continuing the producer's
context from the message headers), the job's span, a span per step and per LLM call."""

from __future__ import annotations

import secrets
import uuid
from contextlib import closing
from pathlib import Path

import pytest

from db import Store
from tests.support.e2e import (
    EVENT_TIMEOUT_S,
    JobEnv,
    JobPublisher,
    build_job_env,
    import_records,
    redis_under_prefix,
)
from tests.support.generated import generated_session
from tests.support.openai_server import OpenAIServer
from tests.support.otlp_receiver import OTLPReceiver, ReceivedSpan
from tests.support.worker_process import WorkerProcess
from worker.broker.contract import TASK_NAME, job_kwargs

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SESSION_ID = "gen-traced"
TURNS = 60
LLM_CONTEXT_TOKENS = 8_000
JOB_STEPS = ("lease", "breaker", "plan", "summarize", "merge", "validate", "swap")
CLIENT_KIND = 3  # the protocol's SPAN_KIND_CLIENT
ERROR_STATUS = 2  # STATUS_CODE_ERROR


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return [span for span in spans if span.parent_span_id == parent.span_id]


def test_one_job_is_one_trace_with_its_steps_and_llm_calls_as_spans(
    postgres_url: str, pg_store: Store, server: OpenAIServer, tmp_path: Path,
) -> None:
    # A summarizer window under the span: map calls on two threads, then a merge call.
    job_env = build_job_env(postgres_url, server.base_url,
                            llm_context_tokens=LLM_CONTEXT_TOKENS)
    with redis_under_prefix(job_env.prefix), closing(JobPublisher(job_env.settings)) as publisher:
        _trace_one_job(job_env, publisher, pg_store, server, tmp_path)


def _trace_one_job(job_env: JobEnv, publisher: JobPublisher, pg_store: Store,
                   server: OpenAIServer, tmp_path: Path) -> None:
    import_records(pg_store, [generated_session(SESSION_ID, TURNS)])
    producer_trace, producer_span = secrets.token_hex(16), secrets.token_hex(8)
    with OTLPReceiver() as receiver:
        # Spans leave only in the child's flush at its exit: the schedule never fires.
        env = {**job_env.env, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
               "OTEL_BSP_SCHEDULE_DELAY": "600000", "OTEL_SERVICE_NAME": "compactor-e2e"}
        worker = WorkerProcess(env, tmp_path / "worker.log", queue=job_env.queue).start()
        try:
            task_id = str(uuid.uuid4())
            publisher.app.send_task(
                TASK_NAME, kwargs=dict(job_kwargs(SESSION_ID, "traced")), task_id=task_id,
                queue=job_env.queue,
                headers={"traceparent": f"00-{producer_trace}-{producer_span}-01"})
            [event] = worker.wait_for_events("compaction.job", 1, timeout_s=EVENT_TIMEOUT_S)
        finally:
            worker.stop()
        spans = receiver.wait_for_spans("compaction.job", 1, timeout_s=10)

    assert (event["outcome"], event["reason"]) == ("compacted", "over_trigger"), \
        event["failure_message"]
    assert {span.trace_id for span in spans} == {producer_trace}
    [task] = [span for span in spans if span.name == f"run/{TASK_NAME}"]
    [job] = [span for span in spans if span.name == "compaction.job"]
    assert task.parent_span_id == producer_span
    assert job.parent_span_id == task.span_id
    assert task.resource["service.name"] == "compactor-e2e"
    assert {f"compaction.{name}": job.attributes.get(f"compaction.{name}") for name in (
        "session_id", "task_id", "outcome", "reason", "tokens_before", "tokens_after",
        "chunks", "llm_calls")} == {
        f"compaction.{name}": event[name] for name in (
            "session_id", "task_id", "outcome", "reason", "tokens_before", "tokens_after",
            "chunks", "llm_calls")}
    steps = {span.name: span for span in children(spans, job)}
    assert sorted(steps) == sorted(f"compaction.{step}" for step in JOB_STEPS)
    calls = children(spans, steps["compaction.summarize"])
    assert len(calls) == event["llm_calls"] == server.request_count
    model = job_env.settings.llm_model
    for call in calls:
        assert call.name == f"chat {model}" and call.kind == CLIENT_KIND
        assert call.status_code != ERROR_STATUS
        assert {key: call.attributes[key] for key in (
            "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.system",
            "gen_ai.request.model", "gen_ai.response.model")} == {
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
            "gen_ai.system": "openai", "gen_ai.request.model": model,
            "gen_ai.response.model": model}
    assert sorted(call.attributes["gen_ai.usage.input_tokens"] for call in calls) == \
        sorted(request.prompt_tokens for request in server.requests)
    assert sum(call.attributes["gen_ai.usage.output_tokens"] for call in calls) == \
        event["completion_tokens"]
    assert len(spans) == 2 + len(JOB_STEPS) + len(calls)
