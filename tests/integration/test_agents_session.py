"""``CompactorSession`` over the real store (SQLite and PostgreSQL): what the Agents SDK
reads, appends, pops and clears, without a model (the SDK's Runner: tests/e2e)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from agents import TResponseInputItem
from agents.memory import Session

from db import Store
from tests.integration.test_store import T0, job_run, summary_revision
from tests.support.e2e import token_counter
from tests.support.provider_rules import responses_rejections
from tests.support.store_jobs import swap_in
from tests.support.wire_sessions import responses_items
from worker.errors import MessagesRejected
from worker.platform.agents_session import (
    CompactorSession,
    PopRefused,
    SessionFormat,
    UnsupportedItem,
)
from worker.platform.sessions import SessionsAPI

pytestmark = pytest.mark.integration


def turn(index: int) -> list[dict[str, Any]]:
    """One agent turn as session items: ask, call, result, answer."""
    return [
        {"role": "user", "content": f"Check R{index}"},
        {"type": "function_call", "call_id": f"c{index}", "name": "look_up",
         "arguments": f'{{"id": "R{index}"}}'},
        {"type": "function_call_output", "call_id": f"c{index}", "output": f"R{index} ok"},
        {"role": "assistant", "content": f"R{index} is confirmed."},
    ]


def items(values: list[dict[str, Any]]) -> list[TResponseInputItem]:
    return cast("list[TResponseInputItem]", values)


@pytest.fixture
def session(store: Store) -> CompactorSession:
    return CompactorSession("agent-1", SessionsAPI(store, token_counter()),
                            session_format=SessionFormat.CHAT)


def test_the_session_implements_the_sdks_session_protocol(session: CompactorSession) -> None:
    as_sdk_session: Session = session  # mypy checks the protocol; isinstance its methods
    assert isinstance(as_sdk_session, Session)


def test_an_agent_starts_with_no_history_and_reads_back_what_it_added(
    session: CompactorSession, store: Store,
) -> None:
    assert asyncio.run(session.get_items()) == []
    asyncio.run(session.add_items(items(turn(1))))
    asyncio.run(session.add_items(items(turn(2))))

    assert asyncio.run(session.get_items()) == turn(1) + turn(2)
    assert store.get_session("agent-1").head_seq == 8


def test_after_a_compaction_the_agent_reads_the_summary_block_and_the_tail(
    session: CompactorSession, store: Store,
) -> None:
    asyncio.run(session.add_items(items(turn(1) + turn(2))))
    swap_in(store, "agent-1", expected_revision_id=None, now=T0,
            revision=summary_revision(4, 8), run=job_run("agent-1"))

    read = asyncio.run(session.get_items())

    assert read == [{"role": "user", "content": "[summary through 4]"}, *turn(2)]


def test_a_limit_keeps_the_latest_items_and_never_starts_on_an_orphaned_result(
    session: CompactorSession,
) -> None:
    asyncio.run(session.add_items(items(turn(1) + turn(2))))
    assert asyncio.run(session.get_items(limit=3)) == turn(2)[1:]
    assert asyncio.run(session.get_items(limit=2)) == turn(2)[3:]  # the result's call is cut
    assert asyncio.run(session.get_items(limit=4)) == turn(2)
    assert asyncio.run(session.get_items(limit=0)) == []
    assert asyncio.run(session.get_items(limit=-1)) == turn(1) + turn(2)


def test_pop_returns_the_newest_item_and_erases_its_message(
    session: CompactorSession, store: Store,
) -> None:
    asyncio.run(session.add_items(items(turn(1))))
    assert asyncio.run(session.pop_item()) == turn(1)[3]
    assert asyncio.run(session.pop_item()) == turn(1)[2]
    assert asyncio.run(session.get_items()) == turn(1)[:2]
    assert store.get_session("agent-1").head_seq == 2


def test_pop_is_refused_for_a_message_of_several_items_or_one_a_compaction_read(
    session: CompactorSession, store: Store,
) -> None:
    asyncio.run(session.add_items(items([
        {"role": "user", "content": "Check R1"},
        {"role": "assistant", "content": "Looking.", "type": "message"},
        {"type": "function_call", "call_id": "c1", "name": "look_up", "arguments": "{}"}])))
    with pytest.raises(PopRefused):
        asyncio.run(session.pop_item())
    asyncio.run(session.add_items(items([
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"role": "assistant", "content": "Done."}])))
    swap_in(store, "agent-1", expected_revision_id=None, now=T0,
            revision=summary_revision(1, 4), run=job_run("agent-1"))
    with pytest.raises(PopRefused):
        asyncio.run(session.pop_item())
    assert store.get_session("agent-1").head_seq == 4


def test_pop_on_a_session_without_history_returns_none(session: CompactorSession) -> None:
    assert asyncio.run(session.pop_item()) is None


def test_what_intake_rejects_or_what_has_no_chat_form_is_refused_and_nothing_is_stored(
    session: CompactorSession, store: Store,
) -> None:
    asyncio.run(session.add_items(items(turn(1))))
    with pytest.raises(MessagesRejected):
        asyncio.run(session.add_items(items([
            {"type": "function_call_output", "call_id": "ghost", "output": "?"}])))
    with pytest.raises(UnsupportedItem):
        asyncio.run(session.add_items(items([
            {"role": "user", "content": "hi"}, {"type": "reasoning", "summary": []}])))
    assert store.get_session("agent-1").head_seq == 4


def test_clear_erases_the_session_and_the_agent_starts_again_from_nothing(
    session: CompactorSession, store: Store,
) -> None:
    asyncio.run(session.clear_session())  # nothing stored yet: nothing to erase
    asyncio.run(session.add_items(items(turn(1))))
    asyncio.run(session.clear_session())

    assert asyncio.run(session.get_items()) == []
    assert store.list_sessions() == []
    asyncio.run(session.add_items(items(turn(2))))
    assert store.get_session("agent-1").head_seq == 4


def test_a_responses_session_keeps_every_sdk_item_as_given(store: Store) -> None:
    session = CompactorSession("agent-r", SessionsAPI(store, token_counter()))
    given = responses_items(6, 3)

    asyncio.run(session.add_items(items(given[:4])))
    asyncio.run(session.add_items(items(given[4:])))

    assert store.get_session("agent-r").session_format == "responses"
    assert asyncio.run(session.get_items()) == given
    for limit in range(1, len(given)):
        window = [dict(item) for item in asyncio.run(session.get_items(limit))]
        assert window == given[len(given) - len(window):]
        assert responses_rejections(window, given) == []  # the API would take it
    newest = given[-1]
    assert asyncio.run(session.pop_item()) == newest
    assert asyncio.run(session.get_items()) == given[:-1]
