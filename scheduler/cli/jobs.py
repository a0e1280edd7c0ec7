"""Operator commands around jobs: start a worker, compact in-process, read the runs
table, roll a session back, and inspect or reset its breaker."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from scheduler.cli.common import (
    expected_errors,
    fail,
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
from scheduler.cli.groups import CommandGroup
from worker.compaction import Outcome

if TYPE_CHECKING:
    from db import RevisionRecord, Store
    from worker.job.values import JobResult

JsonFlag = Annotated[bool, typer.Option("--json", help="One JSON object per line.")]
T = TypeVar("T")
breaker_app = typer.Typer(cls=CommandGroup, no_args_is_help=True,
                          help="Inspect or reset a session's failure breaker.")


def register(app: typer.Typer) -> None:
    app.command("worker")(worker_command)
    app.command("compact")(compact_command)
    app.command("runs")(runs_command)
    app.command("rollback")(rollback_command)
    app.command("roll-forward")(roll_forward_command)
    app.add_typer(breaker_app, name="breaker")


def worker_command(
    concurrency: Annotated[int | None, typer.Option(help="Worker processes.")] = None,
    loglevel: Annotated[str, typer.Option(help="Celery's own log level.")] = "INFO",
    task_events: Annotated[bool, typer.Option(
        "-E", "--task-events", help="Send Celery's task events (what Flower shows).")] = False,
) -> None:
    """Start a Celery worker on the compaction queue (prefork pool, fair scheduling)."""
    settings = get_settings()
    argv = [
        "--pool=prefork", f"--concurrency={concurrency or settings.worker_concurrency}",
        f"--queues={settings.queue_name}", f"--loglevel={loglevel}", "-O", "fair",
        "--without-gossip", "--without-mingle", *(["--task-events"] if task_events else []),
    ]
    if settings.metrics_port is not None:
        from worker.broker.serve import set_metrics_environment

        set_metrics_environment()
    # This process becomes the worker (same pid, signals and environment), without the
    # command line's modules that every pool child would otherwise inherit (worker/broker/serve.py).
    # -P: the working directory (a data directory) is not on the module path.
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-P", "-m", "worker.broker.serve", *argv])


@expected_errors
def compact_command(
    sessions: Annotated[list[str] | None, typer.Argument(help="Session ids.")] = None,
    all_sessions: Annotated[bool, typer.Option("--all", help="Every stored session.")] = False,
    inline: Annotated[bool, typer.Option(
        "--inline", help="Run in this process, no queue (required unless --dry-run: use "
        "`compactor trigger` to enqueue).")] = False,
    force: Annotated[bool, typer.Option(help="Compact even under the trigger.")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print each job's plan (span, tail, LLM calls and tokens); run "
        "and write nothing.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Run the compaction pipeline in-process for debugging and small installs.

    Each job's compaction.job event goes to stderr as the job ends; the results table
    (or --json) to stdout at the end.
    """
    from scheduler.cli.previews import print_compaction_plans
    from worker.job import pipeline
    from worker.job.outcome import emit_job_event
    from worker.job.values import JobRequest
    from worker.logging import get_logger
    from worker.runtime import build_runtime

    if not inline and not dry_run:
        fail("`compact` runs jobs in this process: pass --inline (or --dry-run for the "
             "plan), or enqueue with `compactor trigger SESSION...`", exit_code=2)
    if not sessions and not all_sessions:
        fail("name at least one session, or pass --all", exit_code=2)
    settings = get_settings()
    with open_store(settings):  # creates/upgrades the embedded database, checks the schema
        pass
    runtime = build_runtime(settings, use_redis=False)
    try:
        ids = sessions or _all_session_ids(runtime.store)
        if dry_run:
            from worker.job.preview import preview_compaction

            previews = [preview_compaction(JobRequest(sid, "operator", force), runtime.deps,
                                           runtime.policy) for sid in ids]
        else:
            results = []
            for sid in ids:  # each event as its job ends: the operator's progress
                results.append(pipeline.run(JobRequest(sid, "operator", force), runtime.deps,
                                            runtime.policy))
                emit_job_event(get_logger(), results[-1])
    finally:
        runtime.close()
    if dry_run:
        print_compaction_plans(previews, as_json)
        return
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
    from worker.job.outcome import job_event_fields

    if as_json:
        for result in results:
            print_json(job_event_fields(result))
        return
    table = readable_table("session", "outcome", "reason", "before", "after", "revision",
                           shrink=("session", "reason"))
    for r in results:
        table.add_row(shown(r.session_id), r.outcome.value, shown(r.reason),
                      _num(r.figures.tokens_before), _num(r.figures.tokens_after),
                      str(r.revision_id or ""))
    stdout_console().print(table)


