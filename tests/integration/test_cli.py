"""The `compactor` command line on both databases: import reports and exit codes, listing,
showing, and one-line errors for what an operator can fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import Compactor, compactor_for, read_jsonl, write_jsonl
from worker.settings.errors import EXIT_INVALID_SETTINGS

pytestmark = pytest.mark.integration

SYSTEM = {"role": "system", "content": "You are an airline agent."}
USER = {"role": "user", "content": "Change my flight to 2024-05-20."}
REPLY = {"role": "assistant", "content": "Done: reservation NO6JO3."}


def calling(call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function",
         "function": {"name": "get_reservation", "arguments": '{"id": "NO6JO3"}'}}]}


def result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": '{"status": "ok"}'}


GOOD = {"session_id": "s-good", "source": "test", "messages": [
    SYSTEM, USER, calling("c1"), result("c1"), REPLY]}
ORPHAN = {"session_id": "s-orphan", "messages": [USER, result("ghost"), REPLY]}
DUPLICATE = {"session_id": "s-dup", "messages": [
    USER, calling("a"), result("a"), calling("a"), result("a"), REPLY]}
MIXED = [GOOD, ORPHAN, '{"session_id": "s-cut", "messa', DUPLICATE, "[1, 2]"]


@pytest.fixture
def compactor(database_url: str, tmp_path: Path) -> Compactor:
    return compactor_for(database_url, tmp_path / "data")


@pytest.fixture
def mixed_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "mixed.jsonl", MIXED)


def assert_one_line_error(result: Any, fragment: str) -> None:
    assert result.exit_code == 1
    assert fragment in result.stderr
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def assert_invalid_setting(result: Any, variable: str, fragment: str) -> None:
    """Invalid settings end a command before it runs: one JSON line, exit status 78."""
    assert result.exit_code == EXIT_INVALID_SETTINGS
    [event] = [json.loads(line) for line in result.stderr.splitlines()]
    assert (event["event"], event["variable"]) == ("settings.invalid", variable)
    assert fragment in event["message"]


def test_import_reports_every_line_and_exits_1_when_any_was_rejected(
    compactor: Compactor, mixed_file: Path
) -> None:
    result = compactor("import", str(mixed_file), "--json")

    assert result.exit_code == 1
    *reports, summary = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["line"], r["session_id"], r["status"]) for r in reports] == [
        (1, "s-good", "imported"), (2, "s-orphan", "rejected"), (3, None, "rejected"),
        (4, "s-dup", "repaired"), (5, None, "rejected"),
    ]
    assert reports[1]["problems"] == [{
        "kind": "orphan_tool_result", "index": 1, "action": "reject",
        "detail": "tool result for 'ghost' answers no open tool call (dropped on repair)"}]
    assert reports[2]["problems"][0]["detail"].startswith("line 3: invalid JSON")
    assert reports[4]["problems"][0]["detail"] == "line 5: not a JSON object"
    assert [p["kind"] for p in reports[3]["problems"]] == ["duplicate_tool_call_id"]
    assert reports[0]["messages"] == 5 and reports[0]["tokens"] > 0
    assert summary == {"summary": {"imported": 1, "repaired": 1, "rejected": 3, "exists": 0}}
    assert "3 rejected" in result.stderr


def test_continue_on_error_exits_0_with_the_same_report(
    compactor: Compactor, mixed_file: Path
) -> None:
    result = compactor("import", str(mixed_file), "--continue-on-error")

    assert result.exit_code == 0, result.output
    assert "1 imported, 1 repaired, 3 rejected, 0 exists (of 5 lines)" in result.stdout
    assert "line 2 s-orphan: orphan_tool_result at message 1: tool result for 'ghost'" in (
        result.stdout)
    assert "line 3 : malformed_session: line 3: invalid JSON" in result.stdout
    assert {s["session_id"] for s in compactor.json("sessions")} == {"s-good", "s-dup"}


def test_a_second_import_reports_the_sessions_as_existing(
    compactor: Compactor, tmp_path: Path
) -> None:
    path = write_jsonl(tmp_path / "good.jsonl", [GOOD, DUPLICATE])
    assert compactor("import", str(path)).exit_code == 0

    result = compactor("import", str(path), "--json")

    assert result.exit_code == 0
    assert [json.loads(line)["status"] for line in result.stdout.splitlines()[:2]] == [
        "exists", "exists"]


def test_a_strict_policy_rejects_what_the_default_repairs(
    compactor: Compactor, tmp_path: Path
) -> None:
    path = write_jsonl(tmp_path / "dup.jsonl", [DUPLICATE])

    result = compactor("import", str(path), "--policy", "strict", "--json")

    assert result.exit_code == 1
    assert json.loads(result.stdout.splitlines()[0])["status"] == "rejected"


def test_sessions_json_lists_sizes_tokens_and_breakers(
    compactor: Compactor, mixed_file: Path
) -> None:
    compactor("import", str(mixed_file))

    listed = compactor.json("sessions")

    assert [s["session_id"] for s in listed] == ["s-dup", "s-good"]
    good = listed[1]
    assert good["messages"] == 5 and good["revisions"] == 0
    assert good["total_tokens"] == good["projection_tokens"] > 0
    assert good["breaker_state"] == "closed" and good["metadata"] == {"source": "test"}
    assert [s["session_id"] for s in compactor.json("sessions", "--after", "s-dup")] == [
        "s-good"]


def test_sessions_table_shows_every_session(compactor: Compactor, mixed_file: Path) -> None:
    compactor("import", str(mixed_file))

    result = compactor("sessions")

    assert result.exit_code == 0
    assert "s-good" in result.stdout and "s-dup" in result.stdout and "never" in result.stdout


def test_show_json_gives_the_projection_and_revision_history(
    compactor: Compactor, mixed_file: Path
) -> None:
    compactor("import", str(mixed_file))

    shown = compactor.json("show", "s-dup")

    assert shown["revisions"] == []
    assert shown["session"]["session_id"] == "s-dup"
    assert shown["due"] is None  # a few tokens, never compacted
    assert shown["projection"]["messages"] == [USER, calling("a"), result("a"), calling("a_dup1"),
                                               result("a_dup1"), REPLY]


def test_show_prints_the_projection_as_a_table(compactor: Compactor, mixed_file: Path) -> None:
    compactor("import", str(mixed_file))

    result = compactor("show", "s-good")

    assert result.exit_code == 0
    assert "→ get_reservation" in result.stdout and "[c1]" in result.stdout
    assert "breaker closed, due: no" in result.stdout


def test_an_unknown_session_is_a_one_line_error(compactor: Compactor) -> None:
    assert_one_line_error(compactor("show", "nope"), "unknown session")
    assert_one_line_error(compactor("export", "--session", "nope"), "unknown session")


def test_export_writes_a_file_only_when_complete(
    compactor: Compactor, mixed_file: Path, tmp_path: Path
) -> None:
    compactor("import", str(mixed_file))
    out = tmp_path / "out.jsonl"

    result = compactor("export", "--session", "s-good", "-o", str(out))

    assert result.exit_code == 0
    assert read_jsonl(out) == [GOOD]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_export_never_follows_a_planted_partial_symlink(
    compactor: Compactor, mixed_file: Path, tmp_path: Path
) -> None:
    compactor("import", str(mixed_file))
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    (tmp_path / f".{out.name}.partial").symlink_to(victim)

    result = compactor("export", "--session", "s-good", "-o", str(out))

    assert result.exit_code == 0, result.output
    assert victim.read_text(encoding="utf-8") == "keep me"
    assert read_jsonl(out) == [GOOD] and not out.is_symlink()
    assert oct(out.stat().st_mode & 0o777) == oct(0o600)


def test_export_into_a_missing_directory_is_a_one_line_error_naming_it(
    compactor: Compactor, mixed_file: Path, tmp_path: Path
) -> None:
    compactor("import", str(mixed_file))
    missing = tmp_path / "no" / "such"

    result = compactor("export", "-o", str(missing / "out.jsonl"))

    assert_one_line_error(result, f"no such directory {missing}")
    assert not (tmp_path / "no").exists()


def test_db_current_hides_a_password_holding_slashes_colons_and_escapes(
    migrated_postgres_url: str, tmp_path: Path
) -> None:
    # The test server trusts local connections: any password reaches the database.
    url = migrated_postgres_url.replace("postgres@", "postgres:pa/ss:w%2Frd@", 1)
    compactor = compactor_for(url, tmp_path)

    shown = compactor.json("db", "current")["database"]
    text = compactor("db", "current")

    assert shown == migrated_postgres_url.replace("postgres@", "postgres:***@", 1)
    assert "pa/ss" not in text.output and "w%2Frd" not in text.output
    assert shown in text.stdout


def test_a_password_with_a_raw_at_sign_is_a_one_line_error_without_it(tmp_path: Path) -> None:
    compactor = compactor_for("postgresql://app:pa@ss@127.0.0.1:1/nowhere", tmp_path)

    result = compactor("db", "current")

    assert_invalid_setting(result, "COMPACTOR_DATABASE_URL", "must be percent-encoded (%40)")
    assert "pa@ss" not in result.output and "app:***@127.0.0.1:1/nowhere" in result.stderr


def test_a_database_without_schema_says_to_run_db_upgrade(
    empty_database_url: str, tmp_path: Path
) -> None:
    compactor = compactor_for(empty_database_url, tmp_path / "data")

    assert_one_line_error(compactor("sessions"), "run `compactor db upgrade`")
    behind = compactor("db", "current", "--json")
    assert behind.exit_code == 3 and json.loads(behind.stdout)["up_to_date"] is False

    upgraded = compactor("db", "upgrade")

    assert upgraded.exit_code == 0, upgraded.output
    current = compactor.json("db", "current")
    assert current["up_to_date"] is True and current["current"] == current["head"]
    assert compactor.json("sessions") == []


def test_an_unreachable_database_is_a_one_line_error(tmp_path: Path) -> None:
    compactor = compactor_for("postgresql://postgres@127.0.0.1:1/nowhere", tmp_path)

    assert_one_line_error(compactor("sessions"), "database unreachable")


def test_an_unsupported_database_url_is_a_one_line_error_without_its_password(
    tmp_path: Path,
) -> None:
    result = compactor_for("mysql://user:s3cret@db.example/compactor", tmp_path)("sessions")

    assert_invalid_setting(result, "COMPACTOR_DATABASE_URL",
                           "not a sqlite:/// or postgresql:// URL")
    assert "s3cret" not in result.output and "user:***@" in result.stderr


def test_an_unavailable_tokenizer_is_a_one_line_error(
    compactor: Compactor, mixed_file: Path
) -> None:
    broken = Compactor(compactor.env | {"COMPACTOR_TOKENIZER_ENCODING": "p50k_base"})

    assert_one_line_error(broken("import", str(mixed_file)), "tokenizer unavailable")


def test_the_embedded_database_is_created_on_first_import(
    tmp_path: Path, mixed_file: Path
) -> None:
    compactor = Compactor(
        {"COMPACTOR_DATABASE_URL": "", "COMPACTOR_DATA_DIR": str(tmp_path / "embedded")}
    )

    result = compactor("import", str(mixed_file), "--continue-on-error")

    assert result.exit_code == 0, result.output
    assert (tmp_path / "embedded" / "compactor.db").is_file()
    assert len(compactor.json("sessions")) == 2


def test_bytes_that_are_not_utf8_are_repaired_not_fatal(
    compactor: Compactor, tmp_path: Path
) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"session_id": "s-latin1", "messages": '
                     b'[{"role": "user", "content": "caf\xe9"}]}\n')

    result = compactor("import", str(path), "--json")

    assert result.exit_code == 0
    assert json.loads(result.stdout.splitlines()[0])["status"] == "repaired"
    assert compactor.json("show", "s-latin1")["projection"]["messages"] == [
        {"role": "user", "content": "caf\ufffd"}]
