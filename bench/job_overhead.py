"""Per-job orchestration overhead: compaction jobs with an instant summarizer (extractive,
and the OpenAI test server at latency 0) against a bare Celery no-op task, each through
a real prefork worker (concurrency 1) on the same broker, in the same run.

The queue is filled before the worker starts, so completions are back to back; the
per-job wall time is the spacing of the completion events after the warm-up jobs.
"""

from __future__ import annotations

import functools
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import Task

from bench.common import (
    BenchWorker,
    Broker,
    event_time_s,
    openai_server,
    private_broker,
    private_database,
    settings_env,
)
from bench.report import (
    bench_parser,
    median,
    percentile,
    print_header,
    print_load,
    print_table,
)
from bench.sessions import BenchSession, generated_session, import_copies, new_counter
from db import Store, create_db_engine
from worker.celery_app import create_app
from worker.compaction.identifiers import extract_identifiers
from worker.compaction.messages import StoredMessage, parse_message
from worker.logging import JOB_EVENT, get_logger
from worker.settings import get_settings

NOOP_TASK = "bench.noop"
NOOP_EVENT = "bench.noop"
IDENTIFIER_REPEATS = 5
STEPS = ("lease", "breaker", "snapshot", "plan", "summarize", "validate", "swap")
WORKER_APP = "worker.celery_app"
NOOP_APP = "bench.job_overhead:noop_app"

# The benchmark-only app: the real app's broker settings (create_app), one no-op task.
noop_app = create_app(get_settings())


@noop_app.task(name=NOOP_TASK, bind=True)  # type: ignore[untyped-decorator]  # Celery: no hints
def noop(self: Task) -> None:
    # One log line per task, as the real task's one outcome event.
    get_logger().info(NOOP_EVENT, task_id=self.request.id)


@dataclass(frozen=True)
class Variant:
    """One kind of job measured: how to queue it and what ends it."""

    name: str
    app: str
    event: str
    env: dict[str, str]
    publish: Callable[[], list[str]]
    session_ids: tuple[str, ...] = ()  # an LLM variant's sessions: their runs hold latency


@dataclass(frozen=True)
class Measured:
    name: str
    events: list[dict[str, Any]]  # the timed jobs' events, oldest first
    per_job_ms: float
    llm_ms: list[float]  # per timed job: the LLM call's latency inside summarize


def measure(variant: Variant, count: int, warmup: int, log_dir: Path, store: Store) -> Measured:
    """Queue ``count`` jobs, then let one worker drain them; time the steady state."""
    task_ids = set(variant.publish())
    log_path = log_dir / f"{uuid.uuid4().hex}.log"
    with BenchWorker(variant.env, log_path, app=variant.app) as worker:
        worker.wait_for(variant.event, count, timeout_s=60 + count * 30)
        events = [e for e in worker.events(variant.event) if e.get("task_id") in task_ids]
    events.sort(key=event_time_s)
    spacing_s = event_time_s(events[-1]) - event_time_s(events[warmup - 1])
    timed = events[warmup:]
    timed_sessions = {str(e.get("session_id")) for e in timed} & set(variant.session_ids)
    return Measured(variant.name, timed, spacing_s * 1000 / (count - warmup),
                    llm_latency_ms(store, timed_sessions))


