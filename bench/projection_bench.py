"""Projection read latency, the platform's hot path: ``SessionsAPI.projection`` (one
statement) on a 1,000-message session, on PostgreSQL and SQLite, without a summary and
compacted (a revision covering 80%); beside it the ``session_projection`` view read with
plain SQL, the snapshot-then-assembly read it replaced, and one checked append.

Every figure is in-process wall time per call, after warm-up, through the pool.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from bench.common import private_database
from bench.report import bench_parser, median, percentile, print_header, print_load, print_table
from bench.sessions import new_counter, to_rows
from db import MessageText, NewRevision, NewRun, Store, create_db_engine, upgrade_database
from tests.support.generated import generated_turns
from worker.platform.sessions import SessionsAPI

MESSAGES = 1_000
BENCH_OWNER = "bench:1:fill"
VIEW_QUERY = text("SELECT position, message FROM session_projection "
                  "WHERE session_id = :session_id ORDER BY position")


@contextmanager
def sqlite_database() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{Path(directory) / 'bench.db'}"
        upgrade_database(url)
        yield url


def fill(store: Store, messages: int) -> None:
    """Store the plain and the compacted session, ``messages`` chat messages each."""
    system = {"role": "system", "content": "You are an airline agent. Follow the policy."}
    bodies = [system, *generated_turns("bench", messages // 4 + 1)][:messages]
    rows = to_rows(bodies, new_counter())
    now = datetime.now(UTC)
    for session_id in ("plain", "compacted"):
        store.import_session(session_id, {}, rows, now)
    through_seq = messages * 4 // 5
    # A job's lease and swap (``Store.start_job``, ``Store.commit_job``), as a worker's.
    store.start_job("compacted", BENCH_OWNER, 60, now)
    store.commit_job(
        "compacted", expected_revision_id=None, lease_owner=BENCH_OWNER, now=now,
        revision=NewRevision(
            through_seq=through_seq, snapshot_head_seq=messages, summary={"goal": "bench"},
            block={"role": "user", "content": "[summary]"}, block_tokens=10, artifacts_json="[]",
            summary_tokens=10, span_tokens=1_000, projection_tokens_before=2_000, model=None,
            prompt_version=None, summarizer="extractive"),
        run=NewRun(session_id="compacted", task_id=None, attempt=1, reason="bench",
                   outcome="compacted", failure_class=None, failure_message=None, figures={},
                   revision_id=None, started_at=now, finished_at=now),
    )


def time_calls(call: Callable[[], object], repeats: int) -> list[float]:
    """Milliseconds per call, after ten warm-up calls."""
    for _ in range(10):
        call()
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        timings.append((time.perf_counter() - start) * 1000)
    return timings


def measure(kind: str, url: str, repeats: int) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    store, engine = Store.from_url(url), create_db_engine(url)
    with SessionsAPI.open(url) as sessions:
        fill(store, MESSAGES)
        for session_id in ("plain", "compacted"):
            reads: dict[str, Callable[[], object]] = {
                "SessionsAPI.projection": partial(sessions.projection, session_id),
                "view, plain SQL": partial(read_view, engine, session_id),
                "Store.job_snapshot (a job's read)": partial(
                    store.job_snapshot, session_id, to_message=keep_text),
            }
            count = len(sessions.projection(session_id))
            for what, read in reads.items():
                rows.append((kind, session_id, count, what, *summarize(time_calls(read, repeats))))
        turns = iter(range(10**9))
        # Each append its own tool call ids: a repeated id would be renamed (a repair).
        appends = time_calls(
            lambda: sessions.append("plain", generated_turns(f"A{next(turns)}", 1)), repeats)
        rows.append((kind, "plain", "+4", "SessionsAPI.append (4 messages)",
                     *summarize(appends)))
    store.close()
    engine.dispose()
    return rows


def keep_text(text: MessageText) -> MessageText:
    return text


def read_view(engine: Engine, session_id: str) -> list[Any]:
    # A connection per read, as the store takes one: a held one would keep SQLite locked.
    with engine.connect() as connection:
        return list(connection.execute(VIEW_QUERY, {"session_id": session_id}).all())


def summarize(timings: list[float]) -> tuple[float, float, float, float]:
    # The minimum beside the median: on a shared machine it is the unloaded figure.
    return min(timings), median(timings), percentile(timings, 0.95), max(timings)


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    if args.quick:
        args.repeats = 20
    print_header(f"projection read latency, {MESSAGES:,}-message session")
    rows = []
    with private_database() as url:
        rows += measure("postgresql", url, args.repeats)
    with sqlite_database() as url:
        rows += measure("sqlite", url, args.repeats)
    print_load()
    print_table(("database", "session", "messages", "read", "min ms", "median ms", "p95 ms",
                 "max ms"), rows)


if __name__ == "__main__":
    main()
