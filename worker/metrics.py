"""The worker's Prometheus metrics: their definitions, fed from the ``compaction.job``
event's own fields (so a metric never disagrees with the event), and the endpoint.

Multiprocess mode for the prefork pool: the worker's main process points
``PROMETHEUS_MULTIPROC_DIR`` at a directory of its own (``compactor-metrics`` under the
configured one) before the pool forks, every process writes its samples there, and the
main process serves them all (``MultiProcessCollector``) with the fleet-state gauges read
at scrape time (``worker/metrics_state.py``). prometheus-client chooses multiprocess mode
when it is first imported, by that variable alone: `compactor worker` sets it before the
worker's interpreter starts, and a worker that finds the choice already made without it
refuses to start. With metrics off nothing is recorded.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Histogram
    from prometheus_client.registry import Collector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# The worker's own directory under the configured one, named by its metrics port (one
# live worker per port on a host, the same across its restarts): the only place it
# deletes files.
OWN_DIRNAME = "compactor-metrics"
# prometheus-client's sample files: ``<type>_<pid>.db``, ``gauge_<mode>_<pid>.db``.
SAMPLE_FILE = re.compile(r"(counter|histogram|summary|gauge_(live)?(all|min|max|sum|mostrecent))"
                         r"_\d+\.db")
# Seconds; jobs run from milliseconds (skips) to minutes (long LLM spans).
DURATION_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_enabled_in_pid: int | None = None


@dataclass(frozen=True)
class JobMetrics:
    """Every job metric; each one a function of the ``compaction.job`` event's fields."""

    jobs: Counter
    retries: Counter
    duration: Histogram
    step_duration: Histogram
    tokens_before: Counter
    tokens_after: Counter
    tokens_saved: Counter
    llm_calls: Counter
    llm_prompt_tokens: Counter
    llm_cached_tokens: Counter
    llm_completion_tokens: Counter
    llm_retries: Counter
    llm_cost: Counter

    def observe(self, event: Mapping[str, Any]) -> None:
        """Count one job attempt from its event's fields."""
        outcome, reason = str(event["outcome"]), str(event.get("reason") or "")
        self.jobs.labels(outcome=outcome, reason=reason).inc()
        if event.get("will_retry"):
            self.retries.labels(reason=reason).inc()
        if event.get("duration_ms") is not None:
            self.duration.labels(outcome=outcome).observe(event["duration_ms"] / 1000)
        for step, step_ms in (event.get("durations_ms") or {}).items():
            self.step_duration.labels(step=step).observe(step_ms / 1000)
        before, after = event.get("tokens_before"), event.get("tokens_after")
        if event.get("revision_id") is not None and before is not None and after is not None:
            self.tokens_before.inc(before)
            self.tokens_after.inc(after)
            self.tokens_saved.inc(max(0, before - after))
        for counter, figure in ((self.llm_calls, "llm_calls"),
                                (self.llm_prompt_tokens, "prompt_tokens"),
                                (self.llm_cached_tokens, "cached_tokens"),
                                (self.llm_completion_tokens, "completion_tokens"),
                                (self.llm_retries, "llm_retries"),
                                (self.llm_cost, "cost_usd")):
            if event.get(figure):
                counter.inc(event[figure])


@functools.cache
def job_metrics() -> JobMetrics:
    """This process's metrics, created on first use (after the multiprocess setup)."""
    from prometheus_client import REGISTRY

    return build_job_metrics(REGISTRY)


