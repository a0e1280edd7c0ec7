"""Tool outcomes classified at ingest: a job that takes the outcomes stored with a
session's messages classifies its calls exactly as one that reads every result's text,
in every wire format, whichever messages were stored before ingest classified them."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.fake_store import FakeStore
from tests.support.wire_convert import chat_to_anthropic, chat_to_responses
from tests.unit.session_strategies import session_messages, shared_counter
from tests.unit.test_outcomes import TEXTS
from worker.compaction import SessionFormat, classify_calls, classify_results, parse_message
from worker.compaction.intake import IntakePolicy
from worker.compaction.outcomes import CallStatus
from worker.job.planning import group_snapshot, to_snapshot_message
from worker.platform.ingest import ImportStatus, import_record

NOW = datetime(2026, 11, 27, tzinfo=UTC)
# Results a JSON record gives: a status, an error, an exit code or an HTTP status.
RECORDS = st.fixed_dictionaries({}, optional={
    "status": st.sampled_from(("ok", "failed", "cancelled", "timeout", "done")),
    "error": st.one_of(st.none(), st.sampled_from(("E42: no seat", "denied"))),
    "returncode": st.integers(0, 3), "status_code": st.sampled_from((200, 404, 503)),
    "stdout": TEXTS}).map(json.dumps)
RESULTS = st.one_of(TEXTS, RECORDS)


@st.composite
def sessions_with_results(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A chat session whose tool results say how they ended in every way the classifier
    reads (test runs, exit codes, tracebacks, JSON records)."""
    messages = draw(session_messages(max_turns=5, allow_huge=False))
    return [{**m, "content": draw(RESULTS)} if m["role"] == "tool" else m for m in messages]


def record_in(session_format: SessionFormat, messages: list[dict[str, Any]]
              ) -> dict[str, Any]:
    if session_format is SessionFormat.RESPONSES:
        return {"session_id": "s", "format": "responses", "items": chat_to_responses(messages)}
    if session_format is SessionFormat.ANTHROPIC:
        system, converted = chat_to_anthropic(messages)
        return {"session_id": "s", "format": "anthropic", "messages": converted,
                **({"system": system} if system else {})}
    return {"session_id": "s", "messages": messages}


@pytest.mark.parametrize("session_format", list(SessionFormat))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=sessions_with_results(), unclassified=st.sets(st.integers(1, 80)))
def test_the_outcomes_stored_at_ingest_are_those_classified_from_the_text(
    session_format: SessionFormat, messages: list[dict[str, Any]], unclassified: set[int],
) -> None:
    store = FakeStore()
    report = import_record(record_in(session_format, messages), store=store,
                           counter=shared_counter(), policy=IntakePolicy(), now=NOW)
    if report.status is ImportStatus.REJECTED:
        return  # an empty or instructions-only session is no session
    snapshot = store.job_snapshot("s", to_message=to_snapshot_message)
    groups = group_snapshot(snapshot)
    stored = {m.seq: json.loads(m.outcomes_json) for m in snapshot.messages
              if m.outcomes_json is not None}
    # Messages stored before ingest classified them (NULL) are classified from their text.
    older = {seq: outcomes for seq, outcomes in stored.items() if seq not in unclassified}

    from_text = classify_calls(groups)

    assert classify_calls(groups, stored) == from_text
    assert classify_calls(groups, older) == from_text
    # Every message was classified at ingest: one outcome per tool result it holds.
    assert sum(len(outcomes) for outcomes in stored.values()) == len(from_text)
    assert len(stored) == len(snapshot.messages)


def test_a_stored_outcome_is_taken_without_reading_the_text() -> None:
    """The stored outcome decides (a job never reads such a result's text again); one
    that answers another call, or names no status, is classified from the text."""
    result = parse_message({"role": "tool", "tool_call_id": "c1", "content": "exit code 2"})
    [[(call_id, status, lines)]] = classify_results([[result]])
    assert (call_id, status, lines) == ("c1", CallStatus.FAILED, ("exit code 2",))
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}]}
    store = FakeStore()
    import_record({"session_id": "s", "messages": [
        {"role": "user", "content": "run it"}, call,
        {"role": "tool", "tool_call_id": "c1", "content": "exit code 2"}]},
        store=store, counter=shared_counter(), policy=IntakePolicy(), now=NOW)
    groups = group_snapshot(store.job_snapshot("s", to_message=to_snapshot_message))

    [taken] = classify_calls(groups, {3: [["c1", "succeeded", []]]})
    [other_call] = classify_calls(groups, {3: [["c9", "succeeded", []]]})
    [no_status] = classify_calls(groups, {3: [["c1", "finished", []]]})

    assert (taken.status, taken.lines, taken.tool) == (CallStatus.SUCCEEDED, (), "run")
    assert other_call.status is no_status.status is CallStatus.FAILED
