"""The real corpus through `compactor import` and `compactor export`: the full view gives
back every session exactly, metadata included, on both databases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from db import upgrade_database
from tests.support.cli import Compactor, compactor_for, read_jsonl, write_jsonl
from tests.support.corpus import corpus_path, load_corpus
from tests.support.databases import sqlite_url

pytestmark = pytest.mark.integration


@pytest.fixture
def compactor(database_url: str, tmp_path: Path) -> Compactor:
    return compactor_for(database_url, tmp_path / "data")


def by_session_id(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(records, key=lambda record: str(record["session_id"]))


def import_and_export(compactor: Compactor, source: Path, out: Path) -> list[dict[str, Any]]:
    imported = compactor("import", str(source), "--json")
    assert imported.exit_code == 0, imported.output
    summary = json.loads(imported.stdout.splitlines()[-1])["summary"]
    assert summary["rejected"] == summary["repaired"] == summary["exists"] == 0
    exported = compactor("export", "--view", "full", "-o", str(out))
    assert exported.exit_code == 0, exported.output
    return list(read_jsonl(out))


@pytest.mark.corpus
def test_the_dev_corpus_round_trips_exactly(compactor: Compactor, tmp_path: Path) -> None:
    expected = by_session_id(load_corpus("dev"))

    exported = import_and_export(compactor, corpus_path("dev"), tmp_path / "out.jsonl")

    assert len(exported) == len(expected) == 190
    for got, want in zip(exported, expected, strict=True):
        assert got == want, got["session_id"]
        assert list(got) == list(want)  # session_id, source, messages: the file's own order


@pytest.mark.corpus
@pytest.mark.slow
def test_the_long_corpus_imports_and_round_trips(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "long.db")  # one database is enough for 6.8 MB of sessions
    upgrade_database(url)
    compactor = compactor_for(url, tmp_path / "data")
    expected = by_session_id(load_corpus("dev_long"))

    exported = import_and_export(compactor, corpus_path("dev_long"), tmp_path / "out.jsonl")

    assert exported == expected
    listed = {s["session_id"]: s for s in compactor.json("sessions", "--limit", "100")}
    longest = max(expected, key=lambda record: len(record["messages"]))
    assert listed[longest["session_id"]]["messages"] == len(longest["messages"])


def test_the_projection_of_an_uncompacted_session_is_its_history(
    compactor: Compactor, tmp_path: Path
) -> None:
    session = {"session_id": "s1", "source": "t", "team": {"id": 7}, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi 👋"}], "name": "mia"}]}
    compactor("import", str(write_jsonl(tmp_path / "in.jsonl", [session])))

    result = compactor("export", "--view", "projection")

    assert result.exit_code == 0
    assert [json.loads(line) for line in result.stdout.splitlines()] == [session]


def test_the_command_line_runs_as_python_dash_m_scheduler(
    compactor: Compactor, tmp_path: Path
) -> None:
    sessions = [{"session_id": f"s{i}", "source": "sub", "messages": [
        {"role": "user", "content": f"question {i}", "x-extra": [i, None, True]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function",
             "function": {"name": "f", "arguments": "{not json"}}]}]} for i in range(3)]
    source = write_jsonl(tmp_path / "in.jsonl", sessions)

    imported = compactor.subprocess("import", str(source))
    exported = compactor.subprocess("export")

    assert imported.returncode == 0, imported.stderr
    assert "3 imported" in imported.stdout
    assert exported.returncode == 0, exported.stderr
    assert [json.loads(line) for line in exported.stdout.splitlines()] == sessions
