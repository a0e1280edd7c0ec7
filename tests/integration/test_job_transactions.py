"""A job is three transactions and at most twelve database round trips, on PostgreSQL and
SQLite: the lease (one ``UPDATE ... RETURNING``), the snapshot (one read transaction),
and one write that ends it (the swap with the run row, lease release and queue marker;
or, for any other outcome, the run row with the breaker and lease release). On
PostgreSQL a compaction takes two: the lease with the snapshot, and the swap, one
statement each, in autocommit.

Counted with SQLAlchemy's own events on the real engine: every statement
(``before_cursor_execute``) and every transaction (``begin``); a transaction that is not
AUTOCOMMIT costs a BEGIN and a COMMIT round trip besides its statements (SQLite's
``BEGIN IMMEDIATE`` is that BEGIN, not one more statement)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, event, text

from db import (
    LeaseLost,
    MessageText,
    RevisionConflict,
    SessionNotFound,
    Store,
    create_db_engine,
)
from db.job_lease import take_lease
from tests.integration.test_store import job_run, summary_revision
from tests.support.databases import truncate_store_tables
from tests.support.e2e import append_turns, build_job_env, import_records, token_counter
from tests.support.generated import generated_session, generated_turns
from worker.compaction import SummaryInvalid
from worker.errors import Outcome
from worker.job import pipeline
from worker.job.values import JobDeps, JobRequest, JobResult
from worker.runtime import job_policy
from worker.shared_state.provider_breaker import InMemoryBreakerState, ProviderBreaker
from worker.summarizers import ExtractiveSummarizer, SummaryDraft, SummaryWork

pytestmark = pytest.mark.integration

SESSION = "generated-transactions"
MAX_TRANSACTIONS = 3
MAX_ROUND_TRIPS = 12
# PostgreSQL takes the lease with the snapshot in one statement and swaps in another, none
# in a BEGIN ... COMMIT; a connection's first snapshot prepares its statement first.
MAX_COMPACTION_ROUND_TRIPS_POSTGRESQL = 2


@dataclass
class Traffic:
    """What one job sent to its database."""

    statements: list[str] = field(default_factory=list)
    transactions: int = 0
    autocommit_transactions: int = 0

    @property
    def round_trips(self) -> int:
        explicit = self.transactions - self.autocommit_transactions
        return len(self.statements) + 2 * explicit


@contextmanager
def counting() -> Iterator[Traffic]:
    traffic = Traffic()

    def on_statement(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
        if not statement.startswith("BEGIN"):  # SQLite's begin hook: counted as the BEGIN
            traffic.statements.append(statement)

    def on_begin(conn: Connection) -> None:
        traffic.transactions += 1
        options = conn.get_execution_options()
        # PostgreSQL's AUTOCOMMIT, or the store's SQLite begin hook told to emit no BEGIN.
        if "AUTOCOMMIT" in (options.get("isolation_level"), options.get("compactor_sqlite_begin")):
            traffic.autocommit_transactions += 1

    event.listen(Engine, "before_cursor_execute", on_statement)
    event.listen(Engine, "begin", on_begin)
    try:
        yield traffic
    finally:
        event.remove(Engine, "before_cursor_execute", on_statement)
        event.remove(Engine, "begin", on_begin)


class InvalidSummarizer(ExtractiveSummarizer):
    """Answers with a summary that fails validation (a session failure)."""

    def summarize(self, work: SummaryWork) -> SummaryDraft:
        raise SummaryInvalid("refused by the test", reason="invalid_summary")


def deps_for(store: Store, summarizer: ExtractiveSummarizer | None) -> JobDeps:
    counter = token_counter()
    extractive = ExtractiveSummarizer(counter)
    clock = lambda: datetime.now(UTC)  # noqa: E731
    return JobDeps(store=store, summarizer=summarizer or extractive,
                   fallback=ExtractiveSummarizer(counter, kind="fallback"), counter=counter,
                   provider_breaker=ProviderBreaker(InMemoryBreakerState(), threshold=3,
                                                    cooldown_s=60, trial_s=60, clock=clock),
                   clock=clock, worker_id="host:1")


def run_counted(store: Store, database_url: str, task_id: str,
                summarizer: ExtractiveSummarizer | None = None) -> tuple[JobResult, Traffic]:
    settings = build_job_env(database_url, None, summarizer="extractive").settings
    deps, policy = deps_for(store, summarizer), job_policy(settings)
    with store.queue_markers() as markers:
        markers.mark(SESSION, task_id, now=datetime.now(UTC), marker_ttl_s=600)
    with counting() as traffic:
        result = pipeline.run(JobRequest(SESSION, "test", task_id=task_id), deps, policy)
    return result, traffic


def assert_job_ended_cleanly(store: Store, traffic: Traffic) -> None:
    assert traffic.transactions <= MAX_TRANSACTIONS, traffic
    assert traffic.round_trips <= MAX_ROUND_TRIPS, traffic.statements
    state = store.get_session(SESSION)
    assert (state.lease_owner, state.queued_job_id) == (None, None)


def test_a_first_and_a_second_compaction_each_take_three_transactions_at_most(
    store: Store, database_url: str,
) -> None:
    import_records(store, [generated_session(SESSION, 40)])

    first, traffic = run_counted(store, database_url, "task-1")
    assert first.outcome is Outcome.COMPACTED, first
    assert_job_ended_cleanly(store, traffic)
    if database_url.startswith("postgresql"):
        assert_compaction_round_trips_on_postgresql(traffic)

    append_turns(store, SESSION, generated_turns(f"{SESSION}-b", 30))
    second, traffic = run_counted(store, database_url, "task-2")
    assert (second.outcome, second.parent_revision_id) == (Outcome.COMPACTED,
                                                          first.revision_id), second
    assert_job_ended_cleanly(store, traffic)
    if database_url.startswith("postgresql"):
        assert_compaction_round_trips_on_postgresql(traffic)
    [run] = store.runs(session_id=SESSION, limit=1)
    assert (run.outcome, run.revision_id) == ("compacted", second.revision_id)


def assert_compaction_round_trips_on_postgresql(traffic: Traffic) -> None:
    prepares = [s for s in traffic.statements if s.startswith("PREPARE ")]
    assert len(prepares) <= 1, traffic.statements
    assert traffic.round_trips - len(prepares) <= MAX_COMPACTION_ROUND_TRIPS_POSTGRESQL, \
        traffic.statements


def test_a_skipped_and_a_failed_job_also_end_in_one_write(
    store: Store, database_url: str,
) -> None:
    import_records(store, [generated_session(SESSION, 4)])
    skipped, traffic = run_counted(store, database_url, "task-1")
    assert (skipped.outcome, skipped.reason) == (Outcome.SKIPPED, "under_trigger")
    assert_job_ended_cleanly(store, traffic)

    append_turns(store, SESSION, generated_turns(f"{SESSION}-b", 40))
    failed, traffic = run_counted(store, database_url, "task-2",
                                  InvalidSummarizer(token_counter()))
    assert failed.outcome is Outcome.FAILED, failed
    assert_job_ended_cleanly(store, traffic)
    state = store.get_session(SESSION)
    assert (state.breaker_failures, state.active_revision_id) == (1, None)


def test_a_take_over_matches_the_task_id_at_the_owners_end_literally(store: Store) -> None:
    import_records(store, [generated_session(SESSION, 4)])
    now = datetime.now(UTC)
    assert store.start_job(SESSION, "w1:task_1%/", 60, now) is not None
    # LIKE's wildcards and escape character in a task id match only themselves.
    assert store.start_job(SESSION, "w2:taskX1", 60, now, take_over="task_1") is None
    assert store.start_job(SESSION, "w2:task", 60, now, take_over="task%") is None
    taken = store.start_job(SESSION, "w2:task_1%/", 60, now, take_over="task_1%/")
    assert taken is not None and taken.lease_owner == "w2:task_1%/"


@pytest.fixture
def postgres_store(migrated_postgres_url: str) -> Iterator[Store]:
    """A store on the emptied PostgreSQL database, for what only PostgreSQL's statements do."""
    truncate_store_tables(migrated_postgres_url)
    store = Store(create_db_engine(migrated_postgres_url))
    try:
        yield store
    finally:
        store.close()


