"""`compactor demo`: the whole service once, end to end, on the embedded defaults: import
sample sessions, scan, compact them with a real worker process, show what it did.

Everything it starts (the worker, an embedded Redis) is stopped before it returns, on
errors and Ctrl-C too; each run uses a queue and a Redis key prefix of its own, so runs
started together on one Redis neither take nor delete each other's jobs and keys.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from scheduler.cli.common import (
    display_url,
    expected_errors,
    fail,
    load_counter,
    open_store,
    stdout_console,
)
from scheduler.cli.data import PolicyName, intake_policy, read_jsonl

if TYPE_CHECKING:
    from db import RunRecord, Store
    from scheduler.enqueue import QueuedJob
    from worker.platform.ingest import SessionReport
    from worker.settings.config import Settings

# Each run's queue and key prefix: this, then a random tag.
DEMO_NAME = "compactor-demo"
# Applied only where the operator set nothing: a model window that the generated long
# sessions exceed, and no quiet period (every session was imported a moment ago).
DEMO_DEFAULTS: dict[str, Any] = {"model_context_tokens": 32_000, "quiet_period_s": 0}
WORKER_LOG = "demo-worker.log"


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_command)


@expected_errors
def demo_command(
    sessions: Annotated[Path | None, typer.Option(
        "--sessions", exists=True, dir_okay=False, readable=True,
        help="JSONL file of sessions to import (default: built-in generated sessions).")] = None,
    count: Annotated[int, typer.Option(min=1, max=500,
                                       help="Generated sessions (without --sessions).")] = 12,
    seed: Annotated[int, typer.Option(help="Seed of the generated sessions.")] = 7,
    embedded: Annotated[bool, typer.Option(
        "--embedded-redis", help="Use a private embedded Redis even when one is reachable.")
    ] = False,
    queue: Annotated[str | None, typer.Option(
        help="Queue of the demo's jobs (default: compactor-demo-<random tag>).")] = None,
    key_prefix: Annotated[str | None, typer.Option(
        help="Redis key prefix of the demo (default: compactor-demo-<random tag>:).")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 2,
    timeout_s: Annotated[float, typer.Option(
        "--timeout", min=1, help="Longest wait for the jobs (s).")] = 300.0,
) -> None:
    """Run the service end to end once: import sessions, scan, compact with a real worker.

    Uses the embedded SQLite file under COMPACTOR_DATA_DIR (never COMPACTOR_DATABASE_URL),
    the Redis at COMPACTOR_REDIS_URL or, when none answers, a private embedded one, and
    a queue and key prefix of its own for this run (only its own keys are deleted at the
    end). Where unset, COMPACTOR_MODEL_CONTEXT_TOKENS is 32000 and
    COMPACTOR_QUIET_PERIOD_S is 0 for this run. Running it again imports nothing new
    (`exists`) and finds nothing due.
    """
    if queue == "" or key_prefix == "":
        fail("--queue and --key-prefix must not be empty", exit_code=2)
    run_name = f"{DEMO_NAME}-{secrets.token_hex(4)}"
    settings = demo_settings(queue or run_name, key_prefix or f"{run_name}:")
    try:
        all_ended_well = run_demo(settings, sessions, count, seed, force_embedded=embedded,
                                  concurrency=concurrency, timeout_s=timeout_s)
    except KeyboardInterrupt:
        stdout_console().print("\ninterrupted: the processes the demo started are stopped; "
                               "the next run enqueues the unfinished sessions again")
        raise typer.Exit(130) from None
    if not all_ended_well:
        raise typer.Exit(1)


def run_demo(settings: Settings, sessions: Path | None, count: int, seed: int, *,
             force_embedded: bool, concurrency: int, timeout_s: float) -> bool:
    """Import, scan, work, report; False when a job failed."""
    # The demo's own modules load when it runs: `--help` loads no intake or store.
    from scheduler.cli import demo_report
    from worker.platform.ingest import ImportStatus

    console = stdout_console()
    demo_report.print_setup(console, settings, _set_by_demo(settings))
    with open_store(settings) as store:
        reports = import_sessions(store, settings, sessions, count, seed)
        demo_report.print_import(console, reports)
        with demo_redis(settings, force_embedded=force_embedded) as redis_url:
            # The embedded Redis is a plain one, whatever the configured URL.
            run_settings = settings.model_copy(update={
                "redis_url": redis_url, "redis_sentinel_master":
                settings.redis_sentinel_master if redis_url == settings.redis_url else None})
            stored = [r.session_id for r in reports if r.status is not ImportStatus.REJECTED]
            return run_jobs(store, run_settings, stored, concurrency, timeout_s)


def demo_settings(queue: str, key_prefix: str) -> Settings:
    """The settings of this run: the operator's, the embedded database, the demo's queue."""
    from worker.settings.config import Settings

    overrides = {name: value for name, value in DEMO_DEFAULTS.items()
                 if env_name(name) not in os.environ}
    settings = Settings(database_url=None, queue_name=queue, redis_key_prefix=key_prefix,
                        **overrides)
    return settings.model_copy(update={"data_dir": settings.data_dir.resolve()})


def env_name(field_name: str) -> str:
    return f"COMPACTOR_{field_name.upper()}"


def _set_by_demo(settings: Settings) -> list[str]:
    """``NAME=value`` of each demo default this run applies."""
    return [f"{env_name(name)}={getattr(settings, name)}" for name in DEMO_DEFAULTS
            if env_name(name) not in os.environ]


def import_sessions(store: Store, settings: Settings, path: Path | None, count: int,
                    seed: int) -> list[SessionReport]:
    """Import the file's sessions, or the generated ones; already stored ones are `exists`."""
    from scheduler.cli.demo_sessions import generate_sessions
    from worker.platform.ingest import SessionReport, import_record

    counter = load_counter(settings)
    policy, now = intake_policy(PolicyName.DEFAULT), datetime.now(UTC)
    records: Iterator[dict[str, Any] | SessionReport] = (
        (item for _, _, item in read_jsonl(path)) if path else generate_sessions(count, seed))
    return [item if isinstance(item, SessionReport) else
            import_record(item, store=store, counter=counter, policy=policy, now=now)
            for item in records]


