"""`python -m scheduler`: the `compactor` command line."""

from scheduler.cli.main import app

app(prog_name="compactor")
