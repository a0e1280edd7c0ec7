"""The `compactor` command tree as typer builds it, for the tests that keep the docs and
the deploy files true: which subcommands exist, and whether an argument list parses.

Typer ships its own copy of click, so groups are told apart by their ``commands`` table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import typer

from scheduler.cli.main import app


def subcommands(command: Any) -> dict[str, Any] | None:
    """A group's subcommands by name; None for a runnable command."""
    table = getattr(command, "commands", None)
    return table if isinstance(table, dict) else None


def resolve_command(words: Sequence[str]) -> tuple[Any, list[str], list[str]]:
    """Follow ``words`` down the group tree: (command, its path, the remaining words).

    Raises LookupError naming the first word that is no subcommand of its group.
    """
    command: Any = typer.main.get_command(app)
    path: list[str] = []
    rest = list(words)
    while (table := subcommands(command)) is not None and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        if name not in table:
            raise LookupError(f"`compactor {' '.join([*path, name])}` is not a command")
        command, path = table[name], [*path, name]
    return command, path, rest


def check_invocation(argv: Sequence[str]) -> list[str]:
    """Parse ``compactor ARGV`` as the command line would, without running it; return the
    command's path. Raises LookupError for an unknown subcommand, and the command line's
    usage error for options or arguments the command does not take."""
    command, path, rest = resolve_command(argv)
    if rest == ["--help"]:
        return path
    if subcommands(command) is not None:
        raise LookupError(f"`compactor {' '.join(path)}` needs a subcommand")
    command.make_context(" ".join(["compactor", *path]), rest)
    return path


def command_paths() -> set[str]:
    """Every runnable command, as its words joined by spaces ("db upgrade", "worker")."""
    paths: set[str] = set()

    def walk(command: Any, prefix: list[str]) -> None:
        table = subcommands(command)
        if table is None:
            paths.add(" ".join(prefix))
            return
        for name, sub in table.items():
            walk(sub, [*prefix, name])

    walk(typer.main.get_command(app), [])
    return paths
