"""Peak memory of a worker compacting the largest sessions: the generated 1,000,000-token
session and the corpus's largest dev_long session, each in a fresh prefork worker
(concurrency 1, LLM summarizer on the OpenAI test server at latency 0).

The pool child's memory is read before its first job (RSS, PSS and private: it shares
the tokenizer and the imports its parent loaded before the fork), its RSS high-water mark
(``VmHWM``) after a small warm-up job and again after the big one; the peak's growth over
the baseline is set against the session's raw size (its messages as compact JSON).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    BenchWorker,
    Broker,
    ProcessMemory,
    llm_settings,
    openai_server,
    private_broker,
    private_database,
    proc_status_kib,
    settings_env,
    settled_memory,
)
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
from db import Store, create_db_engine
from worker.logging import JOB_EVENT

WARMUP_TOKENS = 20_000
MAX_CALLS = 2_000
MIB = 2**20


@dataclass(frozen=True)
class Peak:
    session: BenchSession
    baseline: ProcessMemory  # the pool child before its first job
    main: ProcessMemory  # the worker's main process, at the same time
    warm_hwm_kib: int
    peak_hwm_kib: int
    job_s: float
    outcome: str


def measure_peak(broker: Broker, store: Store, env: dict[str, str], session: BenchSession,
                 warmup: BenchSession, log_dir: Path) -> Peak:
    """Warm a fresh worker up, then compact ``session``; read the child's high-water mark."""
    tag = f"{session.name}-{len(session.rows)}"
    import_copies(store, warmup, [f"warm-{tag}"])
    import_copies(store, session, [tag])
    with BenchWorker(env, log_dir / f"{tag}.log") as worker:
        [child] = worker.child_pids()
        assert worker.process is not None
        baseline = settled_memory(child)
        main = settled_memory(worker.process.pid)
        broker.publish_jobs([f"warm-{tag}"], force=True)
        worker.wait_for(JOB_EVENT, 1, timeout_s=120)
        warm_kib = proc_status_kib(child, "VmHWM")
        broker.publish_jobs([tag], force=True)
        events = worker.wait_for(JOB_EVENT, 2, timeout_s=600)
        peak_kib = proc_status_kib(child, "VmHWM")
    event = next(e for e in events if e.get("session_id") == tag)
    return Peak(session, baseline, main, warm_kib, peak_kib,
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
        rows.append((peak.session.name, len(peak.session.rows), peak.session.tokens, raw_mib,
                     peak.baseline.rss_kib / 1024, peak.warm_hwm_kib / 1024,
                     peak.peak_hwm_kib / 1024, growth_mib, growth_mib / raw_mib,
                     peak.job_s, peak.outcome))
    print("\nPeak of the pool child (RSS high-water mark) against its baseline RSS:")
    print_table(("session", "messages", "tokens", "raw JSON MiB", "child RSS base MiB",
                 "child HWM warm MiB", "child HWM peak MiB", "peak - base MiB",
                 "growth / raw", "job s", "outcome"), rows)
    print(f"machine memory: {os_total_memory_bytes() / 2**30:.1f} GiB")


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--session-tokens", type=int, default=1_000_000)
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
        env = {**broker.env, **settings_env(
            database_url=url, **llm_settings(server.base_url, window_tokens=128_000,
                                             max_calls=MAX_CALLS))}
        engine = create_db_engine(url)
        peaks = [measure_peak(broker, Store(engine), env, s, warmup, Path(log_dir))
                 for s in sessions]
        engine.dispose()
    print_load()
    print_peaks(peaks)


if __name__ == "__main__":
    main()
