"""Identifiers at ingest and recall: how long identifying every message takes (µs per
token, on a generated coding session and the corpus's largest; alone, and as ingest runs
it, with each identifier's summary line counted), and how long
``Store.recall`` answers on a generated 1,000,000-token session stored in PostgreSQL and
in SQLite, for planted identifiers, a phrase, a frequent word and a miss.

Run: ``.venv/bin/python -m bench.recall_bench`` (``--quick``: 50,000 tokens).
"""

from __future__ import annotations

import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.common import private_database
from bench.report import bench_parser, median, percentile, print_header, print_table
from bench.sessions import (
    BenchSession,
    generated_session,
    largest_corpus_session,
    new_counter,
    tool_heavy_messages,
)
from db import NewMessage, Store, upgrade_database
from worker.compaction import TokenCounter, identifier_rules
from worker.compaction.identifiers import identify_message
from worker.compaction.messages import parse_message
from worker.platform.ingest import count_messages

REPEATS = 5
PLANTED = ("E3283-SCHEMA", "sqlalchemy==8.16.16", "/src/app/main.py", "PAY-4242",
           "mia_li_3668")
QUERIES = (*PLANTED, "from the migration, pin", "RETRY_LIMIT", "no-such-value-anywhere")


def identify_us_per_token(session: BenchSession, counter: TokenCounter | None = None) -> float:
    """Best of REPEATS, CPU time, with the word cache emptied before each run; with
    ``counter``, each identifier's summary line counted too (what ingest does)."""
    messages = [parse_message(row.body) for row in session.rows]
    best_s = float("inf")
    for _ in range(REPEATS):
        identifier_rules.classify_word.cache_clear()
        began = time.process_time()
        for message in messages:
            identify_message(message, counter)
        best_s = min(best_s, time.process_time() - began)
    return best_s * 1e6 / session.tokens


def planted_rows(target_tokens: int) -> list[NewMessage]:
    """A generated session with the planted identifiers in one user turn a third in."""
    counter = new_counter()
    messages = tool_heavy_messages(target_tokens, counter)
    planted = {"role": "user", "content": (
        f"Keep these: {PLANTED[0]} from the migration, pin {PLANTED[1]}, edit {PLANTED[2]}, "
        f"ticket {PLANTED[3]}, user {PLANTED[4]}.")}
    third = next(i for i in range(len(messages) // 3, len(messages))
                 if messages[i]["role"] == "user")
    messages.insert(third, planted)
    return count_messages([parse_message(m) for m in messages], counter)


def time_recall(store: Store, session_id: str) -> list[tuple[str, int, float, float]]:
    rows = []
    for query in QUERIES:
        timings_ms = []
        for _ in range(REPEATS):
            began = time.perf_counter()
            hits = store.recall(session_id, query, limit=20)
            timings_ms.append((time.perf_counter() - began) * 1000)
        rows.append((query, len(hits), median(timings_ms), percentile(timings_ms, 0.95)))
    return rows


def main() -> None:
    args = bench_parser(__doc__ or "").parse_args()
    target_tokens = 50_000 if args.quick else 1_000_000
    print_header("identifiers at ingest and recall")
    counter = new_counter()
    sessions = [generated_session(20_000 if args.quick else 200_000, counter)]
    corpus = None if args.quick else largest_corpus_session(counter)
    sessions += [corpus] if corpus else []
    print_table(("session", "tokens", "identify µs per token (best of 5, CPU)",
                 "with line counts (ingest)"),
                [(s.name, s.tokens, f"{identify_us_per_token(s):.3f}",
                  f"{identify_us_per_token(s, counter):.3f}") for s in sessions])
    rows = planted_rows(target_tokens)
    tokens = sum(row.tokens for row in rows)
    print(f"\nrecall on a generated session of {tokens:,} tokens, {len(rows):,} messages")
    with tempfile.TemporaryDirectory() as tmp:
        sqlite_url = f"sqlite:///{Path(tmp) / 'recall.db'}"
        upgrade_database(sqlite_url)
        with private_database() as postgres_url:
            for kind, url in (("postgresql", postgres_url), ("sqlite", sqlite_url)):
                store = Store.from_url(url)
                try:
                    began = time.perf_counter()
                    store.import_session("big", {}, rows, datetime.now(UTC))
                    print(f"\n{kind}: import {time.perf_counter() - began:.1f} s")
                    print_table(("query", "hits (limit 20)", "median ms", "p95 ms"),
                                [(q, n, f"{m:.1f}", f"{p:.1f}")
                                 for q, n, m, p in time_recall(store, "big")])
                finally:
                    store.close()


if __name__ == "__main__":
    main()
