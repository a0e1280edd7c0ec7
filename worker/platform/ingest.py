"""Sessions in and out: import and append (intake check, one token count per message,
then the store) and export, in the session record format of the JSONL files:
``{"session_id": str, "messages": [...], **metadata}`` for chat sessions, and the
Responses and Anthropic records of ``worker/platform/formats.py``.

An append runs its intake check inside the store's transaction, under the session's row
lock: the store reads the open and answered tool call ids there and hands them to the
check (a callable: ``db`` may not import ``worker``), which returns the rows to insert.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol, TypeVar, overload

from db import (
    MessageRecord,
    NewMessage,
    SchemaMissing,
    SessionExists,
    SessionState,
    StoreError,
    StoreUnavailable,
    ToolCallState,
)
from worker.broker.contract import MAX_SESSION_ID_CHARS, session_id_problem
from worker.compaction import (
    MAX_NESTING_DEPTH,
    Action,
    ChatMessage,
    CheckedItems,
    IntakePolicy,
    IntakeResult,
    Problem,
    ProblemKind,
    SessionFormat,
    TokenCounter,
    check_session,
    classify_results,
    clean_text,
    dump_message,
    find_foreign_chat_fields,
    identify_message,
    measure_depth,
    search_text,
)
from worker.errors import MessagesRejected
from worker.platform.export_views import ExportView
from worker.platform.formats import (
    ITEMS_KEY,
    check_items,
    count_system_prompt,
    item_rows,
    mismatch,
    record_format,
    session_record,
    system_prompt_problem,
)

RECORD_KEYS = ("session_id", "format", "messages", "items")
T = TypeVar("T")


class IngestStore(Protocol):
    """The part of ``db.store.Store`` that import, append and export use."""

    def import_session(
        self, session_id: str, metadata: dict[str, Any], messages: list[NewMessage],
        now: datetime, *, session_format: str = "chat", system_tokens: int = 0,
    ) -> object: ...

    def append_checked(
        self, session_id: str,
        check: Callable[[ToolCallState], tuple[Sequence[NewMessage], T]], *,
        now: datetime, create: bool = False, metadata: dict[str, Any] | None = None,
        session_format: str = "chat", system_tokens: int = 0,
    ) -> tuple[list[int], T]: ...

    def get_session(self, session_id: str) -> SessionState: ...

    def messages(self, session_id: str, *, after_seq: int = 0) -> list[MessageRecord]: ...

    def projection(self, session_id: str) -> list[dict[str, Any]]: ...

    def list_sessions(
        self, *, after: str | None = None, limit: int = 100
    ) -> Sequence[SessionState]: ...


class ImportStatus(StrEnum):
    IMPORTED = "imported"
    REPAIRED = "repaired"  # imported after intake repaired it (problems say what)
    REJECTED = "rejected"  # nothing stored
    EXISTS = "exists"  # a session with this id is already stored; left as it was


@dataclass(frozen=True)
class SessionReport:
    """The outcome of importing one session record (``messages``/``tokens``: stored or
    would-be-stored counts; for a rejected record, ``messages`` is the input count)."""

    session_id: str
    status: ImportStatus
    messages: int
    tokens: int
    problems: tuple[Problem, ...] = ()


def import_sessions(
    records: Iterable[dict[str, Any]], *, store: IngestStore, counter: TokenCounter,
    policy: IntakePolicy, now: datetime,
) -> Iterator[SessionReport]:
    """Import each record in turn; a bad record is reported and the next one goes on."""
    for record in records:
        yield import_record(record, store=store, counter=counter, policy=policy, now=now)


def import_record(
    record: dict[str, Any], *, store: IngestStore, counter: TokenCounter,
    policy: IntakePolicy, now: datetime,
) -> SessionReport:
    """Validate, count and store one session record (all or nothing).

    A database error about this record (a value it refuses, a lost connection) rejects
    the record alone, so an import goes on; only a schema not migrated stops it.
    """
    result: IntakeResult | CheckedItems
    session_format = record_format(record)
    if isinstance(session_format, Problem):
        session_id, _, result = _rejected_record(record, session_format)
        session_format = SessionFormat.CHAT
    elif session_format is SessionFormat.CHAT:
        session_id, metadata, result = check_record(record, policy)
    else:
        session_id, metadata, result = check_record(record, policy, session_format)
    if result.rejected:
        raw_messages = record.get(ITEMS_KEY[session_format])
        count = len(raw_messages) if isinstance(raw_messages, list) else 0
        return SessionReport(session_id, ImportStatus.REJECTED, count, 0, result.problems)
    if isinstance(result, IntakeResult):
        new_messages = count_messages(result.messages, counter)
    else:
        new_messages = item_rows(session_format, result, counter)
    tokens = sum(message.tokens for message in new_messages)
    status = ImportStatus.REPAIRED if result.problems else ImportStatus.IMPORTED
    try:
        store.import_session(session_id, metadata, new_messages, now,
                             session_format=session_format.value,
                             system_tokens=count_system_prompt(session_format, metadata,
                                                               counter))
    except SessionExists:
        status = ImportStatus.EXISTS
    except (SchemaMissing, StoreUnavailable):
        # Not this record's fault: the database is not migrated, or not answering. Every
        # later record would fail the same way, so the import stops and says why.
        raise
    except StoreError as error:
        refused = Problem(ProblemKind.STORE_REFUSED, None,
                          f"the database refused the record: {error}", Action.REJECT)
        return SessionReport(session_id, ImportStatus.REJECTED, len(new_messages), 0,
                             (*result.problems, refused))
    return SessionReport(session_id, status, len(new_messages), tokens, result.problems)


@overload
def check_record(
    record: dict[str, Any], policy: IntakePolicy
) -> tuple[str, dict[str, Any], IntakeResult]: ...


@overload
def check_record(
    record: dict[str, Any], policy: IntakePolicy, session_format: SessionFormat
) -> tuple[str, dict[str, Any], IntakeResult | CheckedItems]: ...


def check_record(
    record: dict[str, Any], policy: IntakePolicy,
    session_format: SessionFormat = SessionFormat.CHAT,
) -> tuple[str, dict[str, Any], IntakeResult | CheckedItems]:
    """Split a record of ``session_format`` into its id, metadata and checked messages
    or items (metadata text included)."""
    session_id = record.get("session_id")
    key = ITEMS_KEY[session_format]
    raw_messages = record.get(key)
    metadata = {k: v for k, v in record.items() if k not in RECORD_KEYS}
    problem = _find_shape_problem(session_id, raw_messages, metadata, key)
    if problem is None and session_format is SessionFormat.CHAT \
            and isinstance(raw_messages, list):
        problem = find_foreign_chat_fields(raw_messages)
    if problem is not None or not isinstance(raw_messages, list):
        return _rejected_record(record, problem)
    metadata, changed = clean_text(metadata)
    result: IntakeResult | CheckedItems = (
        check_session(raw_messages, policy) if session_format is SessionFormat.CHAT
        else check_items(session_format, raw_messages, policy))
    if changed:
        action = policy.action_for(ProblemKind.INVALID_TEXT)
        problem = Problem(ProblemKind.INVALID_TEXT, None, "NUL byte or lone surrogate in "
                          "metadata", action)
        rejected = result.rejected or action is Action.REJECT
        result = dataclasses.replace(result, problems=(problem, *result.problems),
                                     rejected=rejected)
        if rejected:
            result = _emptied(result)
    return str(session_id), metadata, result


def _emptied(result: IntakeResult | CheckedItems) -> IntakeResult | CheckedItems:
    if isinstance(result, IntakeResult):
        return dataclasses.replace(result, messages=())
    return dataclasses.replace(result, items=(), views=())


def _rejected_record(
    record: dict[str, Any], problem: Problem | None
) -> tuple[str, dict[str, Any], IntakeResult]:
    session_id = record.get("session_id")
    rejection = (problem or Problem(ProblemKind.MALFORMED_SESSION, None, "", Action.REJECT),)
    shown_id = session_id[:MAX_SESSION_ID_CHARS] if isinstance(session_id, str) else ""
    return shown_id, {}, IntakeResult((), rejection, rejected=True)


def _find_shape_problem(
    session_id: object, raw_messages: object, metadata: dict[str, Any], key: str
) -> Problem | None:
    """The record's own problem, if any: checked before anything walks its contents."""
    if not isinstance(session_id, str) or not session_id.strip():
        return _rejection(ProblemKind.MALFORMED_SESSION,
                          "session_id missing or not a non-empty string")
    if len(session_id) > MAX_SESSION_ID_CHARS:
        # The job message's own limit: a longer id could be stored but never compacted.
        return _rejection(ProblemKind.TOO_LARGE, f"session_id is {len(session_id):,} "
                          f"characters; at most {MAX_SESSION_ID_CHARS}")
    if clean_text(session_id)[1]:
        return _rejection(ProblemKind.MALFORMED_SESSION,
                          "session_id contains a NUL byte or a lone surrogate")
    control = session_id_problem(session_id)
    if control:
        return _rejection(ProblemKind.MALFORMED_SESSION, control)
    if not isinstance(raw_messages, list):
        return _rejection(ProblemKind.MALFORMED_SESSION, f"{key} missing or not a list")
    if measure_depth(metadata) > MAX_NESTING_DEPTH:
        return _rejection(ProblemKind.TOO_LARGE, "metadata objects and arrays nested deeper "
                          f"than {MAX_NESTING_DEPTH} levels")
    return None


