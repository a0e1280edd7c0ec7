"""The store's contract, run against SQLite and PostgreSQL alike (``store`` fixture):
append, snapshot, projection, swap and rollback (leases and runs: test_store_leases_and_runs)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from db import (
    NewMessage,
    NewRevision,
    NewRun,
    RevisionConflict,
    RevisionNotFound,
    SessionExists,
    SessionNotFound,
    SessionState,
    Store,
    StoreError,
)
from tests.support.store_jobs import SWAPPER, read_snapshot, swap_in, take_lease

pytestmark = pytest.mark.integration

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def message(role: str, text: str, *, tokens: int | None = None, **extra: Any) -> NewMessage:
    body: dict[str, Any] = {"role": role, "content": text, **extra}
    return NewMessage(body=body, role=role, tool_call_id=extra.get("tool_call_id"),
                      tokens=len(text) if tokens is None else tokens)


def conversation(count: int, *, prefix: str = "m") -> list[NewMessage]:
    """A system prompt followed by alternating user/assistant turns (``count`` in all)."""
    turns = [message("system", f"{prefix}-system")]
    turns += [message("user" if i % 2 else "assistant", f"{prefix}-{i}") for i in range(1, count)]
    return turns


def summary_revision(through_seq: int, snapshot_head_seq: int, *, block_tokens: int = 7,
                     label: str = "summary") -> NewRevision:
    block = {"role": "user", "content": f"[{label} through {through_seq}]"}
    return NewRevision(
        through_seq=through_seq, snapshot_head_seq=snapshot_head_seq, summary={"goal": label},
        block=block, block_tokens=block_tokens, artifacts_json='[{"kind": "path", "value": "/a"}]',
        summary_tokens=block_tokens, span_tokens=100, projection_tokens_before=200,
        model="test-model", prompt_version="v1", summarizer="extractive",
    )


def job_run(session_id: str, outcome: str = "compacted", *, at: datetime = T0,
            revision_id: int | None = None) -> NewRun:
    return NewRun(
        session_id=session_id, task_id="task-1", attempt=1, reason="nightly", outcome=outcome,
        failure_class=None, failure_message=None, figures={"tokens_before": 200},
        revision_id=revision_id, started_at=at, finished_at=at + timedelta(seconds=2),
    )


def swap(store: Store, session_id: str, through_seq: int, *, label: str = "summary",
         lease_owner: str | None = None, now: datetime = T0) -> int:
    """Swap in a summary through ``through_seq`` on top of the current snapshot."""
    snapshot = read_snapshot(store, session_id)
    return swap_in(
        store, session_id, expected_revision_id=snapshot.session.active_revision_id,
        owner=lease_owner, now=now, run=job_run(session_id, at=now),
        revision=summary_revision(through_seq, snapshot.session.head_seq, label=label),
    )


def test_appended_messages_round_trip_exactly_with_contiguous_seqs(store: Store) -> None:
    odd = {"role": "tool", "tool_call_id": "call_1", "content": "nul\u0000 é 漢字 \U0001f600",
           "zeta": [1, 2.5, None, True, {"b": 1, "a": 2}], "alpha": 1e20}
    sent = [message("system", "sys"), message("user", "hi", name="u"),
            NewMessage(body=odd, role="tool", tool_call_id="call_1", tokens=9)]
    store.create_session("s1", {"tenant": "t"}, T0)
    assert store.append_messages("s1", sent[:2], now=T0) == [1, 2]
    assert store.append_messages("s1", sent[2:], now=T0) == [3]

    history = store.messages("s1")
    assert [record.seq for record in history] == [1, 2, 3]
    # Key order and value types survive too: the export is byte-identical JSON.
    assert [json.dumps(r.body) for r in history] == [json.dumps(m.body) for m in sent]
    assert history[2].tool_call_id == "call_1" and history[2].tokens == 9
    assert [r.seq for r in store.messages("s1", after_seq=1)] == [2, 3]


def test_appends_keep_the_session_counters(store: Store) -> None:
    state = store.create_session("s1", {"k": "v"}, T0)
    assert (state.head_seq, state.total_tokens, state.last_appended_at) == (0, 0, None)
    later = T0 + timedelta(minutes=5)
    store.append_messages("s1", [message("user", "x", tokens=10), message("assistant", "y",
                                 tokens=5)], now=later)

    state = store.get_session("s1")
    assert state.head_seq == 2
    assert state.total_tokens == state.projection_tokens == state.tokens_since_compaction == 15
    assert state.last_appended_at == later and state.last_appended_at.tzinfo is not None
    assert state.created_at == T0 and state.metadata == {"k": "v"}
    assert state.breaker_state == "closed" and state.active_revision_id is None


def test_unknown_and_duplicate_sessions_are_refused(store: Store) -> None:
    with pytest.raises(SessionNotFound):
        store.append_messages("nope", [message("user", "x")], now=T0)
    with pytest.raises(SessionNotFound):
        store.get_session("nope")
    store.create_session("s1", {}, T0)
    with pytest.raises(SessionExists):
        store.create_session("s1", {}, T0)
    with pytest.raises(SessionExists):
        store.import_session("s1", {}, conversation(3), T0)
    assert store.messages("s1") == []


def test_append_with_create_makes_the_session_once(store: Store) -> None:
    assert store.append_messages("s1", [message("user", "a")], now=T0, create=True,
                                 metadata={"first": True}) == [1]
    assert store.append_messages("s1", [message("user", "b")], now=T0, create=True,
                                 metadata={"second": True}) == [2]
    assert store.get_session("s1").metadata == {"first": True}


def test_import_creates_the_session_with_its_history(store: Store) -> None:
    state = store.import_session("s1", {"source": "test"}, conversation(5), T0)
    assert state.head_seq == 5 and state.metadata == {"source": "test"}
    assert [r.body for r in store.messages("s1")] == [m.body for m in conversation(5)]


def test_snapshot_without_a_revision_holds_every_message(store: Store) -> None:
    store.import_session("s1", {}, conversation(6), T0)
    snapshot = read_snapshot(store, "s1")
    assert snapshot.revision is None
    assert [m.seq for m in snapshot.messages] == [1, 2, 3, 4, 5, 6]
    assert store.projection("s1") == [m.body for m in conversation(6)]


def test_snapshot_and_projection_keep_instructions_insert_the_block_and_keep_the_tail(
    store: Store,
) -> None:
    sent = [message("system", "sys"), message("user", "u2"), message("developer", "dev3"),
            message("assistant", "a4"), message("user", "u5"), message("system", "sys6"),
            message("assistant", "a7")]
    store.import_session("s1", {}, sent, T0)
    revision_id = swap(store, "s1", through_seq=4)

    snapshot = read_snapshot(store, "s1")
    assert snapshot.revision is not None and snapshot.revision.id == revision_id
    assert [m.seq for m in snapshot.messages] == [1, 3, 5, 6, 7]
    block = snapshot.revision.block
    bodies = [m.body for m in sent]
    assert store.projection("s1") == [bodies[0], bodies[2], block, bodies[4], bodies[5],
                                      bodies[6]]
    # The full history is still there: compaction deletes nothing.
    assert [r.body for r in store.messages("s1")] == bodies


def test_swap_recomputes_the_token_figures_in_sql(store: Store) -> None:
    sent = [message("system", "s", tokens=11), message("user", "u", tokens=100),
            message("assistant", "a", tokens=200), message("user", "u", tokens=40)]
    store.import_session("s1", {}, sent, T0)
    snapshot = read_snapshot(store, "s1")
    store.append_messages("s1", [message("assistant", "late", tokens=3)], now=T0)
    revision_id = swap_in(
        store, "s1", expected_revision_id=None, now=T0, run=job_run("s1"),
        revision=summary_revision(3, snapshot.session.head_seq, block_tokens=20),
    )

    state = store.get_session("s1")
    assert state.projection_tokens == 11 + 20 + 40 + 3
    assert state.tokens_since_compaction == 3  # only what the snapshot did not see
    assert state.total_tokens == 354 and state.last_compacted_at == T0
    [revision] = store.revisions("s1")
    assert revision.id == revision_id
    assert revision.projection_tokens_after == state.projection_tokens
    assert revision.parent_revision_id is None and revision.session_id == "s1"
    assert revision.artifacts == [{"kind": "path", "value": "/a"}]
    assert store.runs(session_id="s1")[0].revision_id == revision_id


def test_swap_against_a_stale_revision_conflicts_and_writes_nothing(store: Store) -> None:
    store.import_session("s1", {}, conversation(8), T0)
    first = swap(store, "s1", 4)
    take_lease(store, "s1", SWAPPER, 60, T0)
    before = store.get_session("s1")
    with pytest.raises(RevisionConflict):
        swap_in(store, "s1", expected_revision_id=None, owner=SWAPPER, now=T0,
                run=job_run("s1"), revision=summary_revision(6, 8))
    assert store.get_session("s1") == before
    assert [r.id for r in store.revisions("s1")] == [first]
    assert len(store.runs(session_id="s1")) == 1


def test_swap_refuses_revisions_outside_the_session_bounds(store: Store) -> None:
    store.import_session("s1", {}, conversation(8), T0)
    swap(store, "s1", 5)
    active = store.get_session("s1").active_revision_id
    # Below the parent; past the head; past its own snapshot.
    for through_seq, snapshot_head_seq in ((4, 8), (6, 9), (8, 7)):
        with pytest.raises(ValueError, match="through_seq"):
            swap_in(store, "s1", expected_revision_id=active, now=T0, run=job_run("s1"),
                    revision=summary_revision(through_seq, snapshot_head_seq))
    assert len(store.revisions("s1")) == 1


def test_rollback_restores_the_previous_projection_exactly(store: Store) -> None:
    store.import_session("s1", {}, conversation(10), T0)
    first = swap(store, "s1", 4, label="one")
    store.append_messages("s1", [message("user", "more"), message("assistant", "ok")], now=T0)
    projection_before, state_before = store.projection("s1"), store.get_session("s1")
    second = swap(store, "s1", 9, label="two")
    assert store.projection("s1") != projection_before

    restored = store.rollback("s1")
    assert restored is not None and restored.id == first
    assert store.projection("s1") == projection_before
    state = store.get_session("s1")
    assert state.active_revision_id == first
    assert state.projection_tokens == state_before.projection_tokens
    assert [r.id for r in store.revisions("s1")] == [second, first]  # nothing deleted

    assert store.rollback("s1") is None
    assert store.projection("s1") == [r.body for r in store.messages("s1")]
    assert store.get_session("s1").projection_tokens == store.get_session("s1").total_tokens


def test_rollback_to_an_ancestor_and_its_refusals(store: Store) -> None:
    store.import_session("s1", {}, conversation(12), T0)
    with pytest.raises(RevisionNotFound):
        store.rollback("s1")  # no active revision
    first, second, third = (swap(store, "s1", n) for n in (3, 6, 9))
    with pytest.raises(RevisionNotFound):
        store.rollback("s1", to_revision_id=third)  # the active one is not an ancestor
    with pytest.raises(RevisionNotFound):
        store.rollback("s1", to_revision_id=third + 100)

    restored = store.rollback("s1", to_revision_id=first)
    assert restored is not None and restored.id == first
    with pytest.raises(RevisionNotFound):
        store.rollback("s1", to_revision_id=second)  # no longer in the active chain


def test_sessions_are_listed_in_code_point_order_by_keyset(store: Store) -> None:
    ids = ["b", "B", "a", "é", "Z", "a-1", "a_1", "10", "9"]
    for session_id in ids:
        store.create_session(session_id, {}, T0)
    pages: list[list[SessionState]] = []
    after: str | None = None
    while page := store.list_sessions(after=after, limit=4):
        pages.append(page)
        after = page[-1].session_id
    assert [len(page) for page in pages] == [4, 4, 1]
    assert [s.session_id for page in pages for s in page] == sorted(ids)


def test_naive_datetimes_are_refused(store: Store) -> None:
    with pytest.raises(StoreError, match="naive datetime"):
        store.create_session("s1", {}, datetime(2025, 1, 1))
    with pytest.raises(SessionNotFound):
        store.get_session("s1")
