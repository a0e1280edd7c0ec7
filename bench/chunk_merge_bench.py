"""Chunk-and-merge on a session far over the summarizer's window: a generated tool-heavy
session of 1,000,000+ tokens compacted (forced) by the real pipeline in this process,
the OpenAI test server (latency 0, its own process) enforcing the window. Figures:
prompt tokens sent per span token, calls, chunks, merge rounds and wall time, per
window, with old tool outputs pruned to digests (the default) and whole (audit mode).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.common import (
    inline_runtime,
    llm_settings,
    openai_server,
    private_database,
    run_inline,
)
from bench.report import (
    bench_parser,
    print_header,
    print_load,
    print_table,
)
from bench.sessions import BenchSession, generated_session, import_copies, new_counter
from worker.job.values import JobResult

# Generous: the plan, not this cap, decides how many calls a job makes here.
MAX_CALLS = 2_000


@dataclass(frozen=True)
class Run:
    window_tokens: int
    audit_mode: bool
    result: JobResult
    wall_s: float


def run_one(session: BenchSession, database_url: str, window_tokens: int,
            audit_mode: bool) -> Run:
    """Compact one fresh copy of ``session`` with a summarizer of ``window_tokens``."""
    with openai_server(context_window=window_tokens) as server:
        settings = llm_settings(server.base_url, window_tokens=window_tokens, max_calls=MAX_CALLS)
        with inline_runtime(database_url, audit_mode=audit_mode, **settings) as runtime:
            session_id = f"w{window_tokens}-audit{int(audit_mode)}"
            import_copies(runtime.store, session, [session_id])
            started = time.monotonic()
            result = run_inline(runtime, session_id, force=True)
            wall_s = time.monotonic() - started
    return Run(window_tokens, audit_mode, result, wall_s)


def print_runs(runs: list[Run]) -> None:
    rows = []
    for run in runs:
        figures = run.result.figures.as_dict()
        span = int(figures.get("span_tokens") or 0)
        prompt = int(figures.get("prompt_tokens") or 0)
        rows.append((run.window_tokens, "audit (whole)" if run.audit_mode else "pruned",
                     span, prompt, prompt / span if span else 0.0,
                     figures.get("llm_calls", "-"), figures.get("chunks", "-"),
                     figures.get("merge_rounds", "-"), run.wall_s,
                     run.result.durations_ms.get("summarize", 0.0) / 1000,
                     run.result.outcome.value))
    print_table(("window", "tool outputs", "span tokens", "prompt tokens", "prompt / span",
                 "calls", "chunks", "merge rounds", "wall s", "summarize s", "outcome"), rows)


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--session-tokens", type=int, default=1_000_000)
    parser.add_argument("--windows", default="32000,128000", help="comma-separated tokens")
    args = parser.parse_args()
    if args.quick:
        args.session_tokens, args.windows = 40_000, "16000"
    print_header("chunk-and-merge on a session over the summarizer window")
    session = generated_session(args.session_tokens, new_counter())
    print(f"session: {session.tokens:,} tokens, {len(session.rows):,} messages, "
          f"{session.json_bytes / 2**20:.1f} MiB of JSON", flush=True)
    runs = []
    with private_database() as url:
        for window in (int(w) for w in args.windows.split(",")):
            for audit_mode in (False, True):
                runs.append(run_one(session, url, window, audit_mode))
                print(f"  done: window {window:,}, audit_mode={audit_mode}", flush=True)
    print_load()
    print_runs(runs)


if __name__ == "__main__":
    main()
