"""`compactor append` and `compactor projection`: the platform's side from a shell, through
the same Python API (``worker.platform.sessions``) a platform in Python calls."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from scheduler.cli.common import (
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
from scheduler.cli.data import PolicyName, intake_policy
from scheduler.cli.sessions import projection_table

if TYPE_CHECKING:
    from worker.platform.sessions import AppendReport, Problem

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


class FormatName(StrEnum):
    """The session formats, spelled here so the command line loads without the core."""

    CHAT = "chat"
    RESPONSES = "responses"
    ANTHROPIC = "anthropic"


@expected_errors
def append_command(
    session_id: Annotated[str, typer.Argument(metavar="SESSION", help="The session's id.")],
    file: Annotated[Path, typer.Argument(
        metavar="FILE|-", allow_dash=True, dir_okay=False,
        help="Messages as JSONL (one per line) or one JSON array; - reads stdin.")],
    create: Annotated[bool, typer.Option(
        "--create", help="Create the session when it does not exist.")] = False,
    session_format: Annotated[FormatName | None, typer.Option(
        "--format", help="The session's format: items of another are refused; a session "
        "--create makes is of this format (chat when not given).")] = None,
    policy: Annotated[PolicyName, typer.Option(
        help="Intake policy, as for `compactor import`.")] = PolicyName.DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Append messages (or Responses items, Anthropic messages: the session's format) to
    a session: checked like an import, stored in one transaction.

    Results for a tool call an earlier append left open are accepted. Prints the new
    messages' seqs and what intake repaired; exits 1, storing nothing, when intake
    rejects them (the problems say why).
    """
    from worker.platform.sessions import (
        AppendReport,
        MessagesRejected,
        SessionFormat,
        SessionsAPI,
    )

    messages = read_messages(file)
    settings = get_settings()
    with open_store(settings) as store:
        sessions = SessionsAPI(store, load_counter(settings), intake_policy(policy))
        try:
            report = sessions.append(
                session_id, messages, create=create,
                session_format=None if session_format is None
                else SessionFormat(session_format.value))
        except MessagesRejected as rejected:
            print_append(session_id, "rejected", AppendReport((), rejected.problems), as_json)
            raise typer.Exit(1) from None
    print_append(session_id, "repaired" if report.problems else "appended", report, as_json)


@expected_errors
def projection_command(
    session_id: Annotated[str, typer.Argument(metavar="SESSION", help="The session's id.")],
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the session's record in its format, as `export --view "
        "projection` writes it (its messages or items ready for the provider's API).")] = False,
) -> None:
    """Show what a model is sent: instructions, the summary block, the recent messages."""
    from worker.compaction import SessionFormat
    from worker.platform.export_views import ExportView
    from worker.platform.formats import ITEMS_KEY
    from worker.platform.ingest import export_session

    with open_store(get_settings()) as store:
        record = export_session(store, session_id, ExportView.PROJECTION)
    if as_json:
        print_json(record)
        return
    items_key = ITEMS_KEY[SessionFormat(record.get("format", SessionFormat.CHAT))]
    stdout_console().print(projection_table(record[items_key]))


def read_messages(file: Path) -> list[Any]:
    """Parse a JSON array, or JSONL of one message per line (blank lines skipped)."""
    raw = sys.stdin.buffer.read() if str(file) == "-" else read_file(file)
    # Bytes that are not UTF-8 become lone surrogates, which intake repairs.
    text = raw.decode("utf-8", "surrogateescape").removeprefix("\ufeff")
    if text.lstrip().startswith("["):
        messages = parse_json(text, "the input")
        if not isinstance(messages, list):
            fail("the input is not a JSON array of messages")
        return messages
    return [parse_json(line, f"line {number}")
            for number, line in enumerate(text.splitlines(), start=1) if line.strip()]


def read_file(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError as error:
        fail(f"cannot read {file}: {error.strerror}")


def parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        fail(f"{where}: invalid JSON: {error.msg} (line {error.lineno}, column {error.colno})")


def print_append(session_id: str, status: str, report: AppendReport, as_json: bool) -> None:
    if as_json:
        print_json({"session_id": session_id, "status": status, "seqs": list(report.seqs),
                    "problems": [problem_json(p) for p in report.problems]})
        return
    if report.seqs:
        span = f"{report.seqs[0]}-{report.seqs[-1]}" if len(report.seqs) > 1 else report.seqs[0]
        stdout_console().print(f"{shown(session_id)}: {status} {len(report.seqs)} messages "
                               f"(seq {span})", highlight=False)
    elif status != "rejected":
        stdout_console().print(f"{shown(session_id)}: nothing to append", highlight=False)
    console = stderr_console() if status == "rejected" else stdout_console()
    for problem in report.problems:
        where = "" if problem.index is None else f" at message {problem.index}"
        console.print(f"{problem.kind.value}{where} ({problem.action.value}): "
                      f"{shown(problem.detail)}", highlight=False)


def problem_json(problem: Problem) -> dict[str, Any]:
    return {"kind": problem.kind.value, "index": problem.index, "detail": problem.detail,
            "action": problem.action.value}
