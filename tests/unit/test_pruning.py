"""Pre-pruning: tool outputs become one-line digests, nothing else changes."""

from __future__ import annotations

import json
import pickle
import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.chat_rules import find_chat_violations
from tests.unit.session_strategies import sessions, shared_counter, to_stored
from worker.compaction.grouping import Group, GroupKind, group_messages
from worker.compaction.messages import Role, StoredMessage, dump_message
from worker.compaction.pruning import (
    DIGEST_LINE_CHARS,
    digest_tool_output,
    first_meaningful_line,
    prune_groups,
)

USER_DETAILS = json.dumps(
    {"user_id": "mia_li_3668", "name": {"first_name": "Mia", "last_name": "Li"},
     "reservations": [f"R{i:05d}" for i in range(40)]},
    indent=2,
)


def exchange(call_id: str, output: str, name: str = "get_user_details") -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]


def groups_of(*messages: dict[str, Any]) -> list[Group]:
    return group_messages(to_stored(messages, shared_counter()))


def test_a_digest_gives_size_and_first_meaningful_line() -> None:
    digest = digest_tool_output("get_user_details", USER_DETAILS)
    lines = len(USER_DETAILS.splitlines())
    assert digest == (
        f"[tool result digest] get_user_details: {len(USER_DETAILS):,} chars, {lines:,} lines; "
        'first line: "user_id": "mia_li_3668",'
    )


def test_a_digest_groups_thousands_and_cuts_a_long_first_line() -> None:
    output = '{"user_id": "mia_li_3668", ' + '"x": 1, ' * 400 + "}"
    digest = digest_tool_output("get_user_details", output)
    assert digest.startswith(
        f"[tool result digest] get_user_details: {len(output):,} chars, 1 lines; "
        'first line: {"user_id": "mia_li_3668", '
    )
    assert "," in f"{len(output):,}"
    assert digest.endswith(" ...")
    assert len(digest.split("first line: ", 1)[1]) <= DIGEST_LINE_CHARS + len(" ...")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ""),
        ("\n\n  \n", ""),
        ("{\n  [\n\n  \"ok\": true\n", "\"ok\": true"),
        ("],\n---\n   error E42  \nmore", "error E42"),
        ("((( )))", ""),
    ],
)
def test_the_first_meaningful_line_skips_blank_and_punctuation_lines(
    text: str, expected: str
) -> None:
    assert first_meaningful_line(text) == expected


@given(st.text(st.sampled_from(["{", "]", ",", " ", "\t", "\n", "\u00a0", "a", "7", "é", "\r"]),
               max_size=30))
def test_the_first_meaningful_line_is_the_first_not_made_of_noise_alone(text: str) -> None:
    noise = set(string.punctuation + string.whitespace)
    lines = [line.strip() for line in text.splitlines()]
    expected = next((line for line in lines if line and not set(line) <= noise), "")
    assert first_meaningful_line(text, max_chars=100) == expected


def test_an_output_without_a_meaningful_line_says_none() -> None:
    assert digest_tool_output("noop", "{\n}\n").endswith("first line: (none)")


def test_pruning_replaces_only_tool_contents_and_keeps_everything_else() -> None:
    groups = groups_of({"role": "user", "content": "who am I?"}, *exchange("a", USER_DETAILS))
    pruned = prune_groups(groups, audit_mode=False, counter=shared_counter())
    assert pruned[0] is groups[0]
    before, after = groups[1].messages, pruned[1].messages
    assert after[0] is before[0]
    tool_before, tool_after = dump_message(before[1].message), dump_message(after[1].message)
    assert tool_after.pop("content") == digest_tool_output("get_user_details", USER_DETAILS)
    tool_before.pop("content")
    assert tool_after == tool_before
    assert after[1].seq == before[1].seq
    assert after[1].tokens == shared_counter().count_message(after[1].message) < before[1].tokens


def test_a_digest_is_counted_when_its_count_is_asked_and_stands_for_a_stored_message(
) -> None:
    counter = shared_counter().for_job()
    groups = groups_of({"role": "user", "content": "who am I?"}, *exchange("a", USER_DETAILS))
    digest = prune_groups(groups, audit_mode=False, counter=counter)[1].messages[1]
    assert digest.message.text not in counter._counts  # type: ignore[attr-defined]
    stored = StoredMessage(digest.seq, digest.message, counter.count_message(digest.message))
    assert (digest.tokens, digest, hash(digest)) == (stored.tokens, stored, hash(stored))
    assert pickle.loads(pickle.dumps(digest)) == stored


def test_pruning_keeps_the_most_recent_tool_groups_whole() -> None:
    groups = groups_of(*exchange("a", USER_DETAILS), *exchange("b", USER_DETAILS),
                       *exchange("c", USER_DETAILS))
    pruned = prune_groups(groups, audit_mode=False, counter=shared_counter(),
                          keep_recent_tool_groups=2)
    assert pruned[0] is not groups[0]
    assert pruned[1:] == groups[1:]


def test_audit_mode_returns_the_groups_untouched() -> None:
    groups = groups_of(*exchange("a", USER_DETAILS))
    pruned = prune_groups(groups, audit_mode=True, counter=shared_counter())
    assert all(p is g for p, g in zip(pruned, groups, strict=True))


def test_an_output_shorter_than_its_digest_is_kept() -> None:
    groups = groups_of(*exchange("a", "ok"))
    assert prune_groups(groups, audit_mode=False, counter=shared_counter()) == groups


def test_the_tool_name_comes_from_the_call_or_the_message() -> None:
    orphan = {"role": "tool", "tool_call_id": "ghost", "name": "legacy_tool",
              "content": USER_DETAILS}
    groups = groups_of(*exchange("a", USER_DETAILS, name="search_flights"), orphan)
    texts = [g.messages[-1].message.text for g in prune_groups(
        groups, audit_mode=False, counter=shared_counter())]
    assert texts[0].startswith("[tool result digest] search_flights:")
    assert texts[1].startswith("[tool result digest] legacy_tool:")


@settings(max_examples=40, deadline=None)
@given(sessions())
def test_pruned_sessions_keep_their_shape_and_validity(session: list[StoredMessage]) -> None:
    groups = group_messages(session)
    pruned = prune_groups(groups, audit_mode=False, counter=shared_counter())
    assert [(g.kind, g.pending, [m.seq for m in g.messages]) for g in pruned] == [
        (g.kind, g.pending, [m.seq for m in g.messages]) for g in groups
    ]
    assert find_chat_violations([m.message for g in pruned for m in g.messages]) == []
    for old, new in zip(groups, pruned, strict=True):
        for was, now in zip(old.messages, new.messages, strict=True):
            if was.message.role is not Role.TOOL or old.kind is not GroupKind.TOOL_EXCHANGE:
                assert now is was
            if now is not was:
                assert len(now.message.text) < len(was.message.text)
                assert now.tokens == shared_counter().count_message(now.message)
