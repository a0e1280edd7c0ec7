"""`compactor gc` and `compactor delete`: the data lifecycle from the command line."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from scheduler.cli.common import (
    expected_errors,
    fail,
    get_settings,
    open_store,
    print_json,
    shown,
    stderr_console,
    stdout_console,
)

if TYPE_CHECKING:
    from db import GcBatch
    from worker.settings.config import Settings

# A refusal an operator may override (--force), apart from errors (1).
EXIT_REFUSED = 4

JsonOption = Annotated[bool, typer.Option("--json", help="One JSON line.")]


def register(app: typer.Typer) -> None:
    app.command("gc")(gc_command)
    app.command("delete")(delete_command)


@expected_errors
def gc_command(
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Count what would be removed; remove nothing.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Remove superseded revisions and old run records, and erase sessions idle for
    longer than gc_session_retention_s when it is set, in batches (safe while workers
    run): the active revision and gc_keep_revisions before it always stay."""
    from worker.platform.lifecycle import collect_garbage, gc_policy

    settings = _settings()
    with open_store(settings) as store:
        report = collect_garbage(store, gc_policy(settings), datetime.now(UTC),
                                 dry_run=dry_run, on_batch=None if as_json else _show_batch)
    if as_json:
        print_json(report)
        return
    verb = "would remove" if dry_run else "removed"
    stdout_console().print(f"{verb} {report.sessions} idle sessions, {report.revisions} "
                           f"revisions and {report.runs} runs in {report.batches} batches "
                           f"({report.duration_ms} ms)",
                           highlight=False)


@expected_errors
def delete_command(
    session_id: Annotated[str, typer.Argument(metavar="SESSION", help="The session's id.")],
    force: Annotated[bool, typer.Option(
        "--force", help="Delete even while a job holds the session's lease (the job then "
        "ends without writing).")] = False,
    as_json: JsonOption = False,
) -> None:
    """Erase a session: its messages, revisions, runs and queue marker, in one transaction.

    Exit status 4 when a job holds the session's lease and --force is not given.
    """
    from db import SessionLeased
    from worker.platform.lifecycle import delete_session

    settings = _settings()
    with open_store(settings) as store:
        try:
            deleted = delete_session(store, session_id, force=force, now=datetime.now(UTC))
        except SessionLeased as exc:
            fail(f"{exc}; nothing deleted (--force deletes anyway)", exit_code=EXIT_REFUSED)
    if as_json:
        print_json(deleted)
        return
    counts = ", ".join(f"{count} {table}" for table, count in deleted.removed.items())
    extras = [f"queue marker {deleted.queued_job_id}" if deleted.queued_job_id else "",
              f"lease of {deleted.broken_lease_owner} broken"
              if deleted.broken_lease_owner else ""]
    stdout_console().print(
        f"deleted {shown(session_id)}: {counts}"
        + "".join(f"; {shown(extra)}" for extra in extras if extra), highlight=False)


def _show_batch(batch: GcBatch) -> None:
    stderr_console().print(f"{batch.table}: {batch.removed} in this batch", highlight=False)


def _settings() -> Settings:
    from worker.logging import configure_logging

    settings = get_settings()
    configure_logging(settings.log_format.value, settings.log_level)
    return settings
