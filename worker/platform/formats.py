"""Session records per wire format: which format a record is, its items checked and made
into store rows, and the record a stored session is exported as.

    chat       {"session_id": ..., "messages": [...]}
    responses  {"session_id": ..., "format": "responses", "items": [...]}
    anthropic  {"session_id": ..., "format": "anthropic", "system": ..., "messages": [...]}

Every other key is the session's metadata (an Anthropic record's ``system`` is kept
with it, as given, and counted once into ``sessions.system_tokens``: see
:func:`count_system_prompt`). A record of one format is never read as another: an unknown
``format``, or the other formats' list key, is a ``format_mismatch`` naming the field
(``items`` in a record without ``format`` too: it is never metadata).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from db import NewMessage
from worker.compaction import (
    Action,
    CheckedItems,
    IntakePolicy,
    ItemView,
    Mention,
    Problem,
    ProblemKind,
    ResultOutcome,
    SessionFormat,
    TokenCounter,
    check_anthropic_messages,
    check_responses_items,
    classify_results,
    count_view,
    identify_message,
    parse_message,
    search_text,
    view_item,
)

ITEMS_KEY = {SessionFormat.CHAT: "messages", SessionFormat.RESPONSES: "items",
             SessionFormat.ANTHROPIC: "messages"}
_FORMATS = ", ".join(f.value for f in SessionFormat)


def record_format(record: dict[str, Any]) -> SessionFormat | Problem:
    """The record's format (``chat`` when it names none), or the rejection saying why
    it has none."""
    value = record.get("format", SessionFormat.CHAT.value)
    if value not in tuple(SessionFormat):
        return mismatch(f"format {value!r} is not one of {_FORMATS}")
    session_format = SessionFormat(value)
    key = ITEMS_KEY[session_format]
    other = "messages" if key == "items" else "items"
    if other in record and "format" not in record:
        # Never metadata: a Responses record that lost its "format" is not read as chat.
        return mismatch('items: a record without "format" is chat, its messages in '
                        '"messages"; "items" is the list of a Responses record: give the '
                        'record "format": "responses" (no metadata key is named "items")')
    if other in record:
        return mismatch(f'{other}: a {session_format.value} record holds its items in '
                        f'"{key}"')
    return system_prompt_problem(session_format, record) or session_format


def system_prompt_problem(session_format: SessionFormat, fields: dict[str, Any]
                          ) -> Problem | None:
    """The rejection of an Anthropic record's (or new session's metadata's) ``system``
    that is neither a string nor a list of text blocks; None when it is one, or absent."""
    system = fields.get("system")
    if session_format is SessionFormat.ANTHROPIC and system is not None \
            and not _is_system_prompt(system):
        return Problem(ProblemKind.MALFORMED_SESSION, None,
                       "system is not a string or a list of text blocks", Action.REJECT)
    return None


def _is_system_prompt(system: object) -> bool:
    return isinstance(system, str) or (isinstance(system, list) and all(
        isinstance(block, dict) and block.get("type") == "text"
        and isinstance(block.get("text"), str) for block in system))


def count_system_prompt(session_format: SessionFormat, metadata: dict[str, Any],
                        counter: TokenCounter) -> int:
    """The tokens of the session's system prompt kept outside its messages: an Anthropic
    session's ``system`` (checked by :func:`system_prompt_problem`), counted as the chat
    system message of the same text is, so both formats compact alike; 0 for the other
    formats, whose instructions are messages."""
    system = metadata.get("system")
    if session_format is not SessionFormat.ANTHROPIC or system is None:
        return 0
    return count_view(view_item(session_format, {"role": "system", "content": system}), counter)


def mismatch(detail: str, index: int | None = None) -> Problem:
    return Problem(ProblemKind.FORMAT_MISMATCH, index, detail, Action.REJECT)


def check_items(
    session_format: SessionFormat, raw_items: Sequence[Any], policy: IntakePolicy, *,
    open_ids: Collection[str] = (), seen_ids: Collection[str] = frozenset(),
    is_append: bool = False,
) -> CheckedItems:
    """Check Responses items or Anthropic messages (chat has its own intake)."""
    if session_format is SessionFormat.RESPONSES:
        return check_responses_items(raw_items, policy, open_ids=open_ids,
                                     seen_ids=seen_ids, is_append=is_append)
    return check_anthropic_messages(raw_items, policy, open_ids=open_ids, is_append=is_append)


def item_rows(session_format: SessionFormat, checked: CheckedItems, counter: TokenCounter
              ) -> list[NewMessage]:
    """Turn checked items into store rows, each body verbatim, counted, identified and its
    tool results classified once through its view (opaque parts counted, never searched,
    identified nor classified; reasoning searched, not identified).

    The ``role`` column is the view's (a Responses call or reasoning item: assistant; an
    output: tool), and ``tool_call_id`` the call a Responses call or output item is
    about, so the store finds open calls without reading bodies. Anthropic messages
    keep theirs in their bodies (one message may answer several calls).
    """
    line_counter = counter.for_job()
    rows = []
    classified = classify_results([view.chat_messages() for view in checked.views])
    for item, view, outcomes in zip(checked.items, checked.views, classified, strict=True):
        call_id = None
        if session_format is SessionFormat.RESPONSES:
            call_id = next((c.call_id for c in view.calls), None) or next(
                (o.call_id for o in view.outputs), None)
        rows.append(NewMessage(
            body=item, role=view.role.value, tool_call_id=call_id,
            tokens=count_view(view, counter),
            identifiers=identify_view(view, line_counter),
            search_text=view_search_text(view), outcomes=outcomes))
    return rows


def view_search_text(view: ItemView) -> str:
    """What recall searches of an item: its chat messages' search texts, one a line."""
    return "\n".join(search_text(message) for message in view.chat_messages())


