"""Peak memory of a worker compacting the largest sessions: the generated 1,000,000-token
session and the corpus's largest dev_long session, each in a fresh prefork worker
(concurrency 1, LLM summarizer on the OpenAI test server at latency 0).

The worker starts as the deploy files start it, ``compactor worker``. The pool child's
memory is read before its first job (RSS, PSS and private: it shares the tokenizer and
the imports its parent loaded before the fork), its RSS high-water mark
(``VmHWM``) after a small warm-up job and again after the big one; the peak's growth over
the baseline, and over the warm-up's mark, is set against the session's raw size (its
messages as compact JSON). The child's file-backed pages (``RssFile``: the code of the
libraries it runs, shared through the page cache) are read at each point: a fork does not
map them in the child, so its first job faults in the pages it runs, which RSS counts.

The floor under the child's baseline is measured too: a bare Celery worker started the
same way, loading before its pool forks only the libraries the mission fixes (the
tokenizer, the OpenAI SDK, SQLAlchemy and psycopg, the ORM, pydantic, structlog and
Redis; ``bench/floor_worker.py``), one at a time and together, and none of the service's
code.

``--heap`` also runs the generated session's job in this process under ``tracemalloc``:
the Python heap's peak in each step, and the allocation sites (the innermost frame in the
service's own code) that hold the most when the swap begins.
"""

from __future__ import annotations

import linecache
import sys
import tempfile
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    BenchWorker,
    Broker,
    ProcessMemory,
    inline_runtime,
    llm_settings,
    openai_server,
    private_broker,
    private_database,
    proc_status_kib,
    run_inline,
    settings_env,
    settled_memory,
)
from bench.floor_worker import LIBRARIES_VARIABLE
from bench.report import (
    bench_parser,
    os_total_memory_bytes,
    print_header,
    print_load,
    print_table,
)
from bench.sessions import (
    BenchSession,
    generated_session,
    import_copies,
    largest_corpus_session,
    new_counter,
    smallest_corpus_session,
)
from bench.startup_bench import tiktoken_cache
from db import Store, create_db_engine
from tests.support.worker_process import REPO_ROOT
from worker.job.values import JobTrace
from worker.logging import JOB_EVENT

WARMUP_TOKENS = 20_000
MAX_CALLS = 2_000
MIB = 2**20
# The floor's library sets (``bench/floor_worker.py``): Celery alone, each library on
# its own, then together, with and without the ORM.
FLOOR_SETS = (
    ("Celery alone", ""),
    ("+ tokenizer (o200k_base)", "tokenizer"),
    ("+ OpenAI SDK", "sdk"),
    ("+ SQLAlchemy Core, psycopg", "sqlalchemy"),
    ("+ SQLAlchemy Core and ORM, psycopg", "sqlalchemy,orm"),
    ("+ pydantic, settings, structlog, redis", "support"),
    ("all but the ORM", "tokenizer,sdk,sqlalchemy,support"),
    ("all of them", "tokenizer,sdk,sqlalchemy,orm,support"),
)
HEAP_SITES = 12
TRACED_FRAMES = 25


@dataclass(frozen=True)
class Peak:
    session: BenchSession
    baseline: ProcessMemory  # the pool child before its first job
    main: ProcessMemory  # the worker's main process, at the same time
    warm_hwm_kib: int
    peak_hwm_kib: int
    file_kib: tuple[int, int, int]  # RssFile before its first job, after each job
    job_s: float
    outcome: str


class CompactorBenchWorker(BenchWorker):
    """``compactor worker``, which runs Celery's worker command in a process that holds
    none of the command line's modules (``celery -A ... worker`` loads Celery's whole
    command group: ~10 MiB more in every child)."""

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "scheduler", "worker",
                f"--concurrency={self.concurrency}"]


class FloorWorker(BenchWorker):
    """``bench/floor_worker.py``, started as ``compactor worker`` starts the service's."""

    def argv(self) -> list[str]:
        return [sys.executable, "-P", "-m", "bench.floor_worker", "--pool=prefork",
                f"--concurrency={self.concurrency}", f"--queues={self.queue}",
                "--loglevel=INFO", "-O", "fair", "--without-gossip", "--without-mingle"]


def measure_floor(env: dict[str, str], libraries: str, log_path: Path) -> ProcessMemory:
    """The pool child's memory before any task, in a floor worker that loads
    ``libraries`` before its pool forks."""
    with FloorWorker({**env, LIBRARIES_VARIABLE: libraries}, log_path) as worker:
        [child] = worker.child_pids()
        return settled_memory(child)


