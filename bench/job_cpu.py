"""Worker CPU per compaction job, excluding the LLM: the real pipeline in this process on
PostgreSQL, each job on its own copy of a generated session. The extractive summarizer by
default; ``--summarizer llm`` calls the OpenAI test server (its own process, answering at
once, or after ``--latency-ms``), so what is timed is the worker's side of each call
(prompt, request, reply, validation), and the server's CPU per call is printed beside it.
"Local wall" is the wall less the server's delay per call: what a job adds to the
model's latency (work done while it waits, on another thread, is not in it).

One untimed warm-up job per size, then ``gc.freeze()`` as a worker does after its first
job; each timed job's process CPU time (``time.process_time``) and wall time are
printed as min / median, then each step's CPU time (median). ``--profile`` runs one more
job per size under cProfile and prints its top functions by cumulative, then by own time.
``--skip breaker_open`` opens each copy's breaker first, ``--skip under_trigger`` sets
the trigger above the session: every job is then one that ends with that outcome or
reason, which reads the session row and no message. ``--format responses|anthropic``
times the sessions rewritten in that format (reasoning or thinking added), from a shorter
conversation so they hold the tokens asked for as chat's do (issue 35 compares formats
per job at one size); ``--same-conversation`` rewrites the chat session itself (more
tokens).
"""

from __future__ import annotations

import cProfile
import gc
import pstats
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

from bench.common import (
    ServerProcess,
    inline_runtime,
    llm_settings,
    openai_server,
    private_database,
    proc_cpu_s,
    run_inline,
)
from bench.report import bench_parser, median, print_header, print_load, print_table
from bench.sessions import BenchSession, generated_session, import_copies, new_counter
from db import BreakerUpdate
from worker.compaction import SessionFormat
from worker.errors import Outcome
from worker.job.values import JobResult, JobTrace

PROFILE_LINES = 35
# "lease" takes the lease and reads the snapshot (on PostgreSQL one statement).
STEPS = ("lease", "breaker", "plan", "summarize", "merge", "validate", "swap")
# The summarizer's window (a 128k-token model); the call budget lets a 1M-token span chunk.
LLM_WINDOW_TOKENS = 128_000
LLM_MAX_CALLS = 64
# ``--skip`` reasons, and the outcome of such a job.
SKIPS = {"breaker_open": Outcome.BREAKER_OPEN, "under_trigger": Outcome.SKIPPED}


@dataclass
class Timings:
    """What the timed jobs of one size cost (ms); the server's CPU over their calls."""

    cpu_ms: list[float] = field(default_factory=list)
    wall_ms: list[float] = field(default_factory=list)
    step_ms: dict[str, list[float]] = field(default_factory=dict)
    server_cpu_ms: float = 0.0
    llm_calls: int = 0


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


