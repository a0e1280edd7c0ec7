"""Intake: one case per problem kind (reason and action per policy), round trip, appends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.compaction.intake import (
    MISSING_RESULT_CONTENT,
    Action,
    IntakePolicy,
    IntakeResult,
    ProblemKind,
    check_session,
    find_open_tool_calls,
)
from worker.compaction.limits import MAX_MESSAGES
from worker.compaction.messages import Role, dump_message, parse_message

DEFAULT = IntakePolicy()
STRICT = IntakePolicy.strict()
LENIENT = IntakePolicy.lenient()


def call(call_id: str, name: str = "lookup", arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def calling(*call_ids: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [call(i) for i in call_ids]}


def result(call_id: str, content: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def missing(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": MISSING_RESULT_CONTENT}


SYSTEM = {"role": "system", "content": "You are an airline agent."}
USER = {"role": "user", "content": "Change my flight."}
REPLY = {"role": "assistant", "content": "Done."}


def deep_part(depth: int) -> dict[str, Any]:
    """A content part nested ``depth`` levels, built without recursion."""
    part: dict[str, Any] = {"type": "text", "text": "inside"}
    for _ in range(depth):
        part = {"type": "nested", "part": part}
    return part


def bodies(outcome: IntakeResult) -> list[dict[str, Any]]:
    return [dump_message(message) for message in outcome.messages]


@dataclass(frozen=True)
class Case:
    name: str
    raw: list[Any]
    policy: IntakePolicy
    kind: ProblemKind
    action: Action
    index: int | None
    detail: str  # a fragment the reported detail must contain
    expected: list[dict[str, Any]] | None  # the stored messages; None when rejected


CASES = [
    Case("message that is not an object", [USER, "hello"], LENIENT,
         ProblemKind.MALFORMED_MESSAGE, Action.REJECT, 1, "not an object (str)", None),
    Case("tool_calls that is not a list", [USER, {"role": "assistant", "tool_calls": "x"}],
         LENIENT, ProblemKind.MALFORMED_MESSAGE, Action.REJECT, 1, "tool_calls", None),
    Case("message without a role", [USER, {"content": "hi"}], LENIENT,
         ProblemKind.MALFORMED_MESSAGE, Action.REJECT, 1, "role missing", None),
    Case("unknown role", [USER, {"role": "critic", "content": "meh"}], LENIENT,
         ProblemKind.UNKNOWN_ROLE, Action.REJECT, 1, "'critic'", None),
    Case("legacy function_call converted",
         [USER, {"role": "assistant", "content": None,
                 "function_call": {"name": "lookup", "arguments": "{}"}},
          {"role": "function", "name": "lookup", "content": "ok"}, REPLY],
         DEFAULT, ProblemKind.LEGACY_FUNCTION_CALL, Action.REPAIR, 1, "'legacy_1'",  # and 2
         [USER, {"role": "assistant", "content": None, "tool_calls": [call("legacy_1")]},
          {"role": "tool", "name": "lookup", "tool_call_id": "legacy_1", "content": "ok"},
          REPLY]),
    Case("legacy function_call under a strict policy",
         [USER, {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}}],
         STRICT, ProblemKind.LEGACY_FUNCTION_CALL, Action.REJECT, 1, "converted", None),
    Case("function message that answers nothing", [USER, {"role": "function",
         "name": "f", "content": "ok"}], LENIENT, ProblemKind.LEGACY_FUNCTION_CALL,
         Action.REJECT, 1, "answers no open function_call", None),
    Case("orphan tool result rejected by default", [USER, result("ghost"), REPLY], DEFAULT,
         ProblemKind.ORPHAN_TOOL_RESULT, Action.REJECT, 1, "'ghost'", None),
    Case("orphan tool result dropped on repair", [USER, result("ghost"), REPLY], LENIENT,
         ProblemKind.ORPHAN_TOOL_RESULT, Action.REPAIR, 1, "dropped", [USER, REPLY]),
    Case("missing tool result inside the session", [USER, calling("a", "b"), result("a"),
         USER], DEFAULT, ProblemKind.MISSING_TOOL_RESULT, Action.REPAIR, 1, "'b'",
         [USER, calling("a", "b"), result("a"), missing("b"), USER]),
    Case("missing tool result under a strict policy", [USER, calling("a"), REPLY], STRICT,
         ProblemKind.MISSING_TOOL_RESULT, Action.REJECT, 1, "'a'", None),
    Case("tool call id reused by a later group",
         [USER, calling("a"), result("a"), calling("a"), result("a"), REPLY], DEFAULT,
         ProblemKind.DUPLICATE_TOOL_CALL_ID, Action.REPAIR, 3, "renamed 'a_dup1'",
         [USER, calling("a"), result("a"), calling("a_dup1"), result("a_dup1"), REPLY]),
    Case("tool call id reused under a strict policy",
         [USER, calling("a"), result("a"), calling("a"), result("a")], STRICT,
         ProblemKind.DUPLICATE_TOOL_CALL_ID, Action.REJECT, 3, "already used", None),
    Case("NUL byte and lone surrogate",
         [USER, {"role": "assistant", "content": "a\x00b\ud800c", "x\x00": ["\udfff"]}],
         DEFAULT, ProblemKind.INVALID_TEXT, Action.REPAIR, 1, "NUL",
         [USER, {"role": "assistant", "content": "ab\ufffdc", "x": ["\ufffd"]}]),
    Case("invalid text under a strict policy", [{"role": "user", "content": "\x00"}], STRICT,
         ProblemKind.INVALID_TEXT, Action.REJECT, 0, "surrogate", None),
    Case("empty session", [], LENIENT, ProblemKind.EMPTY_SESSION, Action.REJECT, None,
         "no messages", None),
    Case("content part nested past the limit", [USER, {"role": "user", "content": [
         deep_part(5_000)]}], LENIENT, ProblemKind.TOO_LARGE, Action.REJECT, 1,
         "nested deeper than 64 levels", None),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_each_problem_kind_is_reported_with_its_action(case: Case) -> None:
    outcome = check_session(case.raw, case.policy)

    assert {(p.kind, p.action) for p in outcome.problems} == {(case.kind, case.action)}
    assert outcome.problems[0].index == case.index
    assert case.detail in outcome.problems[0].detail
    assert outcome.rejected is (case.expected is None)
    assert bodies(outcome) == (case.expected or [])


def test_a_session_that_repair_empties_is_rejected() -> None:
    outcome = check_session([result("ghost")], LENIENT)

    assert [(p.kind, p.action) for p in outcome.problems] == [
        (ProblemKind.ORPHAN_TOOL_RESULT, Action.REPAIR),
        (ProblemKind.EMPTY_SESSION, Action.REJECT)]
    assert outcome.problems[-1].detail == "no message is left after repair"
    assert outcome.rejected and outcome.messages == ()


def test_every_problem_kind_has_a_case() -> None:
    # The record's own kinds are reported by ingest (tests/integration/test_import_limits.py).
    # A format mismatch is reported by the formats' intake (tests/unit/test_wire_intake.py).
    record_kinds = {ProblemKind.MALFORMED_SESSION, ProblemKind.STORE_REFUSED,
                    ProblemKind.FORMAT_MISMATCH}
    assert {case.kind for case in CASES} == set(ProblemKind) - record_kinds


def test_a_valid_session_passes_untouched() -> None:
    raw = [SYSTEM, USER, calling("c1", "c2"), result("c2"), result("c1"), REPLY,
           {"role": "user", "content": [{"type": "text", "text": "thanks"}], "name": "mia"}]

    outcome = check_session(raw, STRICT)

    assert outcome.problems == ()
    assert not outcome.rejected and not outcome.repaired
    assert bodies(outcome) == raw


def test_unknown_fields_are_preserved_at_every_level() -> None:
    tool_call = call("c1") | {"index": 0}
    tool_call["function"] = tool_call["function"] | {"strict": True}
    raw = [USER | {"metadata": {"ts": 1}},
           {"role": "assistant", "content": None, "tool_calls": [tool_call],
            "reasoning_content": "thinking", "refusal": None},
           result("c1") | {"name": "lookup", "is_error": False}]

    assert bodies(check_session(raw, STRICT)) == raw


def test_invalid_json_arguments_are_kept_verbatim() -> None:
    arguments = '{"user_id": "mia_li_3668", '
    raw = [USER, {"role": "assistant", "tool_calls": [call("c1", arguments=arguments)]},
           result("c1")]

    outcome = check_session(raw, STRICT)

    assert outcome.problems == ()
    assert outcome.messages[1].tool_calls is not None
    assert outcome.messages[1].tool_calls[0].function.arguments == arguments


def test_an_open_call_at_the_very_end_is_an_agent_still_waiting() -> None:
    outcome = check_session([USER, calling("a", "b"), result("b")], STRICT)

    assert outcome.problems == ()
    assert find_open_tool_calls(outcome.messages) == ("a",)


def test_parallel_calls_sharing_an_id_are_paired_in_order() -> None:
    outcome = check_session([USER, calling("a", "a"), result("a", "1"), result("a", "2")], DEFAULT)

    assert [p.kind for p in outcome.problems] == [ProblemKind.DUPLICATE_TOOL_CALL_ID]
    assert bodies(outcome)[1:] == [calling("a", "a_dup1"), result("a", "1"), result("a_dup1", "2")]


def test_legacy_results_pair_with_the_call_of_the_same_name() -> None:
    raw = [USER, {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
           {"role": "function", "name": "g", "content": "wrong"}]

    outcome = check_session(raw, LENIENT)

    assert outcome.rejected
    assert outcome.problems[-1].detail == "function message answers no open function_call"


def test_an_append_may_answer_the_stored_open_calls() -> None:
    outcome = check_session([result("a"), REPLY], STRICT, open_tool_call_ids=("a",),
                            seen_tool_call_ids={"a", "z"}, is_append=True)

    assert outcome.problems == ()
    assert bodies(outcome) == [result("a"), REPLY]


def test_an_append_that_skips_the_stored_open_calls_gets_their_results_first() -> None:
    outcome = check_session([USER], DEFAULT, open_tool_call_ids=("a", "b"),
                            seen_tool_call_ids={"a", "b"}, is_append=True)

    assert [(p.kind, p.index) for p in outcome.problems] == [
        (ProblemKind.MISSING_TOOL_RESULT, 0), (ProblemKind.MISSING_TOOL_RESULT, 0)
    ]
    assert bodies(outcome) == [missing("a"), missing("b"), USER]


def test_an_append_renames_ids_the_stored_session_already_used() -> None:
    outcome = check_session([calling("a"), result("a")], DEFAULT,
                            seen_tool_call_ids={"a", "a_dup1"}, is_append=True)

    assert bodies(outcome) == [calling("a_dup2"), result("a_dup2")]


def test_an_empty_append_is_no_problem() -> None:
    outcome = check_session([], STRICT, is_append=True)

    assert outcome == IntakeResult(messages=(), problems=(), rejected=False)


def test_find_open_tool_calls_sees_only_the_last_group() -> None:
    messages = [parse_message(m) for m in [USER, calling("a"), REPLY, calling("b", "c"),
                                           result("c")]]

    assert find_open_tool_calls(messages) == ("b",)
    assert find_open_tool_calls(messages[:3]) == ()


def test_a_policy_cannot_repair_what_has_no_repair() -> None:
    assert LENIENT.action_for(ProblemKind.UNKNOWN_ROLE) is Action.REJECT
    assert DEFAULT.action_for(ProblemKind.ORPHAN_TOOL_RESULT) is Action.REJECT
    assert DEFAULT.action_for(ProblemKind.DUPLICATE_TOOL_CALL_ID) is Action.REPAIR


# --- property: whatever comes in, what intake accepts is a well-formed session --------

_IDS = st.sampled_from(["a", "b", "a_dup1"])
_TEXT = st.sampled_from(["x", "\x00", "\ud800", "é"])
_RAW_MESSAGE = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, _TEXT),
    st.builds(lambda t: {"role": "assistant", "content": t}, _TEXT),
    st.builds(lambda ids: calling(*ids), st.lists(_IDS, min_size=1, max_size=3)),
    st.builds(result, _IDS),
    st.just({"role": "assistant", "function_call": {"name": "f", "arguments": "{"}}),
    st.just({"role": "function", "name": "f", "content": "r"}),
    st.just({"role": "critic"}),
    st.just(42),
)


def assert_well_formed(outcome: IntakeResult) -> None:
    """Ids unique, every result answers its group's call, groups closed before moving on."""
    used: set[str] = set()
    open_ids: set[str] = set()
    for message in outcome.messages:
        body = repr(dump_message(message))
        assert "\\x00" not in body and "\\ud" not in body
        if message.role is Role.TOOL:
            assert message.tool_call_id in open_ids
            open_ids.discard(message.tool_call_id)
            continue
        assert not open_ids
        assert used.isdisjoint(message.tool_call_ids)
        assert len(set(message.tool_call_ids)) == len(message.tool_call_ids)
        used.update(message.tool_call_ids)
        open_ids = set(message.tool_call_ids)


