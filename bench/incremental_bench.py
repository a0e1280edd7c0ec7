"""Incremental re-compaction: a generated session is compacted, grows by 10%, and is
compacted again. The second job must read only the new span and the prior summary, so
its prompt tokens ÷ (new span + prior summary) stays near 1 (below 1 where old tool
outputs are pruned), however long the history behind the summary is.

Both jobs run the real pipeline in this process against the OpenAI test server (latency
0, its own process); both are forced, so a small growth is compacted too.
"""

from __future__ import annotations

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
from bench.sessions import (
    BenchSession,
    append_rows,
    generated_session,
    import_copies,
    new_counter,
    to_rows,
    tool_heavy_messages,
)
from worker.job.values import JobResult

MAX_CALLS = 2_000


@dataclass(frozen=True)
class Pair:
    """The first compaction and the one after growth, for one mode."""

    audit_mode: bool
    growth_tokens: int
    first: JobResult
    second: JobResult
    prior_summary_tokens: int


def compact_twice(session: BenchSession, growth: BenchSession, database_url: str,
                  base_url: str, window_tokens: int, audit_mode: bool) -> Pair:
    settings = llm_settings(base_url, window_tokens=window_tokens, max_calls=MAX_CALLS)
    with inline_runtime(database_url, audit_mode=audit_mode, **settings) as runtime:
        session_id = f"incremental-audit{int(audit_mode)}"
        import_copies(runtime.store, session, [session_id])
        first = run_inline(runtime, session_id, force=True)
        prior = runtime.store.revisions(session_id)[0] if first.revision_id else None
        append_rows(runtime.store, session_id, growth.rows)
        second = run_inline(runtime, session_id, force=True)
    return Pair(audit_mode, growth.tokens, first, second,
                prior.summary_tokens if prior else 0)


def print_pairs(pairs: list[Pair]) -> None:
    rows = []
    for pair in pairs:
        first, second = pair.first.figures.as_dict(), pair.second.figures.as_dict()
        span = int(second.get("span_tokens") or 0)
        prompt = int(second.get("prompt_tokens") or 0)
        read = span + pair.prior_summary_tokens
        rows.append((
            "audit (whole)" if pair.audit_mode else "pruned",
            int(first.get("prompt_tokens") or 0), pair.growth_tokens, span,
            pair.prior_summary_tokens, prompt, prompt / read if read else 0.0,
            second.get("llm_calls", "-"), second.get("chunks", "-"),
            pair.second.duration_ms / 1000,
            f"{pair.first.outcome.value}, {pair.second.outcome.value}"))
    print_table(("tool outputs", "1st job prompt tokens", "growth tokens", "new span tokens",
                 "prior summary tokens", "2nd job prompt tokens",
                 "prompt / (span + prior)", "2nd calls", "2nd chunks", "2nd job s",
                 "outcomes"), rows)


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--session-tokens", type=int, default=1_000_000)
    parser.add_argument("--growth", type=float, default=0.10, help="share of the session")
    parser.add_argument("--window", type=int, default=128_000, help="summarizer window")
    args = parser.parse_args()
    if args.quick:
        args.session_tokens, args.window = 30_000, 32_000
    print_header(f"incremental re-compaction after {args.growth:.0%} growth")
    counter = new_counter()
    session = generated_session(args.session_tokens, counter)
    growth_messages = tool_heavy_messages(int(session.tokens * args.growth), counter,
                                          seed=2, with_system=False)
    growth = BenchSession("growth", tuple(to_rows(growth_messages, counter)))
    print(f"session: {session.tokens:,} tokens, then {growth.tokens:,} more; "
          f"summarizer window {args.window:,}", flush=True)
    with openai_server(context_window=args.window) as server, private_database() as url:
        pairs = [compact_twice(session, growth, url, server.base_url, args.window, audit_mode)
                 for audit_mode in (False, True)]
    print_load()
    print_pairs(pairs)


if __name__ == "__main__":
    main()
