"""`compactor append`, `compactor projection` and `compactor import -` on both databases:
a platform's shell script appends turns, answers a call left open, reads what to send."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import Compactor, compactor_for
from tests.support.wire_sessions import anthropic_record, responses_items, responses_record

pytestmark = pytest.mark.integration

SYSTEM = {"role": "system", "content": "You are an airline agent."}
USER = {"role": "user", "content": "Change my flight to 2024-05-20."}
REPLY = {"role": "assistant", "content": "Done: reservation NO6JO3."}
CALLING = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{}"}}]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": '{"status": "ok"}'}


@pytest.fixture
def compactor(database_url: str, tmp_path: Path) -> Compactor:
    return compactor_for(database_url, tmp_path / "data")


def jsonl(*messages: Any) -> str:
    return "".join(json.dumps(m) + "\n" for m in messages)


def test_append_from_stdin_then_from_a_json_array_file_answers_the_open_call(
    compactor: Compactor, tmp_path: Path
) -> None:
    first = compactor.run_with_input(jsonl(SYSTEM, USER, CALLING), "append", "chat", "-",
                                     "--create", "--json")
    array = tmp_path / "turn.json"
    array.write_text(json.dumps([RESULT, REPLY]), encoding="utf-8")
    second = compactor("append", "chat", str(array), "--json")

    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    assert json.loads(first.stdout) == {"session_id": "chat", "status": "appended",
                                        "seqs": [1, 2, 3], "problems": []}
    assert json.loads(second.stdout)["seqs"] == [4, 5]
    assert compactor.json("projection", "chat") == {
        "session_id": "chat", "messages": [SYSTEM, USER, CALLING, RESULT, REPLY]}


def test_a_second_answer_to_the_same_call_is_rejected_and_stores_nothing(
    compactor: Compactor,
) -> None:
    compactor.run_with_input(jsonl(USER, CALLING, RESULT), "append", "chat", "-", "--create")

    result = compactor.run_with_input(jsonl(RESULT), "append", "chat", "-")

    assert result.exit_code == 1
    assert "orphan_tool_result at message 0 (reject)" in result.stderr
    assert len(compactor.json("projection", "chat")["messages"]) == 3


def test_append_reports_repairs_in_text(compactor: Compactor) -> None:
    compactor.run_with_input(jsonl(USER, CALLING), "append", "chat", "-", "--create")

    result = compactor.run_with_input(jsonl(USER), "append", "chat", "-")

    assert result.exit_code == 0, result.output
    assert "chat: repaired 2 messages (seq 3-4)" in result.stdout
    assert "missing_tool_result at message 0 (repair)" in result.stdout


def test_append_to_an_unknown_session_or_of_invalid_json_is_a_one_line_error(
    compactor: Compactor,
) -> None:
    unknown = compactor.run_with_input(jsonl(USER), "append", "nobody", "-")
    invalid = compactor.run_with_input('{"role": "user"\n', "append", "chat", "-", "--create")

    assert unknown.exit_code == 1 and "unknown session" in unknown.stderr
    assert invalid.exit_code == 1 and "line 1: invalid JSON" in invalid.stderr
    assert compactor.json("sessions") == []


def test_projection_prints_a_table_of_what_a_model_is_sent(compactor: Compactor) -> None:
    compactor.run_with_input(jsonl(SYSTEM, USER), "append", "chat", "-", "--create")

    result = compactor("projection", "chat")

    assert result.exit_code == 0
    assert "projection (what a model is sent)" in result.stdout
    assert "Change my flight" in result.stdout


def test_import_reads_sessions_from_stdin(compactor: Compactor) -> None:
    record = {"session_id": "piped", "messages": [SYSTEM, USER, REPLY]}

    result = compactor.run_with_input(json.dumps(record) + "\n", "import", "-", "--json")

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.splitlines()[0])["status"] == "imported"
    assert compactor.json("projection", "piped") == record


def test_import_of_a_missing_file_is_a_one_line_error(compactor: Compactor) -> None:
    result = compactor("import", "/nonexistent/sessions.jsonl")

    assert result.exit_code == 1
    assert "cannot read /nonexistent/sessions.jsonl" in result.stderr


def test_append_creates_a_responses_session_and_refuses_chat_messages_to_it(
    compactor: Compactor,
) -> None:
    items = responses_items(3, 2)

    created = compactor.run_with_input(jsonl(*items[:5]), "append", "r", "-", "--create",
                                       "--format", "responses", "--json")
    chat = compactor.run_with_input(jsonl(RESULT), "append", "r", "-")
    rest = compactor.run_with_input(jsonl(*items[5:]), "append", "r", "-")
    table = compactor("projection", "r")

    assert created.exit_code == 0 and rest.exit_code == 0, created.output + rest.output
    assert chat.exit_code == 1 and "format_mismatch" in chat.stderr
    assert compactor.json("projection", "r") == {"session_id": "r", "format": "responses",
                                                 "items": items}
    assert "function_call_output" in table.stdout


@pytest.mark.parametrize("seed", [3, 17])
def test_projection_json_of_an_uncompacted_session_is_the_record_imported_in_its_format(
    compactor: Compactor, seed: int,
) -> None:
    records = [{"session_id": "c", "agent": "airline", "messages": [SYSTEM, USER, REPLY]},
               responses_record("r", seed, 2), anthropic_record("a", seed, 2)]
    imported = compactor.run_with_input(jsonl(*records), "import", "-")

    assert imported.exit_code == 0, imported.output
    for record in records:
        assert compactor.json("projection", record["session_id"]) == record
        assert compactor.json("show", record["session_id"])["projection"] == record
