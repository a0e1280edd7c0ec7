"""Import and append through the real store: appends are checked against the stored
session's open tool calls and used ids; bad records never stop the others; each tool
result is stored with its outcome."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine, update

from db import Store, decode_mention_lists
from db.models import MessageRow
from tests.support.tool_results import tool_record
from worker.compaction import CallStatus, SessionFormat, classify_results, view_item
from worker.compaction.identifiers import collect_artifacts
from worker.compaction.intake import IntakePolicy, ProblemKind
from worker.compaction.messages import parse_message
from worker.compaction.tokens import TokenCounter
from worker.errors import MessagesRejected
from worker.platform.export_views import ExportView
from worker.platform.ingest import (
    ImportStatus,
    append_checked,
    append_messages,
    export_session,
    import_sessions,
)
from worker.tokenizer.offline import load_encoding

pytestmark = pytest.mark.integration

NOW = datetime(2024, 5, 15, 15, 0, tzinfo=UTC)
POLICY = IntakePolicy()
USER = {"role": "user", "content": "Cancel reservation NO6JO3."}
REPLY = {"role": "assistant", "content": "Cancelled."}


def calling(*call_ids: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": "cancel", "arguments": "{}"}}
        for i in call_ids]}


def result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter(load_encoding("o200k_base"))


def import_one(store: Store, counter: TokenCounter, messages: list[Any]) -> None:
    records = [{"session_id": "s1", "messages": messages}]
    [report] = import_sessions(records, store=store, counter=counter, policy=POLICY, now=NOW)
    assert report.status in (ImportStatus.IMPORTED, ImportStatus.REPAIRED)


def test_one_bad_record_never_stops_the_others(store: Store, counter: TokenCounter) -> None:
    records: list[dict[str, Any]] = [{"session_id": "a", "messages": [USER]}, {"session_id": "b"},
               {"messages": [USER]}, {"session_id": "c", "messages": [USER, result("x")]},
               {"session_id": "a", "messages": [USER]}, {"session_id": "d", "messages": [USER]}]

    reports = list(import_sessions(records, store=store, counter=counter, policy=POLICY,
                                   now=NOW))

    assert [(r.session_id, r.status) for r in reports] == [
        ("a", ImportStatus.IMPORTED), ("b", ImportStatus.REJECTED), ("", ImportStatus.REJECTED),
        ("c", ImportStatus.REJECTED), ("a", ImportStatus.EXISTS), ("d", ImportStatus.IMPORTED)]
    assert reports[1].problems[0].kind is ProblemKind.MALFORMED_SESSION
    assert reports[3].problems[0].kind is ProblemKind.ORPHAN_TOOL_RESULT
    assert [s.session_id for s in store.list_sessions()] == ["a", "d"]


def test_each_message_is_counted_once_and_stored_with_its_count(
    store: Store, counter: TokenCounter
) -> None:
    import_one(store, counter, [USER, calling("c1"), result("c1"), REPLY])

    stored = store.messages("s1")

    assert [m.tokens for m in stored] == [
        counter.count_message(parse_message(m.body)) for m in stored]
    assert store.get_session("s1").total_tokens == sum(m.tokens for m in stored)
    assert [m.tool_call_id for m in stored] == [None, None, "c1", None]


def test_identifiers_are_stored_with_their_summary_lines_counted_and_read_without_them(
    store: Store, counter: TokenCounter, engine: Engine
) -> None:
    said = {"role": "user", "content": "Move NO6JO3; the build failed with E3283-SCHEMA."}
    import_one(store, counter, [said, REPLY])

    [first, _] = store.messages("s1")
    assert {mention[0] for mention in first.identifiers or ()} >= {"NO6JO3", "E3283-SCHEMA"}
    assert [mention[4] for mention in first.identifiers or ()] == \
        [counter.count_text(f"- {mention[0]}\n") for mention in first.identifiers or ()]

    # As a release before line counts stored them: four fields, read as no count.
    with engine.begin() as connection:
        connection.execute(update(MessageRow).where(MessageRow.seq == 1).values(
            identifiers=[list(mention[:4]) for mention in first.identifiers or ()]))
    [older, _] = store.messages("s1")
    assert older.identifiers == tuple((*mention[:4], None) for mention in first.identifiers or ())
    texts = [m.identifiers_json for m in store.job_snapshot("s1", to_message=lambda m: m).messages
             if m.identifiers_json]
    artifacts = collect_artifacts(enumerate(decode_mention_lists(texts), 1))
    assert artifacts and all(artifact.line_tokens is None for artifact in artifacts)


def test_repaired_text_and_metadata_are_stored_clean(store: Store, counter: TokenCounter) -> None:
    records = [{"session_id": "s1", "note": "a\x00b", "messages": [
        {"role": "user", "content": "x\x00y\ud83dz"}]}]

    [report] = import_sessions(records, store=store, counter=counter, policy=POLICY, now=NOW)

    assert report.status is ImportStatus.REPAIRED
    assert export_session(store, "s1", ExportView.FULL) == {
        "session_id": "s1", "note": "ab", "messages": [{"role": "user", "content": "xy\ufffdz"}]}


def test_an_append_answers_the_calls_the_session_left_open(
    store: Store, counter: TokenCounter
) -> None:
    import_one(store, counter, [USER, calling("c1", "c2"), result("c1")])

    seqs = append_messages(store, counter, POLICY, "s1", [result("c2"), REPLY], NOW)

    assert seqs == [4, 5]
    assert store.messages("s1", after_seq=3)[0].tool_call_id == "c2"


def test_calls_left_open_across_several_appends_are_answered_one_append_at_a_time(
    store: Store, counter: TokenCounter
) -> None:
    import_one(store, counter, [USER, calling("c1", "c2", "c3")])

    first = append_checked(store, counter, POLICY, "s1", [result("c2")], NOW)
    second = append_checked(store, counter, POLICY, "s1", [result("c1"), result("c3")], NOW)

    assert (first.seqs, second.seqs) == ((3,), (4, 5))
    assert first.problems == second.problems == ()


def test_a_result_for_a_call_an_earlier_append_answered_is_an_orphan(
    store: Store, counter: TokenCounter
) -> None:
    import_one(store, counter, [USER, calling("c1", "c2")])
    append_messages(store, counter, POLICY, "s1", [result("c1")], NOW)

    with pytest.raises(MessagesRejected, match="orphan_tool_result"):
        append_messages(store, counter, POLICY, "s1", [result("c1")], NOW)
    repaired = append_checked(store, counter, IntakePolicy.lenient(), "s1",
                              [result("c1"), result("c2")], NOW)

    assert repaired.seqs == (4,)
    assert [p.kind for p in repaired.problems] == [ProblemKind.ORPHAN_TOOL_RESULT]
    assert [m.tool_call_id for m in store.messages("s1", after_seq=2)] == ["c1", "c2"]


def test_an_id_used_before_the_open_group_is_renamed_in_a_later_append(
    store: Store, counter: TokenCounter
) -> None:
    import_one(store, counter, [USER, calling("c1"), result("c1"), USER, calling("c2")])

    report = append_checked(store, counter, POLICY, "s1",
                            [result("c2"), calling("c1"), result("c1")], NOW)

    assert [p.kind for p in report.problems] == [ProblemKind.DUPLICATE_TOOL_CALL_ID]
    assert [m.body for m in store.messages("s1", after_seq=6)] == [
        calling("c1_dup1"), result("c1_dup1")]


def test_an_append_with_create_makes_the_session_and_checks_its_messages(
    store: Store, counter: TokenCounter
) -> None:
    report = append_checked(store, counter, POLICY, "new", [USER, calling("c1")], NOW,
                            create=True, metadata={"user": "u1"})

    assert report.seqs == (1, 2)
    assert store.get_session("new").metadata == {"user": "u1"}


def test_an_append_that_skips_an_open_call_records_the_missing_result(
    store: Store, counter: TokenCounter
) -> None:
    import_one(store, counter, [USER, calling("c1")])

    seqs = append_messages(store, counter, POLICY, "s1", [USER], NOW)

    assert seqs == [3, 4]
    assert [m.body for m in store.messages("s1", after_seq=2)] == [
        {"role": "tool", "tool_call_id": "c1", "content": "[no result recorded]"}, USER]


def test_an_append_renames_a_tool_call_id_the_session_already_used(
    store: Store, counter: TokenCounter
) -> None:
    import_one(store, counter, [USER, calling("c1"), result("c1"), REPLY])

    append_messages(store, counter, POLICY, "s1", [USER, calling("c1"), result("c1")], NOW)

    assert [m.body for m in store.messages("s1", after_seq=5)] == [
        calling("c1_dup1"), result("c1_dup1")]


def test_a_rejected_append_stores_nothing(store: Store, counter: TokenCounter) -> None:
    import_one(store, counter, [USER, REPLY])

    with pytest.raises(MessagesRejected, match="orphan_tool_result") as raised:
        append_messages(store, counter, POLICY, "s1", [result("ghost")], NOW)

    assert raised.value.problems[0].index == 0
    assert store.get_session("s1").head_seq == 2


@pytest.mark.parametrize("session_format", list(SessionFormat))
def test_appended_tool_results_carry_the_outcome_their_text_gives(
    store: Store, counter: TokenCounter, session_format: SessionFormat,
) -> None:
    record = tool_record("s1", session_format.value, seed=7, turns=12)
    items = record.get("items") or record["messages"]
    cuts = [0, *sorted(random.Random(7).sample(range(1, len(items)), 6)), len(items)]
    metadata = {"system": record["system"]} if "system" in record else None
    for index, (start, end) in enumerate(itertools.pairwise(cuts)):
        append_checked(store, counter, POLICY, "s1", items[start:end], NOW,
                       create=index == 0, metadata=metadata if index == 0 else None,
                       session_format=session_format if index == 0 else None)

    stored = store.messages("s1")
    expected = [classify_results([view_item(session_format, m.body).chat_messages()])[0]
                for m in stored]
    assert [m.outcomes for m in stored] == expected
    statuses = {status for outcomes in expected for _, status, _ in outcomes}
    assert statuses == set(CallStatus)  # the session's results end in every way
