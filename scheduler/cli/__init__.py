"""The ``compactor`` command line and its demo: one module per group of commands,
assembled into the typer app in ``scheduler/cli/main.py``."""