# What ingest derives of a stored body besides its count: its identifiers and search text,
# and its tool results' outcomes (None where not asked for).
BodyIndex = tuple[tuple[Mention, ...] | None, str | None, tuple[ResultOutcome, ...] | None]


def index_stored_body(session_format: SessionFormat, body: dict[str, Any],
                      counter: TokenCounter, *, with_identifiers: bool,
                      with_outcomes: bool) -> BodyIndex:
    """What ingest would have derived of a stored body of ``session_format`` (the
    backfill's): its identifiers and search text ``with_identifiers``, its outcomes
    ``with_outcomes``."""
    if session_format is SessionFormat.CHAT:
        message = parse_message(body)
        identifiers = tuple(identify_message(message, counter)) if with_identifiers else None
        return (identifiers, search_text(message) if with_identifiers else None,
                classify_results([(message,)])[0] if with_outcomes else None)
    view = view_item(session_format, body)
    return (identify_view(view, counter) if with_identifiers else None,
            view_search_text(view) if with_identifiers else None,
            classify_results([view.chat_messages()])[0] if with_outcomes else None)


def identify_view(view: ItemView, counter: TokenCounter) -> tuple[Mention, ...]:
    """The identifiers of an item's chat messages, once per value, kind and source, its
    reasoning or thinking text left out: a value the agent only thought of was never said,
    and stored as said it would outrank the values the tools returned in every summary
    (recall still finds it: the search text keeps the reasoning)."""
    merged: dict[tuple[str, str, str], Mention] = {}
    for message in view._replace(reasoning="").chat_messages():
        for mention in identify_message(message, counter):
            key = (mention.value, mention.kind, mention.source)
            prior = merged.get(key)
            merged[key] = mention if prior is None else mention._replace(
                occurrences=prior.occurrences + mention.occurrences)
    return tuple(merged.values())


def session_record(session_format: SessionFormat, session_id: str,
                   metadata: dict[str, Any], bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """The record of a session in its format (what import reads back unchanged)."""
    if session_format is SessionFormat.CHAT:
        return {"session_id": session_id, **metadata, "messages": bodies}
    return {"session_id": session_id, "format": session_format.value, **metadata,
            ITEMS_KEY[session_format]: bodies}
