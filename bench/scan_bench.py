"""Benchmark of the due-session scan on PostgreSQL: fills a throwaway database with a
fleet of sessions (one INSERT ... SELECT over generate_series), then times every keyset
page of the scan, prints the EXPLAIN (ANALYZE) plan of its first and second page, and
times enqueueing (marking alone; marking and publishing to Redis pipelined, as the scan
does, or through kombu's ``Producer.batch``; and with one ``send_task`` per job, for
comparison).

    .venv/bin/python -m bench.scan_bench --sessions 1000000

The database (``compactor_bench_<random>``) is created on the server of ``--admin-url``
and dropped at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from celery import Celery
from sqlalchemy import Connection, Engine, Select, create_engine, text
from sqlalchemy.engine import make_url

from db import DueCursor, DueWhy, Store, create_db_engine, upgrade_database
from db.scan import due_page_query
from scheduler.enqueue import CeleryPublisher, Publisher, QueuedJob, run_scan
from scheduler.publisher import RedisPublisher
from scheduler.selection import ScanPolicy
from worker.broker.celery_app import create_app
from worker.broker.contract import TASK_NAME, queue_list_key
from worker.settings.config import Settings

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
WARMUP_JOBS = 1_000

# The fleet, as shares of all sessions (the rest are small and clean): over the trigger,
# dirty under it, appended to in the last minutes, leased, breaker open, freshly queued.
FILL_SQL = """
INSERT INTO sessions (session_id, metadata, head_seq, total_tokens, projection_tokens,
    tokens_since_compaction, created_at, last_appended_at, last_compacted_at, lease_owner,
    lease_expires_at, breaker_state, breaker_failures, breaker_opened_at, queued_at,
    queued_job_id)
SELECT 'bench-' || lpad(i::text, 9, '0'), '{}', 1, p, p, s, :now,
    CASE WHEN r3 < 0.05 THEN :now - interval '5 minutes' ELSE :now - interval '2 days' END,
    :now - interval '3 days',  -- every session compacted before: the dirty tier applies
    CASE WHEN r3 BETWEEN 0.05 AND 0.055 THEN 'w' END,
    CASE WHEN r3 BETWEEN 0.05 AND 0.055 THEN :now + interval '10 minutes' END,
    CASE WHEN r3 BETWEEN 0.06 AND 0.065 THEN 'open' ELSE 'closed' END,
    CASE WHEN r3 BETWEEN 0.06 AND 0.065 THEN 3 ELSE 0 END,
    CASE WHEN r3 BETWEEN 0.06 AND 0.065 THEN :now - interval '5 minutes' END,
    CASE WHEN r3 BETWEEN 0.07 AND 0.08 THEN :now - interval '10 minutes' END,
    CASE WHEN r3 BETWEEN 0.07 AND 0.08 THEN 'queued-' || i END
FROM (
    SELECT i, p, CASE WHEN r2 < 0.5 THEN (p * r2)::int ELSE (p * 0.9)::int END AS s, r3
    FROM (
        SELECT i, r2, r3, CASE
            WHEN r1 < :over_share THEN (:trigger * (1 + 2 * random()))::int
            WHEN r1 < :over_share + :dirty_share THEN (:trigger * (0.6 + 0.4 * random()))::int
            ELSE (:trigger * 0.5 * random())::int END AS p
        FROM (SELECT i, random() AS r1, random() AS r2, random() AS r3
              FROM generate_series(1, :sessions) AS i) AS draws
    ) AS sized
) AS fleet
"""


def main() -> None:
    args = parse_args()
    settings = Settings()
    policy = ScanPolicy(
        trigger_tokens=settings.trigger_tokens, dirty_ratio=settings.dirty_ratio,
        tail_budget_tokens=settings.tail_budget_tokens,
        quiet_period_s=settings.quiet_period_s,
        breaker_cooldown_s=settings.breaker_cooldown_s,
        marker_ttl_s=settings.enqueue_marker_ttl_s, batch_size=args.batch_size,
        max_jobs=args.sessions,
    )
    now = datetime.now(UTC)
    with bench_database(args.admin_url, keep=args.keep) as url:
        engine = create_db_engine(url)
        store = Store(engine)
        try:
            fill(engine, policy, now, args)
            time_pages(store, policy, now)
            explain_pages(engine, policy, now)
            time_enqueueing(store, policy, now, args.enqueue_jobs)
        finally:
            store.close()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--over-share", type=float, default=0.04,
                        help="share of sessions over the trigger")
    parser.add_argument("--dirty-share", type=float, default=0.03,
                        help="share of sessions under the trigger with a large unsummarized tail")
    parser.add_argument("--enqueue-jobs", type=int, default=10_000,
                        help="jobs of each timed enqueue pass (marking alone, then with Redis)")
    parser.add_argument("--admin-url", default=os.environ.get(
        "COMPACTOR_TEST_POSTGRES_URL", DEFAULT_ADMIN_URL))
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    return parser.parse_args()


@contextmanager
def bench_database(admin_url: str, *, keep: bool) -> Iterator[str]:
    name = f"compactor_bench_{secrets.token_hex(4)}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        upgrade_database(url)
        yield url
    finally:
        if keep:
            print(f"kept database {name}")
        else:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def fill(engine: Engine, policy: ScanPolicy, now: datetime, args: argparse.Namespace) -> None:
    began = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(text(FILL_SQL), {
            "now": now, "sessions": args.sessions, "trigger": policy.trigger_tokens,
            "over_share": args.over_share, "dirty_share": args.dirty_share,
        })
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE sessions"))
        size = conn.execute(text("SELECT pg_size_pretty(pg_total_relation_size('sessions'))"))
        print(f"filled {args.sessions:,} sessions in {time.perf_counter() - began:.1f} s "
              f"(table and indexes: {size.scalar()}); trigger {policy.trigger_tokens:,} "
              f"tokens, dirty above {policy.dirty_tokens:,}")


def time_pages(store: Store, policy: ScanPolicy, now: datetime) -> None:
    """Read every page of both tiers through the store, as the scan does, timing each."""
    for why in DueWhy:
        timings_ms: list[float] = []
        rows_total, cursor = 0, None
        while True:
            began = time.perf_counter()
            page = store.due_sessions_page(why, policy.criteria, now, limit=policy.batch_size,
                                           after=cursor)
            timings_ms.append((time.perf_counter() - began) * 1000)
            rows_total += len(page.sessions)
            print(f"  {why.value:<12} page {len(timings_ms):>3}: {len(page.sessions):>6} "
                  f"sessions in {timings_ms[-1]:8.1f} ms")
            if page.next_after is None:
                break
            cursor = page.next_after
        print(f"{why.value}: {rows_total:,} due sessions in {len(timings_ms)} pages; per page "
              f"median {statistics.median(timings_ms):.1f} ms, max {max(timings_ms):.1f} ms, "
              f"total {sum(timings_ms) / 1000:.2f} s")


def explain_pages(engine: Engine, policy: ScanPolicy, now: datetime) -> None:
    """Print the plan of each tier's first page and of a page deep into the tier."""
    criteria, limit = policy.criteria, policy.batch_size
    with engine.connect() as conn:
        for why in DueWhy:
            first = due_page_query(why, criteria, now, limit=limit)
            columns = first.selected_columns
            # The cursor at the end of the first page starts the second.
            end_of_first = conn.execute(
                first.with_only_columns(columns.order_key, columns.id)
                .offset(limit - 1).limit(1)
            ).first()
            pages: list[tuple[str, DueCursor | None]] = [("first page", None)]
            if end_of_first is not None:
                pages.append(("second page", DueCursor(end_of_first[0], end_of_first[1])))
            for label, cursor in pages:
                plan = explain(conn, due_page_query(why, criteria, now, limit=limit,
                                                    after=cursor))
                verdict = ("index range scan, no sequential scan"
                           if "Index Scan" in plan and "Seq Scan" not in plan
                           else "NOT AN INDEX SCAN")
                print(f"\nEXPLAIN (ANALYZE, BUFFERS) {why.value}, {label}: {verdict}\n{plan}")


