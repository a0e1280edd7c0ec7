"""Throughput against a simulated LLM latency as worker concurrency grows: single-chunk
sessions, the OpenAI test server answering every call after a fixed delay, one prefork
worker per concurrency level. Ideal: concurrency / latency jobs per second.

The queue is filled before the worker starts. Steady state is measured from the
concurrency-th completion to the last (each pool child's first job also builds its
runtime); the worker's own ready event starts the end-to-end figure.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    BenchWorker,
    Broker,
    event_time_s,
    machine_cpu_s,
    openai_server,
    private_broker,
    private_database,
    proc_cpu_s,
    settings_env,
)
from bench.report import (
    bench_parser,
    median,
    print_header,
    print_load,
    print_table,
)
from bench.sessions import BenchSession, generated_session, import_copies, new_counter
from db import Store, create_db_engine
from worker.logging import JOB_EVENT


@dataclass(frozen=True)
class Level:
    """One measured concurrency level."""

    session_tokens: int
    concurrency: int
    jobs: int
    steady_jobs_per_s: float
    end_to_end_jobs_per_s: float
    ideal_jobs_per_s: float
    median_job_s: float
    worker_cpu_s_per_job: float
    server_cpu_s_per_job: float
    bench_cpu_s_per_job: float  # this process's (publishing, polling the worker's log)
    machine_busy: float  # share of all cores busy (anything on the machine), steady state
    outcomes: str


def run_level(broker: Broker, store: Store, env: dict[str, str], session: BenchSession,
              concurrency: int, jobs: int, latency_s: float, server_pid: int,
              log_dir: Path) -> Level:
    """Drain ``jobs`` queued jobs with one worker of ``concurrency`` processes."""
    ids = [f"t{session.tokens}-c{concurrency}-{n}" for n in range(jobs)]
    import_copies(store, session, ids)
    broker.publish_jobs(ids)
    with BenchWorker(env, log_dir / f"c{concurrency}-{session.tokens}.log",
                     concurrency=concurrency) as worker:
        timeout_s = 60 + jobs * (20 * latency_s + 5)
        # CPU is counted once every child has finished a job (built its runtime).
        finished_then = len(worker.wait_for(JOB_EVENT, concurrency, timeout_s))
        cpu_then = (worker_cpu_s(worker), proc_cpu_s(server_pid), machine_cpu_s(),
                    time.process_time())
        events = worker.wait_for(JOB_EVENT, jobs, timeout_s)
        cpu_now = (worker_cpu_s(worker), proc_cpu_s(server_pid), machine_cpu_s(),
                   time.process_time())
        ready_s = event_time_s(worker.events("worker.ready")[0])
    done = sorted(event_time_s(e) for e in events)
    steady_s = done[-1] - done[concurrency - 1]
    counted_jobs = max(1, jobs - finished_then)
    busy_s, all_s = (now - then for now, then in zip(cpu_now[2], cpu_then[2], strict=True))
    return Level(
        session_tokens=session.tokens, concurrency=concurrency, jobs=jobs,
        steady_jobs_per_s=(jobs - concurrency) / steady_s if steady_s > 0 else 0.0,
        end_to_end_jobs_per_s=jobs / (done[-1] - ready_s),
        ideal_jobs_per_s=concurrency / latency_s,
        median_job_s=median([float(e["duration_ms"]) / 1000 for e in events]),
        worker_cpu_s_per_job=(cpu_now[0] - cpu_then[0]) / counted_jobs,
        server_cpu_s_per_job=(cpu_now[1] - cpu_then[1]) / counted_jobs,
        bench_cpu_s_per_job=(cpu_now[3] - cpu_then[3]) / counted_jobs,
        machine_busy=busy_s / all_s if all_s else 0.0,
        outcomes=", ".join(sorted({str(e["outcome"]) for e in events})),
    )


def worker_cpu_s(worker: BenchWorker) -> float:
    """CPU time of the worker's main process and pool children so far (s)."""
    assert worker.process is not None
    return sum(proc_cpu_s(pid) for pid in [worker.process.pid, *worker.child_pids()])


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--concurrency", default="1,2,4,8", help="comma-separated levels")
    parser.add_argument("--latency-ms", type=int, default=1_000, help="per LLM call")
    parser.add_argument("--jobs-per-process", type=int, default=8)
    parser.add_argument("--session-tokens", default="20000,100000", help="comma-separated")
    args = parser.parse_args()
    if args.quick:
        # Enough jobs that the counted ones use several of /proc's 10 ms CPU ticks: four
        # small jobs could be charged none.
        args.concurrency, args.latency_ms, args.jobs_per_process = "2", 200, 10
        args.session_tokens = "3000"
    levels = [int(c) for c in args.concurrency.split(",")]
    sizes = [int(t) for t in args.session_tokens.split(",")]
    latency_s = args.latency_ms / 1000
    print_header(f"throughput vs concurrency, LLM latency {latency_s:g} s")
    counter = new_counter()
    results: list[Level] = []
    with (tempfile.TemporaryDirectory() as log_dir,
          openai_server(latency_ms=args.latency_ms) as server,
          private_database() as url, private_broker(url) as broker):
        engine = create_db_engine(url)
        store = Store(engine)
        for tokens in sizes:
            session = generated_session(tokens, counter, seed=tokens)
            env = {**broker.env, **settings_env(
                database_url=url, summarizer="llm", llm_base_url=server.base_url,
                model_context_tokens=round(session.tokens * 1.28),
                tail_budget_tokens=min(8_000, session.tokens // 12))}
            for concurrency in levels:
                results.append(run_level(broker, store, env, session, concurrency,
                                         concurrency * args.jobs_per_process, latency_s,
                                         server.pid, Path(log_dir)))
                print(f"  done: {session.tokens:,} tokens, concurrency {concurrency}",
                      flush=True)
        engine.dispose()
    print_load()
    print_levels(results)


def print_levels(results: list[Level]) -> None:
    print_table(
        ("session tokens", "concurrency", "jobs", "jobs/s steady", "jobs/s end-to-end",
         "ideal jobs/s", "steady / ideal", "median job s", "worker CPU s/job",
         "server CPU s/job", "bench CPU s/job", "machine CPU busy", "outcomes"),
        [(r.session_tokens, r.concurrency, r.jobs, r.steady_jobs_per_s,
          r.end_to_end_jobs_per_s, r.ideal_jobs_per_s,
          f"{r.steady_jobs_per_s / r.ideal_jobs_per_s:.0%}", r.median_job_s,
          r.worker_cpu_s_per_job, r.server_cpu_s_per_job, r.bench_cpu_s_per_job,
          f"{r.machine_busy:.0%}",
          r.outcomes) for r in results])


if __name__ == "__main__":
    main()
