"""`compactor sessions` and `compactor show`: what is stored, as tables or JSON."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from scheduler.cli.common import (
    expected_errors,
    get_settings,
    minute,
    open_store,
    print_json,
    readable_table,
    shown,
    stdout_console,
    to_jsonable,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
PREVIEW_CHARS = 100

if TYPE_CHECKING:
    from db import RevisionRecord, SessionState


class BreakerFilter(StrEnum):
    """A breaker state as the command line spells it."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"

    @property
    def stored(self) -> str:
        """The state as the sessions table stores it."""
        return self.value.replace("-", "_")


@expected_errors
def sessions_command(
    limit: Annotated[int, typer.Option(min=1, help="Most sessions to list.")] = 50,
    after: Annotated[str | None, typer.Option(
        help="List sessions whose id sorts after this one (paging).")] = None,
    breaker: Annotated[BreakerFilter | None, typer.Option(
        help="Only sessions whose breaker is in this state.")] = None,
    as_json: JsonOption = False,
) -> None:
    """List stored sessions in id order: size, tokens, revisions, breaker."""
    with open_store(get_settings()) as store:
        states = store.list_sessions(after=after, limit=limit,
                                     breaker_state=breaker.stored if breaker else None)
        revision_counts = {s.session_id: len(store.revisions(s.session_id)) for s in states}
    if as_json:
        print_json([{**to_jsonable(state), "messages": state.head_seq,
                     "revisions": revision_counts[state.session_id]} for state in states])
        return
    table = readable_table("session", "msgs", "tokens", "projection", "revs",
                           "last compacted", "breaker", shrink=("session", "breaker"))
    for state in states:
        table.add_row(
            shown(state.session_id), str(state.head_seq), f"{state.total_tokens:,}",
            f"{state.projection_tokens:,}", str(revision_counts[state.session_id]),
            minute(state.last_compacted_at) if state.last_compacted_at else "never",
            shown(breaker_text(state)),
        )
    stdout_console().print(table)


@expected_errors
def show_command(
    session_id: Annotated[str, typer.Argument(metavar="SESSION", help="The session's id.")],
    as_json: JsonOption = False,
) -> None:
    """Show one session: its state, revision history and the projection a model is sent.

    ``due`` says whether its size makes it due for the scan (over_trigger, dirty, or
    none); the scan also waits for the quiet period, the lease and the breaker.
    """
    from scheduler.beat import scan_policy  # the scan's modules, only for this command
    from scheduler.selection import due_why
    from worker.compaction import SessionFormat
    from worker.platform.formats import session_record

    settings = get_settings()
    with open_store(settings) as store:
        state = store.get_session(session_id)
        revisions = store.revisions(session_id)
        projection = store.projection(session_id)
    due = due_why(state.projection_tokens, state.tokens_since_compaction,
                  compacted=state.last_compacted_at is not None, policy=scan_policy(settings))
    if as_json:
        # The projection as `projection --json` prints it: the record of the session's format.
        print_json({"session": state, "revisions": revisions, "due": due,
                    "projection": session_record(SessionFormat(state.session_format),
                                                 session_id, state.metadata, projection)})
        return
    console = stdout_console()
    console.print(
        f"[bold]{shown(session_id)}[/]: {state.head_seq} messages, {state.total_tokens:,} tokens, "
        f"projection {state.projection_tokens:,} tokens ({len(projection)} messages), "
        f"breaker {shown(breaker_text(state))}, due: {due.value if due else 'no'}", highlight=False)
    console.print(revision_table(revisions, state.active_revision_id))
    console.print(projection_table(projection))


def breaker_text(state: SessionState) -> str:
    if state.breaker_failures:
        return f"{state.breaker_state} ({state.breaker_failures} failures)"
    return state.breaker_state


def revision_table(revisions: list[RevisionRecord], active_id: int | None) -> Table:
    table = readable_table("rev", "parent", "through", "summary", "projection",
                           "created", "made by", title="revisions (newest first; * active)",
                           shrink=("made by",))
    for revision in revisions:
        marker = "*" if revision.id == active_id else ""
        made_by = " ".join(filter(None, (revision.summarizer, revision.model,
                                         revision.prompt_version)))
        table.add_row(
            f"{revision.id}{marker}", str(revision.parent_revision_id or "-"),
            str(revision.through_seq), f"{revision.summary_tokens:,}",
            f"{revision.projection_tokens_before:,} → {revision.projection_tokens_after:,}",
            minute(revision.created_at), shown(made_by),
        )
    return table


def projection_table(projection: list[dict[str, Any]]) -> Table:
    table = readable_table("#", "role", "preview", title="projection (what a model is sent)",
                           shrink=("preview",))
    for position, body in enumerate(projection, start=1):
        role = body.get("role") or body.get("type")  # a Responses call or output: its type
        table.add_row(str(position), shown(role), shown(preview_message(body)))
    return table


def preview_message(body: dict[str, Any]) -> str:
    """One line: the text, tool calls as name(arguments), a tool result's call id."""
    content = body.get("content")
    if isinstance(content, list):
        content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    parts = [str(content)] if content else []
    for call in body.get("tool_calls") or ():
        function = call.get("function") or {}
        parts.append(f"→ {function.get('name')}({function.get('arguments')})")
    if body.get("tool_call_id"):
        parts.insert(0, f"[{body['tool_call_id']}]")
    text = " ".join(" ".join(parts).split())
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
