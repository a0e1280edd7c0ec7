"""Session ids are printable text: intake refuses an id holding a control character at
import, at append and create (the platform's API), and at `compactor trigger`, naming
the character; and what the database or Redis already holds (a legacy session, its
runs, a dead letter) is printed by the command line with every control character
escaped: no ESC, C1 or bidi control reaches the terminal's bytes."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from db import NewMessage, NewRun, Store
from tests.support.cli import REPO_ROOT
from tests.support.databases import open_store, truncate_store_tables
from tests.support.e2e import REDIS_URL, redis_under_prefix, token_counter
from worker.broker.queue_items import ItemRejected
from worker.compaction.intake import IntakePolicy, ProblemKind
from worker.errors import MessagesRejected
from worker.platform.ingest import ImportStatus, import_sessions
from worker.platform.sessions import SessionsAPI
from worker.shared_state.dead_letters import DeadLetters, build_dead_letter
from worker.shared_state.keys import RedisKeys

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
HOSTILE_ID = "abc\x1b]0;pwned\x07\x1b[2J-\x9b31m-\u202egpj.exe"
REFUSAL = "session_id contains control character U+001B at position 3"
# What a terminal would act on: ESC, BEL, C1 CSI (UTF-8 C2 9B), RIGHT-TO-LEFT OVERRIDE.
RAW_CONTROLS = (b"\x1b", b"\x07", "\x9b".encode(), "\u202e".encode())
ESCAPED_ID = "abc\\x1b]0;pwned\\x07\\x1b[2J-\\x9b31m-\\u202egpj.exe"
MESSAGES = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]


@pytest.fixture
def prefix() -> str:
    return f"test-controls-{uuid.uuid4().hex[:10]}:"


@pytest.fixture
def pg_url(migrated_postgres_url: str) -> str:
    """The command-line tests run on PostgreSQL alone: each command is a process."""
    truncate_store_tables(migrated_postgres_url)
    return migrated_postgres_url


@pytest.fixture
def client(prefix: str) -> Iterator[redis.Redis]:
    with redis_under_prefix(prefix) as running:
        yield running


def test_import_rejects_an_id_with_a_control_character_naming_it(store: Store) -> None:
    [report] = import_sessions([{"session_id": HOSTILE_ID, "messages": MESSAGES}],
                               store=store, counter=token_counter(), policy=IntakePolicy(),
                               now=NOW)

    assert report.status is ImportStatus.REJECTED
    assert [(p.kind, p.detail) for p in report.problems] == [
        (ProblemKind.MALFORMED_SESSION, REFUSAL)]
    assert store.list_sessions() == []


@pytest.mark.parametrize("session_id, refusal", [
    (HOSTILE_ID, REFUSAL),
    ("fine\u2066isolated", "session_id contains control character U+2066 at position 4"),
])
def test_append_and_create_reject_an_id_with_a_control_character(
    store: Store, session_id: str, refusal: str
) -> None:
    sessions = SessionsAPI(store, token_counter(), IntakePolicy())

    with pytest.raises(MessagesRejected) as appended:
        sessions.append(session_id, MESSAGES, create=True)
    with pytest.raises(MessagesRejected) as created:
        sessions.create(session_id)

    assert [p.detail for p in appended.value.problems] == [refusal]
    assert [p.detail for p in created.value.problems] == [refusal]
    assert store.list_sessions() == []


def test_trigger_refuses_an_id_with_a_control_character_and_enqueues_nothing(
    pg_url: str, tmp_path: Path, prefix: str, client: redis.Redis,
) -> None:
    done = compactor_process(pg_url, prefix, tmp_path, "trigger", "ok-id", HOSTILE_ID)

    assert done.returncode == 2
    assert REFUSAL.encode() in done.stderr
    assert_no_raw_control(done)
    assert list(client.scan_iter(match=f"{prefix}*")) == []


def test_stored_control_characters_are_printed_escaped_by_every_command(
    pg_url: str, client: redis.Redis, prefix: str, tmp_path: Path,
) -> None:
    with open_store(pg_url) as store:  # rows from before intake refused such ids
        write_legacy_rows(store)
    letter = build_dead_letter(f"item for {HOSTILE_ID}".encode(), "compaction\x1b[7m",
                               ItemRejected("not_an_envelope", f"about {HOSTILE_ID}"), NOW)
    DeadLetters(client, RedisKeys(prefix), max_items=10).add(letter)

    commands = [["sessions"], ["show", HOSTILE_ID], ["runs"], ["breaker", "status", HOSTILE_ID],
                ["dead", "list"], ["dead", "show", letter.entry_id], ["runs", "--json"],
                ["projection", "unknown\x1b[2J"]]
    done = [compactor_process(pg_url, prefix, tmp_path, *args) for args in commands]

    assert [d.returncode for d in done] == [0, 0, 0, 0, 0, 0, 0, 1]
    for result in done:
        assert_no_raw_control(result)
    for result in done[:6]:
        assert ESCAPED_ID.encode() in result.stdout.replace(b"\n", b""), result.args
    assert b"\\u001b" in done[6].stdout
    assert b"unknown\\x1b[2J" in done[7].stderr


def write_legacy_rows(store: Store) -> None:
    store.import_session(HOSTILE_ID, {}, [NewMessage(body=m, role=m["role"], tool_call_id=None,
                                                     tokens=5) for m in MESSAGES], NOW)
    store.record_run(NewRun(HOSTILE_ID, "task\x1b[1m", 1, "nightly\x1b[5m", "failed",
                            "Boom\x9b", "bad \u202e news", {}, None, NOW, NOW))


def compactor_process(database_url: str, prefix: str, tmp_path: Path,
                      *args: str) -> subprocess.CompletedProcess[bytes]:
    """`compactor ARGS` as a process, its output kept as the raw bytes a terminal gets."""
    env = {"COMPACTOR_DATABASE_URL": database_url, "COMPACTOR_REDIS_URL": REDIS_URL,
           "COMPACTOR_REDIS_KEY_PREFIX": prefix, "COMPACTOR_DATA_DIR": str(tmp_path),
           "COMPACTOR_LOG_FORMAT": "json", "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "scheduler", *args], env=os.environ | env,
                          cwd=REPO_ROOT, capture_output=True, timeout=120, check=False)


def assert_no_raw_control(done: subprocess.CompletedProcess[bytes]) -> None:
    for control in RAW_CONTROLS:
        assert control not in done.stdout + done.stderr, (done.args, control)
