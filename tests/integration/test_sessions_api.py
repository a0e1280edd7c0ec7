"""The platform's Python API (``worker.platform.sessions``) on SQLite and PostgreSQL: a platform
creates a session, appends turns as its agent loop produces them, and reads what to send."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.integration.test_store import T0, job_run, summary_revision
from tests.support.databases import open_store
from tests.support.store_jobs import swap_in, take_lease
from worker.platform.recall_tool import handle_recall
from worker.platform.sessions import (
    MessagePinned,
    MessagesRejected,
    ProblemKind,
    SchemaMissing,
    SessionExists,
    SessionLeased,
    SessionNotFound,
    SessionsAPI,
)

pytestmark = pytest.mark.integration

SYSTEM = {"role": "system", "content": "You book flights."}
USER = {"role": "user", "content": "Move booking NO6JO3 to Friday."}


def calling(call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "move", "arguments": "{}"}}]}


def result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "moved"}


@pytest.fixture
def sessions(database_url: str) -> Iterator[SessionsAPI]:
    with SessionsAPI.open(database_url) as opened:
        yield opened


def test_an_agent_loop_appends_turn_by_turn_and_reads_them_back_to_send(
    sessions: SessionsAPI,
) -> None:
    sessions.create("chat", {"user": "u1"})

    first = sessions.append("chat", [SYSTEM, USER, calling("c1")])
    second = sessions.append("chat", [result("c1"), {"role": "assistant", "content": "Done."}])

    assert (first.seqs, second.seqs) == ((1, 2, 3), (4, 5))
    assert first.problems == second.problems == ()
    assert sessions.projection("chat") == [SYSTEM, USER, calling("c1"), result("c1"),
                                           {"role": "assistant", "content": "Done."}]
    assert [m.seq for m in sessions.history("chat", after_seq=3)] == [4, 5]
    assert sessions.session("chat").metadata == {"user": "u1"}
    assert sessions.revisions("chat") == []
    # The identifier index covers every stored message, compacted or not.
    artifacts = {artifact.value: artifact for artifact in sessions.artifacts("chat")}
    assert {(value, a.kind) for value, a in artifacts.items()} == {("NO6JO3", "id"),
                                                                   ("move", "tool")}
    assert (artifacts["NO6JO3"].first_seq, artifacts["NO6JO3"].sources) == (
        2, frozenset({"user"}))


def test_repairs_are_reported_and_rejections_store_nothing(sessions: SessionsAPI) -> None:
    appended = sessions.append("chat", [USER, {"role": "user", "content": "a\x00b"}],
                               create=True)

    assert [p.kind for p in appended.problems] == [ProblemKind.INVALID_TEXT]
    with pytest.raises(MessagesRejected) as rejected:
        sessions.append("chat", [result("nobody-called")])
    assert rejected.value.problems[0].kind is ProblemKind.ORPHAN_TOOL_RESULT
    assert sessions.session("chat").head_seq == 2


def test_errors_are_the_stores_typed_errors(sessions: SessionsAPI) -> None:
    sessions.create("chat")

    with pytest.raises(SessionExists):
        sessions.create("chat")
    with pytest.raises(SessionNotFound):
        sessions.append("nobody", [USER])
    with pytest.raises(SessionNotFound):
        sessions.projection("nobody")


def test_opening_an_unmigrated_database_fails_before_any_call(empty_database_url: str) -> None:
    with pytest.raises(SchemaMissing):
        SessionsAPI.open(empty_database_url)


def test_the_projection_follows_the_active_summary_and_the_artifacts_every_message(
    sessions: SessionsAPI, database_url: str
) -> None:
    sessions.append("chat", [SYSTEM, USER, {"role": "assistant", "content": "ok"}, USER],
                    create=True)
    with open_store(database_url) as store:
        swap_in(store, "chat", expected_revision_id=None, now=T0, run=job_run("chat"),
                revision=summary_revision(3, 4))

    projection = sessions.projection("chat")

    assert projection == [SYSTEM, {"role": "user", "content": "[summary through 3]"}, USER]
    assert [(a.value, a.count) for a in sessions.artifacts("chat") if a.kind == "id"] == [
        ("NO6JO3", 2)]
    assert [r.through_seq for r in sessions.revisions("chat")] == [3]


def test_one_instance_serves_many_threads(sessions: SessionsAPI) -> None:
    for n in range(4):
        sessions.create(f"chat-{n}")

    def talk(n: int) -> None:
        for turn in range(10):
            sessions.append(f"chat-{n % 4}", [{"role": "user", "content": f"{n}-{turn}"}])
            sessions.projection(f"chat-{n % 4}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(talk, range(8)))

    assert sorted(len(sessions.history(f"chat-{n}")) for n in range(4)) == [20, 20, 20, 20]



def test_a_user_erasure_request_deletes_the_session_unless_a_job_is_compacting_it(
    sessions: SessionsAPI, database_url: str
) -> None:
    sessions.append("chat", [SYSTEM, USER, calling("c1"), result("c1")], create=True)
    with open_store(database_url) as store:
        assert take_lease(store, "chat", "worker:job-1", 60, datetime.now(UTC))

    with pytest.raises(SessionLeased):
        sessions.delete("chat")
    deleted = sessions.delete("chat", force=True)

    assert deleted.removed["messages"] == 4 and deleted.removed["sessions"] == 1
    assert deleted.broken_lease_owner == "worker:job-1"
    with pytest.raises(SessionNotFound):
        sessions.projection("chat")


def test_the_newest_message_can_be_taken_back_until_a_summary_reads_it(
    sessions: SessionsAPI,
) -> None:
    sessions.append("chat", [SYSTEM, USER], create=True)

    newest = sessions.newest("chat")
    assert newest is not None and newest.body == USER
    popped = sessions.pop("chat", newest.seq)

    assert popped.seq == 2 and sessions.projection("chat") == [SYSTEM]
    with pytest.raises(MessagePinned):
        sessions.pop("chat", 2)
    assert sessions.newest("missing") is None


def test_an_erased_identifier_is_recalled_nowhere_once_its_seq_is_taken_again(
    sessions: SessionsAPI, database_url: str,
) -> None:
    sessions.append("chat", [SYSTEM, USER], create=True)
    sessions.append("chat", [{"role": "user", "content": "Refund ticket PAY-4242 too."}])
    sessions.pop("chat", 3)
    sessions.append("chat", [{"role": "user", "content": "Refund ticket ZQ-7781 instead."}])

    with open_store(database_url) as store:
        erased = json.loads(handle_recall(store, "chat", '{"query": "PAY-4242"}'))
        kept = json.loads(handle_recall(store, "chat", '{"query": "ZQ-7781"}'))
    assert erased["hits"] == []
    assert [(hit["seq"], hit["excerpt"]) for hit in kept["hits"]] == \
        [(3, "Refund ticket ZQ-7781 instead.")]
    values = {artifact.value: artifact.first_seq for artifact in sessions.artifacts("chat")}
    assert "PAY-4242" not in values and values["ZQ-7781"] == 3
