"""The data lifecycle on SQLite and PostgreSQL: erasing a session, erasing its newest
message, and collecting superseded revisions and old runs in batches."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from db import (
    SESSION_TABLES,
    GcBatch,
    GcPolicy,
    MessagePinned,
    NewMessage,
    SessionLeased,
    SessionNotFound,
    Store,
)
from tests.integration.test_store import T0, conversation, job_run, message, swap
from tests.support.store_jobs import take_lease

pytestmark = pytest.mark.integration

DAY = timedelta(days=1)
KEEP_ONE = GcPolicy(keep_revisions=1, revision_retention_s=DAY.total_seconds(),
                    run_retention_s=DAY.total_seconds(), batch_size=2)


def compacted_session(store: Store, session_id: str, revisions: int, *,
                      at: list[int] | None = None) -> list[int]:
    """A session of ``2 * revisions + 2`` messages with a chain of ``revisions``
    revisions, the i-th made ``at[i]`` days after T0; return their ids, oldest first."""
    store.import_session(session_id, {}, conversation(2 * revisions + 2), T0)
    days = at or [0] * revisions
    return [swap(store, session_id, 2 * (i + 1), label=f"r{i}", now=T0 + days[i] * DAY)
            for i in range(revisions)]


def test_delete_erases_every_row_of_the_session_and_says_how_many(store: Store) -> None:
    compacted_session(store, "gone", 2)
    compacted_session(store, "kept", 1)
    for session_id in ("gone", "kept"):
        store.append_messages(session_id, [NewMessage(
            {"role": "user", "content": "E3283-SCHEMA again"}, "user", None, 6,
            identifiers=(("E3283-SCHEMA", "error", "user", 1, 6),),
            search_text="E3283-SCHEMA again")], now=T0)
    store.record_run(job_run("gone", "skipped"))
    with store.queue_markers() as markers:
        markers.mark("gone", "job-7", now=T0, marker_ttl_s=60)

    deleted = store.delete_session("gone", now=T0)

    assert deleted.removed == {"runs": 3, "artifacts": 1, "messages": 7, "revisions": 2,
                               "parked_jobs": 0, "sessions": 1}
    assert list(deleted.removed) == [table.name for table in SESSION_TABLES]
    assert (deleted.queued_job_id, deleted.broken_lease_owner) == ("job-7", None)
    with pytest.raises(SessionNotFound):
        store.get_session("gone")
    assert store.runs(session_id="gone") == []
    assert len(store.revisions("kept")) == 1 and len(store.messages("kept")) == 5
    assert [hit.seq for hit in store.recall("kept", "E3283-SCHEMA")] == [5]
    assert [artifact.value for artifact in store.artifacts("kept")] == ["E3283-SCHEMA"]


def test_delete_is_refused_while_a_job_holds_the_lease_unless_forced(store: Store) -> None:
    compacted_session(store, "busy", 1)
    assert take_lease(store, "busy", "worker:task-1", 60, T0)

    with pytest.raises(SessionLeased):
        store.delete_session("busy", now=T0 + timedelta(seconds=30))
    assert store.get_session("busy").head_seq == 4

    deleted = store.delete_session("busy", force=True, now=T0 + timedelta(seconds=30))
    assert deleted.broken_lease_owner == "worker:task-1"
    with pytest.raises(SessionNotFound):
        store.get_session("busy")


def test_an_expired_lease_does_not_block_a_delete(store: Store) -> None:
    compacted_session(store, "stale", 1)
    assert take_lease(store, "stale", "worker:dead", 60, T0)
    assert store.delete_session("stale", now=T0 + timedelta(seconds=61)).removed["sessions"] == 1


def test_delete_of_an_unknown_session_raises_and_removes_nothing(store: Store) -> None:
    compacted_session(store, "kept", 1)
    with pytest.raises(SessionNotFound):
        store.delete_session("never", now=T0)
    assert store.get_session("kept").head_seq == 4


def test_popping_the_newest_message_steps_the_head_and_figures_back(store: Store) -> None:
    store.import_session("s", {}, conversation(4), T0)
    before = store.get_session("s")
    popped = store.pop_message("s", seq=4, now=T0)

    after = store.get_session("s")
    assert popped.seq == 4 and after.head_seq == 3
    assert after.total_tokens == before.total_tokens - popped.tokens
    assert after.projection_tokens == before.projection_tokens - popped.tokens
    assert store.append_messages("s", conversation(1, prefix="n"), now=T0) == [4]


def test_a_message_a_compaction_has_read_or_an_older_one_cannot_be_popped(
    store: Store,
) -> None:
    compacted_session(store, "s", 1)  # the revision's snapshot saw all 4 messages
    with pytest.raises(MessagePinned):
        store.pop_message("s", seq=4, now=T0)
    store.append_messages("s", conversation(1, prefix="n"), now=T0)
    with pytest.raises(MessagePinned):
        store.pop_message("s", seq=4, now=T0)
    assert store.pop_message("s", seq=5, now=T0).body["content"] == "n-system"


def mentioning(text: str, *values: str, source: str = "user") -> NewMessage:
    """A user message naming ``values``, indexed as ingest would index it."""
    return NewMessage({"role": "user", "content": text}, "user", None, len(text),
                      identifiers=tuple((value, "ticket", source, 1, 6) for value in values),
                      search_text=text)


def test_a_popped_message_leaves_recall_and_the_artifact_index_before_its_seq_is_reused(
    store: Store,
) -> None:
    store.import_session("s", {}, [message("system", "sys"),
                                   mentioning("first PAY-1111, KEEP-2222", "PAY-1111",
                                              "KEEP-2222")], T0)
    store.append_messages("s", [mentioning("erase PAY-4242, KEEP-2222", "PAY-4242",
                                           "KEEP-2222", source="tool_output")], now=T0)
    store.pop_message("s", seq=3, now=T0)
    assert store.append_messages("s", [mentioning("now ZZ-1111", "ZZ-1111")], now=T0) == [3]

    assert store.recall("s", "PAY-4242") == []
    assert [(hit.seq, hit.excerpt) for hit in store.recall("s", "ZZ-1111")] == \
        [(3, "now ZZ-1111")]
    artifacts = {a.value: (a.first_seq, a.last_seq, a.count, a.sources)
                 for a in store.artifacts("s")}
    assert artifacts == {"PAY-1111": (2, 2, 1, frozenset({"user"})),
                         "KEEP-2222": (2, 2, 1, frozenset({"user"})),
                         "ZZ-1111": (3, 3, 1, frozenset({"user"}))}


def test_a_message_a_rolled_back_compaction_read_cannot_be_popped(store: Store) -> None:
    compacted_session(store, "s", 1)  # the revision's snapshot saw all 4 messages
    store.rollback("s")

    with pytest.raises(MessagePinned):
        store.pop_message("s", seq=4, now=T0)
    assert store.get_session("s").head_seq == 4


def test_a_pop_waits_until_an_expired_lease_is_released(store: Store) -> None:
    store.import_session("s", {}, conversation(4), T0)
    assert take_lease(store, "s", "worker:stalled", 60, T0)

    with pytest.raises(SessionLeased):  # its job may wake, renew it and swap what it read
        store.pop_message("s", seq=4, now=T0 + timedelta(seconds=61))
    assert store.release_lease("s", "worker:stalled")
    assert store.pop_message("s", seq=4, now=T0 + timedelta(seconds=61)).seq == 4


def test_gc_keeps_the_active_revision_and_n_ancestors_and_removes_older_superseded_ones(
    store: Store,
) -> None:
    ids = compacted_session(store, "s", 4)
    store.rollback("s")  # ids[2] active; ids[3] is rolled back
    batches = store.collect_garbage(KEEP_ONE, T0 + 2 * DAY)

    assert [r.id for r in store.revisions("s")] == [ids[2], ids[1]]
    assert store.revisions("s")[-1].parent_revision_id is None
    assert sum(b.removed for b in batches if b.table == "revisions") == 2
    assert store.get_session("s").active_revision_id == ids[2]
    assert store.projection("s")[1]["content"] == "[r2 through 6]"


def test_gc_keeps_revisions_younger_than_the_retention_and_remaps_their_runs(
    store: Store,
) -> None:
    ids = compacted_session(store, "s", 3, at=[0, 0, 2])
    policy = GcPolicy(keep_revisions=0, revision_retention_s=DAY.total_seconds(),
                      run_retention_s=10 * DAY.total_seconds(), batch_size=10)

    store.collect_garbage(policy, T0 + 2 * DAY)

    assert [r.id for r in store.revisions("s")] == [ids[2]]
    assert [run.revision_id for run in store.runs(session_id="s")] == [ids[2], None, None]


def test_gc_removes_runs_older_than_their_retention_in_batches(store: Store) -> None:
    store.create_session("s", {}, T0)
    for day in range(5):
        store.record_run(job_run("s", at=T0 + day * DAY))
    seen: list[GcBatch] = []

    store.collect_garbage(KEEP_ONE, T0 + 4 * DAY + timedelta(hours=1), on_batch=seen.append)

    assert [(b.table, b.removed) for b in seen] == [("runs", 2), ("runs", 2)]
    assert [run.started_at for run in store.runs(session_id="s")] == [T0 + 4 * DAY]


def test_a_dry_run_counts_what_gc_would_remove_and_writes_nothing(store: Store) -> None:
    compacted_session(store, "s", 3)
    store.record_run(job_run("s", "skipped"))
    batches = store.collect_garbage(KEEP_ONE, T0 + 5 * DAY, dry_run=True)

    assert {table: sum(b.removed for b in batches if b.table == table)
            for table in ("revisions", "runs")} == {"revisions": 1, "runs": 4}
    assert len(store.revisions("s")) == 3 and len(store.runs(session_id="s")) == 4


def test_gc_pages_through_many_sessions_and_compaction_continues_on_the_kept_chain(
    store: Store,
) -> None:
    for index in range(5):
        compacted_session(store, f"s{index}", 3)
    store.collect_garbage(KEEP_ONE, T0 + 2 * DAY)

    assert all(len(store.revisions(f"s{index}")) == 2 for index in range(5))
    store.append_messages("s0", conversation(2, prefix="n"), now=T0 + 3 * DAY)
    newest = swap(store, "s0", 8, label="after-gc", now=T0 + 3 * DAY)
    latest, parent = store.revisions("s0")[:2]
    assert (latest.id, latest.parent_revision_id) == (newest, parent.id)


def test_gc_erases_sessions_idle_past_their_retention_but_not_one_a_job_holds(
    store: Store,
) -> None:
    for session_id in ("idle", "leased"):
        compacted_session(store, session_id, 1)
    store.append_messages("recent", conversation(2), now=T0 + 9 * DAY, create=True)
    assert take_lease(store, "leased", "worker:job-1", 3 * DAY.total_seconds(),
                      T0 + 9 * DAY)
    policy = replace(KEEP_ONE, session_retention_s=7 * DAY.total_seconds())

    counted = store.collect_garbage(policy, T0 + 10 * DAY, dry_run=True)
    batches = store.collect_garbage(policy, T0 + 10 * DAY)

    assert [(b.table, b.removed) for b in counted if b.table == "sessions"] == [("sessions", 1)]
    assert [(b.table, b.removed) for b in batches if b.table == "sessions"] == [("sessions", 1)]
    with pytest.raises(SessionNotFound):
        store.get_session("idle")
    assert store.runs(session_id="idle") == []
    assert {s.session_id for s in store.list_sessions()} == {"leased", "recent"}
