"""`compactor batches list|poll`: the Batch API batches parked jobs wait on, and one poll
(docs/RUNBOOK.md, "Batches")."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Annotated

import typer

from scheduler.cli.common import (
    expected_errors,
    get_settings,
    print_json,
    readable_table,
    shown,
    stdout_console,
)
from scheduler.cli.groups import CommandGroup

batches_app = typer.Typer(cls=CommandGroup, no_args_is_help=True,
                          help="Batch API batches (COMPACTOR_LLM_MODE=batch): list, poll.")
JsonOption = Annotated[bool, typer.Option("--json", help="JSON on stdout.")]


@batches_app.command("list")
@expected_errors
def list_command(as_json: JsonOption = False) -> None:
    """List the batches parked jobs wait on: id, status, jobs, requests."""
    from db import Store
    from scheduler.batches import list_open_batches
    from worker.runtime import llm_config
    from worker.summarizers.openai_batch import LLMBatches
    from worker.summarizers.openai_client import LLMClient

    settings = get_settings()
    store = Store.from_url(settings.effective_database_url)
    try:
        with LLMClient(llm_config(settings)) as client:
            listed = list_open_batches(store, LLMBatches(client))
    finally:
        store.close()
    if as_json:
        print_json([dataclasses.asdict(batch) for batch in listed])
        return
    table = readable_table("batch", "status", "jobs", "requests")
    for batch in listed:
        table.add_row(shown(batch.batch_id or "(not sent)"), shown(batch.status),
                      str(batch.jobs), str(batch.requests))
    console = stdout_console()
    console.print(table)
    console.print(f"{len(listed)} batches, {sum(b.jobs for b in listed)} parked jobs")


@batches_app.command("poll")
@expected_errors
def poll_command(as_json: JsonOption = False) -> None:
    """One poll (what beat runs every batch_poll_interval_s): collect finished batches,
    send their jobs again, submit the requests parked since."""
    from scheduler.batches import run_scheduled_poll

    report = run_scheduled_poll(get_settings(), datetime.now(UTC))
    if as_json:
        print_json(dataclasses.asdict(report))
        return
    console = stdout_console()
    for batch_id, status in report.collected.items():
        console.print(f"collected {shown(batch_id)}: {shown(status)}", highlight=False)
    for batch_id, requests in report.submitted.items():
        console.print(f"submitted {shown(batch_id)}: {requests} requests", highlight=False)
    console.print(f"{len(report.open)} batches still open, {report.resumed} jobs sent again",
                  highlight=False)