@settings(max_examples=200, deadline=None)
@given(st.lists(_RAW_MESSAGE, max_size=12))
def test_whatever_intake_accepts_is_well_formed(raw: list[Any]) -> None:
    outcome = check_session(raw, LENIENT)

    if outcome.rejected:
        assert outcome.messages == ()
        assert any(p.action is Action.REJECT for p in outcome.problems)
    else:
        assert_well_formed(outcome)
        assert all(p.action is Action.REPAIR for p in outcome.problems)


@settings(max_examples=100, deadline=None)
@given(st.lists(_RAW_MESSAGE, max_size=12))
def test_a_repaired_session_passes_a_second_check_untouched(raw: list[Any]) -> None:
    first = check_session(raw, LENIENT)
    repaired = [dump_message(message) for message in first.messages]

    second = check_session(repaired, STRICT, is_append=True)

    assert second.problems == ()
    assert bodies(second) == repaired


def test_a_message_nested_up_to_the_limit_is_taken() -> None:
    outcome = check_session([{"role": "user", "content": [deep_part(60)]}], STRICT)

    assert not outcome.rejected and outcome.problems == ()


def test_more_messages_than_the_limit_are_rejected_without_checking_each() -> None:
    outcome = check_session([None] * (MAX_MESSAGES + 1), DEFAULT)

    assert outcome.rejected
    assert [(p.kind, p.index) for p in outcome.problems] == [(ProblemKind.TOO_LARGE, None)]
