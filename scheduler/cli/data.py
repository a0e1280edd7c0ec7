"""`compactor import` and `compactor export`: sessions in and out as JSONL files, one
``{"session_id", "messages", **metadata}`` record per line."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from scheduler.cli.common import (
    dumps_json,
    expected_errors,
    fail,
    get_settings,
    load_counter,
    open_store,
    print_json,
    shown,
    stderr_console,
    stdout_console,
)
from worker.platform.export_views import ExportView

if TYPE_CHECKING:
    from worker.compaction import IntakePolicy, ProblemKind
    from worker.platform.ingest import SessionReport


class PolicyName(StrEnum):
    DEFAULT = "default"  # repair what keeps every message; reject orphans and bad shapes
    STRICT = "strict"  # reject every problem
    LENIENT = "lenient"  # repair every problem that has a repair (drops orphan results)




def intake_policy(name: PolicyName) -> IntakePolicy:
    """The policy a name picks; built when a command runs (`--help` loads no intake)."""
    from worker.compaction import IntakePolicy

    return {PolicyName.DEFAULT: IntakePolicy, PolicyName.STRICT: IntakePolicy.strict,
            PolicyName.LENIENT: IntakePolicy.lenient}[name]()


# How often a long export reports its count on stderr (s).
EXPORT_PROGRESS_EVERY_S = 2.0
# Keyed by ImportStatus's values (a StrEnum): the module loads no intake.
STATUS_STYLES = {"imported": "green", "repaired": "yellow", "rejected": "bold red",
                 "exists": "dim"}


@expected_errors
def import_command(
    file: Annotated[Path, typer.Argument(
        metavar="FILE|-", dir_okay=False, allow_dash=True,
        help="JSONL file, one session per line; - reads stdin.")],
    continue_on_error: Annotated[bool, typer.Option(
        "--continue-on-error", help="Exit 0 even when sessions or lines were rejected.")] = False,
    policy: Annotated[PolicyName, typer.Option(
        help="Intake policy: default repairs legacy function calls, missing tool results, "
        "duplicate tool call ids and invalid text, and rejects the rest; strict rejects "
        "every problem; lenient also drops orphan tool results.")] = PolicyName.DEFAULT,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON report per line.")] =
    False,
) -> None:
    """Import sessions: check and repair each one, count its tokens, store it.

    Each session is stored whole or not at all; a rejected session or a malformed line
    never stops the others. A session id already stored is reported as `exists` and left
    alone, so re-running an import is harmless. Exits 1 when anything was rejected,
    unless --continue-on-error. The embedded SQLite default is created on first use; a
    configured COMPACTOR_DATABASE_URL must be upgraded with `compactor db upgrade` first.
    """
    from worker.platform.ingest import ImportStatus, SessionReport, import_record

    settings = get_settings()
    counter, chosen_policy = load_counter(settings), intake_policy(policy)
    now = datetime.now(UTC)
    rows: list[tuple[int, SessionReport]] = []
    with open_store(settings) as store, open_input(file) as (lines, size_bytes), \
            progress_bar(size_bytes) as advance:
        for line_number, size, item in read_jsonl_lines(lines):
            report = item if isinstance(item, SessionReport) else import_record(
                item, store=store, counter=counter, policy=chosen_policy, now=now)
            advance(size)
            rows.append((line_number, report))
            if as_json:
                print_json({"line": line_number, **json_report(report)})
    statuses = Counter(report.status for _, report in rows)
    if as_json:
        print_json({"summary": {status.value: statuses[status] for status in ImportStatus}})
    else:
        print_import_table(rows, statuses)
    if statuses[ImportStatus.REJECTED] and not continue_on_error:
        stderr_console().print(
            f"{statuses[ImportStatus.REJECTED]} rejected (nothing stored for them); "
            "exit 1 (--continue-on-error exits 0)", highlight=False)
        raise typer.Exit(1)


@contextmanager
def open_input(file: Path) -> Iterator[tuple[IO[bytes], int | None]]:
    """Yield the input's bytes and its size (None for stdin, whose size is unknown)."""
    if str(file) == "-":
        yield sys.stdin.buffer, None
        return
    try:
        lines = file.open("rb")
    except OSError as error:
        fail(f"cannot read {file}: {error.strerror}")
    with lines:
        yield lines, file.stat().st_size


def read_jsonl(path: Path) -> Iterator[tuple[int, int, dict[str, Any] | SessionReport]]:
    """Yield (line number, bytes, record) of a file, as ``read_jsonl_lines``."""
    with path.open("rb") as lines:
        yield from read_jsonl_lines(lines)


def read_jsonl_lines(
    lines: IO[bytes],
) -> Iterator[tuple[int, int, dict[str, Any] | SessionReport]]:
    """Yield (line number, bytes, record), or a rejection report for a malformed line."""
    for line_number, raw in enumerate(lines, start=1):
        # Bytes that are not UTF-8 become lone surrogates, which intake repairs.
        text = raw.decode("utf-8", "surrogateescape").removeprefix("\ufeff")
        if not text.strip():
            continue
        yield line_number, len(raw), parse_line(line_number, text, len(raw))