def time_jobs(database_url: str, session: BenchSession, jobs: int, *, profile: bool,
              server: ServerProcess | None, skip: str | None = None) -> Timings:
    """Time ``jobs`` jobs on copies of ``session``, with the LLM summarizer at ``server``
    when one is given, else the extractive one; with ``skip``, jobs skipped for that
    reason (``SKIPS``)."""
    ids = [f"cpu-{session.tokens}-{i}" for i in range(jobs + 2)]
    summarizer: dict[str, object] = {"summarizer": "extractive"}
    if server is not None:
        summarizer = llm_settings(server.base_url, window_tokens=LLM_WINDOW_TOKENS,
                                  max_calls=LLM_MAX_CALLS)
    timings = Timings()
    # Under the trigger: a window whose trigger (70% of it) is over the whole session.
    window_tokens = session.tokens * (2 if skip == "under_trigger" else 1.28)
    with inline_runtime(database_url, **summarizer, model_context_tokens=round(window_tokens),
                        tail_budget_tokens=min(8_000, session.tokens // 12)) as runtime:
        import_copies(runtime.store, session, ids)
        expected = SKIPS[skip] if skip else Outcome.COMPACTED
        if skip == "breaker_open":
            for session_id in ids:
                runtime.store.set_breaker(session_id, BreakerUpdate("open", 3, datetime.now(UTC)))
        _checked(run_inline(runtime, ids[0]), expected)
        gc.freeze()
        server_cpu_s = proc_cpu_s(server.pid) if server else 0.0
        with step_cpu_recorded(timings.step_ms):
            for session_id in ids[1:-1]:
                cpu0, wall0 = time.process_time(), time.perf_counter()
                result = _checked(run_inline(runtime, session_id), expected)
                timings.cpu_ms.append((time.process_time() - cpu0) * 1000)
                timings.wall_ms.append((time.perf_counter() - wall0) * 1000)
                timings.llm_calls += result.figures.llm_calls or 0
        if server is not None:
            timings.server_cpu_ms = (proc_cpu_s(server.pid) - server_cpu_s) * 1000
        if profile:
            profiler = cProfile.Profile()
            profiler.enable()
            _checked(run_inline(runtime, ids[-1]), expected)
            profiler.disable()
            print(f"\ncProfile of one {session.tokens:,}-token job:")
            stats = pstats.Stats(profiler)
            stats.sort_stats("cumulative").print_stats(PROFILE_LINES)
            stats.sort_stats("tottime").print_stats(PROFILE_LINES)
    return timings


def _checked(result: JobResult, expected: Outcome) -> JobResult:
    if result.outcome is not expected:
        raise RuntimeError(f"a measured job was {result.outcome.value}, not {expected.value}")
    return result


@contextmanager
def server_if(wanted: bool, latency_ms: int) -> Iterator[ServerProcess | None]:
    """The OpenAI test server, answering after ``latency_ms``, when ``wanted``."""
    if not wanted:
        yield None
        return
    with openai_server(context_window=LLM_WINDOW_TOKENS, latency_ms=latency_ms) as server:
        yield server


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--jobs", type=int, default=5, help="timed jobs per size")
    parser.add_argument("--session-tokens", default="5000,100000,1000000",
                        help="comma-separated")
    parser.add_argument("--profile", action="store_true", help="cProfile one more job")
    parser.add_argument("--skip", choices=sorted(SKIPS),
                        help="time jobs skipped for this reason instead")
    parser.add_argument("--summarizer", choices=("extractive", "llm"), default="extractive")
    parser.add_argument("--format", choices=[f.value for f in SessionFormat],
                        default=SessionFormat.CHAT.value, help="the sessions' format")
    parser.add_argument("--same-conversation", action="store_true",
                        help="rewrite chat's conversation in --format (more tokens) rather "
                             "than one of the same size in tokens")
    parser.add_argument("--latency-ms", type=int, default=0,
                        help="the LLM server's delay per call: wall minus it is the job's "
                             "local wall, the work it does besides waiting on the model")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.session_tokens = 1, "3000"
    print_header(f"worker CPU per job, {args.summarizer} summarizer, {args.format} "
                 "sessions, in-process"
                 + (f", jobs skipped ({args.skip})" if args.skip else ""))
    counter = new_counter()
    sessions = [generated_session(int(t), counter, session_format=SessionFormat(args.format),
                                  sized_in_format=not args.same_conversation)
                for t in args.session_tokens.split(",")]
    rows, step_rows = [], []
    with private_database() as url, server_if(args.summarizer == "llm",
                                                         args.latency_ms) as server:
        for session in sessions:
            timed = time_jobs(url, session, args.jobs, profile=args.profile, server=server,
                              skip=args.skip)
            calls_per_job = timed.llm_calls / len(timed.cpu_ms)
            rows.append((session.tokens, len(session.rows), len(timed.cpu_ms),
                         min(timed.cpu_ms), median(timed.cpu_ms), min(timed.wall_ms),
                         median(timed.wall_ms),
                         median(timed.wall_ms) - calls_per_job * args.latency_ms,
                         calls_per_job, timed.server_cpu_ms / max(timed.llm_calls, 1)))
            step_rows.append((session.tokens,
                              *(median(timed.step_ms[step]) if step in timed.step_ms else 0.0
                                for step in STEPS)))
    print_table(("session tokens", "messages", "jobs", "CPU ms min", "CPU ms median",
                 "wall ms min", "wall ms median", "local wall ms median",
                 "LLM calls per job",
                 "server CPU ms per call"), rows)
    print("\nCPU ms per step (median; the thread's CPU time inside each step):")
    print_table(("session tokens", *STEPS), step_rows)
    print_load()


if __name__ == "__main__":
    main()