def test_only_the_leases_commit_skips_the_wal_flush_on_postgresql(
    postgres_store: Store,
) -> None:
    import_records(postgres_store, [generated_session(SESSION, 4)])
    with postgres_store._engine.connect() as connection:
        # As in production: the test databases commit asynchronously throughout.
        connection.execute(text("SET synchronous_commit TO on"))
        connection.commit()
        with connection.begin():
            assert take_lease(connection, SESSION, "w1:task-1", 60, datetime.now(UTC))
            assert connection.scalar(text("SHOW synchronous_commit")) == "off"
        # Local to the lease's transaction: the next one on this pooled connection (a
        # swap) commits durably.
        with connection.begin():
            assert connection.scalar(text("SHOW synchronous_commit")) == "on"


# What a refused swap is: (expected revision, owner, through_seq past the head) -> error.
REFUSALS = {"stale_revision": (RevisionConflict, 12345, "w1:task-1", 0),
            "lost_lease": (LeaseLost, None, "w2:task-2", 0),
            "past_the_head": (ValueError, None, "w1:task-1", 5),
            "unknown_session": (SessionNotFound, None, "w1:task-1", 0)}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refused_swap_is_one_statement_whose_result_names_the_check_on_postgresql(
    postgres_store: Store, case: str,
) -> None:
    store = postgres_store
    error, expected, owner, past = REFUSALS[case]
    import_records(store, [generated_session(SESSION, 8)])
    now = datetime.now(UTC)
    assert store.start_job(SESSION, "w1:task-1", 60, now) is not None
    session_id = "nope" if case == "unknown_session" else SESSION
    head_seq = store.get_session(SESSION).head_seq
    before = store.get_session(SESSION)
    with counting() as traffic, pytest.raises(error):
        store.commit_job(session_id, expected_revision_id=expected, lease_owner=owner,
                         revision=summary_revision(2, head_seq + past),
                         run=job_run(session_id), now=now)
    assert (len(traffic.statements), traffic.transactions,
            traffic.autocommit_transactions) == (1, 1, 1), traffic.statements
    assert store.get_session(SESSION) == before
    assert store.revisions(SESSION) == [] and store.runs(session_id=session_id) == []


