"""A night in batch mode against the same night synchronous (issue 36): N generated due
sessions (about one in three long enough for chunk-and-merge) compacted on PostgreSQL
through the Batch API of the test server (jobs park, the poller submits and collects,
the answered jobs run again until none is sent), then the same sessions compacted
synchronously on a fresh database. Prints both nights' calls, tokens by kind and cost,
their ratio, and what the batch night left: sessions not compacted, messages lost,
parked rows, leases held.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import private_database
from bench.report import bench_parser, print_header, print_load, print_table
from db import upgrade_database
from tests.support.batch_night import (
    MODEL,
    WINDOW_TOKENS,
    batch_night,
    compacted_costs,
    import_all,
    night_sessions,
    run_jobs,
    runtime_for,
)
from tests.support.openai_server import OpenAIServer
from worker.job.values import JobRequest

FIGURES = ("llm_calls", "prompt_tokens", "cached_tokens", "completion_tokens", "cost_usd")


def batch_run(url: str, sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """The batch night on ``url``: its runs' sums and what it left behind."""
    ids = [session["session_id"] for session in sessions]
    with OpenAIServer(model=MODEL, context_window=WINDOW_TOKENS, latency_ms=0) as server:
        runtime = runtime_for(url, server, "batch")
        try:
            import_all(runtime, sessions)
            began = time.monotonic()
            results, batches = batch_night(runtime, server, ids)
            took_s = time.monotonic() - began
            runs = compacted_costs(runtime.store, ids)
            store = runtime.store
            left = {
                "not compacted": sum(session_id not in runs for session_id in ids),
                "messages lost": sum(len(store.messages(s["session_id"])) != len(s["messages"])
                                     for s in sessions),
                "parked rows left": len(store.parked_jobs()),
                "leases held": sum(store.get_session(i).lease_owner is not None for i in ids),
                "parks": sum(r.outcome.value == "parked" for rs in results.values() for r in rs),
                "batches": batches, "seconds the batch night took": round(took_s, 1),
            }
        finally:
            runtime.close()
    return {"sums": _sums(runs), "left": left, "runs": runs}


def sync_run(sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """The same sessions compacted synchronously, on a fresh SQLite database."""
    ids = [session["session_id"] for session in sessions]
    with tempfile.TemporaryDirectory() as directory, \
            OpenAIServer(model=MODEL, context_window=WINDOW_TOKENS, latency_ms=0) as server:
        url = f"sqlite:///{Path(directory) / 'sync.db'}"
        upgrade_database(url)
        runtime = runtime_for(url, server, "sync")
        try:
            import_all(runtime, sessions)
            outcomes = Counter(result.outcome.value for result in
                               run_jobs(runtime, [JobRequest(i, "nightly") for i in ids]))
            runs = compacted_costs(runtime.store, ids)
        finally:
            runtime.close()
    return {"sums": _sums(runs), "outcomes": outcomes, "runs": runs}


def _sums(runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    return {name: sum(figures[name] or 0 for figures in runs.values()) for name in FIGURES}


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--seed", type=int, default=200)
    args = parser.parse_args()
    if args.quick:
        args.sessions = 6
    print_header(f"a batch-mode night of {args.sessions} due sessions against it synchronous")
    sessions = night_sessions(seed=args.seed, count=args.sessions)
    with private_database() as url:
        batched = batch_run(url, sessions)
    synchronous = sync_run(sessions)
    print_load()
    chunked = sum((figures["merge_rounds"] or 0) > 0 for figures in synchronous["runs"].values())
    print(f"sessions: {args.sessions} (seed {args.seed}), {chunked} of them chunk-and-merge; "
          f"synchronous outcomes {dict(synchronous['outcomes'])}")
    rows = [[name, _shown(batched["sums"][name]), _shown(synchronous["sums"][name])]
            for name in FIGURES]
    cost = batched["sums"]["cost_usd"] / (synchronous["sums"]["cost_usd"] or float("nan"))
    print_table(["figure", "batch", "synchronous"], rows)
    print(f"cost ratio (batch / synchronous): {cost:.4f}")
    print_table(["left by the batch night", "count"],
                [[name, str(value)] for name, value in batched["left"].items()])
    per_session = [batched["runs"][i]["cost_usd"] / synchronous["runs"][i]["cost_usd"]
                   for i in batched["runs"] if synchronous["runs"].get(i, {}).get("cost_usd")]
    if per_session:
        print(f"per-session cost ratio: min {min(per_session):.4f}, median "
              f"{statistics.median(per_session):.4f}, max {max(per_session):.4f}")


def _shown(value: float) -> str:
    return f"{value:,.6f}" if isinstance(value, float) and not value.is_integer() \
        else f"{int(value):,}"


if __name__ == "__main__":
    main()