@dataclass(frozen=True)
class AppendReport:
    """What one append stored: the new messages' seqs (contiguous positions in the
    session) and the problems intake repaired (empty when stored as given)."""

    seqs: tuple[int, ...]
    problems: tuple[Problem, ...] = ()


def append_checked(
    store: IngestStore, counter: TokenCounter, policy: IntakePolicy, session_id: str,
    raw_messages: Sequence[Any], now: datetime, *, create: bool = False,
    metadata: dict[str, Any] | None = None, session_format: SessionFormat | None = None,
) -> AppendReport:
    """Check ``raw_messages`` against the stored session and append them, atomically.

    They are items of the session's format; ``session_format``, when given, must be it
    (and is the format of a session ``create`` makes; chat when not given).

    One transaction under the session's row lock: a result for a call an earlier append
    left open is accepted, and of two concurrent appends answering the same call the
    second finds it answered (an orphan result, rejected or dropped per ``policy``).
    Tokens are counted inside the transaction (after repair), so keep batches modest.

    Raises:
        MessagesRejected: intake rejected the messages (or the id, ``check_session_id``);
            nothing was appended.
        db.SessionNotFound: no session has this id (and ``create`` is False).
    """
    check_session_id(session_id)
    new_format = session_format or SessionFormat.CHAT
    system_tokens = 0
    if create:
        system_tokens = count_checked_system_prompt(session_id, new_format, metadata or {},
                                                    counter)

    def check(state: ToolCallState) -> tuple[list[NewMessage], tuple[Problem, ...]]:
        stored = SessionFormat(state.session_format)
        if session_format not in (None, stored):
            raise MessagesRejected(session_id, (mismatch(
                f"format: session {session_id!r} is a {stored.value} session, not "
                f"{session_format}"),))
        if stored is not SessionFormat.CHAT:
            checked = check_items(stored, raw_messages, policy, open_ids=state.open_ids,
                                  seen_ids=state.answered_ids, is_append=True)
            if checked.rejected:
                raise MessagesRejected(session_id, checked.problems)
            return item_rows(stored, checked, counter), checked.problems
        foreign = find_foreign_chat_fields(raw_messages)
        if foreign is not None:
            raise MessagesRejected(session_id, (foreign,))
        result = check_session(
            raw_messages, policy, open_tool_call_ids=state.open_ids,
            seen_tool_call_ids=state.answered_ids, is_append=True,
        )
        if result.rejected:
            raise MessagesRejected(session_id, result.problems)
        return count_messages(result.messages, counter), result.problems

    seqs, problems = store.append_checked(
        session_id, check, now=now, create=create, metadata=metadata,
        session_format=new_format.value, system_tokens=system_tokens)
    return AppendReport(tuple(seqs), problems)