def test_a_swap_that_waited_on_an_append_runs_again_and_counts_the_appended_message(
    postgres_store: Store,
) -> None:
    # The swap's statement takes its snapshot before it waits for the row lock: once the
    # append commits, the row it locks is ahead of the messages it would sum, so it
    # writes nothing and runs again, in a fresh snapshot, still in autocommit.
    store = postgres_store
    import_records(store, [generated_session(SESSION, 8)])
    now = datetime.now(UTC)
    assert store.start_job(SESSION, "w1:task-1", 60, now) is not None
    head_seq = store.get_session(SESSION).head_seq
    with store._engine.connect() as appender, ThreadPoolExecutor(1) as pool:
        append_late_message(appender)
        with counting() as traffic:
            swapped = pool.submit(store.commit_job, SESSION, expected_revision_id=None,
                                  lease_owner="w1:task-1", now=now, run=job_run(SESSION),
                                  revision=summary_revision(2, head_seq))
            wait_for_a_lock_wait(store)
            appender.commit()
            revision_id = swapped.result(timeout=30)
    swaps = [s for s in traffic.statements if "pg_stat_activity" not in s]
    assert len(swaps) == 2 and all(s.startswith("WITH ") for s in swaps), swaps
    assert traffic.autocommit_transactions >= 1
    state = store.get_session(SESSION)
    assert (state.active_revision_id, state.lease_owner, state.head_seq) == \
        (revision_id, None, head_seq + 1)
    assert state.tokens_since_compaction == LATE_MESSAGE_TOKENS  # appended after the snapshot
    [revision] = store.revisions(SESSION)
    assert revision.projection_tokens_after == state.projection_tokens


LATE_MESSAGE = """{"role": "user", "content": "appended while the lease waited"}"""
LATE_MESSAGE_TOKENS = 7


def append_late_message(appender: Connection) -> None:
    """Append one message, uncommitted: ``appender`` holds the session's row lock."""
    appender.execute(text("UPDATE sessions SET head_seq = head_seq + 1"))
    appender.execute(text(
        "INSERT INTO messages (session_id, seq, role, body, tokens, created_at) "
        "SELECT id, head_seq, 'user', CAST(:body AS JSON), :tokens, now() FROM sessions"),
        {"body": LATE_MESSAGE, "tokens": LATE_MESSAGE_TOKENS})


def test_a_lease_that_waited_on_an_append_reads_the_snapshot_that_append_left(
    postgres_store: Store,
) -> None:
    # The lease's statement takes its snapshot before it waits for the row lock: once
    # the append commits, the row it locks is ahead of the messages it would read, and
    # the job reads a fresh snapshot instead.
    store = postgres_store
    import_records(store, [generated_session(SESSION, 4)])
    head_seq = store.get_session(SESSION).head_seq
    with store._engine.connect() as appender, ThreadPoolExecutor(1) as pool:
        append_late_message(appender)
        started = pool.submit(store.start_job_with_snapshot, SESSION, "w1:task-1", 60,
                              datetime.now(UTC), to_message=keep_text)
        wait_for_a_lock_wait(store)
        appender.commit()
        snapshot = started.result(timeout=30)
    assert snapshot is not None
    assert (snapshot.session.head_seq, snapshot.session.lease_owner) == \
        (head_seq + 1, "w1:task-1")
    assert [m.seq for m in snapshot.messages][-1] == head_seq + 1


def keep_text(text: MessageText) -> MessageText:
    return text


def wait_for_a_lock_wait(store: Store, timeout_s: float = 10.0) -> None:
    """Return once a statement of this database waits for a row lock."""
    deadline = time.monotonic() + timeout_s
    with store._engine.connect() as connection:
        while time.monotonic() < deadline:
            waiting = connection.scalar(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"))
            connection.rollback()
            if waiting:
                return
            time.sleep(0.01)
    raise AssertionError("no statement waited for the row lock")


def test_the_swap_leaves_another_jobs_queue_marker_in_place(store: Store, database_url: str,
                                                           ) -> None:
    import_records(store, [generated_session(SESSION, 40)])
    settings = build_job_env(database_url, None, summarizer="extractive").settings
    with store.queue_markers() as markers:
        markers.mark(SESSION, "task-other", now=datetime.now(UTC), marker_ttl_s=600)
    result = pipeline.run(JobRequest(SESSION, "test", task_id="task-1"),
                          deps_for(store, None), job_policy(settings))
    assert result.outcome is Outcome.COMPACTED, result
    state = store.get_session(SESSION)
    assert (state.active_revision_id, state.lease_owner, state.queued_job_id) == \
        (result.revision_id, None, "task-other")
