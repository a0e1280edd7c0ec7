"""Operator commands around jobs: start a worker, compact in-process, read the runs
table, roll a session back, and inspect or reset its breaker."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from db import BreakerUpdate, SessionNotFound, Store
from scheduler.cli.common import (
    expected_errors,
    fail,
    open_store,
    print_json,
    stdout_console,
    to_jsonable,
)
from worker import pipeline
from worker.job import JobRequest, JobResult
from worker.logging import get_logger
from worker.outcome import emit_job_event, job_event_fields
from worker.runtime import build_runtime
from worker.settings import get_settings

JsonFlag = Annotated[bool, typer.Option("--json", help="One JSON object per line.")]
breaker_app = typer.Typer(help="Inspect or reset a session's failure breaker.",
                          no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.command("worker")(worker_command)
    app.command("compact")(compact_command)
    app.command("runs")(runs_command)
    app.command("rollback")(rollback_command)
    app.add_typer(breaker_app, name="breaker")


def worker_command(
    concurrency: Annotated[int | None, typer.Option(help="Worker processes.")] = None,
    loglevel: Annotated[str, typer.Option(help="Celery's own log level.")] = "INFO",
) -> None:
    """Start a Celery worker on the compaction queue (prefork pool, fair scheduling)."""
    settings = get_settings()
    from worker.celery_app import app  # loads the Celery app only for this command

    app.worker_main([
        "worker", "--pool=prefork", f"--concurrency={concurrency or settings.worker_concurrency}",
        f"--queues={settings.queue_name}", f"--loglevel={loglevel}", "-O", "fair",
        "--without-gossip", "--without-mingle",
    ])


@expected_errors
def compact_command(
    sessions: Annotated[list[str] | None, typer.Argument(help="Session ids.")] = None,
    all_sessions: Annotated[bool, typer.Option("--all", help="Every stored session.")] = False,
    inline: Annotated[bool, typer.Option("--inline", help="Run in this process, no queue "
                                         "(required: use `compactor trigger` to enqueue).")
                      ] = False,
    force: Annotated[bool, typer.Option(help="Compact even under the trigger.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Run the compaction pipeline in-process for debugging and small installs."""
    if not inline:
        fail("`compact` runs jobs in this process: pass --inline, or enqueue with "
             "`compactor trigger SESSION...`", exit_code=2)
    if not sessions and not all_sessions:
        fail("name at least one session, or pass --all", exit_code=2)
    settings = get_settings()
    with open_store(settings):  # creates/upgrades the embedded database, checks the schema
        pass
    runtime = build_runtime(settings, use_redis=False)
    try:
        ids = sessions or _all_session_ids(runtime.store)
        results = [pipeline.run(JobRequest(sid, "operator", force), runtime.deps, runtime.policy)
                   for sid in ids]
    finally:
        runtime.close()
    for result in results:
        emit_job_event(get_logger(), result)
    _print_results(results, as_json)
    if any(r.outcome.value in ("failed", "rejected") for r in results):
        raise typer.Exit(1)


def _all_session_ids(store: Store) -> list[str]:
    ids: list[str] = []
    page = store.list_sessions(limit=1000)
    while page:
        ids.extend(s.session_id for s in page)
        page = store.list_sessions(after=ids[-1], limit=1000)
    return ids


def _print_results(results: list[JobResult], as_json: bool) -> None:
    if as_json:
        for result in results:
            print_json(job_event_fields(result))
        return
    table = Table("session", "outcome", "reason", "tokens before", "tokens after", "revision")
    for r in results:
        table.add_row(r.session_id, r.outcome.value, r.reason,
                      _num(r.figures.tokens_before), _num(r.figures.tokens_after),
                      str(r.revision_id or ""))
    stdout_console().print(table)


def _num(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else ""


@expected_errors
def runs_command(
    session: Annotated[str | None, typer.Option(help="Only this session.")] = None,
    outcome: Annotated[str | None, typer.Option(help="Only this outcome.")] = None,
    limit: Annotated[int, typer.Option(help="Newest N runs.")] = 50,
    as_json: JsonFlag = False,
) -> None:
    """List job runs, newest first: outcome, reason, tokens, failure.

    With --json, ``rolled_back`` says whether a run's revision has left its session's
    active chain (null: the run made no revision).
    """
    with open_store(get_settings()) as store:
        runs = store.runs(session_id=session, outcome=outcome, limit=limit)
        chains = {sid: _active_chain(store, sid)
                  for sid in {run.session_id for run in runs if run.revision_id is not None}}
    if as_json:
        for run in runs:
            rolled_back = (None if run.revision_id is None
                           else run.revision_id not in chains[run.session_id])
            print_json({**to_jsonable(run), "rolled_back": rolled_back})
        return
    table = Table("id", "session", "started", "outcome", "reason", "before", "after", "failure")
    for run in runs:
        figures = run.figures or {}
        table.add_row(str(run.id), run.session_id, run.started_at.isoformat(timespec="seconds"),
                      run.outcome, str(figures.get("outcome_reason") or run.reason),
                      _num(figures.get("tokens_before")), _num(figures.get("tokens_after")),
                      run.failure_class or "")
    stdout_console().print(table)


def _active_chain(store: Store, session_id: str) -> set[int]:
    """The session's active revision and its ancestors: the revisions still in force."""
    try:
        current = store.get_session(session_id).active_revision_id
    except SessionNotFound:  # erased since its runs were recorded
        return set()
    parents = {r.id: r.parent_revision_id for r in store.revisions(session_id)}
    chain: set[int] = set()
    while current is not None and current not in chain:
        chain.add(current)
        current = parents.get(current)
    return chain


@expected_errors
def rollback_command(
    session: Annotated[str, typer.Argument(help="Session id.")],
    to: Annotated[int | None, typer.Option("--to", help="An earlier revision of the active "
                                           "chain (default: the parent).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Point the session back at an earlier revision; nothing is deleted."""
    with open_store(get_settings()) as store:
        if store.get_session(session).active_revision_id is None:
            fail(f"session {session} has no summary to roll back")
        revision = store.rollback(session, to_revision_id=to)
        state = store.get_session(session)
    active = revision.id if revision else None
    if as_json:
        print_json({"session_id": session, "active_revision_id": active,
                    "projection_tokens": state.projection_tokens})
        return
    stdout_console().print(f"{session}: active revision is now {active or 'none (full history)'}"
                           f", projection {state.projection_tokens:,} tokens")


@breaker_app.command("status")
@expected_errors
def breaker_status(session: Annotated[str, typer.Argument()], as_json: JsonFlag = False) -> None:
    """Show the breaker of a session: state, consecutive failures, when it opened."""
    with open_store(get_settings()) as store:
        state = store.get_session(session)
    fields = {"session_id": session, "state": state.breaker_state,
              "failures": state.breaker_failures, "opened_at": state.breaker_opened_at}
    if as_json:
        print_json(fields)
        return
    opened = state.breaker_opened_at.isoformat() if state.breaker_opened_at else "-"
    stdout_console().print(f"{session}: {state.breaker_state}, {state.breaker_failures} "
                           f"consecutive failures, opened at {opened}")


@breaker_app.command("reset")
@expected_errors
def breaker_reset(session: Annotated[str, typer.Argument()]) -> None:
    """Close a session's breaker so the next job runs normally."""
    with open_store(get_settings()) as store:
        store.set_breaker(session, BreakerUpdate(state="closed", failures=0, opened_at=None))
    stdout_console().print(f"{session}: breaker closed")
