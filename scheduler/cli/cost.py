"""`compactor cost --since WHEN`: what the runs of a window (a night) cost, and when each
compaction pays for itself (``scheduler/cost_report.py``)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import typer

from scheduler.cli.common import (
    expected_errors,
    get_settings,
    minute,
    open_store,
    parse_when,
    print_json,
    readable_table,
    shown,
    stdout_console,
    to_jsonable,
)

if TYPE_CHECKING:
    from scheduler.cost_report import CostReport


def register(app: typer.Typer) -> None:
    app.command("cost")(cost_command)


@expected_errors
def cost_command(
    since: Annotated[datetime, typer.Option(
        parser=parse_when, metavar="WHEN",
        help="Runs started at or after WHEN: an ISO datetime (UTC unless it says) or a "
        "span ago (30m, 24h, 7d).")],
    until: Annotated[datetime | None, typer.Option(
        parser=parse_when, metavar="WHEN", help="Only runs started before WHEN.")] = None,
    session_model: Annotated[str | None, typer.Option(
        help="The model the sessions are sent to: its input price (COMPACTOR_LLM_PRICES) "
        "values the tokens a compaction removes. Default: COMPACTOR_LLM_MODEL.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Report what the jobs of a window cost: jobs, tokens by kind (input, cached,
    output), cost in USD, and per compacted session the tokens removed from each future
    request, its request rate since its previous compaction, and the requests until the
    compaction has paid for itself."""
    from scheduler.cost_report import build_cost_report

    settings = get_settings()
    with open_store(settings) as store:
        runs = store.costed_runs(since=since, until=until)
    report = build_cost_report(runs, settings.price_table, since=since, until=until,
                               session_model=session_model or settings.llm_model)
    if as_json:
        print_json(to_jsonable(report))
        return
    _print_report(report)


def _print_report(report: CostReport) -> None:
    console = stdout_console()
    outcomes = ", ".join(f"{count:,} {outcome}"
                         for outcome, count in sorted(report.jobs_by_outcome.items()))
    console.print(
        f"{report.jobs:,} jobs since {minute(report.since)} ({outcomes or 'none'}); "
        f"{report.llm_calls:,} LLM calls; tokens: {report.input_tokens:,} input, "
        f"{report.cached_tokens:,} cached, {report.output_tokens:,} output", highlight=False)
    console.print(f"cost: ${report.cost_usd:.4f} (through the Batch API: "
                  f"${report.cost_at_batch_price_usd:.4f}; synchronous: "
                  f"${report.cost_at_sync_price_usd:.4f})", highlight=False)
    if report.unpriced_jobs:
        console.print(f"{report.unpriced_jobs:,} jobs called a model without a price in "
                      "COMPACTOR_LLM_PRICES: their cost is unknown and left out",
                      highlight=False)
    if not report.session_model_priced:
        console.print(f"the sessions' model {shown(report.session_model)} has no price in "
                      "COMPACTOR_LLM_PRICES: the paybacks are unknown (--session-model "
                      "names another)", highlight=False)
    table = readable_table("session", "cost $", "removed", "requests/h", "payback requests",
                           "payback h", shrink=("session",),
                           title=f"savings (priced at {shown(report.session_model)} input)")
    for saving in report.sessions:
        table.add_row(shown(saving.session_id), _number(saving.cost_usd, 6),
                      f"{saving.tokens_removed:,}", _number(saving.requests_per_hour, 1),
                      _number(saving.payback_requests, 1), _number(saving.payback_hours, 1))
    console.print(table)


def _number(value: float | None, digits: int) -> str:
    return "unknown" if value is None else f"{value:,.{digits}f}"
