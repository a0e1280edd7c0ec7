"""A drop-in session for the OpenAI Agents SDK (the ``agents`` extra) backed by the store:
an agent's history lives here, and each turn it is sent the compacted projection
(instructions, the summary block, the verbatim tail) instead of the whole history.

``CompactorSession`` implements the SDK's ``Session`` protocol (``get_items``,
``add_items``, ``pop_item``, ``clear_session``). A session on a Responses-API model (the
SDK's default) is a ``responses`` session: its items are stored as the SDK gives them,
reasoning, hosted tool calls and all, and returned as stored. A session on a Chat
Completions model is a ``chat`` session: items are converted exactly, or refused with
:class:`~worker.platform.agents_items.UnsupportedItem`
(``worker/platform/agents_items.py``). Appends pass the same intake check as any other
append. Store calls block, so each runs in a thread. It reaches the store only through
the platform's API, ``worker.platform.sessions``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, cast

from worker.compaction import RESPONSES_CALLS, RESPONSES_OUTPUTS, responses_call_id
from worker.platform.agents_items import UnsupportedItem, items_to_messages, messages_to_items
from worker.platform.sessions import (
    MessagePinned,
    SessionFormat,
    SessionLeased,
    SessionNotFound,
    SessionsAPI,
)

if TYPE_CHECKING:
    from agents import TResponseInputItem
    from agents.memory import SessionSettings

__all__ = ["CompactorSession", "PopRefused", "SessionFormat", "UnsupportedItem"]


class PopRefused(RuntimeError):
    """Raised when the newest item cannot be popped: it shares its stored message with
    other items, a compaction has read it, or a job is compacting the session."""


class CompactorSession:
    """The Agents SDK session of ``session_id``, kept in the compactor's store.

    ``session_format`` is the format a new session is created with: ``responses`` for a
    Responses-API model (the SDK's default), ``chat`` for ``OpenAIChatCompletionsModel``;
    a stored session keeps its own.
    """

    def __init__(self, session_id: str, sessions: SessionsAPI, *,
                 session_settings: SessionSettings | None = None,
                 session_format: SessionFormat = SessionFormat.RESPONSES) -> None:
        self.session_id = session_id
        self.session_settings = session_settings
        self._sessions = sessions
        self._new_format = SessionFormat(session_format)
        self._format: SessionFormat | None = None  # the stored session's, once read

    def _session_format(self) -> SessionFormat:
        if self._format is None:
            try:
                self._format = SessionFormat(self._sessions.session(self.session_id)
                                             .session_format)
            except SessionNotFound:
                return self._new_format
        return self._format

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """Return the projection as items: the summary block and the verbatim tail, or the
        latest ``limit`` of them (never starting on a tool output whose call is cut off)."""
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        session_format, projection = await asyncio.to_thread(self._projection)
        items = (projection if session_format is SessionFormat.RESPONSES
                 else messages_to_items(projection))
        if limit is not None and limit >= 0:  # negative: everything, as the SDK's sessions
            items = _window(items, limit)
        return cast("list[TResponseInputItem]", items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append the items, as given to a Responses session, as chat messages to a chat
        session (MessagesRejected when intake refuses them, UnsupportedItem when one has
        no chat form; nothing is stored then)."""
        await asyncio.to_thread(self._add, [dict(cast("dict[str, Any]", i)) for i in items])

    def _add(self, items: list[dict[str, Any]]) -> None:
        session_format = self._session_format()
        messages = (items if session_format is SessionFormat.RESPONSES
                    else items_to_messages(items))
        if messages:
            # An agent's first turn creates its session.
            self._sessions.append(self.session_id, messages, create=True,
                                  session_format=session_format)
            self._format = session_format

    async def pop_item(self) -> TResponseInputItem | None:
        """Erase the newest stored message and return it as an item (None: no history).

        Refused (PopRefused) when that message is more than one item (assistant text with
        tool calls), when the active summary's compaction already read it, or while a job
        holds the session's lease: a summary must never speak of an erased message.
        """
        newest = await asyncio.to_thread(self._sessions.newest, self.session_id)
        if newest is None:
            return None
        seq = newest.seq
        items = ([newest.body] if self._session_format() is SessionFormat.RESPONSES
                 else messages_to_items([newest.body]))
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
        await asyncio.to_thread(self._erase)

    def _projection(self) -> tuple[SessionFormat, list[dict[str, Any]]]:
        try:
            return self._session_format(), self._sessions.projection(self.session_id)
        except SessionNotFound:
            return self._new_format, []

    def _erase(self) -> None:
        # The application asked for it: a job compacting meanwhile ends without writing.
        with contextlib.suppress(SessionNotFound):
            self._sessions.delete(self.session_id, force=True)
        self._format = None


def _without_orphan_outputs(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop leading tool outputs whose call the window cut off (the API refuses them)."""
    calls = {responses_call_id(item) for item in items if item.get("type") in RESPONSES_CALLS}
    start = 0
    while (start < len(items) and items[start].get("type") in RESPONSES_OUTPUTS
           and responses_call_id(items[start]) not in calls):
        start += 1
    return items[start:]


def _window(items: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The latest ``limit`` items, moved later past the rest of a reply whose reasoning
    the window would cut off (the Responses API refuses a reply's item without it)."""
    inside, replying = [], False
    for item in items:  # whether each item belongs to a reply begun before it
        kind = item.get("type", "message")
        inside.append(replying and kind != "reasoning")
        if kind == "reasoning":
            replying = True
        elif kind.endswith("_output") or item.get("role") not in (None, "assistant"):
            replying = False
    start = max(len(items) - limit, 0) if limit else len(items)
    while start < len(items) and inside[start]:
        start += 1
    return _without_orphan_outputs(items[start:])