def _num(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else ""


@expected_errors
def runs_command(
    session: Annotated[str | None, typer.Option(help="Only this session.")] = None,
    outcome: Annotated[Outcome | None, typer.Option(help="Only this outcome.")] = None,
    since: Annotated[datetime | None, typer.Option(
        parser=parse_when, metavar="WHEN",
        help="Only runs started at or after WHEN: an ISO datetime (UTC unless it says) "
        "or a span ago (30m, 24h, 7d).")] = None,
    until: Annotated[datetime | None, typer.Option(
        parser=parse_when, metavar="WHEN", help="Only runs started before WHEN.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Newest N runs.")] = 50,
    as_json: JsonFlag = False,
) -> None:
    """List job runs, newest first: outcome, reason, tokens, failure.

    With --json, ``rolled_back`` says whether a run's revision has left its session's
    active chain (null: the run made no revision).
    """
    with open_store(get_settings()) as store:
        runs = store.runs(session_id=session, outcome=outcome.value if outcome else None,
                          since=since, until=until, limit=limit)
        chains = {sid: _active_chain(store, sid)
                  for sid in {run.session_id for run in runs if run.revision_id is not None}}
    if as_json:
        for run in runs:
            rolled_back = (None if run.revision_id is None
                           else run.revision_id not in chains[run.session_id])
            print_json({**to_jsonable(run), "rolled_back": rolled_back})
        return
    table = readable_table("id", "session", "started", "outcome", "reason", "before", "after",
                           "failure", shrink=("session", "reason", "failure"))
    for run in runs:
        figures = run.figures or {}
        table.add_row(str(run.id), shown(run.session_id), minute(run.started_at),
                      shown(run.outcome), shown(figures.get("outcome_reason") or run.reason),
                      _num(figures.get("tokens_before")), _num(figures.get("tokens_after")),
                      shown(run.failure_class or ""))
    stdout_console().print(table)


def _active_chain(store: Store, session_id: str) -> set[int]:
    """The session's active revision and its ancestors: the revisions still in force."""
    from db import SessionNotFound

    try:
        current = store.get_session(session_id).active_revision_id
    except SessionNotFound:  # erased since its runs were recorded
        return set()
    if current is None:
        return set()
    return {current, *_ancestors(current, store.revisions(session_id))}


@expected_errors
def rollback_command(
    session: Annotated[str, typer.Argument(help="Session id.")],
    to: Annotated[int | None, typer.Option("--to", help="An earlier revision of the active "
                                           "chain (default: the parent).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Point the session back at an earlier revision; nothing is deleted
    (`compactor roll-forward` re-activates a later one)."""
    with open_store(get_settings()) as store:
        active = store.get_session(session).active_revision_id
        if active is None:
            fail(f"session {session} has no summary to roll back")
        revisions = store.revisions(session)
        if to is not None:
            _check_target(session, to, revisions, _ancestors(active, revisions),
                          "earlier", "roll-forward")
        revision = _revision_errors(lambda: store.rollback(session, to_revision_id=to))
        state = store.get_session(session)
    _print_active(session, revision.id if revision else None, state.projection_tokens,
                  as_json)


@expected_errors
def roll_forward_command(
    session: Annotated[str, typer.Argument(help="Session id.")],
    to: Annotated[int | None, typer.Option("--to", help="A later revision, descending from "
                                           "the active one (default: the newest).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Re-activate a later revision after a rollback; nothing is deleted."""
    with open_store(get_settings()) as store:
        active = store.get_session(session).active_revision_id
        revisions = store.revisions(session)
        later = [r.id for r in revisions
                 if active is None or active in _ancestors(r.id, revisions)]
        if to is None and not later:
            fail(f"session {session} has no revision later than the active one "
                 f"({active or 'none'})")
        target = to if to is not None else max(later)
        _check_target(session, target, revisions, set(later), "later", "rollback")
        revision = _revision_errors(lambda: store.roll_forward(session,
                                                               to_revision_id=target))
        state = store.get_session(session)
    _print_active(session, revision.id, state.projection_tokens, as_json)


def _ancestors(revision_id: int, revisions: list[RevisionRecord]) -> set[int]:
    """The revisions ``revision_id`` descends from."""
    parents = {r.id: r.parent_revision_id for r in revisions}
    found: set[int] = set()
    current = parents.get(revision_id)
    while current is not None and current not in found:
        found.add(current)
        current = parents.get(current)
    return found


def _check_target(session: str, target: int, revisions: list[RevisionRecord],
                  allowed: set[int], direction: str, other_command: str) -> None:
    """Fail with what is wrong with ``target`` and what the session has instead."""
    ids = sorted(r.id for r in revisions)
    if target not in ids:
        fail(f"session {session} has no revision {target}; it has {_id_list(ids)}")
    if target not in allowed:
        choices = _id_list(sorted(allowed)) if allowed else "none"
        fail(f"revision {target} of session {session} is not {direction} than the active "
             f"one; {direction} ones: {choices} (see `compactor {other_command}`)")


def _id_list(ids: list[int]) -> str:
    if ids and ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 2:
        return f"{ids[0]}..{ids[-1]}"
    return ", ".join(map(str, ids))


def _revision_errors(change: Callable[[], T]) -> T:
    """Run a rollback or roll-forward; a revision that moved meanwhile is a plain error."""
    from db import RevisionNotFound

    try:
        return change()
    except RevisionNotFound as error:
        fail(f"{error} (the session changed meanwhile; look again with `compactor show`)")


def _print_active(session: str, active: int | None, projection_tokens: int,
                  as_json: bool) -> None:
    if as_json:
        print_json({"session_id": session, "active_revision_id": active,
                    "projection_tokens": projection_tokens})
        return
    stdout_console().print(f"{shown(session)}: active revision is now "
                           f"{active or 'none (full history)'}, projection "
                           f"{projection_tokens:,} tokens", highlight=False)


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
    stdout_console().print(f"{shown(session)}: {shown(state.breaker_state)}, "
                           f"{state.breaker_failures} consecutive failures, opened at {opened}",
                           highlight=False)


@breaker_app.command("reset")
@expected_errors
def breaker_reset(session: Annotated[str, typer.Argument()]) -> None:
    """Close a session's breaker so the next job runs normally."""
    from db import BreakerUpdate

    with open_store(get_settings()) as store:
        store.set_breaker(session, BreakerUpdate(state="closed", failures=0, opened_at=None))
    stdout_console().print(f"{shown(session)}: breaker closed", highlight=False)
