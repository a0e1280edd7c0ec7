"""What `compactor demo` prints: its setup, the import, the outcome of every session, one
compacted session's projection, and where an operator looks next."""

from __future__ import annotations

import shutil
import sys
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from db import CostedRun, RunRecord, SessionState
from scheduler.cli.common import display_url, readable_table, shown
from scheduler.cli.sessions import projection_table
from worker.platform.ingest import ImportStatus, SessionReport
from worker.settings.core import LLMMode

if TYPE_CHECKING:
    from db import Store
    from worker.settings.config import Settings

OUTCOME_ROWS = 40  # sessions listed in the outcome table; the rest are counted
PROJECTION_ROWS = 12  # projection messages shown after the summary block
SUMMARY_LINES = 24  # lines of the summary block shown
FAILED_OUTCOMES = ("failed", "rejected")
DEFAULT_DATA_DIR = Path(".compactor").resolve()
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def print_setup(console: Console, settings: Settings, set_by_demo: list[str]) -> None:
    console.print(
        f"[bold]compactor demo[/]: database {shown(display_url(settings.configured_database_url))}"
        f", summarizer {settings.effective_summarizer.value}, model window "
        f"{settings.model_context_tokens:,} tokens (compacts above {settings.trigger_tokens:,})",
        highlight=False, soft_wrap=True)
    if set_by_demo:
        console.print(f"demo settings for this run: {', '.join(set_by_demo)} (set them in the "
                      "environment to choose others)", highlight=False, markup=False)


def print_import(console: Console, reports: list[SessionReport]) -> None:
    statuses = Counter(report.status for report in reports)
    tokens = sum(report.tokens for report in reports)
    console.print(f"import: {len(reports)} sessions, {tokens:,} tokens: "
                  + ", ".join(f"{statuses[s]} {s.value}" for s in ImportStatus),
                  highlight=False, soft_wrap=True)
    for report in reports:
        if report.status is ImportStatus.REJECTED:
            kinds = ", ".join(sorted({problem.kind.value for problem in report.problems}))
            console.print(f"  rejected {shown(report.session_id or '(no id)')}: {kinds}",
                          highlight=False)


def print_nothing_due(console: Console, store: Store, settings: Settings,
                      session_ids: list[str]) -> None:
    states = [store.get_session(sid) for sid in _stored(session_ids)]
    compacted = sum(1 for state in states if state.active_revision_id is not None)
    console.print(f"[bold green]Nothing left to do[/]: the scan found no session due "
                  f"({compacted} of {len(states)} already compacted, the others under the "
                  "trigger).", highlight=False, soft_wrap=True)
    print_next_steps(console, settings, _largest(states))


@dataclass(frozen=True)
class _Row:
    session_id: str
    messages: int
    outcome: str
    reason: str
    before: int
    after: int


def print_results(console: Console, store: Store, settings: Settings, session_ids: list[str],
                  runs: dict[str, RunRecord]) -> bool:
    """Print the outcome table and one projection; False when a job failed."""
    rows = [_row(store, settings, sid, runs.get(sid)) for sid in _stored(session_ids)]
    console.print(_outcome_table(rows))
    before, after = sum(r.before for r in rows), sum(r.after for r in rows)
    done = [r for r in rows if r.after < r.before]
    console.print(
        f"[bold]Saved {before - after:,} tokens[/] ({_share(before - after, before)}) by "
        f"compacting {len(done)} of {len(rows)} sessions: a model now reads {after:,} tokens "
        f"instead of {before:,}.", highlight=False, soft_wrap=True)
    print_cost(console, settings, list(runs.values()))
    best = max(done, key=lambda r: r.before - r.after, default=None)
    if best is not None:
        print_projection(console, store, best.session_id)
    print_next_steps(console, settings, best.session_id if best else None)
    failed = [r for r in rows if r.outcome in FAILED_OUTCOMES]
    for row in failed:
        console.print(f"[red]{row.outcome}[/]: {shown(row.session_id)} ({shown(row.reason)})")
    return not failed


def print_cost(console: Console, settings: Settings, runs: list[RunRecord]) -> None:
    """What the demo's LLM calls cost, and what the Batch API would have charged."""
    from scheduler.cost_report import build_cost_report

    report = build_cost_report([CostedRun(run) for run in runs], settings.price_table,
                               since=min((run.started_at for run in runs), default=_EPOCH),
                               until=None, session_model=settings.llm_model)
    if not report.llm_calls:
        return
    prompt = report.input_tokens + report.cached_tokens
    priced = (f"cost ${report.cost_usd:.4f} (through the Batch API: "
              f"${report.cost_at_batch_price_usd:.4f})")
    if settings.llm_mode is LLMMode.BATCH:
        priced = (f"the night cost ${report.cost_usd:.4f} through the Batch API "
                  f"(synchronous calls: ${report.cost_at_sync_price_usd:.4f})")
    if report.unpriced_jobs:
        priced = f"cost unknown: {shown(settings.llm_model)} has no price in COMPACTOR_LLM_PRICES"
    console.print(
        f"{report.llm_calls:,} LLM calls sent {prompt:,} prompt tokens "
        f"({report.cached_tokens:,} served from the provider's cache) and got "
        f"{report.output_tokens:,} back: {priced}; `compactor cost --since 1h` has the "
        "details.", highlight=False, soft_wrap=True)


