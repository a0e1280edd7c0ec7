"""Per-job orchestration overhead: compaction jobs with an instant summarizer (extractive,
and the OpenAI test server at latency 0) against a bare Celery no-op task, on the same
prefork worker (concurrency 1) and broker, interleaved in rounds.

The queue holds, round after round, a block of no-ops then a block of compaction jobs,
and is filled before the worker starts, so jobs run back to back in that order. A
block's per-job wall time is the spacing of its last completion from the previous
block's, over its size; each round gives one ratio (compaction / no-op), and the script
prints their min and median: the no-op's own time swings with the machine's load, and
only a ratio taken side by side holds still.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tiktoken
from celery import Task
from sqlalchemy import Connection, event
from sqlalchemy.engine import Engine

from bench.common import (
    BenchWorker,
    Broker,
    event_time_s,
    inline_runtime,
    openai_server,
    private_broker,
    private_database,
    run_inline,
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
from worker.broker.celery_app import app
from worker.compaction.identifiers import extract_identifiers
from worker.compaction.messages import StoredMessage, parse_message
from worker.logging import JOB_EVENT, get_logger

NOOP_TASK = "bench.noop"
NOOP_EVENT = "bench.noop"
IDENTIFIER_REPEATS = 5
# "lease" takes the lease and reads the snapshot (on PostgreSQL one statement).
STEPS = ("lease", "breaker", "plan", "summarize", "merge", "validate", "swap")
# The real app with one more task: the worker that runs the jobs runs the no-ops too.
WORKER_APP = "bench.job_overhead:app"


@app.task(name=NOOP_TASK, bind=True)  # type: ignore[untyped-decorator]  # Celery: no hints
def noop(self: Task) -> None:
    # One log line per task, as the real task's one outcome event.
    get_logger().info(NOOP_EVENT, task_id=self.request.id)


@dataclass(frozen=True)
class Variant:
    """One kind of compaction job: its worker's settings and its sessions' copies."""

    name: str
    env: dict[str, str]
    session_ids: tuple[str, ...]
    is_llm: bool


@dataclass(frozen=True)
class Measured:
    name: str
    ratios: list[float]  # per round: compaction per-job ms / no-op per-job ms
    noop_ms: list[float]  # per round
    job_ms: list[float]  # per round
    events: list[dict[str, Any]]  # the timed compaction jobs' events
    llm_ms: list[float] = field(default_factory=list)  # per timed job, inside summarize


def queue_rounds(broker: Broker, variant: Variant, rounds: int, per_round: int,
                 warmup: int) -> list[tuple[str, list[str]]]:
    """Queue the warm-up jobs, then ``rounds`` x (no-op block, compaction block); return
    the blocks in queue order as (kind, task ids)."""
    sessions = iter(variant.session_ids)
    blocks: list[tuple[str, list[str]]] = [
        ("warmup", _publish_noops(broker, warmup) +
         broker.publish_jobs([next(sessions) for _ in range(warmup)]))]
    for _ in range(rounds):
        blocks.append(("noop", _publish_noops(broker, per_round)))
        blocks.append(("job", broker.publish_jobs([next(sessions) for _ in range(per_round)])))
    return blocks


def _publish_noops(broker: Broker, count: int) -> list[str]:
    ids = [f"bench-noop-{uuid.uuid4().hex}" for _ in range(count)]
    for task_id in ids:
        broker.app.send_task(NOOP_TASK, task_id=task_id, queue=broker.settings.queue_name)
    return ids


def measure(broker: Broker, variant: Variant, rounds: int, per_round: int, warmup: int,
            log_dir: Path, store: Store) -> Measured:
    """Let one worker drain the interleaved rounds; time each block by its completions."""
    blocks = queue_rounds(broker, variant, rounds, per_round, warmup)
    total = sum(len(ids) for _, ids in blocks)
    with BenchWorker(variant.env, log_dir / f"{uuid.uuid4().hex}.log", app=WORKER_APP) as worker:
        worker.wait_for(NOOP_EVENT, total - rounds * per_round - warmup,
                        timeout_s=60 + total * 30)
        worker.wait_for(JOB_EVENT, rounds * per_round + warmup, timeout_s=60 + total * 30)
        done = {e["task_id"]: e for e in worker.events(NOOP_EVENT) + worker.events(JOB_EVENT)
                if "task_id" in e}
    ends = [max(event_time_s(done[task_id]) for task_id in ids) for _, ids in blocks]
    per_job = [(ends[i] - ends[i - 1]) * 1000 / len(blocks[i][1]) for i in range(1, len(blocks))]
    noop_ms, job_ms = per_job[0::2], per_job[1::2]
    timed = [done[task_id] for kind, ids in blocks if kind == "job" for task_id in ids]
    return Measured(variant.name, [j / n for j, n in zip(job_ms, noop_ms, strict=True)],
                    noop_ms, job_ms, timed,
                    llm_latency_ms(store, {str(e["session_id"]) for e in timed})
                    if variant.is_llm else [])


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
        variants.append(Variant(f"compaction, {session.tokens:,} tokens ({kind})",
                                {**env, **extra}, ids, kind.startswith("LLM")))
    return variants


def llm_latency_ms(store: Store, session_ids: set[str]) -> list[float]:
    if not session_ids:
        return []
    return [float(run.figures.get("llm_latency_s") or 0.0) * 1000
            for run in store.runs(limit=10 * len(session_ids) + 100)
            if run.session_id in session_ids]


def print_results(results: list[Measured], per_round: int) -> None:
    print(f"\nPer-job wall time, interleaved rounds on one worker (concurrency 1), "
          f"{per_round} jobs of each kind per round:")
    rows = []
    for result in results:
        durations = [float(e["duration_ms"]) for e in result.events]
        rows.append((result.name, len(result.ratios), median(result.noop_ms),
                     median(result.job_ms), min(result.ratios), median(result.ratios),
                     max(result.ratios), median(durations), percentile(durations, 0.95)))
    print_table(("job", "rounds", "no-op ms median", "per-job wall ms median",
                 "x no-op min", "x no-op median", "x no-op max", "pipeline ms median",
                 "pipeline ms p95"), rows)
    for result in results:
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


@dataclass
class WorkCount:
    """What one in-process job asked of the database and the tokenizer."""

    statements: int = 0
    transactions: int = 0
    explicit_transactions: int = 0  # not AUTOCOMMIT: a BEGIN and a COMMIT round trip
    tokenizer_calls: int = 0
    tokens_counted: int = 0

    @property
    def round_trips(self) -> int:
        """Statements plus BEGIN and COMMIT (a pool checkout's pre-ping not included)."""
        return self.statements + 2 * self.explicit_transactions


@contextmanager
def counting_work() -> Iterator[WorkCount]:
    """Count SQL statements (every engine) and tokenizer calls while the block runs."""
    count = WorkCount()
    original: Callable[..., list[int]] = tiktoken.Encoding.encode_ordinary

    def on_statement(_conn: Connection, _cursor: Any, statement: str, *_: Any) -> None:
        if not statement.startswith("BEGIN"):  # SQLite's begin hook: the BEGIN itself
            count.statements += 1

    def on_begin(conn: Connection) -> None:
        count.transactions += 1
        options = conn.get_execution_options()
        if "AUTOCOMMIT" not in (options.get("isolation_level"),
                                options.get("compactor_sqlite_begin")):
            count.explicit_transactions += 1

    def encode_ordinary(encoding: tiktoken.Encoding, text: str) -> list[int]:
        tokens = original(encoding, text)
        count.tokenizer_calls += 1
        count.tokens_counted += len(tokens)
        return tokens

    event.listen(Engine, "before_cursor_execute", on_statement)
    event.listen(Engine, "begin", on_begin)
    # A bench-only probe on the class: every encoding of this process counts its calls.
    tiktoken.Encoding.encode_ordinary = encode_ordinary  # type: ignore[assignment,method-assign]
    try:
        yield count
    finally:
        tiktoken.Encoding.encode_ordinary = original  # type: ignore[method-assign]  # the probe undone
        event.remove(Engine, "before_cursor_execute", on_statement)
        event.remove(Engine, "begin", on_begin)


def print_work_per_job(database_url: str, store: Store, sessions: list[BenchSession],
                       base_url: str) -> None:
    """Run one job per session and summarizer in this process, counting its work."""
    rows = []
    for session in sessions:
        for kind, extra in (("extractive", {"summarizer": "extractive"}),
                            ("LLM server", {"summarizer": "llm", "llm_base_url": base_url})):
            session_id = f"count-{kind.split()[0]}-{session.tokens}"
            import_copies(store, session, [session_id])
            with inline_runtime(database_url, model_context_tokens=round(session.tokens * 1.28),
                                tail_budget_tokens=min(8_000, session.tokens // 12),
                                **extra) as runtime, counting_work() as count:
                began = time.perf_counter()
                result = run_inline(runtime, session_id)
                elapsed_ms = (time.perf_counter() - began) * 1000
            rows.append((session.tokens, kind, count.transactions, count.statements,
                         count.round_trips, count.tokenizer_calls, count.tokens_counted,
                         elapsed_ms, result.outcome.value))
    print("\nWork per job, in-process (SQL on every engine: round trips = statements + "
          "BEGIN/COMMIT; tokenizer calls of this process, the test server's not included):")
    print_table(("session tokens", "summarizer", "transactions", "SQL statements",
                 "round trips", "tokenizer calls", "tokens counted", "job ms", "outcome"),
                rows)


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=10, help="jobs of each kind")
    parser.add_argument("--warmup", type=int, default=3, help="untimed first jobs")
    parser.add_argument("--session-tokens", default="5000,100000", help="comma-separated")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.per_round, args.warmup, args.session_tokens = 2, 2, 1, "3000"
    print_header("job orchestration overhead vs a bare Celery task, interleaved")
    count = args.rounds * args.per_round + args.warmup
    counter = new_counter()
    sessions = [generated_session(int(t), counter) for t in args.session_tokens.split(",")]
    sizes = ", ".join(f"{s.tokens:,} tokens ({len(s.rows)} messages)" for s in sessions)
    print(f"sessions: {sizes}; {args.rounds} rounds of {args.per_round} no-ops then "
          f"{args.per_round} jobs, after {args.warmup} warm-up jobs of each", flush=True)
    with (tempfile.TemporaryDirectory() as log_dir, openai_server() as server,
          private_database() as url, private_broker(url) as broker):
        engine = create_db_engine(url)
        store = Store(engine)
        variants = []
        for session in sessions:
            # --quick: the extractive variant differs by one setting; one worker start less.
            variants += job_variants(broker, url, session, count, server.base_url, store,
                                     extractive=not args.quick)
        results = [measure(broker, v, args.rounds, args.per_round, args.warmup,
                           Path(log_dir), store) for v in variants]
        print_load()
        print_results(results, args.per_round)
        print_work_per_job(url, store, sessions, server.base_url)
        engine.dispose()
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
