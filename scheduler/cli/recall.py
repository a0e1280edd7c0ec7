"""`compactor recall SESSION QUERY`: the stored messages where a value or phrase appears,
compacted spans included."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from scheduler.cli.common import (
    expected_errors,
    fail,
    get_settings,
    open_store,
    print_json,
    shown,
    stdout_console,
)


@expected_errors
def recall_command(
    session_id: Annotated[str, typer.Argument(metavar="SESSION", help="The session's id.")],
    query: Annotated[str, typer.Argument(help="A value or phrase, as written (any case).")],
    limit: Annotated[int, typer.Option(min=1, help="Most messages to show.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] =
    False,
) -> None:
    """Find where a value or phrase appears in a session's stored messages (seq, role,
    excerpt), using the database's text index; originals are never deleted."""
    with open_store(get_settings()) as store:
        try:
            hits = store.recall(session_id, query, limit=limit)
        except ValueError as error:
            fail(str(error))
    if as_json:
        print_json({"session_id": session_id, "query": query, "hits": hits})
        return
    table = Table("seq", "role", "excerpt")
    for hit in hits:
        table.add_row(str(hit.seq), shown(hit.role), shown(hit.excerpt))
    console = stdout_console()
    console.print(table)
    console.print(f"{len(hits)} messages", highlight=False)
