"""Responses and Anthropic sessions through the real store, on both databases: stored
verbatim (import -> export and append -> projection give back equal JSON), the format
fixed at creation, and a record of one format never read as another."""

from __future__ import annotations

import copy
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from db import DueCriteria, Store
from tests.support.wire_sessions import (
    anthropic_messages,
    anthropic_record,
    responses_items,
    responses_record,
    system_prompt,
    text_twins,
)
from worker.compaction import IntakePolicy, ProblemKind, SessionFormat, TokenCounter
from worker.compaction.messages import parse_message
from worker.errors import MessagesRejected
from worker.platform.export_views import ExportView
from worker.platform.ingest import ImportStatus, append_checked, export_session, import_record
from worker.platform.sessions import SessionsAPI
from worker.tokenizer.offline import load_encoding

pytestmark = pytest.mark.integration

NOW = datetime(2024, 5, 15, 15, 0, tzinfo=UTC)
POLICY = IntakePolicy()
SEEDS = (3, 17, 29)


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter(load_encoding("o200k_base"))


def imported(store: Store, counter: TokenCounter, record: dict[str, Any]) -> ImportStatus:
    report = import_record(record, store=store, counter=counter, policy=POLICY, now=NOW)
    assert report.problems == (), report.problems
    return report.status


@pytest.mark.parametrize("seed", SEEDS)
def test_responses_and_anthropic_records_round_trip_exactly_through_import_and_export(
    store: Store, counter: TokenCounter, seed: int,
) -> None:
    records = [responses_record(f"r{seed}", seed, 6), anthropic_record(f"a{seed}", seed, 6)]

    for record in records:
        assert imported(store, counter, record) is ImportStatus.IMPORTED
        for view in ExportView:  # nothing is compacted yet: the projection is the record
            assert export_session(store, record["session_id"], view) == record
    assert store.get_session(f"r{seed}").session_format == "responses"
    assert store.get_session(f"a{seed}").session_format == "anthropic"


