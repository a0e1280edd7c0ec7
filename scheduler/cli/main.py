"""The `compactor` command line: the typer app, assembled from small command modules.

Settings are read only in the commands, through ``get_settings()``; helpers shared by
every command live in ``scheduler/cli/common.py``.
"""

from __future__ import annotations

import typer

from scheduler.cli import data, demo, jobs, platform, schedule, sessions
from scheduler.cli.db import db_app

app = typer.Typer(
    name="compactor",
    help="Offline compaction of stored AI-agent sessions.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",  # help paragraphs reflow; `code` renders as code
    # Locals can hold message contents and secrets: never print them in a traceback.
    pretty_exceptions_show_locals=False,
)

app.add_typer(db_app, name="db")
app.command("import")(data.import_command)
app.command("export")(data.export_command)
app.command("append")(platform.append_command)
app.command("projection")(platform.projection_command)
app.command("sessions")(sessions.sessions_command)
app.command("show")(sessions.show_command)
jobs.register(app)
schedule.register(app)
demo.register(app)
