"""The job metrics are a function of the ``compaction.job`` event's fields, and the
fleet-state gauges are read at most once per interval however often they are scraped."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.test_outcome_event import a_result
from worker.errors import Outcome
from worker.job.figures import JobFigures
from worker.job.outcome import job_event_fields, rejected_message_fields
from worker.metrics import MULTIPROC_ENV, SAMPLE_FILE, build_job_metrics
from worker.metrics_state import FleetState, FleetStateCollector


def observed(*events: dict[str, object]) -> CollectorRegistry:
    registry = CollectorRegistry()
    metrics = build_job_metrics(registry)
    for event in events:
        metrics.observe(event)
    return registry


def test_a_compacted_job_counts_its_outcome_tokens_and_steps() -> None:
    registry = observed(job_event_fields(a_result()))
    value = registry.get_sample_value
    assert value("compactor_jobs_total", {"outcome": "compacted",
                                          "reason": "over_trigger"}) == 1
    assert (value("compactor_tokens_before_total"), value("compactor_tokens_after_total"),
            value("compactor_tokens_saved_total")) == (9_000, 3_000, 6_000)
    assert value("compactor_job_step_duration_seconds_count", {"step": "swap"}) == 1
    assert value("compactor_job_duration_seconds_sum", {"outcome": "compacted"}) == 0.0125


def test_a_failed_job_counts_its_llm_cost_and_a_retried_one_its_retry_but_no_tokens() -> None:
    failed = dataclasses.replace(
        a_result(), outcome=Outcome.FAILED, reason="schema_mismatch", revision_id=None,
        figures=JobFigures(tokens_before=9_000, llm_calls=2, prompt_tokens=1_500,
                           cached_tokens=1_024, completion_tokens=300, cost_usd=0.25))
    retried = dataclasses.replace(failed, reason="server_error")
    registry = observed(job_event_fields(failed),
                        job_event_fields(retried, will_retry=True))
    value = registry.get_sample_value
    assert value("compactor_jobs_total", {"outcome": "failed",
                                          "reason": "schema_mismatch"}) == 1
    assert value("compactor_job_retries_total", {"reason": "server_error"}) == 1
    assert value("compactor_job_retries_total", {"reason": "schema_mismatch"}) is None
    assert (value("compactor_llm_calls_total"), value("compactor_llm_prompt_tokens_total"),
            value("compactor_llm_cached_tokens_total"),
            value("compactor_llm_completion_tokens_total")) == (4, 3_000, 2_048, 600)
    assert value("compactor_llm_cost_usd_total") == 0.5
    assert value("compactor_tokens_saved_total") == 0  # nothing was committed


def test_an_unreadable_message_counts_as_a_rejected_job() -> None:
    registry = observed(rejected_message_fields("t-9", "undecodable_message", "X", "y"))
    assert registry.get_sample_value("compactor_jobs_total", {
        "outcome": "rejected", "reason": "undecodable_message"}) == 1


def test_the_fleet_state_is_read_once_per_interval_and_parses_as_exposition() -> None:
    reads: list[float] = []
    now = [100.0]

    def read_state() -> FleetState:
        reads.append(now[0])
        return FleetState({"open": 3}, "half_open", 7,
                          {"open": 2, "submitted": 5, "answered": 0}, 1)

    registry = CollectorRegistry()
    registry.register(FleetStateCollector(read_state, "compaction", ttl_s=10,
                                          clock=lambda: now[0]))
    first = generate_latest(registry).decode()
    now[0] += 5
    generate_latest(registry)
    now[0] += 6
    generate_latest(registry)
    assert reads == [100.0, 111.0]
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(first) for s in family.samples}
    assert samples[("compactor_session_breakers", (("state", "open"),))] == 3
    assert samples[("compactor_session_breakers", (("state", "half_open"),))] == 0
    assert samples[("compactor_provider_breaker", (("state", "half_open"),))] == 1
    assert samples[("compactor_provider_breaker", (("state", "closed"),))] == 0
    assert samples[("compactor_queue_depth", (("queue", "compaction"),))] == 7
    assert samples[("compactor_parked_jobs", (("state", "submitted"),))] == 5
    assert samples[("compactor_open_batches", ())] == 1


def test_a_source_that_cannot_be_read_leaves_its_gauges_out() -> None:
    registry = CollectorRegistry()
    registry.register(FleetStateCollector(lambda: FleetState(None, None, 2), "q"))
    names = {f.name for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert names == {"compactor_queue_depth"}


def test_the_readme_names_exactly_the_metrics_the_endpoint_exposes() -> None:
    registry = observed(job_event_fields(a_result()))
    registry.register(FleetStateCollector(lambda: FleetState({}, "closed", 0, {}, 0), "q"))
    # Outside multiprocess mode each metric has a _created series too; the endpoint's not.
    exposed = {f.name for f in text_string_to_metric_families(generate_latest(registry).decode())
               if not f.name.endswith("_created")}
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(compactor_[a-z_]+)", section))
    # "`compactor_tokens_before_total`, `_after_total`, `_saved_total`" names three.
    named |= {f"compactor_tokens{suffix}" for suffix in re.findall(r"`(_[a-z]+_total)`", section)}
    assert {name.removesuffix("_total") for name in named} == exposed


# Every kind of metric prometheus_client has, in multiprocess mode, in a fresh process.
WRITE_EVERY_KIND = """
from prometheus_client import Counter, Gauge, Histogram, Summary
Counter("c", "c").inc()
Histogram("h", "h").observe(1)
Summary("s", "s").observe(1)
for mode in ("all", "liveall", "min", "livemin", "max", "livemax", "sum", "livesum",
             "mostrecent", "livemostrecent"):
    Gauge("g_" + mode, "g", multiprocess_mode=mode).set(1)
"""


def test_the_sample_file_pattern_matches_every_file_prometheus_client_writes(
    tmp_path: Path,
) -> None:
    """What a worker's start deletes is exactly prometheus_client's own naming."""
    subprocess.run([sys.executable, "-c", WRITE_EVERY_KIND], check=True, timeout=60,
                   env=os.environ | {MULTIPROC_ENV: str(tmp_path)})
    written = sorted(path.name for path in tmp_path.iterdir())
    assert len(written) == 3 + 10, written
    assert all(SAMPLE_FILE.fullmatch(name) for name in written), written
    for other in ("counter.db", "counter_1.db.bak", "notes_1.db", "gauge_1.db", "x/counter_1"):
        assert not SAMPLE_FILE.fullmatch(other), other
