"""The service's own cost per task: a no-op task on the service's app and worker (its
signal handlers, logging, allocator trim, consumer and transport) against the same no-op
on a bare Celery worker (``bench/floor_worker.py`` with no library loaded, keeping the
service's delivery contract: late acks, one message prefetched), both prefork with one
child, on one Redis.

Both workers stay up; blocks of no-ops alternate between them, round after round, each
block published once the previous one has finished. A block's per-task time is the
spacing of its first and last completion over its size (publishing is not counted);
each round gives one ratio (service / bare), and the script prints their min and median:
only a ratio taken side by side holds still while the machine's load swings.
"""

from __future__ import annotations

import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from celery import Celery

from bench.common import (
    BenchWorker,
    Broker,
    event_time_s,
    private_broker,
    private_database,
    settings_env,
)
from bench.floor_worker import LIBRARIES_VARIABLE
from bench.floor_worker import app as bare_app
from bench.job_overhead import NOOP_EVENT, NOOP_TASK, WORKER_APP
from bench.memory_bench import FloorWorker
from bench.report import bench_parser, median, print_header, print_load, print_table


@dataclass(frozen=True)
class NoopWorker:
    """One of the two workers compared, and where its no-ops are published."""

    name: str
    label: str
    worker: BenchWorker
    app: Celery
    queue: str


def noop_workers(broker: Broker, env: dict[str, str], log_dir: Path) -> list[NoopWorker]:
    """The service's worker and the bare one, not started, on ``broker``'s Redis; each app
    publishes to its own worker (the service's keys carry its prefix)."""
    bare_queue = f"{broker.settings.queue_name}-bare"
    return [
        NoopWorker("service", "service (worker.broker.celery_app)",
                   BenchWorker(env, log_dir / "service.log", app=WORKER_APP),
                   broker.app, broker.settings.queue_name),
        NoopWorker("bare", "bare Celery (bench.floor_worker)",
                   FloorWorker({**env, "COMPACTOR_QUEUE_NAME": bare_queue,
                                LIBRARIES_VARIABLE: ""}, log_dir / "bare.log"),
                   bare_app, bare_queue),
    ]


def run_block(worker: BenchWorker, publish: list[str], seen: int,
              timeout_s: float) -> float:
    """Wait for the block ``publish`` named, already sent; its per-task ms."""
    events = worker.wait_for(NOOP_EVENT, seen + len(publish), timeout_s)
    mine = [event_time_s(e) for e in events if e.get("task_id") in set(publish)]
    return (max(mine) - min(mine)) * 1000 / max(1, len(mine) - 1)


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per-round", type=int, default=200, help="no-ops per block")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.per_round = 2, 20
    print_header("the service's no-op task against a bare Celery no-op, interleaved")
    with (tempfile.TemporaryDirectory() as log_dir, private_database() as url,
          private_broker(url) as broker):
        env = {**broker.env, **settings_env(database_url=url, summarizer="extractive")}
        service, bare = noop_workers(broker, env, Path(log_dir))
        with service.worker, bare.worker:
            counts = {"service": 0, "bare": 0}
            ratios, service_ms, bare_ms = [], [], []
            for round_index in range(args.rounds + 1):  # the first round warms both up
                per_task = {}
                for noop in (service, bare):
                    ids = [f"noop-{uuid.uuid4().hex}" for _ in range(args.per_round)]
                    for task_id in ids:
                        noop.app.send_task(NOOP_TASK, task_id=task_id, queue=noop.queue)
                    per_task[noop.name] = run_block(noop.worker, ids, counts[noop.name],
                                                    timeout_s=60 + args.per_round)
                    counts[noop.name] += len(ids)
                if round_index:
                    service_ms.append(per_task["service"])
                    bare_ms.append(per_task["bare"])
                    ratios.append(per_task["service"] / per_task["bare"])
        print_load()
        print(f"\n{args.rounds} rounds of {args.per_round} no-ops on each worker (after one "
              f"warm-up round):")
        print_table(("worker", "per-task ms median"),
                    [(service.label, median(service_ms)), (bare.label, median(bare_ms))])
        print()  # a table starts after a blank line (the smoke test reads them apart)
        print_table(("service / bare", "min", "median", "max"),
                    [("per-task wall time", min(ratios), median(ratios), max(ratios))])


if __name__ == "__main__":
    main()
