"""Records past the import limits through `compactor import`, on both databases: each is
rejected alone with its reason (nesting, size, id length, the database's own refusal),
and the good records around it still import. Before the limits, a deep line or content
part aborted the whole import with a RecursionError and a 10 KB id with a database error."""

from __future__ import annotations

import json
import random
import string
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import Compactor, compactor_for, write_jsonl
from worker.broker.contract import MAX_SESSION_ID_CHARS, JobMessage

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "Rebook me on LH 401."},
            {"role": "assistant", "content": "Done: reservation NO6JO3."}]


@pytest.fixture
def compactor(database_url: str, tmp_path: Path) -> Compactor:
    return compactor_for(database_url, tmp_path / "data")


def good(session_id: str) -> dict[str, Any]:
    return {"session_id": session_id, "messages": MESSAGES}


def deep_line(depth: int) -> str:
    """A record whose metadata nests ``depth`` arrays: the parser recursed out at 3,000."""
    return (f'{{"session_id": "deep-line", "messages": {json.dumps(MESSAGES)}, '
            f'"meta": {"[" * depth}{"]" * depth}}}')


def deep_content_part(depth: int) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "text", "text": "the innermost part"}
    for _ in range(depth - 1):
        part = {"type": "nested", "part": part}
    return {"session_id": "deep-part", "messages": [
        {"role": "user", "content": [part]}, MESSAGES[1]]}


def random_id(chars: int) -> str:
    rng = random.Random(7)
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(chars))


def import_lines(compactor: Compactor, path: Path) -> tuple[int, list[dict[str, Any]]]:
    result = compactor("import", str(path), "--json")
    assert "Traceback" not in result.output
    return result.exit_code, [json.loads(line) for line in result.stdout.splitlines()]


def test_records_past_the_limits_are_rejected_alone_and_the_rest_imports(
    compactor: Compactor, tmp_path: Path
) -> None:
    part_record = deep_content_part(250)
    assert 6_000 < len(json.dumps(part_record)) < 8_000  # the 6.6 KB part
    lines: list[Any] = [
        good("s-first"), deep_line(3_000), good("s-second"), part_record,
        good("s-third"), {"session_id": random_id(10_240), "messages": MESSAGES},
        {"session_id": "a" * 10_240, "messages": MESSAGES}, good("s-last"),
    ]

    exit_code, reports = import_lines(compactor, write_jsonl(tmp_path / "in.jsonl", lines))

    assert exit_code == 1
    statuses = [(r["line"], r["status"]) for r in reports[:-1]]
    assert statuses == [(1, "imported"), (2, "rejected"), (3, "imported"), (4, "rejected"),
                        (5, "imported"), (6, "rejected"), (7, "rejected"), (8, "imported")]
    rejected = [r for r in reports[:-1] if r["status"] == "rejected"]
    assert [[p["kind"] for p in r["problems"]] for r in rejected] == [["too_large"]] * 4
    details = [r["problems"][0]["detail"] for r in rejected]
    assert "nested deeper than 64 levels" in details[0]
    assert "nested deeper than 64 levels" in details[1]
    assert details[2] == details[3] == f"session_id is 10,240 characters; at most " \
        f"{MAX_SESSION_ID_CHARS}"
    stored = {s["session_id"] for s in compactor.json("sessions")}
    assert stored == {"s-first", "s-second", "s-third", "s-last"}


def test_the_longest_id_import_takes_is_one_a_job_message_takes(
    compactor: Compactor, tmp_path: Path
) -> None:
    longest, too_long = "x" * MAX_SESSION_ID_CHARS, "y" * (MAX_SESSION_ID_CHARS + 1)
    path = write_jsonl(tmp_path / "ids.jsonl", [good(longest), good(too_long)])

    _, reports = import_lines(compactor, path)

    assert [r["status"] for r in reports[:-1]] == ["imported", "rejected"]
    assert JobMessage(session_id=longest).session_id == longest


def test_a_record_the_database_refuses_is_reported_for_that_record_alone(
    migrated_postgres_url: str, tmp_path: Path
) -> None:
    # PostgreSQL's JSON has no Infinity: Python's parser reads it, the database refuses it.
    compactor = compactor_for(migrated_postgres_url, tmp_path / "data")
    before, refused, after = (f"{tmp_path.name}-{n}" for n in ("before", "refused", "after"))
    lines = [good(before), {**good(refused), "score": float("inf")}, good(after)]

    exit_code, reports = import_lines(compactor, write_jsonl(tmp_path / "in.jsonl", lines))

    assert exit_code == 1
    assert [r["status"] for r in reports[:-1]] == ["imported", "rejected", "imported"]
    [problem] = reports[1]["problems"]
    assert problem["kind"] == "store_refused"
    assert problem["detail"].startswith("the database refused the record: ")
    stored = {s["session_id"] for s in compactor.json("sessions", "--limit", "1000")}
    assert {before, after} <= stored and refused not in stored
