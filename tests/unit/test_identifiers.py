"""Identifier extraction: each kind caught verbatim, ordinary text left alone, ranking."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from db import decode_mention_lists
from tests.support.corpus import load_corpus, skip_without_corpus
from tests.unit.session_strategies import sessions, shared_counter, to_stored
from worker.compaction.identifiers import (
    KIND_WEIGHTS,
    SOURCES,
    Artifact,
    StoredMention,
    collect_artifacts,
    dump_artifacts_json,
    extract_identifiers,
    find_identifiers,
    identify_message,
)
from worker.compaction.messages import INSTRUCTION_ROLES, StoredMessage, parse_message

UUID = "123e4567-e89b-12d3-a456-426614174000"
SHA = "9fceb02d0ae598e95dc970b74767f19372d61af8"


@pytest.mark.parametrize(
    ("text", "value", "kind"),
    [
        ("see https://example.com/api/v1?id=7.", "https://example.com/api/v1?id=7", "url"),
        ("reach me at mia.li3818@example.com", "mia.li3818@example.com", "email"),
        (f"trace {UUID} logged", UUID, "uuid"),
        ("edit /srv/app/config.yaml now", "/srv/app/config.yaml", "path"),
        ("run ./scripts/deploy.sh", "./scripts/deploy.sh", "path"),
        ("in ~/projects/app", "~/projects/app", "path"),
        ("open src/app/main.py please", "src/app/main.py", "path"),
        ("the file setup.cfg is stale", "setup.cfg", "path"),
        (r"saved to C:\Users\mia\report.txt", r"C:\Users\mia\report.txt", "path"),
        ("compiler said E1234 twice", "E1234", "error"),
        ("the server answered HTTP 404", "HTTP 404", "error"),
        ("query failed: ORA-00942 table missing", "ORA-00942", "error"),
        ("open failed with ENOENT", "ENOENT", "error"),
        ("raised FileNotFoundError at startup", "FileNotFoundError", "error"),
        ("got status code 503 back", "status code 503", "error"),
        ("upgrade to v1.2.3 today", "v1.2.3", "version"),
        ("we run 3.11.7 in prod", "3.11.7", "version"),
        ("needs Python 3.11 or later", "3.11", "version"),
        ("tracked in JIRA-123", "JIRA-123", "ticket"),
        ("fixed by #456", "#456", "ticket"),
        (f"commit {SHA} merged", SHA, "hash"),
        ("short sha 3f2a9bc1 reverted", "3f2a9bc1", "hash"),
        ("flight HAT170 is delayed", "HAT170", "id"),
        ("reservation ZFA04Y was cancelled", "ZFA04Y", "id"),
        ("my reservation ID is HATHAT.", "HATHAT", "id"),
        ("my user id is mia_li_3668", "mia_li_3668", "id"),
        ('{"reservation_id": "HATHAT", "status": "ok"}', "HATHAT", "id"),
        ('{"payment_id":"credit_card_4421486"}', "credit_card_4421486", "id"),
        ("token a8Kz93LqXw stored", "a8Kz93LqXw", "id"),
    ],
)
def test_each_kind_of_identifier_is_found_verbatim(text: str, value: str, kind: str) -> None:
    assert (value, kind) in find_identifiers(text)


@pytest.mark.parametrize(
    "text",
    [
        "I would like to book a flight from New York to Seattle on May 20th for $255.50.",
        "Please CONFIRM the BOOKING now, THANK you.",
        "Use UTF-8 and SHA-256 encoding, and/or 1/2 of A/B tests.",
        "The flight left at 2024-05-15T15:00:00 from JFK to SEA.",
        "Option #1 is cheaper, I'm 100% sure, rated 3.5 stars.",
        "Basic economy has 0 free checked bags; each extra bag is 50 dollars.",
        "Your card ending in 7447 will be charged.",
    ],
)
def test_ordinary_text_yields_no_identifiers(text: str) -> None:
    assert find_identifiers(text) == []


def test_a_url_is_one_identifier_not_also_a_path_or_version() -> None:
    found = find_identifiers("docs at https://example.com/docs/v1.2.3/guide.md, then stop")
    assert found == [("https://example.com/docs/v1.2.3/guide.md", "url")]


def _stored(messages: list[dict[str, Any]]) -> list[StoredMessage]:
    return to_stored(messages, shared_counter(), first_seq=10)


AIRLINE_SPAN: list[dict[str, Any]] = [
    {"role": "system", "content": "Policy: see reservation POLICY1 and /etc/policy.md"},
    {"role": "user", "content": "Hi, my user id is mia_li_3668 and I want to cancel ZFA04Y."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {
            "name": "get_user_details", "arguments": '{"user_id":"mia_li_3668"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(
        {"user_id": "mia_li_3668", "reservations": ["ZFA04Y", "4WQ150", "HATHAT"]})},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_2", "type": "function", "function": {
            "name": "get_reservation_details", "arguments": '{"reservation_id":"ZFA04Y"}'}}]},
    {"role": "tool", "tool_call_id": "call_2", "content": json.dumps(
        {"reservation_id": "ZFA04Y", "flights": [{"flight_number": "HAT170"}]})},
    {"role": "assistant", "content": "Flight HAT170 on ZFA04Y can be cancelled. Confirm?"},
]


def test_an_airline_span_yields_user_reservation_and_flight_ids_with_tools() -> None:
    artifacts = {a.value: a for a in extract_identifiers(_stored(AIRLINE_SPAN))}
    assert {"mia_li_3668", "ZFA04Y", "4WQ150", "HATHAT", "HAT170"} <= set(artifacts)
    assert artifacts["get_user_details"].kind == "tool"
    assert artifacts["ZFA04Y"] == Artifact(
        "ZFA04Y", "id", count=5, first_seq=11, last_seq=16,
        sources=frozenset({"user", "tool_output", "tool_argument", "assistant"}))
    assert artifacts["HAT170"].first_seq == 15
    assert artifacts["4WQ150"].sources == frozenset({"tool_output"})
    assert artifacts["mia_li_3668"].is_said and not artifacts["4WQ150"].is_said


def test_ingest_counts_each_identifier_s_summary_line_once() -> None:
    counter = shared_counter()
    for stored in _stored(AIRLINE_SPAN):
        mentions = identify_message(stored.message, counter)
        assert [m.line_tokens for m in mentions] == \
            [None if m.kind == "tool" else counter.count_text(f"- {m.value}\n")
             for m in mentions]
        # Without a counter: the same mentions, no line counts.
        assert identify_message(stored.message) == \
            [mention._replace(line_tokens=None) for mention in mentions]


def test_instruction_messages_are_not_indexed() -> None:
    values = {a.value for a in extract_identifiers(_stored(AIRLINE_SPAN))}
    assert "POLICY1" not in values
    assert "/etc/policy.md" not in values


def test_ranking_puts_spoken_ids_before_ids_only_listed_in_results() -> None:
    ranked = [a.value for a in extract_identifiers(_stored(AIRLINE_SPAN))]
    assert ranked[:2] == ["ZFA04Y", "mia_li_3668"]
    assert ranked.index("HAT170") < ranked.index("4WQ150")
    # Equal scores keep the order of first appearance.
    assert ranked.index("4WQ150") < ranked.index("HATHAT")


def test_errors_outrank_ids_seen_as_often() -> None:
    span = _stored([{"role": "user", "content": "Build ZFA04Y failed with E1234."}])
    assert [a.value for a in extract_identifiers(span)] == ["E1234", "ZFA04Y"]


def test_artifacts_are_dumped_as_the_json_a_revision_row_stores() -> None:
    artifacts = collect_artifacts([(3, [("E1234", "error", "user", 1)]),
                                   (5, [("E1234", "error", "tool_output", 2),
                                        ("src/a.py", "path", "tool_argument", 1)])])
    assert dump_artifacts_json(artifacts) == json.dumps([
        {"value": "E1234", "kind": "error", "count": 3, "first_seq": 3, "last_seq": 5,
         "sources": ["tool_output", "user"]},
        {"value": "src/a.py", "kind": "path", "count": 1, "first_seq": 5, "last_seq": 5,
         "sources": ["tool_argument"]},
    ])


def _plain_artifacts(mentions: list[tuple[int, list[StoredMention]]]) -> list[Artifact]:
    """The ranking as its docstring states it, one mention at a time."""
    order: list[str] = []
    found: dict[str, dict[str, Any]] = {}
    for seq, stored in mentions:
        for value, kind, source, count, *line_tokens in stored:
            if value not in found:
                order.append(value)
                found[value] = {"kind": kind, "count": 0, "said": 0, "seqs": [],
                                "sources": set(), "line_tokens": None}
            tally = found[value]
            if tally["line_tokens"] is None and line_tokens:
                tally["line_tokens"] = line_tokens[0]
            if KIND_WEIGHTS.get(kind, 0) > KIND_WEIGHTS.get(tally["kind"], 0):
                tally["kind"] = kind
            tally["count"] += count
            tally["said"] += 0 if source == "tool_output" else count
            tally["seqs"].append(seq)
            tally["sources"].add(source)
    artifacts = [Artifact(value, found[value]["kind"], found[value]["count"],
                          min(found[value]["seqs"]), max(found[value]["seqs"]),
                          frozenset(found[value]["sources"]), found[value]["line_tokens"])
                 for value in order]
    return sorted(artifacts, key=lambda a: (
        -KIND_WEIGHTS.get(a.kind, 1) * (a.count + found[a.value]["said"]), a.first_seq))


VALUES = ["E1234", "src/a.py", "ZFA04Y", "v1.2", "x", "é漢"]
MENTIONS = st.tuples(st.sampled_from(VALUES), st.sampled_from([*KIND_WEIGHTS, "other"]),
                     st.sampled_from(SOURCES), st.integers(1, 5))


def _as_stored(mentions: list[tuple[str, str, str, int]], counted: bool
               ) -> list[StoredMention]:
    """A message's mentions as stored: with each value's line count (a stand-in figure,
    one per value), or as stored before line counts were kept (four fields)."""
    if counted:
        return [(*mention, 2 + VALUES.index(mention[0])) for mention in mentions]
    return cast(list[StoredMention], mentions)


@given(st.lists(st.tuples(st.lists(MENTIONS, max_size=5), st.booleans()), max_size=8),
       st.integers(0, 3))
def test_collected_artifacts_match_a_plain_tally_of_the_mentions(
    messages: list[tuple[list[tuple[str, str, str, int]], bool]], step: int,
) -> None:
    per_message = [_as_stored(found, counted) for found, counted in messages]
    mentions = [(10 + index * step, stored) for index, stored in enumerate(per_message)]
    assert collect_artifacts(mentions) == _plain_artifacts(mentions)
    # As the store's JSON text decodes them.
    texts = [json.dumps(stored) for stored in per_message]
    seqs = [seq for seq, _ in mentions]
    decoded = zip(seqs, decode_mention_lists(texts), strict=True)
    assert collect_artifacts(decoded) == _plain_artifacts(mentions)


def test_mention_lists_decode_as_json_loads_does_across_batches() -> None:
    texts = [json.dumps([[f"v{i}", "id", "user", i]] * (i % 3)) for i in range(600)]
    assert list(decode_mention_lists(texts)) == [json.loads(text) for text in texts]
    assert list(decode_mention_lists([])) == []


@given(st.lists(st.builds(Artifact, st.text(), st.sampled_from(list(KIND_WEIGHTS)),
                          st.integers(0, 10**12), st.integers(0, 10**12),
                          st.integers(0, 10**12), st.frozensets(st.sampled_from(SOURCES))),
                max_size=6))
def test_dumped_artifacts_are_the_text_json_dumps_gives(artifacts: list[Artifact]) -> None:
    assert dump_artifacts_json(artifacts) == json.dumps([
        {"value": a.value, "kind": a.kind, "count": a.count, "first_seq": a.first_seq,
         "last_seq": a.last_seq, "sources": sorted(a.sources)} for a in artifacts])


@settings(max_examples=40, deadline=None)
@given(sessions(max_turns=6, allow_huge=False))
def test_extraction_is_deterministic_and_every_value_occurs_in_the_span(
    messages: list[StoredMessage],
) -> None:
    first = extract_identifiers(messages)
    assert extract_identifiers(list(messages)) == first
    assert len({a.value for a in first}) == len(first)
    indexed = [m for m in messages if m.message.role not in INSTRUCTION_ROLES]
    haystack = "\n".join(
        [m.message.text for m in indexed]
        + [f"{c.function.name}\n{c.function.arguments}" for m in indexed
           for c in m.message.tool_calls or ()]
    )
    for artifact in first:
        assert artifact.value in haystack
        assert artifact.count >= 1


def _labelled_ids(session: dict[str, Any]) -> set[str]:
    """The reservation and user ids the session's tool calls name in their arguments."""
    found: set[str] = set()
    for message in session["messages"]:
        for call in message.get("tool_calls") or ():
            arguments = json.loads(call["function"]["arguments"])
            found.update(
                value for key, value in arguments.items()
                if key in ("reservation_id", "user_id") and isinstance(value, str)
            )
    return found


@pytest.mark.corpus
def test_corpus_reservation_and_user_ids_are_all_extracted() -> None:
    skip_without_corpus()
    checked = 0
    for session in load_corpus("dev"):
        # Token counts play no part in extraction: skip counting to keep the test fast.
        stored = [StoredMessage(n, parse_message(m), 0) for n, m in enumerate(session["messages"])]
        values = {a.value for a in extract_identifiers(stored)}
        missing = _labelled_ids(session) - values
        assert not missing, f"{session['session_id']}: {sorted(missing)}"
        checked += len(_labelled_ids(session))
    assert checked > 100
