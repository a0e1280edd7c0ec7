"""A drop-in session for the OpenAI Agents SDK (the ``agents`` extra) backed by the store:
an agent's history lives here, and each turn it is sent the compacted projection
(instructions, the summary block, the verbatim tail) instead of the whole history.

``CompactorSession`` implements the SDK's ``Session`` protocol (``get_items``,
``add_items``, ``pop_item``, ``clear_session``). Items are converted exactly, or refused
with :class:`~worker.agents_items.UnsupportedItem` (``worker/agents_items.py``); appends
pass the same intake check as any other append. Store calls block, so each runs in a
thread. Only this module's ``SessionStore`` touches the store and ``worker.ingest``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from db import MessagePinned, SessionLeased, SessionNotFound, Store
from worker.agents_items import UnsupportedItem, items_to_messages, messages_to_items
from worker.compaction import IntakePolicy, TokenCounter
from worker.ingest import append_messages

if TYPE_CHECKING:
    from agents import TResponseInputItem
    from agents.memory import SessionSettings

__all__ = ["CompactorSession", "PopRefused", "SessionStore", "UnsupportedItem"]


class PopRefused(RuntimeError):
    """Raised when the newest item cannot be popped: it shares its stored message with
    other items, a compaction has read it, or a job is compacting the session."""


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class SessionStore:
    """What the session needs of the store, in one place: read the projection, append
    checked messages, erase the newest message or the whole session."""

    store: Store
    counter: TokenCounter
    policy: IntakePolicy = field(default_factory=IntakePolicy)
    clock: Callable[[], datetime] = _utc_now

    def projection(self, session_id: str) -> list[dict[str, Any]]:
        try:
            return self.store.projection(session_id)
        except SessionNotFound:
            return []

    def append(self, session_id: str, messages: list[dict[str, Any]]) -> None:
        now = self.clock()
        # An agent's first turn creates its session; an existing one is left as it is.
        self.store.append_messages(session_id, [], now=now, create=True)
        append_messages(self.store, self.counter, self.policy, session_id, messages, now)

    def newest(self, session_id: str) -> tuple[int, dict[str, Any]] | None:
        try:
            head_seq = self.store.get_session(session_id).head_seq
        except SessionNotFound:
            return None
        newest = self.store.messages(session_id, after_seq=head_seq - 1)
        return (newest[-1].seq, newest[-1].body) if newest else None

    def pop(self, session_id: str, seq: int) -> None:
        self.store.pop_message(session_id, seq=seq, now=self.clock())

    def erase(self, session_id: str) -> None:
        try:
            # The application asked for it: a job compacting meanwhile ends without writing.
            self.store.delete_session(session_id, force=True, now=self.clock())
        except SessionNotFound:
            return


class CompactorSession:
    """The Agents SDK session of ``session_id``, kept in the compactor's store."""

    def __init__(self, session_id: str, sessions: SessionStore, *,
                 session_settings: SessionSettings | None = None) -> None:
        self.session_id = session_id
        self.session_settings = session_settings
        self._sessions = sessions

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """Return the projection as items: the summary block and the verbatim tail, or the
        latest ``limit`` of them (never starting on a tool output whose call is cut off)."""
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        projection = await asyncio.to_thread(self._sessions.projection, self.session_id)
        items = messages_to_items(projection)
        if limit is not None and limit >= 0:  # negative: everything, as the SDK's sessions
            items = _without_orphan_outputs(items[-limit:] if limit else [])
        return cast("list[TResponseInputItem]", items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append the items as chat messages (MessagesRejected when intake refuses them,
        UnsupportedItem when one has no chat form; nothing is stored then)."""
        messages = items_to_messages([dict(cast("dict[str, Any]", item)) for item in items])
        if messages:
            await asyncio.to_thread(self._sessions.append, self.session_id, messages)

    async def pop_item(self) -> TResponseInputItem | None:
        """Erase the newest stored message and return it as an item (None: no history).

        Refused (PopRefused) when that message is more than one item (assistant text with
        tool calls), when the active summary's compaction already read it, or while a job
        holds the session's lease: a summary must never speak of an erased message.
        """
        newest = await asyncio.to_thread(self._sessions.newest, self.session_id)
        if newest is None:
            return None
        seq, body = newest
        items = messages_to_items([body])
        if len(items) != 1:
            raise PopRefused(f"message {seq} is {len(items)} items; pop it whole with the "
                             "store, or not at all")
        try:
            await asyncio.to_thread(self._sessions.pop, self.session_id, seq)
        except (MessagePinned, SessionLeased, SessionNotFound) as exc:
            raise PopRefused(str(exc)) from exc
        return cast("TResponseInputItem", items[0])

    async def clear_session(self) -> None:
        """Erase the session with its whole history, revisions and runs."""
        await asyncio.to_thread(self._sessions.erase, self.session_id)


def _without_orphan_outputs(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop leading tool outputs whose call the window cut off (the API refuses them)."""
    calls = {item.get("call_id") for item in items if item.get("type") == "function_call"}
    start = 0
    while (start < len(items) and items[start].get("type") == "function_call_output"
           and items[start].get("call_id") not in calls):
        start += 1
    return items[start:]
