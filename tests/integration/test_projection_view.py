"""The SQL read contract: the ``session_projection`` view returns exactly what the Python
API's projection returns, on SQLite and PostgreSQL, for every shape of session."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

from db import NewMessage, SessionNotFound, Store, create_db_engine
from tests.integration.test_store import T0, conversation, message, swap
from tests.support.store_jobs import read_snapshot

pytestmark = pytest.mark.integration

VIEW_QUERY = text(
    "SELECT position, message FROM session_projection WHERE session_id = :session_id "
    "ORDER BY position"
)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_db_engine(database_url)
    yield engine
    engine.dispose()


def build_sessions(store: Store) -> list[str]:
    """One session of each shape the projection rule distinguishes; return their ids."""
    store.import_session("plain", {}, conversation(5), T0)
    store.create_session("empty", {}, T0)
    # Instructions on both sides of the boundary (seq 1 and 3 covered, 7 after it).
    mixed = [message("system", "rules"), message("user", "u1"), message("developer", "dev"),
             message("assistant", "a1"), message("user", "u2"), message("assistant", "a2"),
             message("system", "late rules"), message("user", "u3")]
    store.import_session("compacted", {}, mixed, T0)
    swap(store, "compacted", 5)
    store.append_messages("compacted", [message("assistant", "after the swap")], now=T0)
    store.import_session("rolled-back", {}, conversation(10), T0)
    swap(store, "rolled-back", 4, label="one")
    swap(store, "rolled-back", 8, label="two")
    store.rollback("rolled-back")
    store.import_session("rolled-to-none", {}, conversation(6), T0)
    swap(store, "rolled-to-none", 3)
    store.rollback("rolled-to-none")
    store.import_session("covers-all", {}, conversation(4), T0)
    swap(store, "covers-all", 4)
    odd = {"role": "tool", "tool_call_id": "c1", "content": "nul\u0000 é 漢字 \U0001f600 \"q\" \\",
           "extra": {"n": 1.5e300, "nested": [None, True, {"k": []}]}}
    store.import_session("odd", {}, [message("user", "x"), NewMessage(odd, "tool", "c1", 3)], T0)
    return ["plain", "empty", "compacted", "rolled-back", "rolled-to-none", "covers-all", "odd"]


def read_view(engine: Engine, session_id: str) -> list[tuple[int, Any]]:
    with engine.connect() as connection:
        rows = connection.execute(VIEW_QUERY, {"session_id": session_id}).all()
    return [(position, as_json(message_json)) for position, message_json in rows]


def as_json(value: Any) -> Any:
    # PostgreSQL's driver decodes json columns itself; SQLite hands back the text.
    return json.loads(value) if isinstance(value, str) else value


def assemble_from_snapshot(store: Store, session_id: str) -> list[dict[str, Any]]:
    """The projection rule spelled out in Python over the job's snapshot."""
    snapshot = read_snapshot(store, session_id)
    bodies = [(m.seq, json.loads(m.body_json)) for m in snapshot.messages]
    if snapshot.revision is None:
        return [body for _seq, body in bodies]
    through_seq = snapshot.revision.through_seq
    return [*(body for seq, body in bodies if seq <= through_seq),
            snapshot.revision.block, *(body for seq, body in bodies if seq > through_seq)]


def test_the_view_returns_exactly_what_the_api_returns_for_every_shape_of_session(
    store: Store, engine: Engine
) -> None:
    for session_id in build_sessions(store):
        projection = store.projection(session_id)

        assert read_view(engine, session_id) == list(enumerate(projection, start=1)), session_id
        assert projection == assemble_from_snapshot(store, session_id), session_id


def test_the_view_places_the_block_after_the_covered_instructions_only(
    store: Store, engine: Engine
) -> None:
    build_sessions(store)

    contents = [m["content"] for _, m in read_view(engine, "compacted")]

    assert contents == ["rules", "dev", "[summary through 5]", "a2", "late rules", "u3",
                        "after the swap"]


def test_the_whole_view_read_at_once_agrees_with_the_api_session_by_session(
    store: Store, engine: Engine
) -> None:
    session_ids = build_sessions(store)
    with engine.connect() as connection:
        rows = connection.execute(text(
            "SELECT session_id, position, message FROM session_projection "
            "ORDER BY session_id, position")).all()

    by_session: dict[str, list[Any]] = {}
    for session_id, _, message_json in rows:
        by_session.setdefault(session_id, []).append(as_json(message_json))

    expected = {sid: store.projection(sid) for sid in session_ids if store.projection(sid)}
    assert by_session == expected


def test_an_unknown_session_has_no_rows_in_the_view_and_raises_in_the_api(
    store: Store, engine: Engine
) -> None:
    build_sessions(store)

    assert read_view(engine, "nobody") == []
    with pytest.raises(SessionNotFound):
        store.projection("nobody")
    assert store.projection("empty") == []
