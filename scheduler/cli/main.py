"""The `compactor` command line: the typer app, assembled from small command modules.

Settings are read only in the commands (and the callback that configures logging for
all of them), through ``get_settings()``; helpers shared by every command live in
``scheduler/cli/common.py``.
"""

from __future__ import annotations

import logging

import pydantic
import typer

from scheduler.cli import data, demo, jobs, lifecycle, platform, recall, schedule, sessions
from scheduler.cli.db import db_app
from scheduler.cli.dead import dead_app
from worker.logging import configure_logging
from worker.settings import get_settings

app = typer.Typer(
    name="compactor",
    help="Offline compaction of stored AI-agent sessions.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",  # help paragraphs reflow; `code` renders as code
    # Locals can hold message contents and secrets: never print them in a traceback.
    pretty_exceptions_show_locals=False,
)



@app.callback()
def _configure_logging() -> None:
    # Every command logs on stderr as the workers do (alembic's records included);
    # stdout keeps the command's own answer.
    try:
        settings = get_settings()
    except pydantic.ValidationError:
        configure_logging()  # the command reports the invalid settings itself
        return
    configure_logging(settings.log_format.value, settings.log_level)
    # The embedded database is checked on every command: alembic's per-connection notes
    # would open each one's stderr. `compactor db upgrade` reports its migrations again.
    logging.getLogger("alembic").setLevel(logging.WARNING)


app.add_typer(db_app, name="db")
app.add_typer(dead_app, name="dead")
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
