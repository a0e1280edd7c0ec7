"""`python -m scheduler`: the `compactor` command line."""

from scheduler.cli import app

app(prog_name="compactor")