@contextmanager
def demo_redis(settings: Settings, *, force_embedded: bool) -> Iterator[str]:
    """Yield the Redis URL of this run: the configured one, or a private embedded one."""
    from scheduler.cli.demo_services import DemoServiceError, embedded_redis, is_redis_reachable
    from worker.shared_state.connection import connect_redis

    console = stdout_console()
    shown_url = display_url(settings.redis_url)
    if not force_embedded and is_redis_reachable(connect_redis(settings, timeout_s=1)):
        console.print(f"redis: {shown_url} (queue {settings.queue_name!r}, key prefix "
                      f"{settings.redis_key_prefix!r})", highlight=False, soft_wrap=True)
        yield settings.redis_url
        return
    why = "as asked" if force_embedded else f"no Redis answered at {shown_url}"
    try:
        with embedded_redis(settings.data_dir / "demo-redis") as server:
            console.print(f"redis: {why}; started a private embedded redis-server (pid "
                          f"{server.pid}) at {server.url} for this run (queue "
                          f"{settings.queue_name!r}, key prefix {settings.redis_key_prefix!r})",
                          highlight=False, soft_wrap=True)
            yield server.url
        console.print(f"redis: embedded redis-server (pid {server.pid}) stopped",
                      highlight=False, soft_wrap=True)
    except DemoServiceError as exc:
        fail(str(exc))


def run_jobs(store: Store, settings: Settings, session_ids: list[str], concurrency: int,
             timeout_s: float) -> bool:
    """Scan, then run a real worker until every job ended; False when a job failed."""
    from scheduler.cli import demo_report

    console = stdout_console()
    jobs: list[QueuedJob] = []
    try:
        jobs = _scan(settings)
        if not jobs:
            demo_report.print_nothing_due(console, store, settings, session_ids)
            return True
        runs = _work(store, settings, jobs, concurrency, timeout_s)
    finally:
        _clean_up(store, settings, jobs)
    return demo_report.print_results(console, store, settings, session_ids, runs)


