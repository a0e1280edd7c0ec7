"""`compactor db`: upgrade the database schema, report its revision, and backfill what
a schema upgrade cannot compute (identifiers of messages stored before 0003)."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from scheduler.cli.common import (
    display_url,
    expected_errors,
    fail,
    get_settings,
    is_embedded,
    load_counter,
    open_store,
    print_json,
    shown,
    stderr_console,
    stdout_console,
)
from scheduler.cli.groups import CommandGroup
from worker.platform.backfill import DEFAULT_BATCH_MESSAGES

db_app = typer.Typer(
    cls=CommandGroup,
    help="The database schema (alembic migrations packaged with the service).",
    no_args_is_help=True,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
# Defaults: db.migrate's LOCK_TIMEOUT_S and LOCK_ATTEMPTS (not imported: `--help` loads no
# alembic); a unit test holds them equal.
LockTimeoutOption = Annotated[float, typer.Option(
    "--lock-timeout", min=0.001, metavar="SECONDS",
    help="PostgreSQL: how long a migration waits for a table's lock before it gives way "
    "(nothing changed), pauses as long and tries again.")]
LockAttemptsOption = Annotated[int, typer.Option(
    "--lock-attempts", min=1, help="PostgreSQL: attempts before it gives up.")]
DEFAULT_LOCK_TIMEOUT_S = 5.0
DEFAULT_LOCK_ATTEMPTS = 4


@db_app.command("upgrade")
@expected_errors
def upgrade_command(lock_timeout: LockTimeoutOption = DEFAULT_LOCK_TIMEOUT_S,
                    lock_attempts: LockAttemptsOption = DEFAULT_LOCK_ATTEMPTS) -> None:
    """Upgrade the schema to the newest revision (idempotent; safe to run on every deploy).

    For the embedded SQLite default, data_dir is created first. On PostgreSQL a migration
    never queues the service's statements behind a long transaction for more than
    --lock-timeout; after --lock-attempts it exits 1 with nothing changed.
    """
    from db import current_revision, upgrade_database

    settings = get_settings()
    url, shown_url = settings.effective_database_url, settings.configured_database_url
    if is_embedded(settings):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    logging.getLogger("alembic").setLevel(logging.INFO)  # log each migration it runs
    upgrade_database(url, lock_timeout_s=lock_timeout, lock_attempts=lock_attempts)
    stdout_console().print(
        f"database {shown(display_url(shown_url))} is at revision {current_revision(url)} (head)",
        highlight=False,
    )


# Exit status of `db current` when the schema is not the newest, of `db downgrade` when
# it is refused for want of --yes.
EXIT_BEHIND = 3
EXIT_UNCONFIRMED = 4


@db_app.command("current")
@expected_errors
def current_command(as_json: JsonOption = False) -> None:
    """Show the schema revision of the database and whether it is the newest.

    Exit status 3 when it is not (never migrated, or behind the head): a deploy check.
    """
    from db import current_revision, head_revision

    settings = get_settings()
    url, shown_url = settings.effective_database_url, settings.configured_database_url
    never_created = is_embedded(settings) and not (settings.data_dir / "compactor.db").exists()
    current = None if never_created else current_revision(url)
    head = head_revision()
    if as_json:
        print_json({"database": display_url(shown_url), "current": current, "head": head,
                    "up_to_date": current == head})
    else:
        state = "up to date" if current == head else "behind: run `compactor db upgrade`"
        stdout_console().print(
            f"database {shown(display_url(shown_url))}: revision {current or 'none'}, head {head} "
            f"({state})",
            highlight=False,
        )
    if current != head:
        raise typer.Exit(EXIT_BEHIND)


@db_app.command("downgrade")
@expected_errors
def downgrade_command(
    revision: Annotated[str | None, typer.Argument(
        metavar="[REVISION]", help="The revision to go back to, or `base` (no tables); "
        "default: the one before the current.")] = None,
    yes: Annotated[bool, typer.Option(
        "--yes", help="Downgrade: what the newer revisions added is dropped, data in it "
        "included.")] = False,
    lock_timeout: LockTimeoutOption = DEFAULT_LOCK_TIMEOUT_S,
    lock_attempts: LockAttemptsOption = DEFAULT_LOCK_ATTEMPTS,
) -> None:
    """Take the schema back to an earlier revision (to run an older release).

    Without --yes it only says what it would do, and exits with status 4.
    """
    from db import current_revision, downgrade_database, known_revisions

    settings = get_settings()
    url, shown_url = settings.effective_database_url, settings.configured_database_url
    current = current_revision(url)
    if current is None:
        fail("the database has no schema: nothing to downgrade")
    order = ["base", *known_revisions()]
    target = revision or order[order.index(current) - 1]
    if target not in order:
        fail(f"no revision {target!r}; the revisions are {', '.join(order)}")
    if order.index(target) >= order.index(current):
        fail(f"revision {target} is not before the current revision {current}")
    dropped = ", ".join(order[order.index(target) + 1: order.index(current) + 1])
    plan = f"downgrade {display_url(shown_url)} from {current} to {target}, undoing {dropped}"
    if not yes:
        fail(f"would {plan}; what they added is dropped, data included: pass --yes",
             exit_code=EXIT_UNCONFIRMED)
    logging.getLogger("alembic").setLevel(logging.INFO)  # log each migration it undoes
    downgrade_database(url, target, lock_timeout_s=lock_timeout, lock_attempts=lock_attempts)
    stdout_console().print(f"database {shown(display_url(shown_url))} is at revision "
                           f"{current_revision(url) or 'none (base)'}", highlight=False)


@db_app.command("backfill")
@expected_errors
def backfill_command(
    batch_messages: Annotated[int, typer.Option(
        min=1, help="Messages indexed per transaction.")] = DEFAULT_BATCH_MESSAGES,
    as_json: JsonOption = False,
) -> None:
    """Index messages stored before identifiers were computed at ingest (run once after
    upgrading to schema 0003), and count Anthropic system prompts stored before schema
    0009; idempotent, safe beside running workers.

    Each message's identifiers and search text are computed and stored, and the
    session's artifact index updated, so jobs rank them and `compactor recall` finds them.
    An Anthropic session's `system` is counted into its token totals, so the trigger
    sees it.
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from worker.platform.backfill import backfill

    settings = get_settings()
    counter = load_counter(settings)
    with open_store(settings) as store:
        total = store.count_unindexed_messages()
        console = stderr_console()
        with Progress(TextColumn("indexing"), BarColumn(), MofNCompleteColumn(),
                      TimeRemainingColumn(), console=console, transient=True,
                      disable=not console.is_terminal) as progress:
            task = progress.add_task("backfill", total=total)
            report = backfill(store, counter, batch_messages=batch_messages,
                              on_batch=lambda count: progress.advance(task, count))
    if as_json:
        print_json({"sessions": report.sessions, "messages": report.messages,
                    "system_prompts": report.system_prompts})
        return
    stdout_console().print(f"indexed {report.messages} messages in {report.sessions} "
                           f"sessions; counted {report.system_prompts} system prompts",
                           highlight=False)
