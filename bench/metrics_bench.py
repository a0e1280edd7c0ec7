"""What the metrics cost: counting one ``compaction.job`` event in multiprocess mode (in
forked children, as the prefork pool does), and one scrape of the endpoint's multiprocess
collector over every child's files, by number of processes; CPU time, not wall time. The
fleet-state gauges (one grouped count, one Redis round trip, cached 5 s) are not included.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from bench.report import bench_parser, print_header, print_table
from worker.errors import Outcome
from worker.job.figures import JobFigures
from worker.job.outcome import job_event_fields
from worker.job.values import JobResult
from worker.metrics import MULTIPROC_ENV, enable_metrics

EVENTS_PER_CHILD = 2_000
SCRAPES = 20


def sample_event(index: int) -> dict[str, object]:
    """A compacted job's event, its reason one of a few (label sets as in production)."""
    fields = job_event_fields(JobResult(
        session_id="s-1", task_id="t-1", attempt=1, trigger="scan", outcome=Outcome.COMPACTED,
        reason="over_trigger", summarizer="llm", failure_class=None, failure_message=None,
        retryable=False, retry_after_s=None, revision_id=7, parent_revision_id=None,
        breaker_state="closed", durations_ms={}, duration_ms=1200.0,
        figures=JobFigures(tokens_before=90_000, tokens_after=30_000, llm_calls=2,
                           prompt_tokens=40_000, completion_tokens=2_000, llm_retries=0)))
    fields["reason"] = ("over_trigger", "forced", "anti_thrash")[index % 3]
    fields["durations_ms"] = {step: 10.0 for step in ("lease", "breaker", "snapshot", "plan",
                                                      "summarize", "merge", "validate", "swap")}
    return fields


def count_in_child(events: int, pipe_w: int) -> None:
    """Count ``events`` events in this forked child; write the µs per event to the pipe."""
    from worker.metrics import record_job_event

    prepared = [sample_event(i) for i in range(events)]
    record_job_event(prepared[0])  # the first event creates the files; then steady state
    started = time.process_time()  # CPU time: the machine's load would swell wall time
    for event in prepared:
        record_job_event(event)
    per_event_us = (time.process_time() - started) / events * 1e6
    os.write(pipe_w, f"{per_event_us:.3f}\n".encode())
    os._exit(0)


def run(processes: int, events: int) -> tuple[float, float]:
    """Fork ``processes`` counting children; return (median µs/event, median scrape ms)."""
    os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="metrics-bench-")  # this run only
    enable_metrics(port=0)
    from prometheus_client import CollectorRegistry, generate_latest  # after: multiprocess
    from prometheus_client.multiprocess import MultiProcessCollector

    read_fd, write_fd = os.pipe()
    pids = []
    for _ in range(processes):
        pid = os.fork()
        if pid == 0:
            count_in_child(events, write_fd)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    os.close(write_fd)
    with os.fdopen(read_fd) as results:
        per_event_us = [float(line) for line in results.read().split()]
    registry = CollectorRegistry()
    MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # unannotated upstream
    scrape_ms = []
    for _ in range(SCRAPES):
        started = time.process_time()
        body = generate_latest(registry)
        scrape_ms.append((time.process_time() - started) * 1000)
    assert b'compactor_jobs_total{outcome="compacted",reason="forced"}' in body
    return statistics.median(per_event_us), statistics.median(scrape_ms)


def main() -> None:
    args = bench_parser(__doc__ or "").parse_args()
    print_header("metrics: counting an event, scraping the pool")
    events = 50 if args.quick else EVENTS_PER_CHILD
    rows = []
    for processes in ((1, 2) if args.quick else (1, 4, 16)):
        per_event_us, scrape_ms = run(processes, events)
        rows.append((processes, events, f"{per_event_us:.1f}", f"{scrape_ms:.2f}"))
    print_table(("processes", "events each", "CPU us per event median", "scrape CPU ms median"),
                rows)


if __name__ == "__main__":
    main()
