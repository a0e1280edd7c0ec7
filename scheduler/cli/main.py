"""The `compactor` command line: the typer app, assembled from small command modules.

Settings are read only in the commands (and the callback that configures logging for
all of them), through ``get_settings()``; helpers shared by every command live in
``scheduler/cli/common.py``.
"""

from __future__ import annotations

import logging
import sys
from types import TracebackType
from typing import Annotated, Any

import typer

from scheduler.cli import (
    check,
    cost,
    data,
    demo,
    jobs,
    lifecycle,
    platform,
    recall,
    schedule,
    sessions,
)
from scheduler.cli.batches import batches_app
from scheduler.cli.db import db_app
from scheduler.cli.dead import dead_app
from scheduler.cli.groups import CommandGroup

HELP_FLAGS = ("--help", "-h")


class _HelpAwareGroup(CommandGroup):
    """Notes whether a subcommand's help was asked for, before the callback runs: help
    is shown whatever the settings (`compactor check` reports them)."""

    # typer passes its own Context; the base class names typer's private click copy's.
    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        words = [*ctx._protected_args, *ctx.args]
        words = words[:words.index("--")] if "--" in words else words
        ctx.meta["help_requested"] = any(flag in words for flag in HELP_FLAGS)
        return super().invoke(ctx)


app = typer.Typer(
    cls=_HelpAwareGroup,
    name="compactor",
    help="Offline compaction of stored AI-agent sessions.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",  # help paragraphs reflow; `code` renders as code
    # Locals can hold message contents and secrets: never print them in a traceback.
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(requested: bool) -> None:
    if requested:
        from importlib.metadata import version

        typer.echo(f"compactor {version('session-compactor')}")
        raise typer.Exit()


@app.callback()
def _configure_logging(
    ctx: typer.Context,
    _version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print the installed version and exit.")] = False,
) -> None:
    # Every command logs on stderr as the workers do (alembic's records included);
    # stdout keeps the command's own answer. Invalid settings end every command but help
    # here: one line per problem, exit status 78. Help logs nothing and reads no
    # settings: it loads neither pydantic-settings nor structlog (bench.startup_bench times it).
    if ctx.meta.get("help_requested"):
        return
    from worker.settings.errors import settings_or_exit

    settings_or_exit()
    # typer installs its own hook when the app is called; this one, set after it, sends
    # an unexpected error's traceback through the logs' scrubber instead of printing it.
    sys.excepthook = _log_crash
    # The embedded database is checked on every command: alembic's per-connection notes
    # would open each one's stderr. `compactor db upgrade` reports its migrations again.
    logging.getLogger("alembic").setLevel(logging.WARNING)


def _log_crash(exc_type: type[BaseException], exc: BaseException,
               traceback: TracebackType | None) -> None:
    """Log an unexpected error as one ``cli.crashed`` record, scrubbed as every record is
    (a driver's message may quote a URL or a key)."""
    from worker.logging import get_logger

    get_logger().critical("cli.crashed", exc_info=(exc_type, exc, traceback))


app.add_typer(db_app, name="db")
app.add_typer(dead_app, name="dead")
app.add_typer(batches_app, name="batches")
app.command("import")(data.import_command)
app.command("export")(data.export_command)
app.command("append")(platform.append_command)
app.command("projection")(platform.projection_command)
app.command("sessions")(sessions.sessions_command)
app.command("show")(sessions.show_command)
app.command("recall")(recall.recall_command)
jobs.register(app)
schedule.register(app)
lifecycle.register(app)
demo.register(app)
check.register(app)
cost.register(app)
