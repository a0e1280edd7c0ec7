"""The job's store port (``worker.job.ports.JobLedgerPort``) holds the same contract on the
in-memory fake the unit suite uses and on the real store, SQLite and PostgreSQL: leases
with expiry and ownership, compare-and-swap of the active revision, breaker fields, runs
and unknown sessions. A fake that drifted from ``db.Store`` fails here."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import pytest

from db import (
    BreakerUpdate,
    JobSnapshot,
    LeaseLost,
    MessageRecord,
    MessageText,
    NewMessage,
    NewRevision,
    NewRun,
    RevisionConflict,
    RevisionRecord,
    RevisionSizes,
    RunRecord,
    SessionNotFound,
    SessionState,
    SnapshotSkipRule,
    ToolCallState,
    upgrade_database,
)
from tests.support.databases import open_store, sqlite_url, truncate_store_tables
from tests.support.fake_store import FakeStore
from tests.support.store_jobs import read_snapshot, swap_in, take_lease
from worker.job.ports import JobLedgerPort

pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TTL_S = 30
SESSION = "s-contract"


class ContractStore(JobLedgerPort, Protocol):
    """What the checks need besides the port: setting a session up, reading it back, and
    the single-purpose lease and run methods operators and tools use."""

    def start_job(self, session_id: str, owner: str, ttl_s: float, now: datetime, *,
                  take_over: str | None = None) -> SessionState | None: ...

    def release_lease(self, session_id: str, owner: str) -> bool: ...

    def messages(self, session_id: str, *, after_seq: int = 0) -> list[MessageRecord]: ...

    def revisions(self, session_id: str) -> Sequence[RevisionRecord]: ...

    def record_run(self, run: NewRun, *, breaker: BreakerUpdate | None = None) -> int: ...

    def import_session(self, session_id: str, metadata: dict[str, Any],
                       messages: Sequence[NewMessage], now: datetime, *,
                       session_format: str = "chat", system_tokens: int = 0) -> object: ...

    def rollback(self, session_id: str) -> RevisionRecord | None: ...

    def runs(self, *, session_id: str | None = None, outcome: str | None = None,
             limit: int = 100) -> Sequence[RunRecord]: ...

    def append_checked(
        self, session_id: str,
        check: Callable[[ToolCallState], tuple[Sequence[NewMessage], Any]], *,
        now: datetime, create: bool = False, metadata: dict[str, Any] | None = None,
    ) -> tuple[list[int], Any]: ...


@pytest.fixture(params=["fake", "sqlite", "postgresql", "postgresql-pgbouncer"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ContractStore]:
    """A store of each kind holding one session: a system prompt and six messages."""
    if request.param == "fake":
        fake = FakeStore()
        _import(fake)
        yield fake
        return
    if request.param == "sqlite":
        url = sqlite_url(tmp_path / "store.db")
        upgrade_database(url)
    else:
        url = str(request.getfixturevalue("migrated_postgres_url"))
        truncate_store_tables(url)
    with open_store(url) as real:
        _import(real)
        yield real


def _import(store: ContractStore) -> None:
    roles = ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    messages = [NewMessage({"role": role, "content": f"m{i}"}, role, None, 10 + i)
                for i, role in enumerate(roles)]
    store.import_session(SESSION, {}, messages, T0)


def a_run(outcome: str = "compacted", session_id: str = SESSION) -> NewRun:
    return NewRun(session_id, "task-1", 1, "test", outcome, None, None, {"k": 1}, None, T0, T0)


ARTIFACTS = [{"value": "src/a.py", "kind": "path", "count": 2, "first_seq": 1, "last_seq": 3,
              "sources": ["tool_output", "user"]}]


def a_revision(through_seq: int, head_seq: int = 7) -> NewRevision:
    return NewRevision(through_seq=through_seq, snapshot_head_seq=head_seq,
                       summary={"goal": "g"}, block={"role": "user", "content": "summary"},
                       block_tokens=5, artifacts_json=json.dumps(ARTIFACTS), summary_tokens=5,
                       span_tokens=40, projection_tokens_before=91, model="m",
                       prompt_version="p", summarizer="extractive")


def swap(store: ContractStore, expected: int | None, through_seq: int, owner: str | None = None,
         now: datetime = T0, breaker: BreakerUpdate | None = None) -> int:
    return swap_in(store, SESSION, expected_revision_id=expected, owner=owner,
                   revision=a_revision(through_seq), run=a_run(), now=now, breaker=breaker)


def test_every_session_method_raises_session_not_found_for_an_unknown_session(
    store: ContractStore,
) -> None:
    calls: list[Callable[[], object]] = [
        lambda: store.start_job("nope", "a", TTL_S, T0),
        lambda: store.job_snapshot("nope", to_message=keep_text),
        lambda: store.commit_job("nope", expected_revision_id=None, lease_owner="a",
                                 revision=a_revision(2), run=a_run(session_id="nope"), now=T0),
        lambda: store.release_lease("nope", "a"),
        lambda: store.get_session("nope"),
        lambda: store.set_breaker("nope", BreakerUpdate("open", 3, T0)),
        lambda: store.revisions("nope"),
    ]
    for call in calls:
        with pytest.raises(SessionNotFound):
            call()


def calling(*call_ids: str) -> NewMessage:
    calls = [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
             for i in call_ids]
    return NewMessage({"role": "assistant", "content": None, "tool_calls": calls},
                      "assistant", None, 5)


def answering(call_id: str) -> NewMessage:
    return NewMessage({"role": "tool", "tool_call_id": call_id, "content": "ok"}, "tool",
                      call_id, 2)


def test_an_append_check_sees_the_open_and_answered_tool_calls_of_the_stored_session(
    store: ContractStore,
) -> None:
    seen: list[ToolCallState] = []

    def append(*rows: NewMessage) -> list[int]:
        def check(state: ToolCallState) -> tuple[Sequence[NewMessage], None]:
            seen.append(state)
            return rows, None
        return store.append_checked(SESSION, check, now=T0)[0]

    assert append(calling("c1"), answering("c1"), calling("c2", "c3")) == [8, 9, 10]
    append(answering("c3"))
    append()

    assert seen == [ToolCallState((), frozenset()),
                    ToolCallState(("c2", "c3"), frozenset({"c1"})),
                    ToolCallState(("c2",), frozenset({"c1", "c3"}))]


def test_a_failing_append_check_stores_nothing(store: ContractStore) -> None:
    def check(state: ToolCallState) -> tuple[Sequence[NewMessage], None]:
        raise ValueError("rejected")

    with pytest.raises(ValueError, match="rejected"):
        store.append_checked(SESSION, check, now=T0)

    assert store.get_session(SESSION).head_seq == 7


def test_a_run_of_an_unknown_session_is_recorded_and_its_breaker_ignored(
    store: ContractStore,
) -> None:
    store.record_run(a_run("rejected", "nope"), breaker=BreakerUpdate("closed", 1, None))
    [run] = store.runs(session_id="nope")
    assert (run.outcome, run.figures, run.revision_id) == ("rejected", {"k": 1}, None)


def test_a_lease_is_exclusive_until_it_expires_and_only_its_owner_releases_it(
    store: ContractStore,
) -> None:
    assert take_lease(store, SESSION, "a", TTL_S, T0)
    assert take_lease(store, SESSION, "a", TTL_S, T0 + timedelta(seconds=1))  # renewed
    assert not take_lease(store, SESSION, "b", TTL_S, T0 + timedelta(seconds=TTL_S))
    assert not store.release_lease(SESSION, "b")
    assert take_lease(store, SESSION, "b", TTL_S, T0 + timedelta(seconds=TTL_S + 1))
    assert store.get_session(SESSION).lease_owner == "b"
    assert not store.release_lease(SESSION, "a")
    assert store.release_lease(SESSION, "b")
    state = store.get_session(SESSION)
    assert (state.lease_owner, state.lease_expires_at) == (None, None)


def test_a_swap_points_the_session_at_the_revision_closes_the_breaker_and_records_the_run(
    store: ContractStore,
) -> None:
    store.set_breaker(SESSION, BreakerUpdate("half_open", 3, T0))
    take_lease(store, SESSION, "a", TTL_S, T0)

    revision_id = swap(store, None, 4, owner="a")

    state, [revision] = store.get_session(SESSION), store.revisions(SESSION)
    assert state.active_revision_id == revision_id == revision.id
    assert (state.breaker_state, state.breaker_failures, state.breaker_opened_at) == \
        ("closed", 0, None)
    # The system prompt (10) stays, the block (5) replaces seqs 2-4, seqs 5-7 follow.
    assert state.projection_tokens == revision.projection_tokens_after == 10 + 5 + 14 + 15 + 16
    assert (revision.parent_revision_id, revision.through_seq) == (None, 4)
    [run] = store.runs(session_id=SESSION)
    assert (run.outcome, run.revision_id) == ("compacted", revision_id)
    assert state.lease_owner is None
    snapshot = read_snapshot(store, SESSION)
    assert snapshot.revision == revision
    assert [m.seq for m in snapshot.messages] == [1, 5, 6, 7]


def test_a_swap_from_a_stale_revision_raises_revision_conflict_and_writes_nothing(
    store: ContractStore,
) -> None:
    first = swap(store, None, 2)

    with pytest.raises(RevisionConflict):
        swap(store, None, 4)

    assert [r.id for r in store.revisions(SESSION)] == [first]
    assert store.get_session(SESSION).active_revision_id == first
    assert len(store.runs(session_id=SESSION)) == 1


def test_a_swap_without_the_lease_raises_lease_lost_and_writes_nothing(
    store: ContractStore,
) -> None:
    take_lease(store, SESSION, "a", TTL_S, T0)
    with pytest.raises(LeaseLost):
        swap(store, None, 2, owner="b")
    with pytest.raises(LeaseLost):
        swap(store, None, 2, owner="a", now=T0 + timedelta(seconds=TTL_S))
    assert store.revisions(SESSION) == [] and store.runs(session_id=SESSION) == []
    assert store.get_session(SESSION).active_revision_id is None


def test_a_swap_given_a_breaker_keeps_it_and_revisions_list_newest_first(
    store: ContractStore,
) -> None:
    first = swap(store, None, 2)
    opened = BreakerUpdate("open", 3, T0)
    second = swap(store, first, 4, breaker=opened)

    state = store.get_session(SESSION)
    assert (state.breaker_state, state.breaker_failures) == ("open", 3)
    assert [(r.id, r.parent_revision_id) for r in store.revisions(SESSION)] == \
        [(second, first), (first, None)]


def test_a_recorded_run_sets_the_breaker_and_invalid_breakers_are_refused(
    store: ContractStore,
) -> None:
    store.record_run(a_run("failed"), breaker=BreakerUpdate("open", 3, T0))
    state = store.get_session(SESSION)
    assert (state.breaker_state, state.breaker_failures, state.active_revision_id) == \
        ("open", 3, None)
    with pytest.raises(ValueError):
        store.set_breaker(SESSION, BreakerUpdate("ajar", 0, None))


def test_a_job_starts_with_the_lease_and_the_row_unless_another_owner_holds_it(
    store: ContractStore,
) -> None:
    started = store.start_job(SESSION, "w1:task-1", TTL_S, T0)
    assert started is not None and started == store.get_session(SESSION)
    assert (started.lease_owner, started.lease_expires_at, started.head_seq) == \
        ("w1:task-1", T0 + timedelta(seconds=TTL_S), 7)

    assert store.start_job(SESSION, "w2:task-2", TTL_S, T0) is None
    # A redelivery of task-1 takes over the lease its lost delivery left.
    assert store.start_job(SESSION, "w2:task-2", TTL_S, T0, take_over="task-2") is None
    taken = store.start_job(SESSION, "w2:task-1", TTL_S, T0, take_over="task-1")
    assert taken is not None and taken.lease_owner == "w2:task-1"


def test_a_job_snapshot_carries_the_sizes_of_the_newest_revisions_only(
    store: ContractStore,
) -> None:
    assert store.job_snapshot(SESSION, to_message=keep_text).recent_revisions == ()
    first = swap(store, None, 2)
    second = swap(store, first, 3)
    swap(store, second, 4)
    revisions = store.revisions(SESSION)

    snapshot = store.job_snapshot(SESSION, history=2, to_message=keep_text)

    assert snapshot.recent_revisions == tuple(
        RevisionSizes(r.projection_tokens_before, r.projection_tokens_after)
        for r in revisions[:2])
    assert (snapshot.session, snapshot.revision) == (store.get_session(SESSION), revisions[0])
    active = [m for m in store.messages(SESSION) if m.seq > 4 or m.role == "system"]
    assert [(m.seq, json.loads(m.body_json), m.tokens,
             tuple(map(tuple, json.loads(m.identifiers_json or "[]"))))
            for m in snapshot.messages] == \
        [(m.seq, m.body, m.tokens, m.identifiers or ()) for m in active]


def test_a_job_takes_the_lease_with_its_snapshot_and_reads_nothing_without_it(
    store: ContractStore,
) -> None:
    first = swap(store, None, 2)
    expected = store.job_snapshot(SESSION, history=2, to_message=keep_text)

    started = store.start_job_with_snapshot(SESSION, "w1:task-1", TTL_S, T0, history=2,
                                            to_message=keep_text)

    assert started is not None
    assert started.session == store.get_session(SESSION)
    assert (started.session.lease_owner, started.session.lease_expires_at) == \
        ("w1:task-1", T0 + timedelta(seconds=TTL_S))
    assert (started.revision, started.messages, started.recent_revisions) == \
        (expected.revision, expected.messages, expected.recent_revisions)
    assert started.revision is not None and started.revision.id == first
    assert store.start_job_with_snapshot(SESSION, "w2:task-2", TTL_S, T0,
                                         to_message=keep_text) is None
    # A redelivery of task-1 takes over the lease its lost delivery left.
    taken = store.start_job_with_snapshot(SESSION, "w2:task-1", TTL_S, T0,
                                          take_over="task-1", to_message=keep_text)
    assert taken is not None and taken.session.lease_owner == "w2:task-1"
    with pytest.raises(SessionNotFound):
        store.start_job_with_snapshot("nope", "w1:task-1", TTL_S, T0, to_message=keep_text)


@pytest.mark.parametrize("leased", [False, True], ids=["snapshot", "lease-with-snapshot"])
def test_a_snapshot_of_a_session_under_the_gates_trigger_reads_its_row_alone(
    store: ContractStore, leased: bool
) -> None:
    first = swap(store, None, 2)
    projection = store.get_session(SESSION).projection_tokens
    expected = store.job_snapshot(SESSION, history=2, to_message=keep_text)

    def snapshot(trigger_tokens: int) -> JobSnapshot[MessageText] | None:
        skip_rule = SnapshotSkipRule(trigger_tokens=trigger_tokens)
        if leased:
            return store.start_job_with_snapshot(SESSION, "w1:task-1", TTL_S, T0, history=2,
                                                 to_message=keep_text, skip_rule=skip_rule)
        return store.job_snapshot(SESSION, history=2, to_message=keep_text, skip_rule=skip_rule)

    at_it, under_it = snapshot(projection), snapshot(projection - 1)

    assert at_it is not None and under_it is not None
    assert (at_it.under_trigger, at_it.breaker_refused) == (True, False)
    assert (at_it.messages, at_it.recent_revisions) == ([], ())
    assert at_it.revision is not None and at_it.revision.id == first
    assert at_it.session.projection_tokens == projection
    assert not under_it.under_trigger
    assert (under_it.revision, under_it.messages, under_it.recent_revisions) == \
        (expected.revision, expected.messages, expected.recent_revisions)
    # What the row says is what the job would have summed: the block and what it reads.
    assert expected.revision is not None
    assert projection == expected.revision.summary_tokens + sum(m.tokens
                                                                for m in expected.messages)

def keep_text(text: MessageText) -> MessageText:
    return text


def test_a_job_commit_swaps_records_the_run_and_releases_the_lease_in_one_go(
    store: ContractStore,
) -> None:
    store.start_job(SESSION, "a", TTL_S, T0)

    revision_id = store.commit_job(SESSION, expected_revision_id=None, lease_owner="a",
                                   revision=a_revision(4), run=a_run(), now=T0)

    state = store.get_session(SESSION)
    assert (state.active_revision_id, state.lease_owner, state.lease_expires_at) == \
        (revision_id, None, None)
    assert state.projection_tokens == 10 + 5 + 14 + 15 + 16
    assert store.revisions(SESSION)[0].artifacts == ARTIFACTS  # stored from its JSON text
    [run] = store.runs(session_id=SESSION)
    assert run.revision_id == revision_id
    with pytest.raises(LeaseLost):  # the lease went with the commit
        store.commit_job(SESSION, expected_revision_id=revision_id, lease_owner="a",
                         revision=a_revision(5), run=a_run(), now=T0)
    store.start_job(SESSION, "a", TTL_S, T0)
    with pytest.raises(RevisionConflict):
        store.commit_job(SESSION, expected_revision_id=None, lease_owner="a",
                         revision=a_revision(5), run=a_run(), now=T0)
    assert store.get_session(SESSION).lease_owner == "a"  # nothing written on a conflict
    assert len(store.runs(session_id=SESSION)) == 1


def test_a_job_commit_writes_the_sessions_figures_and_the_whole_run(
    store: ContractStore,
) -> None:
    store.start_job(SESSION, "a", TTL_S, T0)
    store.set_breaker(SESSION, BreakerUpdate("half_open", 2, T0))

    revision_id = store.commit_job(SESSION, expected_revision_id=None, lease_owner="a",
                                   revision=a_revision(4, head_seq=5), run=a_run(),
                                   now=T0 + timedelta(seconds=1))

    state = store.get_session(SESSION)
    assert (state.tokens_since_compaction, state.last_compacted_at) == \
        (15 + 16, T0 + timedelta(seconds=1))
    assert (state.breaker_state, state.breaker_failures, state.breaker_opened_at) == \
        ("closed", 0, None)
    [run] = store.runs(session_id=SESSION)
    assert (run.task_id, run.attempt, run.reason, run.outcome, run.failure_class,
            run.figures, run.revision_id, run.started_at, run.finished_at) == \
        ("task-1", 1, "test", "compacted", None, {"k": 1}, revision_id, T0, T0)


def test_a_finished_job_records_its_run_and_breaker_and_releases_only_its_own_lease(
    store: ContractStore,
) -> None:
    store.start_job(SESSION, "a", TTL_S, T0)
    store.finish_job(a_run("failed"), lease_owner="b", breaker=BreakerUpdate("closed", 1, None))
    state = store.get_session(SESSION)
    assert (state.lease_owner, state.breaker_failures) == ("a", 1)

    store.finish_job(a_run("failed"), lease_owner="a", breaker=BreakerUpdate("open", 2, T0),
                     clear_queue_marker=True)
    state = store.get_session(SESSION)
    assert (state.lease_owner, state.breaker_state, state.breaker_failures) == \
        (None, "open", 2)
    store.finish_job(a_run("rejected", "nope"), lease_owner="a", clear_queue_marker=True)
    assert [r.outcome for r in store.runs(limit=3)] == ["rejected", "failed", "failed"]
    with pytest.raises(ValueError):
        store.finish_job(a_run("failed"), lease_owner=None, breaker=BreakerUpdate("ajar", 0, None))


def figures(state: SessionState) -> tuple[int, int, int]:
    return state.total_tokens, state.projection_tokens, state.tokens_since_compaction


def test_a_system_prompt_outside_the_messages_counts_in_every_figure_as_a_system_message(
    store: ContractStore,
) -> None:
    """The fixture's session opens with a system message; its twin keeps the same tokens
    as a system prompt outside its messages (an Anthropic ``system``), the rest alike."""
    twin, [system, *rest] = "s-outside", store.messages(SESSION)
    store.import_session(twin, {"system": "policy"}, [
        NewMessage(m.body, m.role, None, m.tokens) for m in rest], T0,
        session_format="anthropic", system_tokens=system.tokens)
    assert store.get_session(twin).system_tokens == system.tokens
    assert figures(store.get_session(twin)) == figures(store.get_session(SESSION))

    # Each cuts after the same message (seq 4 of the session, seq 3 of its twin).
    for session_id, through_seq, head_seq in ((SESSION, 4, 7), (twin, 3, 6)):
        take_lease(store, session_id, "a", TTL_S, T0)
        swap_in(store, session_id, expected_revision_id=None, owner="a",
                revision=a_revision(through_seq, head_seq), run=a_run(session_id=session_id),
                now=T0)
    [compacted], [twin_compacted] = store.revisions(SESSION), store.revisions(twin)
    assert twin_compacted.projection_tokens_after == compacted.projection_tokens_after
    assert figures(store.get_session(twin)) == figures(store.get_session(SESSION))
    assert read_snapshot(store, twin).session.system_tokens == system.tokens

    store.rollback(SESSION)
    store.rollback(twin)
    assert figures(store.get_session(twin)) == figures(store.get_session(SESSION))
