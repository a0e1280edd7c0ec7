"""Worker CPU per compaction job, excluding the LLM: the extractive summarizer, the real
pipeline in this process on PostgreSQL, each job on its own copy of a generated session.

One untimed warm-up job per size, then ``gc.freeze()`` as a worker does after its first
job; each timed job's process CPU time (``time.process_time``) and wall time are
printed as min / median, then each step's CPU time (median). ``--profile`` runs one more
job per size under cProfile and prints its top functions by cumulative, then by own time.
"""

from __future__ import annotations

import cProfile
import gc
import pstats
import time
from collections.abc import Iterator
from contextlib import contextmanager

from bench.common import inline_runtime, private_database, run_inline
from bench.report import bench_parser, median, print_header, print_load, print_table
from bench.sessions import BenchSession, generated_session, import_copies, new_counter
from worker.errors import Outcome
from worker.job import JobTrace

PROFILE_LINES = 35
STEPS = ("lease", "breaker", "snapshot", "plan", "summarize", "merge", "validate", "swap")


@contextmanager
def step_cpu_recorded(cpu_ms: dict[str, list[float]]) -> Iterator[None]:
    """Record each pipeline step's CPU time (this thread's) into ``cpu_ms`` as well: the
    job's own ``durations_ms`` are wall times."""
    wall_step = JobTrace.step

    @contextmanager
    def step(trace: JobTrace, name: str) -> Iterator[None]:
        began = time.thread_time()
        try:
            with wall_step(trace, name):
                yield
        finally:
            cpu_ms.setdefault(name, []).append((time.thread_time() - began) * 1000)

    JobTrace.step = step  # type: ignore[method-assign,assignment]  # bench only, restored below
    try:
        yield
    finally:
        JobTrace.step = wall_step  # type: ignore[method-assign]


def time_jobs(database_url: str, session: BenchSession, jobs: int, *, profile: bool
              ) -> tuple[list[float], list[float], dict[str, list[float]]]:
    """CPU and wall ms of ``jobs`` timed jobs on copies of ``session``, and their steps'
    CPU ms."""
    ids = [f"cpu-{session.tokens}-{i}" for i in range(jobs + 2)]
    with inline_runtime(database_url, summarizer="extractive",
                        model_context_tokens=round(session.tokens * 1.28),
                        tail_budget_tokens=min(8_000, session.tokens // 12)) as runtime:
        import_copies(runtime.store, session, ids)
        _checked(run_inline(runtime, ids[0]).outcome)
        gc.freeze()
        cpu_ms: list[float] = []
        wall_ms: list[float] = []
        step_ms: dict[str, list[float]] = {}
        with step_cpu_recorded(step_ms):
            for session_id in ids[1:-1]:
                cpu0, wall0 = time.process_time(), time.perf_counter()
                _checked(run_inline(runtime, session_id).outcome)
                cpu_ms.append((time.process_time() - cpu0) * 1000)
                wall_ms.append((time.perf_counter() - wall0) * 1000)
        if profile:
            profiler = cProfile.Profile()
            profiler.enable()
            _checked(run_inline(runtime, ids[-1]).outcome)
            profiler.disable()
            print(f"\ncProfile of one {session.tokens:,}-token job:")
            stats = pstats.Stats(profiler)
            stats.sort_stats("cumulative").print_stats(PROFILE_LINES)
            stats.sort_stats("tottime").print_stats(PROFILE_LINES)
    return cpu_ms, wall_ms, step_ms


def _checked(outcome: Outcome) -> None:
    if outcome is not Outcome.COMPACTED:
        raise RuntimeError(f"a measured job was {outcome.value}, not compacted")


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--jobs", type=int, default=5, help="timed jobs per size")
    parser.add_argument("--session-tokens", default="5000,100000,1000000",
                        help="comma-separated")
    parser.add_argument("--profile", action="store_true", help="cProfile one more job")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.session_tokens = 1, "3000"
    print_header("worker CPU per job, extractive summarizer, in-process")
    counter = new_counter()
    sessions = [generated_session(int(t), counter) for t in args.session_tokens.split(",")]
    rows, step_rows = [], []
    with private_database() as url:
        for session in sessions:
            cpu_ms, wall_ms, step_ms = time_jobs(url, session, args.jobs, profile=args.profile)
            rows.append((session.tokens, len(session.rows), len(cpu_ms), min(cpu_ms),
                         median(cpu_ms), min(wall_ms), median(wall_ms)))
            step_rows.append((session.tokens,
                              *(median(step_ms[step]) if step in step_ms else 0.0
                                for step in STEPS)))
    print_table(("session tokens", "messages", "jobs", "CPU ms min", "CPU ms median",
                 "wall ms min", "wall ms median"), rows)
    print("\nCPU ms per step (median; the thread's CPU time inside each step):")
    print_table(("session tokens", *STEPS), step_rows)
    print_load()


if __name__ == "__main__":
    main()
