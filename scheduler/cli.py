"""The `compactor` command line: the typer app, assembled from small command modules.

Settings are read only in the commands, through ``get_settings()``; helpers shared by
every command live in ``scheduler/cli_common.py``.
"""

from __future__ import annotations

import typer

from scheduler import cli_data, cli_demo, cli_jobs, cli_schedule, cli_sessions
from scheduler.cli_db import db_app

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
app.command("import")(cli_data.import_command)
app.command("export")(cli_data.export_command)
app.command("sessions")(cli_sessions.sessions_command)
app.command("show")(cli_sessions.show_command)
cli_jobs.register(app)
cli_schedule.register(app)
cli_demo.register(app)