def _scan(settings: Settings) -> list[QueuedJob]:
    from kombu.exceptions import OperationalError as BrokerUnavailable

    from scheduler.cli.demo_jobs import scan_and_enqueue

    try:
        jobs = scan_and_enqueue(settings, datetime.now(UTC))
    except BrokerUnavailable as exc:
        fail(f"broker unreachable: {exc}")
    if jobs is None:
        fail("another scan holds the demo's scan lock; nothing enqueued")
    stdout_console().print(f"scan: enqueued {len(jobs)} due sessions on queue "
                           f"{settings.queue_name!r}", highlight=False, soft_wrap=True)
    return jobs


def _work(store: Store, settings: Settings, jobs: list[QueuedJob], concurrency: int,
          timeout_s: float) -> dict[str, RunRecord]:
    from scheduler.cli.demo_jobs import wait_for_jobs
    from scheduler.cli.demo_services import DemoServiceError, worker_process

    console = stdout_console()
    log_path = settings.data_dir / WORKER_LOG
    try:
        with worker_process(worker_env(settings), log_path, concurrency) as worker:
            console.print(f"worker: `compactor worker` pid {worker.pid} ready (concurrency "
                          f"{concurrency}), log {log_path}", highlight=False, soft_wrap=True)
            runs = wait_for_jobs(store, jobs, worker, timeout_s, settings.max_transient_retries,
                                 _batch_poller(settings))
        console.print(f"worker: pid {worker.pid} stopped", highlight=False, soft_wrap=True)
    except DemoServiceError as exc:
        fail(str(exc))
    return runs


def _batch_poller(settings: Settings) -> Callable[[], None] | None:
    """In batch mode, the poll beat would run: the demo's jobs park until it does."""
    from worker.settings.core import LLMMode

    if settings.llm_mode is not LLMMode.BATCH:
        return None
    from scheduler.batches import run_scheduled_poll

    # The SDK's HTTP client logs each request at info: the poll's events say enough.
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    stdout_console().print("batch mode: the jobs park; each poll sends their requests as "
                           "a batch, collects it and sends them again", highlight=False,
                           soft_wrap=True)

    def poll() -> None:
        run_scheduled_poll(settings, datetime.now(UTC))

    return poll


def worker_env(settings: Settings) -> dict[str, str]:
    """The worker's environment: the operator's, with this run's settings on top."""
    return {**os.environ,
            "COMPACTOR_DATA_DIR": str(settings.data_dir),
            "COMPACTOR_DATABASE_URL": settings.effective_database_url,
            "COMPACTOR_REDIS_URL": settings.redis_url,
            "COMPACTOR_REDIS_SENTINEL_MASTER": settings.redis_sentinel_master or "",
            "COMPACTOR_REDIS_KEY_PREFIX": settings.redis_key_prefix,
            "COMPACTOR_QUEUE_NAME": settings.queue_name,
            "COMPACTOR_MODEL_CONTEXT_TOKENS": str(settings.model_context_tokens),
            "COMPACTOR_QUIET_PERIOD_S": str(settings.quiet_period_s),
            "COMPACTOR_LOG_FORMAT": "json"}


def _clean_up(store: Store, settings: Settings, jobs: list[QueuedJob]) -> None:
    """Free the sessions of jobs that never ran for the next scan; drop the demo's keys."""
    from scheduler.cli.demo_jobs import release_unfinished, session_of
    from scheduler.cli.demo_services import delete_keys, is_redis_reachable
    from worker.shared_state.connection import connect_redis

    started = {run.task_id for job in jobs
               for run in store.runs(session_id=session_of(job), limit=50) if run.task_id}
    release_unfinished(settings, jobs, started)
    if is_redis_reachable(connect_redis(settings, timeout_s=1)):
        delete_keys(connect_redis(settings), settings.redis_key_prefix)