def build_job_metrics(registry: CollectorRegistry) -> JobMetrics:
    """Define every job metric in ``registry``."""
    from prometheus_client import Counter, Histogram

    def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, doc, labels, registry=registry)

    def histogram(name: str, doc: str, labels: Sequence[str]) -> Histogram:
        return Histogram(name, doc, labels, registry=registry, buckets=DURATION_BUCKETS_S)

    return JobMetrics(
        jobs=counter("compactor_jobs", "Job attempts by outcome and reason (one per "
                     "compaction.job event).", ["outcome", "reason"]),
        retries=counter("compactor_job_retries", "Job attempts that end in a retry, by "
                        "the transient failure's reason.", ["reason"]),
        duration=histogram("compactor_job_duration_seconds", "Job wall time by outcome.",
                           ["outcome"]),
        step_duration=histogram("compactor_job_step_duration_seconds", "Wall time of each "
                                "job step (lease, breaker, plan, summarize, merge, "
                                "validate, swap).", ["step"]),
        tokens_before=counter("compactor_tokens_before", "Projection tokens before the "
                              "committed compactions."),
        tokens_after=counter("compactor_tokens_after", "Projection tokens after the "
                             "committed compactions."),
        tokens_saved=counter("compactor_tokens_saved", "Projection tokens the committed "
                             "compactions saved (before - after)."),
        llm_calls=counter("compactor_llm_calls", "LLM requests made, failed jobs included."),
        llm_prompt_tokens=counter("compactor_llm_prompt_tokens", "Prompt tokens the "
                                  "endpoint reported, failed jobs included."),
        llm_cached_tokens=counter("compactor_llm_cached_tokens", "Prompt tokens the "
                                  "endpoint served from its prompt cache."),
        llm_completion_tokens=counter("compactor_llm_completion_tokens", "Completion "
                                      "tokens the endpoint reported, failed jobs included."),
        llm_retries=counter("compactor_llm_retries", "SDK-level retries of transient LLM "
                            "errors."),
        llm_cost=counter("compactor_llm_cost_usd", "What the LLM calls cost (USD, the jobs' "
                         "cost_usd), failed jobs included; unpriced models add nothing."),
    )


def record_job_event(event: Mapping[str, Any]) -> None:
    """Count one ``compaction.job`` event, when this worker serves metrics."""
    if _enabled_in_pid is not None:  # set in the main process, inherited by its children
        job_metrics().observe(event)


class MetricsSetupError(Exception):
    """Raised when prometheus-client was imported before multiprocess mode was set up."""


def choose_multiproc_dir() -> str:
    """The directory under which the worker keeps its samples: ``PROMETHEUS_MULTIPROC_DIR``,
    else a fresh temporary one; set in the environment so that prometheus-client, whoever
    imports it first, chooses multiprocess mode."""
    directory = os.environ.get(MULTIPROC_ENV) or tempfile.mkdtemp(prefix="compactor-metrics-")
    os.environ[MULTIPROC_ENV] = directory
    return directory


def own_metrics_dirname(port: int) -> str:
    """The directory of the worker serving ``port``, under ``PROMETHEUS_MULTIPROC_DIR``."""
    return f"{OWN_DIRNAME}-{port}"


def enable_metrics(port: int) -> Path:
    """Prepare multiprocess collection in the worker's main process, before the pool
    forks: the directory of the worker serving ``port``, under the configured one, is
    created and emptied of an earlier run's sample files (nothing else in it or around
    it is touched: workers sharing the configured directory keep their samples).

    Raises:
        MetricsSetupError: prometheus-client was imported in single-process mode.
    """
    global _enabled_in_pid
    values = sys.modules.get("prometheus_client.values")
    if values is not None and not getattr(values.ValueClass, "_multiprocess", False):
        raise MetricsSetupError(
            f"prometheus_client was imported before the worker set {MULTIPROC_ENV}, so its "
            f"samples would stay in each pool process; start it with `compactor worker`, "
            f"or set {MULTIPROC_ENV} to a directory in its environment")
    path = Path(choose_multiproc_dir()) / own_metrics_dirname(port)
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.iterdir():
        if SAMPLE_FILE.fullmatch(stale.name) and stale.is_file():
            stale.unlink()
    os.environ[MULTIPROC_ENV] = str(path)
    _enabled_in_pid = os.getpid()
    return path


def mark_child_dead(pid: int) -> None:
    """Drop a pool child's live-gauge files as it exits (its counters stay counted)."""
    if _enabled_in_pid is not None and pid != _enabled_in_pid:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]  # unannotated upstream


def serve_metrics(host: str, port: int, collectors: Sequence[Collector] = ()) -> Any:
    """Serve every process's samples, and ``collectors`` (read at scrape time), on
    ``host:port`` from a daemon thread; return the server (``shutdown()`` stops it)."""
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # unannotated upstream
    for collector in collectors:
        registry.register(collector)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
