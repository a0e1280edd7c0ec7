"""`compactor check`: is this configuration ready to run? The same checks a worker runs at
start (``worker/checks.py``), as a table of what to fix, or JSON for machines."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from scheduler.cli.common import get_settings, print_json, shown, stdout_console

if TYPE_CHECKING:
    from worker.checks import CheckResult


def register(app: typer.Typer) -> None:
    app.command("check")(check_command)


def check_command(
    as_json: Annotated[bool, typer.Option(
        "--json", help="One JSON object: ok, and every check's result.")] = False,
    probe_llm: Annotated[bool, typer.Option(
        "--llm/--no-llm", help="Call the LLM endpoint with one tiny request (--no-llm: "
        "check its settings only, as the worker's readiness probe does).")] = True,
) -> None:
    """Check the settings, the database (reachable, migrated), Redis, the tokenizer and
    the summarizer (the LLM endpoint with one tiny request); say what to fix.

    Exit status 1 when any check finds a problem (each also logged on stderr as one
    ``check.failed`` line). Invalid settings stop every command before this one runs, one
    line per problem (exit status 78).
    """
    from worker.checks import run_checks  # database, Redis and LLM clients: not for --help
    from worker.logging import get_logger

    results = run_checks(get_settings(), probe_llm=probe_llm)
    healthy = all(result.ok for result in results)
    for result in results:  # the log says it too, one line per finding, as a worker does
        if not result.ok:
            get_logger().error("check.failed", check=result.name, status=result.status.value,
                               detail=result.detail, fix=result.fix, message=result.line)
    if as_json:
        print_json({"ok": healthy, "checks": [_as_json(result) for result in results]})
    else:
        _print_table(results, healthy)
    if not healthy:
        raise typer.Exit(1)


def _as_json(result: CheckResult) -> dict[str, object]:
    return {"check": result.name, "status": result.status.value, "detail": result.detail,
            "fix": result.fix or None, "seconds": round(result.seconds, 3)}


def _print_table(results: list[CheckResult], healthy: bool) -> None:
    table = Table("check", "status", "found", "fix")
    for result in results:
        status = "[green]ok[/]" if result.ok else f"[bold red]{result.status.value}[/]"
        table.add_row(result.name, status, shown(result.detail), shown(result.fix or "-"))
    console = stdout_console()
    console.print(table)
    console.print("ready" if healthy else
                  f"{sum(not r.ok for r in results)} problem(s): fix them and run "
                  "`compactor check` again", highlight=False)