def print_floor(floors: list[tuple[str, ProcessMemory]], service: ProcessMemory) -> None:
    print("\nThe floor: the pool child of a bare Celery worker that loads only the "
          "mission's fixed libraries before its pool forks (MiB):")
    rows = [(name, memory.rss_kib / 1024, memory.pss_kib / 1024, memory.uss_kib / 1024)
            for name, memory in [*floors, ("the service's child (above)", service)]]
    print_table(("libraries loaded before the fork", "floor child RSS MiB",
                 "floor child PSS MiB", "floor child private MiB"), rows)


def measure_peak(broker: Broker, store: Store, env: dict[str, str], session: BenchSession,
                 warmup: BenchSession, log_dir: Path) -> Peak:
    """Warm a fresh worker up, then compact ``session``; read the child's high-water mark."""
    tag = f"{session.name}-{len(session.rows)}"
    import_copies(store, warmup, [f"warm-{tag}"])
    import_copies(store, session, [tag])
    with CompactorBenchWorker(env, log_dir / f"{tag}.log") as worker:
        [child] = worker.child_pids()
        assert worker.process is not None
        baseline = settled_memory(child)
        main = settled_memory(worker.process.pid)
        file_kib = [proc_status_kib(child, "RssFile")]
        broker.publish_jobs([f"warm-{tag}"], force=True)
        worker.wait_for(JOB_EVENT, 1, timeout_s=120)
        warm_kib = proc_status_kib(child, "VmHWM")
        file_kib.append(proc_status_kib(child, "RssFile"))
        broker.publish_jobs([tag], force=True)
        events = worker.wait_for(JOB_EVENT, 2, timeout_s=600)
        peak_kib = proc_status_kib(child, "VmHWM")
        file_kib.append(proc_status_kib(child, "RssFile"))
    event = next(e for e in events if e.get("session_id") == tag)
    before, warmed, after = file_kib
    return Peak(session, baseline, main, warm_kib, peak_kib, (before, warmed, after),
                float(event["duration_ms"]) / 1000, str(event["outcome"]))


def print_peaks(peaks: list[Peak]) -> None:
    print("\nPool child before its first job, and the worker's main process (MiB):")
    print_table(("session", "child RSS", "child PSS", "child private", "main RSS",
                 "main PSS", "main private"),
                [(p.session.name, *(kib / 1024 for kib in (
                    p.baseline.rss_kib, p.baseline.pss_kib, p.baseline.uss_kib,
                    p.main.rss_kib, p.main.pss_kib, p.main.uss_kib))) for p in peaks])
    rows = []
    for peak in peaks:
        raw_mib = peak.session.json_bytes / MIB
        growth_mib = (peak.peak_hwm_kib - peak.baseline.rss_kib) / 1024
        over_warm_mib = (peak.peak_hwm_kib - peak.warm_hwm_kib) / 1024
        rows.append((peak.session.name, len(peak.session.rows), peak.session.tokens, raw_mib,
                     peak.baseline.rss_kib / 1024, peak.warm_hwm_kib / 1024,
                     peak.peak_hwm_kib / 1024, growth_mib, growth_mib / raw_mib,
                     over_warm_mib, over_warm_mib / raw_mib,
                     " / ".join(f"{kib / 1024:.1f}" for kib in peak.file_kib),
                     peak.job_s, peak.outcome))
    print("\nPeak of the pool child (RSS high-water mark) against its baseline RSS, and "
          "against its mark after the warm-up job:")
    print_table(("session", "messages", "tokens", "raw JSON MiB", "child RSS base MiB",
                 "child HWM warm MiB", "child HWM peak MiB", "peak - base MiB",
                 "growth / raw", "peak - warm MiB", "over warm / raw",
                 "file pages MiB base / warm / peak", "job s", "outcome"), rows)
    print(f"machine memory: {os_total_memory_bytes() / 2**30:.1f} GiB")


