"""Recall on PostgreSQL and SQLite: every planted identifier of a session imported
through ingest is found by the database's text index, exactly as written; the artifact
index holds them; the tool answers its schema's calls."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from db import Store
from scheduler.cli.demo_sessions import generate_sessions
from tests.unit.session_strategies import shared_counter
from worker.compaction.intake import IntakePolicy
from worker.platform.ingest import ImportStatus, import_record
from worker.platform.recall_tool import RECALL_TOOL, handle_recall

pytestmark = pytest.mark.integration

NOW = datetime(2025, 1, 1, tzinfo=UTC)
PLANTED = ["E3283-SCHEMA", "sqlalchemy==8.16.16", "/src/app/main.py", "ERR_CONN_RESET",
           "HTTP 503", "PAY-4242", "mia_li_3668", "ZFA04Y", "left-pad@^2",
           "3f2a9bc1d4", "mia.li@example.com", "+1 415-555-0100"]


def planted_session(session_id: str) -> dict[str, Any]:
    [record] = generate_sessions(1, seed=3)
    messages = record["messages"]
    messages.insert(1, {"role": "user", "content": (
        f"Keep these: {PLANTED[0]} from the migration, pin {PLANTED[1]}, edit "
        f"{PLANTED[2]}; the socket said {PLANTED[3]} and upstream {PLANTED[4]}. "
        f"Ticket {PLANTED[5]}, user id {PLANTED[6]}, reservation {PLANTED[7]}.")})
    messages.append({"role": "user", "content": (
        f"Also {PLANTED[8]}, commit {PLANTED[9]}, mail {PLANTED[10]}, phone {PLANTED[11]}.")})
    return {"session_id": session_id, "messages": messages}


def imported(store: Store, session_id: str) -> str:
    report = import_record(planted_session(session_id), store=store, counter=shared_counter(),
                           policy=IntakePolicy(), now=NOW)
    assert report.status is ImportStatus.IMPORTED
    return session_id


def test_every_planted_identifier_is_recalled_exactly(store: Store) -> None:
    session_id = imported(store, "recall-1")
    for value in PLANTED:
        hits = store.recall(session_id, value)
        assert hits, value
        assert all(value.casefold() in hit.excerpt.casefold() for hit in hits), value
    assert [hit.seq for hit in store.recall(session_id, "e3283-schema")] == [2]


def test_recall_finds_phrases_and_nothing_where_nothing_matches(store: Store) -> None:
    session_id = imported(store, "recall-2")
    assert store.recall(session_id, "from the migration, pin")
    assert store.recall(session_id, "E3283-SCHEMB") == []
    assert store.recall(session_id, "100%_no_such_thing") == []
    with pytest.raises(ValueError, match="3 characters"):
        store.recall(session_id, "ab")


def test_the_artifact_index_holds_the_planted_identifiers(store: Store) -> None:
    session_id = imported(store, "recall-3")
    artifacts = {a.value: a for a in store.artifacts(session_id)}
    assert {"E3283-SCHEMA", "sqlalchemy==8.16.16", "/src/app/main.py", "PAY-4242"} <= set(
        artifacts)
    assert artifacts["E3283-SCHEMA"].sources == frozenset({"user"})
    assert artifacts["E3283-SCHEMA"].first_seq == artifacts["E3283-SCHEMA"].last_seq == 2


def test_the_recall_tool_answers_its_schema_and_reports_bad_calls(store: Store) -> None:
    session_id = imported(store, "recall-4")
    assert RECALL_TOOL["function"]["name"] == "recall"
    answer = json.loads(handle_recall(store, session_id, '{"query": "PAY-4242", "limit": 1}'))
    assert [hit["seq"] for hit in answer["hits"]] == [2]
    assert json.loads(handle_recall(store, session_id, "{}"))["error"] == "invalid_arguments"
    assert json.loads(handle_recall(store, session_id, '{"query": "x"}'))["error"] == \
        "invalid_query"
    assert json.loads(handle_recall(store, "nope", '{"query": "abc"}'))["error"] == \
        "unknown_session"
