"""Traces load only when asked for: a pool child's first steps and one job, in a fresh
process as ``compactor worker`` runs them (the entry's import guards, the main process's
preload, the child's ``worker_process_init``, a job that compacts through the LLM
summarizer, the child's exit). Without an OTLP endpoint, or with the SDK disabled, no
``opentelemetry`` module is in ``sys.modules`` (redis-py would import the metrics SDK
whenever it is installed); with one, the SDK traces and the exit flushes the job's span,
and a failed LLM call is an error span naming the error's class, as is its job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from db import upgrade_database
from tests.support.databases import open_store, sqlite_url
from tests.support.e2e import build_job_env, import_records, redis_under_prefix
from tests.support.generated import generated_session
from tests.support.openai_server import OpenAIServer
from tests.support.otlp_receiver import OTLPReceiver
from tests.support.worker_process import REPO_ROOT

pytestmark = pytest.mark.integration

SESSION_ID = "gen-imports"
TURNS = 60
ERROR_STATUS = 2  # the protocol's STATUS_CODE_ERROR

POOL_CHILD_WITH_ONE_JOB = textwrap.dedent("""
    import json, sys
    from worker.broker.serve import keep_out_terminal_only_modules
    keep_out_terminal_only_modules()
    import celery.bin.worker
    from celery import signals
    from worker.broker.celery_app import app
    from worker.job import pipeline
    from worker.job.values import JobRequest
    from worker.runtime import get_runtime, share_before_fork
    from worker.settings.config import get_settings
    app.loader.import_default_modules()
    share_before_fork(get_settings())
    signals.worker_process_init.send(sender=None)
    runtime = get_runtime(get_settings())
    result = pipeline.run(JobRequest(sys.argv[1], "imports"), runtime.deps, runtime.policy)
    signals.worker_process_shutdown.send(sender=None, pid=None, exitcode=0)
    print(json.dumps({"outcome": result.outcome.value, "reason": result.reason,
                      "failure_class": result.failure_class,
                      "llm_calls": result.figures.llm_calls,
                      "modules": [name for name, module in sys.modules.items()
                                  if module is not None]}))
""")


def run_pool_child(tmp_path: Path, server: OpenAIServer, otel: dict[str, str]
                   ) -> dict[str, Any]:
    url = sqlite_url(tmp_path / "store.db")
    upgrade_database(url)
    with open_store(url) as store:
        import_records(store, [generated_session(SESSION_ID, TURNS)])
    job_env = build_job_env(url, server.base_url)
    env = {name: value for name, value in os.environ.items() if not name.startswith("OTEL_")}
    with redis_under_prefix(job_env.prefix):
        done = subprocess.run([sys.executable, "-P", "-c", POOL_CHILD_WITH_ONE_JOB, SESSION_ID],
                              capture_output=True, text=True, timeout=120, check=False,
                              env={**env, **job_env.env, **otel}, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def opentelemetry_modules(report: dict[str, Any]) -> list[str]:
    return sorted(name for name in report["modules"]
                  if name == "opentelemetry" or name.startswith("opentelemetry."))


@pytest.mark.parametrize("otel", [{}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
                                       "OTEL_SDK_DISABLED": "true"}],
                         ids=["unset", "sdk-disabled"])
def test_a_worker_that_does_not_trace_loads_nothing_of_opentelemetry(
    tmp_path: Path, otel: dict[str, str],
) -> None:
    with OpenAIServer() as server:
        report = run_pool_child(tmp_path, server, otel)

    assert (report["outcome"], report["llm_calls"]) == ("compacted", 1)
    assert opentelemetry_modules(report) == []
    assert "worker.tracing.spans" in report["modules"]  # the job ran past its no-op spans


def test_a_worker_with_an_otlp_endpoint_traces_and_flushes_at_its_exit(tmp_path: Path) -> None:
    with OpenAIServer() as server, OTLPReceiver() as receiver:
        report = run_pool_child(tmp_path, server, {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "600000"})
        spans = receiver.wait_for_spans("compaction.job", 1, timeout_s=5)

    assert (report["outcome"], report["llm_calls"]) == ("compacted", 1)
    assert {"opentelemetry.sdk.trace", "worker.tracing.export"} <= set(report["modules"])
    assert len({span.trace_id for span in spans}) == 1
    assert len([span for span in spans if span.name.startswith("chat ")]) == 1


def test_a_failed_llm_call_and_its_job_are_error_spans_naming_the_error_class(
    tmp_path: Path,
) -> None:
    with OpenAIServer(behaviour="error_500") as server, OTLPReceiver() as receiver:
        report = run_pool_child(tmp_path, server, {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
        spans = receiver.wait_for_spans("compaction.job", 1, timeout_s=5)

    by_name = {span.name: span for span in spans}
    [call] = [span for span in spans if span.name.startswith("chat ")]
    job, summarize = by_name["compaction.job"], by_name["compaction.summarize"]
    assert (report["outcome"], report["llm_calls"]) == ("failed", 1)
    assert (call.status_code, call.attributes["error.type"]) == (ERROR_STATUS, "ProviderError")
    assert "gen_ai.usage.input_tokens" not in call.attributes
    assert summarize.status_code == ERROR_STATUS
    assert (job.status_code, job.attributes["compaction.outcome"]) == (ERROR_STATUS, "failed")
    assert (job.attributes["compaction.reason"], job.attributes["error.type"]) == \
        (report["reason"], report["failure_class"])