def explain(conn: Connection, statement: Select[Any]) -> str:
    compiled = statement.compile(conn)
    rows = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS) {compiled}", compiled.params)
    return "\n".join(row[0] for row in rows)


class CountingPublisher:
    """Stands in for the broker, to time the database side alone."""

    def __init__(self) -> None:
        self.sent = 0

    def publish(self, jobs: Sequence[QueuedJob]) -> None:
        self.sent += len(jobs)


@dataclass(frozen=True)
class KombuBatchPublisher:
    """``send_task`` per job inside kombu's ``Producer.batch``: Celery builds each message,
    kombu writes the page as one pipeline (the alternative to RedisPublisher's template)."""

    app: Celery
    queue: str

    def publish(self, jobs: Sequence[QueuedJob]) -> None:
        with self.app.producer_or_acquire() as producer, producer.batch(len(jobs) + 1):
            for job in jobs:
                self.app.send_task(TASK_NAME, kwargs=dict(job.kwargs), task_id=job.job_id,
                                   queue=self.queue, producer=producer)


def time_enqueueing(store: Store, policy: ScanPolicy, now: datetime, jobs: int) -> None:
    """Time scans of ``jobs`` sessions each: marking alone, then marking and publishing
    pipelined (the scan's publisher; kombu's batch of ``send_task`` messages), then with
    one ``send_task`` per job. An untimed scan of 1,000 first: the first statements of a
    run compile and warm caches."""
    run_scan(store, CountingPublisher(), policy, now, limit=WARMUP_JOBS)
    began = time.perf_counter()
    report = run_scan(store, CountingPublisher(), policy, now, limit=jobs)
    print_rate("marked queued (no broker)", report.enqueued, time.perf_counter() - began)
    tag = secrets.token_hex(4)
    settings = Settings(redis_key_prefix=f"bench-{tag}:", queue_name=f"bench-{tag}")
    app = create_app(settings)
    client = redis.Redis.from_url(settings.redis_url)
    publishers: list[tuple[str, Publisher]] = [
        ("marked and published to Redis, pipelined (RedisPublisher)",
         RedisPublisher(client, settings.redis_key_prefix, settings.queue_name)),
        ("marked and published to Redis, pipelined (kombu Producer.batch)",
         KombuBatchPublisher(app, settings.queue_name)),
        ("marked and published to Redis, send_task per job (CeleryPublisher)",
         CeleryPublisher(app, settings.queue_name)),
    ]
    try:
        for what, publisher in publishers:
            began = time.perf_counter()
            report = run_scan(store, publisher, policy, now, limit=jobs)
            print_rate(what, report.enqueued, time.perf_counter() - began)
        queued = client.llen(queue_list_key(settings.redis_key_prefix, settings.queue_name))
        print(f"messages on the queue: {queued:,}")
    finally:
        keys = list(client.scan_iter(match=f"{settings.redis_key_prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()
        app.close()


def print_rate(what: str, count: int, elapsed_s: float) -> None:
    print(f"scan: {count:,} sessions {what} in {elapsed_s:.2f} s "
          f"({count / elapsed_s:,.0f} per s)")


if __name__ == "__main__":
    main()