def count_checked_system_prompt(session_id: str, session_format: SessionFormat,
                                metadata: dict[str, Any], counter: TokenCounter) -> int:
    """The tokens of a new session's system prompt in ``metadata`` (an Anthropic
    session's ``system``; 0 for the other formats).

    Raises:
        MessagesRejected: ``system`` is neither a string nor a list of text blocks.
    """
    problem = system_prompt_problem(session_format, metadata)
    if problem is not None:
        raise MessagesRejected(session_id, (problem,))
    return count_system_prompt(session_format, metadata, counter)


def check_session_id(session_id: str) -> None:
    """Refuse an id that holds a control character before it reaches the store.

    Raises:
        MessagesRejected: with one ``malformed_session`` problem naming the character.
    """
    problem = session_id_problem(session_id)
    if problem:
        raise MessagesRejected(session_id, (_rejection(ProblemKind.MALFORMED_SESSION, problem),))


def _rejection(kind: ProblemKind, detail: str) -> Problem:
    return Problem(kind, None, detail, Action.REJECT)


def append_messages(
    store: IngestStore, counter: TokenCounter, policy: IntakePolicy, session_id: str,
    raw_messages: Sequence[Any], now: datetime,
) -> list[int]:
    """Append to an existing session as ``append_checked`` does; return the seqs."""
    return list(append_checked(store, counter, policy, session_id, raw_messages, now).seqs)


def count_messages(messages: Sequence[ChatMessage], counter: TokenCounter) -> list[NewMessage]:
    """Turn checked messages into store rows, each counted, identified and (a tool result)
    classified once, with its identifiers' summary lines counted (stored messages never
    change, so no job scans, counts or classifies them again)."""
    # The identifiers' lines through a counter that remembers them: a session's values
    # recur from message to message.
    line_counter = counter.for_job()
    return [
        NewMessage(body=dump_message(message), role=message.role.value,
                   tool_call_id=message.tool_call_id, tokens=counter.count_message(message),
                   identifiers=tuple(identify_message(message, line_counter)),
                   search_text=search_text(message), outcomes=outcomes)
        for message, outcomes in zip(
            messages, classify_results([(message,) for message in messages]), strict=True)
    ]


def export_session(store: IngestStore, session_id: str, view: ExportView) -> dict[str, Any]:
    """Return one session as a record of its format; the full view round-trips what was
    imported."""
    state = store.get_session(session_id)
    if view is ExportView.FULL:
        bodies = [record.body for record in store.messages(session_id)]
    else:
        bodies = store.projection(session_id)
    return session_record(SessionFormat(state.session_format), session_id, state.metadata,
                          bodies)


def iter_session_ids(store: IngestStore, *, page_size: int = 500) -> Iterator[str]:
    """Yield every stored session id in order, one keyset page at a time."""
    after: str | None = None
    while True:
        page = store.list_sessions(after=after, limit=page_size)
        yield from (state.session_id for state in page)
        if len(page) < page_size:
            return
        after = page[-1].session_id
