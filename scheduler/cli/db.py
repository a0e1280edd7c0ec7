"""`compactor db`: upgrade the database schema, report its revision, and backfill what
a schema upgrade cannot compute (identifiers of messages stored before 0003)."""

from __future__ import annotations

import logging
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from db import current_revision, head_revision, upgrade_database
from scheduler.cli.common import (
    database_url,
    display_url,
    expected_errors,
    is_embedded,
    open_store,
    print_json,
    stderr_console,
    stdout_console,
)
from worker.backfill import DEFAULT_BATCH_MESSAGES, backfill
from worker.settings import get_settings

db_app = typer.Typer(
    help="The database schema (alembic migrations packaged with the service).",
    no_args_is_help=True,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


@db_app.command("upgrade")
@expected_errors
def upgrade_command() -> None:
    """Upgrade the schema to the newest revision (idempotent; safe to run on every deploy).

    For the embedded SQLite default, data_dir is created first.
    """
    settings = get_settings()
    url = database_url(settings)
    if is_embedded(settings):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    logging.getLogger("alembic").setLevel(logging.INFO)  # log each migration it runs
    upgrade_database(url)
    stdout_console().print(
        f"database {display_url(url)} is at revision {current_revision(url)} (head)",
        highlight=False,
    )


@db_app.command("current")
@expected_errors
def current_command(as_json: JsonOption = False) -> None:
    """Show the schema revision of the database and whether it is the newest."""
    settings = get_settings()
    url = database_url(settings)
    never_created = is_embedded(settings) and not (settings.data_dir / "compactor.db").exists()
    current = None if never_created else current_revision(url)
    head = head_revision()
    if as_json:
        print_json({"database": display_url(url), "current": current, "head": head,
                    "up_to_date": current == head})
        return
    state = "up to date" if current == head else "run `compactor db upgrade`"
    stdout_console().print(
        f"database {display_url(url)}: revision {current or 'none'}, head {head} ({state})",
        highlight=False,
    )


@db_app.command("backfill")
@expected_errors
def backfill_command(
    batch_messages: Annotated[int, typer.Option(
        min=1, help="Messages indexed per transaction.")] = DEFAULT_BATCH_MESSAGES,
    as_json: JsonOption = False,
) -> None:
    """Index messages stored before identifiers were computed at ingest (run once after
    upgrading to schema 0003; idempotent, safe beside running workers).

    Each message's identifiers and search text are computed and stored, and the
    session's artifact index updated, so jobs rank them and `compactor recall` finds them.
    """
    with open_store(get_settings()) as store:
        total = store.count_unindexed_messages()
        console = stderr_console()
        with Progress(TextColumn("indexing"), BarColumn(), MofNCompleteColumn(),
                      TimeRemainingColumn(), console=console, transient=True,
                      disable=not console.is_terminal) as progress:
            task = progress.add_task("backfill", total=total)
            report = backfill(store, batch_messages=batch_messages,
                              on_batch=lambda count: progress.advance(task, count))
    if as_json:
        print_json({"sessions": report.sessions, "messages": report.messages})
        return
    stdout_console().print(f"indexed {report.messages} messages in {report.sessions} "
                           "sessions", highlight=False)
