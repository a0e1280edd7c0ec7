"""The scheduling commands of `compactor`: `trigger`, `scan`, `reconcile` and `beat`.

Settings are read here, in the command functions, and handed down as plain values.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from scheduler.cli.common import (
    display_url,
    expected_errors,
    fail,
    get_settings,
    is_embedded,
    open_store,
    print_json,
    readable_table,
    shown,
    stdout_console,
)

if TYPE_CHECKING:
    from db import MarkResult
    from scheduler.enqueue import ScanReport
    from scheduler.selection import ScanPreview
    from worker.settings.config import Settings

# Exit status of `trigger` when some id names no session, of `scan` when the lock is held.
EXIT_PARTIAL = 3


def register(app: typer.Typer) -> None:
    """Add `trigger`, `scan`, `reconcile` and `beat` to the `compactor` app."""
    app.command("trigger")(trigger)
    app.command("scan")(scan)
    app.command("beat")(beat)
    app.command("reconcile")(reconcile)


@expected_errors
def trigger(
    session_ids: Annotated[list[str], typer.Argument(metavar="SESSION",
                                                     help="External session ids.")],
    force: Annotated[bool, typer.Option(
        "--force", help="Compact even under the trigger or anti-thrash guard.")] = False,
    reason: Annotated[str, typer.Option(help="Why, as logged with the job.")] = "trigger",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON line.")] = False,
) -> None:
    """Enqueue a compaction job per session, unless one is already queued.

    A session that already has a queued job (marker younger than enqueue_marker_ttl_s)
    is reported already_queued; with --force only while that job is queued, delivered
    or running: a marker naming a job Redis lost is replaced. Exit status 3 when an id
    is unknown; 2, and nothing enqueued, when an id holds a control character.
    """
    from db import MarkStatus
    from scheduler.enqueue import CeleryPublisher, trigger_sessions
    from scheduler.reconcile import broker_jobs, is_job_lost
    from worker.broker.celery_app import create_app
    from worker.broker.contract import MAX_REASON_CHARS, session_id_problem

    if not 0 < len(reason) <= MAX_REASON_CHARS:
        fail(f"--reason must be 1 to {MAX_REASON_CHARS} characters")
    for session_id in session_ids:
        problem = session_id_problem(session_id)
        if problem:
            fail(f"{problem}; nothing enqueued", exit_code=2)
    settings = get_settings()
    publisher = CeleryPublisher(create_app(settings), settings.queue_name)
    now = datetime.now(UTC)
    with open_store(settings) as store, _broker_errors(settings), broker_jobs(settings) as broker:
        results = trigger_sessions(
            store, publisher, session_ids, reason=reason, force=force, now=now,
            marker_ttl_s=settings.enqueue_marker_ttl_s,
            is_lost=lambda session_id, job_id: is_job_lost(store, broker, session_id,
                                                            job_id, now))
    if as_json:
        print_json(results)
    else:
        _print_trigger_table(results)
    if any(r.status is MarkStatus.UNKNOWN_SESSION for r in results):
        raise typer.Exit(EXIT_PARTIAL)


@expected_errors
def scan(
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Show what would be enqueued, and why; enqueue nothing.")] = False,
    limit: Annotated[int | None, typer.Option(
        min=1, help="Enqueue at most this many (below scan_max_jobs).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON line.")] = False,
) -> None:
    """Enqueue the due sessions now, most to gain first (what the nightly beat does).

    Exit status 3 when another scan holds the scan lock.
    """
    from scheduler.beat import run_scheduled_scan, scan_policy
    from scheduler.selection import preview_scan

    settings = get_settings()
    now = datetime.now(UTC)
    if dry_run:
        with open_store(settings) as store:
            preview = preview_scan(store, scan_policy(settings), now, limit=limit)
        _print_dry_run(preview, as_json)
        return
    _create_embedded_schema(settings)
    with _progress(enabled=not as_json and sys.stdout.isatty()) as on_progress, \
            _broker_errors(settings):
        report = run_scheduled_scan(settings, now, limit=limit, on_progress=on_progress)
    if report is None:
        fail("another scan holds the scan lock; nothing enqueued", exit_code=EXIT_PARTIAL)
    _print_scan_report(report, as_json)


@expected_errors
def reconcile(
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Show what would be repaired; change nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON line.")] = False,
) -> None:
    """Repair what Redis and the database disagree on (what beat runs every
    reconcile_interval_s): re-send or clear the jobs Redis lost, release dead leases and
    record their attempts."""
    from scheduler.reconcile import run_scheduled_reconcile

    settings = get_settings()
    with _broker_errors(settings):
        repairs = run_scheduled_reconcile(settings, datetime.now(UTC), dry_run=dry_run)
    if as_json:
        print_json({"dry_run": dry_run, "repairs": repairs, "count": len(repairs)})
        return
    table = Table("session", "problem", "action", "job id", "new job id",
                  title="would repair" if dry_run else "repaired")
    for repair in repairs:
        table.add_row(shown(repair.session_id), shown(repair.problem), shown(repair.action),
                      shown(repair.job_id or "-"), shown(repair.new_job_id or "-"))
    console = stdout_console()
    console.print(table)
    console.print(f"{len(repairs)} repairs{' (dry run)' if dry_run else ''}")


@expected_errors
def beat() -> None:
    """Run the beat process: sends `compactor.scan` at scan_cron (UTC)."""
    from scheduler.beat import start_beat
    from worker.broker.celery_app import create_app

    settings = get_settings()
    try:
        start_beat(create_app(settings), settings)
    except ValueError as exc:
        fail(str(exc))




def _create_embedded_schema(settings: Settings) -> None:
    from db import upgrade_database

    if is_embedded(settings):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        upgrade_database(settings.effective_database_url)


@contextmanager
def _broker_errors(settings: Settings) -> Iterator[None]:
    from kombu.exceptions import OperationalError as BrokerUnavailable
    from redis import RedisError

    try:
        yield
    except (BrokerUnavailable, RedisError) as exc:
        fail(f"broker unreachable at COMPACTOR_REDIS_URL={display_url(settings.redis_url)}: "
             f"{str(exc).rstrip('.')}; start Redis or fix the URL, then run the command again")


@contextmanager
def _progress(*, enabled: bool) -> Iterator[Callable[[ScanReport], None] | None]:
    if not enabled:
        yield None
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=stdout_console(), transient=True) as progress:
        task = progress.add_task("scanning")

        def show(report: ScanReport) -> None:
            progress.update(task, description=f"scanning: {report.due_seen} due, "
                                              f"{report.enqueued} enqueued")

        yield show


def _print_trigger_table(results: list[MarkResult]) -> None:
    from db import MarkStatus

    table = Table("session", "status", "job id")
    styles = {MarkStatus.ENQUEUED: "green", MarkStatus.ALREADY_QUEUED: "yellow",
              MarkStatus.UNKNOWN_SESSION: "red"}
    for result in results:
        table.add_row(shown(result.session_id),
                      f"[{styles[result.status]}]{result.status.value}[/]",
                      shown(result.job_id or "-"))
    stdout_console().print(table)


def _print_dry_run(preview: ScanPreview, as_json: bool) -> None:
    due = preview.sessions
    total_tokens = sum(session.estimated_tokens for session in due)
    if as_json:
        print_json({"dry_run": True, "sessions": due, "count": len(due),
                    "estimated_tokens": total_tokens, "stopped": preview.stopped,
                    "left_out": preview.left_out})
        return
    console = stdout_console()
    if due:
        table = readable_table("#", "session", "why", "projection", "since compaction",
                               "est. tokens", title="would enqueue (most to gain first)",
                               shrink=("session",))
        for rank, session in enumerate(due, start=1):
            table.add_row(str(rank), shown(session.session_id), session.why.value,
                          f"{session.projection_tokens:,}",
                          f"{session.tokens_since_compaction:,}",
                          f"{session.estimated_tokens:,}")
        console.print(table)
    console.print(f"{len(due)} sessions, {total_tokens:,} estimated summarizer tokens; "
                  f"stopped: {preview.stopped.value}", highlight=False)
    left_out = ", ".join(f"{count:,} {reason}" for reason, count in preview.left_out.items())
    console.print(f"left out: {left_out or 'none'}", highlight=False)


def _print_scan_report(report: ScanReport, as_json: bool) -> None:
    if as_json:
        print_json(report)
        return
    stdout_console().print(
        f"enqueued {report.enqueued} ({report.over_trigger} over trigger, {report.dirty} "
        f"dirty), {report.lost_race} already queued by another enqueuer, "
        f"{report.estimated_tokens} estimated summarizer tokens; "
        f"stopped: {report.stopped.value if report.stopped else '-'}"
    )