def _row(store: Store, settings: Settings, session_id: str, run: RunRecord | None) -> _Row:
    state = store.get_session(session_id)
    if run is not None:
        figures = run.figures or {}
        before = int(figures.get("tokens_before") or state.projection_tokens)
        after = int(figures.get("tokens_after") or before)
        reason = str(figures.get("outcome_reason") or run.reason)
        # A scan forces the job of a "dirty" session: its trigger says more than "forced".
        return _Row(session_id, state.head_seq, run.outcome,
                    run.reason if reason == "forced" else reason, before, after)
    if state.active_revision_id is not None:
        before = store.revisions(session_id)[-1].projection_tokens_before
        return _Row(session_id, state.head_seq, "compacted earlier", "not due",
                    before, state.projection_tokens)
    over = state.projection_tokens > settings.trigger_tokens
    return _Row(session_id, state.head_seq, "not due",
                "over trigger, not queued" if over else "under trigger",
                state.projection_tokens, state.projection_tokens)


def _outcome_table(rows: list[_Row]) -> Table:
    table = readable_table("session", "msgs", "outcome", "reason", "before", "after",
                           "saved", title="outcome per session", shrink=("session", "reason"))
    styles = {"compacted": "green", "compacted earlier": "green", "fallback": "yellow",
              "not due": "dim"}
    for row in rows[:OUTCOME_ROWS]:
        style = styles.get(row.outcome, "red" if row.outcome in FAILED_OUTCOMES else "")
        saved = row.before - row.after
        table.add_row(shown(row.session_id), str(row.messages),
                      f"[{style}]{row.outcome}[/]" if style else row.outcome, shown(row.reason),
                      f"{row.before:,}", f"{row.after:,}",
                      f"{saved:,} ({_share(saved, row.before)})" if saved else "-")
    if len(rows) > OUTCOME_ROWS:
        table.caption = f"… and {len(rows) - OUTCOME_ROWS} more sessions (compactor sessions)"
    return table


def print_projection(console: Console, store: Store, session_id: str) -> None:
    """The summary block and the start of the verbatim tail of one compacted session."""
    state = store.get_session(session_id)
    projection = store.projection(session_id)
    console.print(f"\n[bold]{shown(session_id)}[/]: a model is now sent {len(projection)} "
                  f"messages ({state.projection_tokens:,} tokens) instead of {state.head_seq} "
                  f"({state.total_tokens:,} tokens). Its summary block:",
                  highlight=False, soft_wrap=True)
    block = next((m for m in projection if str(m.get("content", "")).startswith("[Summary")),
                 None)
    if block is not None:
        lines = str(block["content"]).splitlines()
        more = [f"… {len(lines) - SUMMARY_LINES} more lines"] if len(lines) > SUMMARY_LINES else []
        text = "\n".join(shown(line) for line in [*lines[:SUMMARY_LINES], *more])
        console.print(Panel(text, title="summary block", expand=False))
    table = projection_table(projection[:PROJECTION_ROWS])
    if len(projection) > PROJECTION_ROWS:
        table.caption = (f"… {len(projection) - PROJECTION_ROWS} more messages: "
                         f"compactor show {session_id}")
    console.print(table)


def print_next_steps(console: Console, settings: Settings, session_id: str | None) -> None:
    sid = session_id or "SESSION"
    env = "" if settings.data_dir == DEFAULT_DATA_DIR else \
        f"COMPACTOR_DATA_DIR={settings.data_dir} "
    steps = (
        ("compactor sessions", "every stored session: tokens, revisions, breaker"),
        (f"compactor show {sid}", "its revisions and the projection a model is sent"),
        ("compactor runs", "one row per job: outcome, reason, tokens before/after"),
        (f"compactor rollback {sid}", "back to the previous revision (nothing is deleted)"),
        (f"compactor export --view projection --session {sid}", "the projection as JSONL"),
    )
    width = max(len(env + command) for command, _ in steps)
    console.print("\n[bold]Where to look next[/]", highlight=False, soft_wrap=True)
    if shutil.which("compactor") is None:
        # `make demo` runs from .venv without activating it: say how to reach the command.
        console.print(f"  (put `compactor` on your PATH first: source "
                      f"{Path(sys.executable).parent / 'activate'})", markup=False,
                      highlight=False, soft_wrap=True)
    for command, what in steps:
        # Whole lines, never wrapped by rich, so each command copies and pastes as is.
        console.print(f"  {env + command:<{width}}  # {what}", markup=False, highlight=False,
                      soft_wrap=True)
    log = settings.data_dir / "demo-worker.log"
    console.print(f"  database: {settings.data_dir / 'compactor.db'}\n  worker log (JSON "
                  f"lines): {log}\n    jq -c 'select(.event==\"compaction.job\") | {{session_id,"
                  f" outcome, reason, tokens_before, tokens_after}}' {log}", highlight=False,
                  markup=False, soft_wrap=True)


def _stored(session_ids: list[str]) -> list[str]:
    return list(dict.fromkeys(sid for sid in session_ids if sid))


def _largest(states: list[SessionState]) -> str | None:
    """The compacted session with the longest history (the one worth showing)."""
    compacted = [state for state in states if state.active_revision_id is not None]
    best = max(compacted, key=lambda state: state.total_tokens, default=None)
    return best.session_id if best is not None else None


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"