def trace_heap(url: str, llm: dict[str, object], session: BenchSession,
               warmup: BenchSession) -> None:
    """Run ``session``'s job in this process under tracemalloc (after a warm-up job) and
    print the heap's peak per step and the biggest holders at the swap."""
    with inline_runtime(url, **llm) as runtime:
        import_copies(runtime.store, warmup, ["heap-warm"])
        import_copies(runtime.store, session, ["heap"])
        run_inline(runtime, "heap-warm", force=True)
        steps: list[tuple[str, float, float]] = []
        at_swap: list[tracemalloc.Snapshot] = []
        commit_job = runtime.store.commit_job

        def snapshot_then_commit(*args: Any, **kwargs: Any) -> int:
            at_swap.append(tracemalloc.take_snapshot())
            return commit_job(*args, **kwargs)

        runtime.store.commit_job = snapshot_then_commit  # type: ignore[method-assign]  # bench only
        tracemalloc.start(TRACED_FRAMES)
        try:
            with step_heap_recorded(steps):
                outcome = run_inline(runtime, "heap", force=True).outcome.value
        finally:
            tracemalloc.stop()
    # Each step resets tracemalloc's peak: the job's is the highest step's.
    peak = max(top for _, _, top in steps)
    print(f"\nPython heap of one in-process job ({session.name}, {outcome}; tracemalloc, "
          f"MiB): peak {peak / MIB:.1f} = {peak / session.json_bytes:.1f} x raw")
    print_table(("step", "heap at start", "peak in step"),
                [(name, start / MIB, top / MIB) for name, start, top in steps])
    if at_swap:
        print("\nWhat the heap holds as the swap begins, by allocation site (MiB):")
        print_table(("MiB", "blocks", "site", "code"), heap_sites(at_swap[0]))


@contextmanager
def step_heap_recorded(steps: list[tuple[str, float, float]]) -> Iterator[None]:
    """Record each pipeline step's traced heap at its start and its peak inside it."""
    wall_step = JobTrace.step

    @contextmanager
    def step(trace: JobTrace, name: str) -> Iterator[None]:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        try:
            with wall_step(trace, name):
                yield
        finally:
            steps.append((name, start, tracemalloc.get_traced_memory()[1]))

    JobTrace.step = step  # type: ignore[method-assign,assignment]  # bench only, restored below
    try:
        yield
    finally:
        JobTrace.step = wall_step  # type: ignore[method-assign]


def heap_sites(snapshot: tracemalloc.Snapshot) -> list[tuple[float, int, str, str]]:
    """The biggest holders, each charged to the innermost frame of its allocation that is
    the service's own code (a library's allocation goes to the line that called it)."""
    sizes: Counter[tuple[str, int]] = Counter()
    blocks: Counter[tuple[str, int]] = Counter()
    for stat in snapshot.statistics("traceback"):
        site = ("(elsewhere)", 0)
        for frame in reversed(stat.traceback):  # oldest first: walk from the innermost
            if frame.filename.startswith(str(REPO_ROOT)) and "/.venv/" not in frame.filename:
                site = (frame.filename, frame.lineno)
                break
        sizes[site] += stat.size
        blocks[site] += stat.count
    return [(size / MIB, blocks[site], f"{Path(site[0]).relative_to(REPO_ROOT)}:{site[1]}"
             if site[1] else site[0], linecache.getline(*site).strip()[:70] if site[1] else "")
            for site, size in sizes.most_common(HEAP_SITES)]


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--session-tokens", type=int, default=1_000_000)
    parser.add_argument("--heap", action="store_true",
                        help="also trace one in-process job's Python heap (tracemalloc)")
    args = parser.parse_args()
    if args.quick:
        args.session_tokens = 30_000
    print_header("peak worker memory on the largest sessions")
    counter = new_counter()
    corpus = (smallest_corpus_session if args.quick else largest_corpus_session)(counter)
    if corpus is None:
        print("corpus absent: only the generated session is measured")
    sessions = [generated_session(args.session_tokens, counter), *([corpus] if corpus else [])]
    if args.quick:
        # One worker start is enough to keep the script from rotting.
        sessions = sessions[-1:]
    warmup = generated_session(WARMUP_TOKENS, counter, seed=3)
    with (tempfile.TemporaryDirectory() as log_dir, openai_server() as server,
          private_database() as url, private_broker(url) as broker):
        llm = llm_settings(server.base_url, window_tokens=128_000, max_calls=MAX_CALLS)
        env = {**broker.env, **settings_env(database_url=url, **llm)}
        engine = create_db_engine(url)
        peaks = [measure_peak(broker, Store(engine), env, s, warmup, Path(log_dir))
                 for s in sessions]
        engine.dispose()
        print_load()
        print_peaks(peaks)
        floor_env = {**broker.env,
                     "TIKTOKEN_CACHE_DIR": str(tiktoken_cache(Path(log_dir)))}
        floor_sets = FLOOR_SETS[-1:] if args.quick else FLOOR_SETS
        floors = [(name, measure_floor(floor_env, libraries, Path(log_dir) / f"floor{i}.log"))
                  for i, (name, libraries) in enumerate(floor_sets)]
        print_load()
        print_floor(floors, peaks[0].baseline)
        if args.heap:
            trace_heap(url, llm, sessions[0], warmup)


if __name__ == "__main__":
    main()