def split_at_random(items: list[dict[str, Any]], seed: int) -> list[list[dict[str, Any]]]:
    """Cut a session into appends at random places, some between a call and its output."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(items)), k=min(8, len(items) - 1)))
    return [items[a:b] for a, b in zip([0, *cuts], [*cuts, len(items)], strict=True)]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("session_format", [SessionFormat.RESPONSES, SessionFormat.ANTHROPIC])
def test_appends_give_back_the_items_verbatim_in_the_projection(
    store: Store, counter: TokenCounter, seed: int, session_format: SessionFormat,
) -> None:
    items = (responses_items(seed, 5) if session_format is SessionFormat.RESPONSES
             else anthropic_messages(seed, 5))

    for index, batch in enumerate(split_at_random(items, seed)):
        report = append_checked(store, counter, POLICY, "s", batch, NOW, create=index == 0,
                                session_format=session_format if index == 0 else None)
        assert report.problems == ()

    assert store.projection("s") == items
    assert [m.body for m in store.messages("s")] == items
    assert store.get_session("s").session_format == session_format.value
    assert store.get_session("s").total_tokens == sum(m.tokens for m in store.messages("s"))


def rejection(error: pytest.ExceptionInfo[MessagesRejected]) -> tuple[ProblemKind, str]:
    problem = error.value.problems[0]
    return problem.kind, problem.detail


def test_the_format_is_fixed_when_the_session_is_created(
    store: Store, counter: TokenCounter,
) -> None:
    append_checked(store, counter, POLICY, "s", responses_items(1, 1)[:2], NOW, create=True,
                   session_format=SessionFormat.RESPONSES)

    with pytest.raises(MessagesRejected) as error:
        append_checked(store, counter, POLICY, "s", [{"role": "user", "content": "hi"}], NOW,
                       session_format=SessionFormat.CHAT)
    assert rejection(error) == (ProblemKind.FORMAT_MISMATCH,
                                "format: session 's' is a responses session, not chat")
    with pytest.raises(MessagesRejected) as error:
        append_checked(store, counter, POLICY, "s", [
            {"role": "tool", "tool_call_id": "c", "content": "ok"}], NOW)
    assert rejection(error)[0] is ProblemKind.FORMAT_MISMATCH
    assert "items[0]" in rejection(error)[1]
    assert len(store.messages("s")) == 2


def test_an_anthropic_record_without_its_format_is_refused_not_read_as_chat(
    store: Store, counter: TokenCounter,
) -> None:
    record = anthropic_record("a", 5, 2)
    del record["format"], record["system"]

    report = import_record(record, store=store, counter=counter, policy=POLICY, now=NOW)

    assert report.status is ImportStatus.REJECTED
    [problem] = report.problems
    assert problem.kind is ProblemKind.FORMAT_MISMATCH
    assert problem.detail.startswith("messages[1].content[0].type")
    assert "format" in problem.detail and "anthropic" in problem.detail


CHAT_RECORD = {"session_id": "r", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("record", "change", "detail"), [
    (responses_record("r", 2, 1), lambda r: r.update(format="gemini"),
     "format 'gemini' is not one of"),
    (responses_record("r", 2, 1), lambda r: r.update(messages=r.pop("items")),
     'messages: a responses record holds'),
    # "items" is never metadata: a record without "format" that has it is refused.
    (CHAT_RECORD, lambda r: r.update(items=[]), 'items: a record without "format" is chat'),
    (CHAT_RECORD, lambda r: r.update(items={"source": "crm"}),
     'give the record "format": "responses"'),
    (CHAT_RECORD, lambda r: r.update(format="chat", items=[]),
     'items: a chat record holds its items in'),
])
def test_a_record_that_mixes_formats_is_refused_naming_the_field(
    store: Store, counter: TokenCounter, record: dict[str, Any], change: Any, detail: str,
) -> None:
    record = copy.deepcopy(record)
    change(record)

    report = import_record(record, store=store, counter=counter, policy=POLICY, now=NOW)

    assert report.status is ImportStatus.REJECTED
    assert report.problems[0].kind is ProblemKind.FORMAT_MISMATCH
    assert detail in report.problems[0].detail
    assert store.list_sessions() == []


def test_a_responses_output_whose_call_an_earlier_append_left_open_is_accepted_once(
    store: Store, counter: TokenCounter,
) -> None:
    items = responses_items(11, 1)
    first_output = next(i for i, item in enumerate(items)
                        if item["type"] == "function_call_output")
    append_checked(store, counter, POLICY, "s", items[:first_output], NOW, create=True,
                   session_format=SessionFormat.RESPONSES)

    append_checked(store, counter, POLICY, "s", [items[first_output]], NOW)
    with pytest.raises(MessagesRejected) as error:
        append_checked(store, counter, POLICY, "s", [items[first_output]], NOW)

    assert rejection(error)[0] is ProblemKind.ORPHAN_TOOL_RESULT
    assert "items[0].call_id" in rejection(error)[1]


def test_an_anthropic_tool_result_must_answer_the_message_just_before(
    store: Store, counter: TokenCounter,
) -> None:
    messages = anthropic_messages(12, 2)
    append_checked(store, counter, POLICY, "s", messages[:2], NOW, create=True,
                   session_format=SessionFormat.ANTHROPIC)

    with pytest.raises(MessagesRejected) as error:  # the answer skipped: results missing
        append_checked(store, counter, POLICY, "s", messages[3:4], NOW)
    assert rejection(error)[0] is ProblemKind.MISSING_TOOL_RESULT
    append_checked(store, counter, POLICY, "s", messages[2:], NOW)
    with pytest.raises(MessagesRejected) as error:  # the same results again: orphans
        append_checked(store, counter, POLICY, "s", messages[2:3], NOW)
    assert ProblemKind.ORPHAN_TOOL_RESULT in {p.kind for p in error.value.problems}
    assert store.projection("s") == messages


@pytest.mark.parametrize("make_record", [responses_record, anthropic_record])
def test_recall_and_the_artifact_index_read_every_format_and_never_an_opaque_part(
    store: Store, counter: TokenCounter, make_record: Any,
) -> None:
    record = make_record("w", 8, 3)
    imported(store, counter, record)
    items = record.get("items") or record["messages"]
    # A reservation the tool was asked about (a call's arguments, a tool_use's input) and
    # returned (an output, a tool_result).
    value = "wR1x0"

    hits = store.recall("w", value)
    artifacts = {a.value: a for a in store.artifacts("w")}

    assert len(hits) >= 3 and all(value in hit.excerpt for hit in hits)
    assert {"tool_argument", "tool_output"} <= artifacts[value].sources
    for item in items:  # no part of an encrypted reasoning or a signature is searchable
        opaque = item.get("encrypted_content") or next(
            (b.get("signature") or b.get("data") for b in item.get("content") or ()
             if isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking")),
            None)
        if opaque:
            assert store.recall("w", opaque[:24]) == []
            assert not any(opaque[:24] in a for a in artifacts)


def due_ids(store: Store, trigger_tokens: int) -> set[str]:
    """The sessions a scan an hour after import finds due with this trigger."""
    criteria = DueCriteria(trigger_tokens=trigger_tokens, dirty_tokens=10**9,
                           quiet_period_s=600, breaker_cooldown_s=600, marker_ttl_s=600)
    return {row.session_id
            for row in store.iter_due_sessions(criteria, NOW + timedelta(hours=1), page_size=10)}


@pytest.mark.parametrize("seed", SEEDS)
def test_an_anthropic_system_prompt_is_counted_as_its_chat_twins_system_message(
    store: Store, counter: TokenCounter, seed: int,
) -> None:
    anthropic, chat = text_twins(f"t{seed}", seed, 8, system_prompt(seed, 20 + 5 * seed))
    for record in (anthropic, chat):
        assert imported(store, counter, record) is ImportStatus.IMPORTED
        assert export_session(store, record["session_id"], ExportView.FULL) == record

    outside, inside = store.get_session(f"t{seed}"), store.get_session(f"t{seed}-chat")
    system_message = store.messages(inside.session_id)[0]
    assert outside.system_tokens == system_message.tokens > 0 and inside.system_tokens == 0
    assert (outside.total_tokens, outside.projection_tokens, outside.tokens_since_compaction) \
        == (inside.total_tokens, inside.projection_tokens, inside.tokens_since_compaction)
    # Due exactly when its twin is, though its messages alone are under the trigger.
    projection = outside.projection_tokens
    assert sum(m.tokens for m in store.messages(outside.session_id)) < projection - 1
    assert due_ids(store, projection - 1) == {outside.session_id, inside.session_id}
    assert due_ids(store, projection) == set()


def test_a_created_anthropic_session_counts_its_system_prompt_and_refuses_a_malformed_one(
    store: Store, counter: TokenCounter,
) -> None:
    sessions, system = SessionsAPI(store, counter), system_prompt(5, 30)
    blocks = [{"type": "text", "text": system}]

    created = sessions.create("c1", {"system": system}, session_format=SessionFormat.ANTHROPIC)
    append_checked(store, counter, POLICY, "c2", [], NOW, create=True,
                   metadata={"system": blocks}, session_format=SessionFormat.ANTHROPIC)

    chat = sessions.create("c3", {"system": system})  # metadata of a chat session: no prompt
    expected = counter.count_message(parse_message({"role": "system", "content": system}))
    assert created.system_tokens == created.projection_tokens == expected
    assert store.get_session("c2").system_tokens == expected
    assert chat.system_tokens == chat.projection_tokens == 0
    with pytest.raises(MessagesRejected) as error:
        sessions.create("c4", {"system": 5}, session_format=SessionFormat.ANTHROPIC)
    assert rejection(error)[0] is ProblemKind.MALFORMED_SESSION
    assert "system" in rejection(error)[1]
