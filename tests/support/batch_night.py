"""A night in batch mode, as the batch-night test and benchmark run it: generated due
sessions (about one in three long enough for chunk-and-merge), a runtime per mode on one
database, and the night's rounds (jobs park, the poller submits and collects, the
answered jobs run again) until no job is sent again."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from db import Store
from scheduler.batches import PollPolicy, PollReport, poll_batches
from scheduler.enqueue import QueuedJob
from tests.support.generated import generated_session
from tests.support.openai_server import OpenAIServer
from worker.compaction import ModelPrice, dump_price_table
from worker.compaction.intake import IntakePolicy
from worker.job import pipeline
from worker.job.values import JobRequest, JobResult
from worker.platform.ingest import import_sessions
from worker.runtime import Runtime, build_runtime, llm_config
from worker.settings.config import Settings
from worker.summarizers.openai_batch import LLMBatches
from worker.summarizers.openai_client import LLMClient

MODEL = "test-summarizer"
PRICE = ModelPrice(input=2.0, cached_input=0.5, output=8.0, batch_discount=0.5)
WINDOW_TOKENS = 12_000
MAX_ROUNDS = 8  # a night's rounds: one, then one per chunk-and-merge reduce round


@dataclass
class RecordingPublisher:
    jobs: list[QueuedJob] = field(default_factory=list)

    def publish(self, jobs: Sequence[QueuedJob]) -> None:
        self.jobs.extend(jobs)


def night_sessions(seed: int, count: int) -> list[dict[str, Any]]:
    """Due sessions; about one in three is long enough for chunk-and-merge."""
    rng = random.Random(seed)
    return [generated_session(f"n{seed}s{index}", rng.choice((70, 90, 250, 300)))
            for index in range(count)]


def runtime_for(database_url: str, server: OpenAIServer, mode: str, **values: Any) -> Runtime:
    settings = Settings(database_url=database_url, llm_base_url=server.base_url,
                        llm_model=MODEL, summarizer="llm", llm_mode=mode,
                        llm_context_tokens=WINDOW_TOKENS, llm_max_output_tokens=1_024,
                        llm_max_retries=0, model_context_tokens=8_000, quiet_period_s=0,
                        llm_prices=dump_price_table({MODEL: PRICE}),
                        batch_sync_max_prompt_tokens=0, **values)
    return build_runtime(settings, use_redis=False)


def import_all(runtime: Runtime, sessions: list[dict[str, Any]]) -> None:
    list(import_sessions(sessions, store=runtime.store, counter=runtime.deps.counter,
                         policy=IntakePolicy(), now=datetime.now(UTC)))


def run_jobs(runtime: Runtime, jobs: list[JobRequest]) -> list[JobResult]:
    results = [pipeline.run(job, runtime.deps, runtime.policy) for job in jobs]
    for result in results:  # a job that ended holds nothing: no lease, no worker
        assert runtime.store.get_session(result.session_id).lease_owner is None
    return results


def poll(runtime: Runtime, server: OpenAIServer, publisher: RecordingPublisher) -> PollReport:
    with LLMClient(llm_config(runtime.settings)) as client:
        return poll_batches(runtime.store, LLMBatches(client), publisher,
                            PollPolicy(max_requests=runtime.settings.batch_max_requests,
                                       marker_ttl_s=3_600,
                                       max_file_bytes=runtime.settings.batch_max_file_bytes),
                            datetime.now(UTC))


def batch_night(runtime: Runtime, server: OpenAIServer, session_ids: list[str],
                on_parked: Any = None) -> tuple[dict[str, list[JobResult]], int]:
    """The night's jobs until none is sent again: each session's results, and batches."""
    publisher, batches = RecordingPublisher(), 0
    jobs = [JobRequest(session_id, "nightly", task_id=f"first-{session_id}")
            for session_id in session_ids]
    results: dict[str, list[JobResult]] = {session_id: [] for session_id in session_ids}
    for _ in range(MAX_ROUNDS):
        if not jobs:
            break
        for result in run_jobs(runtime, jobs):
            results[result.session_id].append(result)
        if on_parked is not None:
            on_parked(runtime.store)
            on_parked = None
        submitted = poll(runtime, server, publisher)  # sends what parked
        batches += len(submitted.submitted)
        poll(runtime, server, publisher)  # collects it (the server's batches are quick)
        jobs = [JobRequest(job.kwargs["session_id"], job.kwargs["reason"],
                           force=job.kwargs["force"], task_id=job.job_id)
                for job in publisher.jobs]
        publisher.jobs.clear()
    assert not jobs, f"jobs still sent after {MAX_ROUNDS} rounds: {jobs}"
    return results, batches


def compacted_costs(store: Store, session_ids: list[str]) -> dict[str, dict[str, Any]]:
    runs = {run.session_id: run.figures for run in store.runs(limit=10_000)
            if run.outcome == "compacted" and run.session_id in session_ids}
    return runs