def parse_line(line_number: int, text: str, size_bytes: int) -> dict[str, Any] | SessionReport:
    """Parse one line into a record, or reject it; the limits are checked first because
    the JSON parser recurses and would abort the whole import on a deep line."""
    from worker.compaction import (
        MAX_NESTING_DEPTH,
        MAX_RECORD_BYTES,
        ProblemKind,
        measure_json_depth,
    )

    if size_bytes > MAX_RECORD_BYTES:
        return line_rejected(f"line {line_number}: {size_bytes:,} bytes; at most "
                             f"{MAX_RECORD_BYTES:,}", ProblemKind.TOO_LARGE)
    if measure_json_depth(text) > MAX_NESTING_DEPTH:
        return line_rejected(f"line {line_number}: objects and arrays nested deeper than "
                             f"{MAX_NESTING_DEPTH} levels", ProblemKind.TOO_LARGE)
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        return line_rejected(
            f"line {line_number}: invalid JSON: {error.msg} (column {error.colno})")
    if not isinstance(record, dict):
        return line_rejected(f"line {line_number}: not a JSON object")
    return record


def line_rejected(detail: str, kind: ProblemKind | None = None) -> SessionReport:
    """A rejection report for a line (a malformed session unless ``kind`` says)."""
    from worker.compaction import Action, Problem, ProblemKind
    from worker.platform.ingest import ImportStatus, SessionReport

    problem = Problem(kind or ProblemKind.MALFORMED_SESSION, None, detail, Action.REJECT)
    return SessionReport("", ImportStatus.REJECTED, 0, 0, (problem,))


@contextmanager
def progress_bar(total_bytes: int | None) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(bytes)``; the bar shows on stderr only when it is a terminal."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    console = stderr_console()
    with Progress(
        TextColumn("importing"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
        console=console, transient=True, disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task("import", total=total_bytes)
        yield lambda size: progress.advance(task, size)


def json_report(report: SessionReport) -> dict[str, Any]:
    return {
        "session_id": report.session_id or None, "status": report.status.value,
        "messages": report.messages, "tokens": report.tokens,
        "problems": [{"kind": p.kind.value, "index": p.index, "detail": p.detail,
                      "action": p.action.value} for p in report.problems],
    }


def print_import_table(rows: list[tuple[int, SessionReport]], statuses: Counter[Any]) -> None:
    from worker.compaction import Action
    from worker.platform.ingest import ImportStatus

    table = Table("line", "session", "status", "messages", "tokens", "problems")
    for line_number, report in rows:
        kinds = Counter(f"{p.kind.value} ({p.action.value})" for p in report.problems)
        table.add_row(
            str(line_number), shown(report.session_id or "-"),
            f"[{STATUS_STYLES[report.status]}]{report.status.value}[/]",
            str(report.messages), f"{report.tokens:,}",
            ", ".join(f"{kind} x{n}" if n > 1 else kind for kind, n in kinds.items()),
        )
    console = stdout_console()
    console.print(table)
    for line_number, report in rows:
        for problem in report.problems:
            if problem.action is Action.REJECT:
                where = "" if problem.index is None else f" at message {problem.index}"
                console.print(f"line {line_number} {shown(report.session_id or '')}: "
                              f"{problem.kind.value}{where}: {shown(problem.detail)}",
                              highlight=False)
    console.print(", ".join(f"{statuses[s]} {s.value}" for s in ImportStatus) + " "
                  f"(of {sum(statuses.values())} lines)", highlight=False)


@expected_errors
def export_command(
    view: Annotated[ExportView, typer.Option(
        help="full: every stored message, exactly as imported or appended; projection: "
        "what a model is sent (instructions, summary block, recent tail).")] =
    ExportView.FULL,
    session: Annotated[list[str] | None, typer.Option(
        "--session", help="Export only this session (repeatable).")] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", dir_okay=False, help="Write here (default: stdout).")] = None,
) -> None:
    """Export sessions as JSONL, in the format `compactor import` reads.

    With -o, a new file (mode 0600) is written beside FILE and renamed over it only when
    complete; nothing already in the directory is followed or overwritten meanwhile. The
    count exported so far goes to stderr every few seconds (export.progress).
    """
    from worker.logging import get_logger
    from worker.platform.ingest import export_session, iter_session_ids

    settings = get_settings()
    where = output or "stdout"
    with open_store(settings) as store:
        for session_id in session or ():
            store.get_session(session_id)  # unknown ids fail before anything is written
        session_ids = session or iter_session_ids(store)
        with open_output(output) as out:
            count, reported_at = 0, time.monotonic()
            for session_id in session_ids:
                out.write(dumps_json(export_session(store, session_id, view)) + "\n")
                count += 1
                if time.monotonic() - reported_at >= EXPORT_PROGRESS_EVERY_S:
                    get_logger().info("export.progress", sessions=count, output=str(where))
                    reported_at = time.monotonic()
    stderr_console().print(f"exported {count} sessions ({view.value}) to {shown(where)}",
                           highlight=False)


@contextmanager
def open_output(path: Path | None) -> Iterator[IO[str]]:
    """Yield stdout, or a new file in ``path``'s directory that replaces ``path`` only
    when complete.

    The file is created exclusively under a random name (``mkstemp``: ``O_EXCL``, mode
    0600), so nothing planted in the directory, a symlink included, is ever followed.
    """
    if path is None:
        yield sys.stdout
        return
    directory = path.parent
    if not directory.is_dir():
        fail(f"cannot write {path}: no such directory {directory}")
    try:
        out = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed below, before the rename)
            "w", encoding="utf-8", dir=directory, prefix=f".{path.name}.",
            suffix=".partial", delete=False)
    except OSError as error:
        fail(f"cannot write in {directory}: {error.strerror}")
    try:
        with out:
            yield out
        os.replace(out.name, path)
    finally:
        Path(out.name).unlink(missing_ok=True)