def job_variants(broker: Broker, database_url: str, session: BenchSession, count: int,
                 base_url: str, store: Store, *, extractive: bool = True) -> list[Variant]:
    """Compaction jobs on copies of ``session``: extractive, and the LLM server."""
    env = {**broker.env, **settings_env(
        database_url=database_url,
        # The session sits at 78% of the model window: over the 70% trigger.
        model_context_tokens=round(session.tokens * 1.28),
        tail_budget_tokens=min(8_000, session.tokens // 12))}
    variants = []
    kinds = [("LLM server, latency 0", settings_env(summarizer="llm", llm_base_url=base_url))]
    if extractive:
        kinds.insert(0, ("extractive", settings_env(summarizer="extractive")))
    for kind, extra in kinds:
        ids = tuple(f"{kind.split()[0]}-{session.tokens}-{n}" for n in range(count))
        import_copies(store, session, ids)
        variants.append(Variant(
            f"compaction, {session.tokens:,} tokens ({kind})", WORKER_APP, JOB_EVENT,
            {**env, **extra}, functools.partial(broker.publish_jobs, ids),
            ids if kind.startswith("LLM") else ()))
    return variants


def noop_variant(broker: Broker, count: int) -> Variant:
    def publish() -> list[str]:
        ids = [f"bench-noop-{uuid.uuid4().hex}" for _ in range(count)]
        for task_id in ids:
            broker.app.send_task(NOOP_TASK, task_id=task_id, queue=broker.settings.queue_name)
        return ids

    return Variant("celery no-op task", NOOP_APP, NOOP_EVENT, dict(broker.env), publish)


def llm_latency_ms(store: Store, session_ids: set[str]) -> list[float]:
    if not session_ids:
        return []
    return [float(run.figures.get("llm_latency_s") or 0.0) * 1000
            for run in store.runs(limit=10 * len(session_ids) + 100)
            if run.session_id in session_ids]


def print_results(results: list[Measured]) -> None:
    noop_ms = results[0].per_job_ms
    rows = []
    for result in results:
        durations = [float(e["duration_ms"]) for e in result.events if "duration_ms" in e]
        rows.append((result.name, len(result.events), result.per_job_ms,
                     result.per_job_ms / noop_ms,
                     *((statistics.fmean(durations), median(durations),
                        percentile(durations, 0.95)) if durations else ("-", "-", "-"))))
    print("\nPer-job wall time (steady state, concurrency 1):")
    print_table(("job", "timed jobs", "per-job wall ms", "x no-op", "pipeline ms mean",
                 "pipeline ms median", "pipeline ms p95"), rows)
    for result in results[1:]:
        print(f"\nPipeline steps of {result.name} (durations_ms of compaction.job):")
        step_rows = []
        for step in STEPS:
            values = [float(e["durations_ms"][step]) for e in result.events]
            step_rows.append((step, median(values), percentile(values, 0.95)))
        if result.llm_ms:
            step_rows.append(("(LLM call inside summarize)", median(result.llm_ms),
                              percentile(result.llm_ms, 0.95)))
        print_table(("step", "median ms", "p95 ms"), step_rows)
        print(f"outcomes: {', '.join(sorted({str(e['outcome']) for e in result.events}))}")


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--jobs", type=int, default=100, help="timed jobs per variant")
    parser.add_argument("--warmup", type=int, default=3, help="untimed first jobs")
    parser.add_argument("--session-tokens", default="5000,100000", help="comma-separated")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.warmup, args.session_tokens = 3, 1, "3000"
    print_header("job orchestration overhead vs a bare Celery task")
    count = args.jobs + args.warmup
    counter = new_counter()
    sessions = [generated_session(int(t), counter) for t in args.session_tokens.split(",")]
    sizes = ", ".join(f"{s.tokens:,} tokens ({len(s.rows)} messages)" for s in sessions)
    print(f"sessions: {sizes}; {args.jobs} timed + {args.warmup} warm-up jobs per variant",
          flush=True)
    with (tempfile.TemporaryDirectory() as log_dir, openai_server() as server,
          private_database() as url, private_broker(url) as broker):
        engine = create_db_engine(url)
        store = Store(engine)
        variants = [noop_variant(broker, count)]
        for session in sessions:
            # --quick: the extractive variant differs by one setting; one worker start less.
            variants += job_variants(broker, url, session, count, server.base_url, store,
                                     extractive=not args.quick)
        results = [measure(v, count, args.warmup, Path(log_dir), store) for v in variants]
        engine.dispose()
    print_load()
    print_results(results)
    print_identifier_cost(sessions)


def print_identifier_cost(sessions: list[BenchSession]) -> None:
    """Time identifying every message, in this process, for scale: ingest does it once
    per message; a job only ranks what was stored."""
    rows = []
    for session in sessions:
        stored = [StoredMessage(seq, parse_message(row.body), row.tokens)
                  for seq, row in enumerate(session.rows, 1)]
        timings_ms = []
        for _ in range(IDENTIFIER_REPEATS):
            began = time.perf_counter()
            extract_identifiers(stored)
            timings_ms.append((time.perf_counter() - began) * 1000)
        rows.append((session.tokens, median(timings_ms),
                     median(timings_ms) * 1000 / session.tokens))
    print("\nAt ingest (never in a job): identifiers of every message, in-process:")
    print_table(("session tokens", "median ms", "µs per token"), rows)


if __name__ == "__main__":
    main()
