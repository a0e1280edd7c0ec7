"""`compactor db`: upgrade the database schema and report its revision."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from db import current_revision, head_revision, upgrade_database
from scheduler.cli.common import (
    database_url,
    display_url,
    expected_errors,
    is_embedded,
    print_json,
    stdout_console,
)
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
