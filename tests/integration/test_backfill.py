"""The backfill on PostgreSQL and SQLite: messages stored before identifiers were
computed at ingest get the index ingest would have given them, once, messages stored
before tool outcomes were classified at ingest their outcomes (a job on them meanwhile
classifies from the text, to the same summary), and Anthropic system prompts stored
before they were counted their count; and the two commands an operator runs,
`compactor db backfill` and `compactor recall`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update

from db import RevisionRecord, Store, encode_outcomes
from db.models import MessageRow, SessionRow
from tests.integration.test_recall import NOW, PLANTED, imported, planted_session
from tests.support.cli import compactor_for
from tests.support.tool_results import tool_record
from tests.support.wire_sessions import system_prompt, text_twins
from tests.unit.session_strategies import shared_counter
from worker.compaction import CallStatus, SessionFormat
from worker.compaction.intake import IntakePolicy
from worker.errors import Outcome
from worker.job import pipeline
from worker.job.values import JobRequest
from worker.platform.backfill import backfill
from worker.platform.ingest import append_messages, check_record, count_messages, import_record
from worker.runtime import build_runtime
from worker.settings.config import Settings

pytestmark = pytest.mark.integration
FORMATS = [session_format.value for session_format in SessionFormat]


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


def import_tool_session(store: Store, session_id: str, session_format: str) -> None:
    report = import_record(tool_record(session_id, session_format, seed=11, turns=30),
                           store=store, counter=shared_counter(), policy=IntakePolicy(),
                           now=NOW)
    assert report.problems == (), report.problems


def unclassify(engine: Engine, session_id: str) -> None:
    """Leave the session's messages as a release before migration 0010 stored them."""
    session_pk = select(SessionRow.id).where(SessionRow.session_id == session_id)
    with engine.begin() as connection:
        connection.execute(update(MessageRow).where(
            MessageRow.session_id == session_pk.scalar_subquery()).values(outcomes=None))


@pytest.mark.parametrize("session_format", FORMATS)
def test_backfill_classifies_the_tool_results_of_messages_stored_before_ingest_did(
    store: Store, engine: Engine, session_format: str,
) -> None:
    for session_id in ("old", "new"):
        import_tool_session(store, session_id, session_format)
    unclassify(engine, "old")
    assert all(m.outcomes is None for m in store.messages("old"))
    assert store.count_unindexed_messages() == len(store.messages("old"))

    report = backfill(store, shared_counter(), batch_messages=7)

    assert (report.sessions, report.messages) == (1, len(store.messages("old")))
    assert store.count_unindexed_messages() == 0
    assert [m.outcomes for m in store.messages("old")] == \
        [m.outcomes for m in store.messages("new")]
    assert [m.identifiers for m in store.messages("old")] == \
        [m.identifiers for m in store.messages("new")]  # left as they were
    assert backfill(store, shared_counter()).messages == 0  # idempotent


def compact(database_url: str, session_ids: list[str]) -> dict[str, RevisionRecord]:
    """Run one extractive job on each session; return the revision each swapped in."""
    settings = Settings(database_url=database_url, summarizer="extractive",
                        model_context_tokens=4_000, tail_budget_tokens=400)
    runtime = build_runtime(settings, use_redis=False)
    try:
        for session_id in session_ids:
            result = pipeline.run(JobRequest(session_id, "test"), runtime.deps, runtime.policy)
            assert result.outcome is Outcome.COMPACTED, result
        return {session_id: runtime.store.revisions(session_id)[0]
                for session_id in session_ids}
    finally:
        runtime.close()


@pytest.mark.parametrize("session_format", FORMATS)
def test_a_job_takes_the_stored_outcomes_and_classifies_unclassified_results_alike(
    database_url: str, store: Store, engine: Engine, session_format: str,
) -> None:
    for session_id in ("new", "old", "tampered"):
        import_tool_session(store, session_id, session_format)
    unclassify(engine, "old")
    # Every stored failure turned into a success: a job that reads the column says so.
    with engine.begin() as connection:
        for message in store.messages("tampered"):
            succeeded = tuple((call_id, CallStatus.SUCCEEDED.value, ())
                              for call_id, _, _ in message.outcomes or ())
            connection.execute(update(MessageRow).where(
                MessageRow.seq == message.seq, MessageRow.session_id == select(
                    SessionRow.id).where(SessionRow.session_id == "tampered")
                .scalar_subquery()).values(outcomes=encode_outcomes(succeeded)))

    revisions = compact(database_url, ["new", "old", "tampered"])

    new, old, tampered = (revisions[key] for key in ("new", "old", "tampered"))
    assert (old.summary, old.block) == (new.summary, new.block)
    assert tampered.summary != new.summary
