"""The backfill on PostgreSQL and SQLite: messages stored before identifiers were
computed at ingest get the index ingest would have given them, once, and Anthropic
system prompts stored before they were counted their count; and the two commands an
operator runs, `compactor db backfill` and `compactor recall`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from db import Store
from tests.integration.test_recall import NOW, PLANTED, imported, planted_session
from tests.support.cli import compactor_for
from tests.support.wire_sessions import system_prompt, text_twins
from tests.unit.session_strategies import shared_counter
from worker.compaction.intake import IntakePolicy
from worker.platform.backfill import backfill
from worker.platform.ingest import append_messages, check_record, count_messages, import_record

pytestmark = pytest.mark.integration


def import_unindexed(store: Store, session_id: str) -> None:
    """Store a session as a release before migration 0003 did: no identifiers."""
    record = planted_session(session_id)
    _, metadata, checked = check_record(record, IntakePolicy())
    rows = [dataclasses.replace(row, identifiers=None, search_text=None)
            for row in count_messages(checked.messages, shared_counter())]
    store.import_session(session_id, metadata, rows, NOW)


def test_backfill_gives_old_messages_the_index_ingest_would_have(store: Store) -> None:
    import_unindexed(store, "old")
    imported(store, "new")
    assert store.recall("old", PLANTED[0]) == []
    assert store.count_unindexed_messages() > 0

    report = backfill(store, shared_counter(), batch_messages=7)

    assert report.sessions == 1 and report.messages == len(store.messages("old"))
    assert store.count_unindexed_messages() == 0
    assert store.artifacts("old") == store.artifacts("new")
    assert [m.identifiers for m in store.messages("old")] == \
        [m.identifiers for m in store.messages("new")]
    for value in PLANTED:
        assert store.recall("old", value), value
    assert backfill(store, shared_counter()).messages == 0  # idempotent


def test_backfill_widens_the_index_of_a_session_appended_to_after_the_upgrade(
    store: Store,
) -> None:
    import_unindexed(store, "mixed")
    append_messages(store, shared_counter(), IntakePolicy(), "mixed",
                    [{"role": "user", "content": "Still failing with E3283-SCHEMA."}], NOW)
    [late] = [a for a in store.artifacts("mixed") if a.value == "E3283-SCHEMA"]
    assert late.count == 1

    backfill(store, shared_counter())

    [whole] = [a for a in store.artifacts("mixed") if a.value == "E3283-SCHEMA"]
    assert (whole.first_seq, whole.last_seq, whole.count) == (2, late.last_seq, 2)


def test_the_backfill_and_recall_commands(database_url: str, store: Store,
                                          tmp_path: Path) -> None:
    import_unindexed(store, "cli")
    compactor = compactor_for(database_url, tmp_path / "data")

    assert compactor.json("recall", "cli", "E3283-SCHEMA", "--json")["hits"] == []
    assert compactor.json("db", "backfill", "--json") == {
        "sessions": 1, "messages": len(store.messages("cli")), "system_prompts": 0}
    answer = compactor.json("recall", "cli", "e3283-schema", "--json")
    assert [hit["seq"] for hit in answer["hits"]] == [2]
    assert "E3283-SCHEMA" in answer["hits"][0]["excerpt"]
    table = compactor("recall", "cli", "sqlalchemy==8.16.16")
    assert table.exit_code == 0 and "sqlalchemy==8.16.16" in table.stdout
    short = compactor("recall", "cli", "ab")
    assert short.exit_code == 1 and "3 characters" in short.stderr


def test_backfill_counts_an_anthropic_system_prompt_stored_before_it_was_counted(
    store: Store,
) -> None:
    anthropic, chat = text_twins("pre", 11, 6, system_prompt(11, 25))
    for record in (anthropic, chat):
        import_record(record, store=store, counter=shared_counter(), policy=IntakePolicy(),
                      now=NOW)
    twin = store.get_session("pre-chat")
    # As a release before migration 0009 stored it: no count, none in its totals.
    store.set_system_tokens("pre", 0)
    assert store.get_session("pre").projection_tokens < twin.projection_tokens

    assert backfill(store, shared_counter()).system_prompts == 1

    counted = store.get_session("pre")
    assert counted.system_tokens == store.messages("pre-chat")[0].tokens
    assert (counted.total_tokens, counted.projection_tokens, counted.tokens_since_compaction) \
        == (twin.total_tokens, twin.projection_tokens, twin.tokens_since_compaction)
    assert backfill(store, shared_counter()).system_prompts == 0  # idempotent
