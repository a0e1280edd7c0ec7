"""The store under concurrent writers, on SQLite and PostgreSQL alike: swaps racing
swaps, appends racing swaps, creators and lease takers racing each other."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest

from db import (
    JobSnapshot,
    LeaseLost,
    MessageRecord,
    MessageText,
    NewMessage,
    RevisionConflict,
    Store,
)
from tests.integration.test_store import T0, conversation, job_run, message, summary_revision
from tests.support.store_jobs import read_snapshot, swap_in, take_lease

Snapshot = JobSnapshot[MessageText]

pytestmark = pytest.mark.integration

Result = TypeVar("Result")


def race(count: int, attempt: Callable[[int], Result]) -> list[Result | Exception]:
    """Run ``attempt(i)`` on ``count`` threads released together; return results or errors."""
    barrier = threading.Barrier(count)

    def released(index: int) -> Result | Exception:
        barrier.wait(timeout=30)
        try:
            return attempt(index)
        except Exception as error:  # the caller asserts on each outcome
            return error

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(released, range(count)))


def swapper_from(store: Store, snapshot: Snapshot) -> Callable[[int], int]:
    """A job that swaps a summary in on top of ``snapshot`` (each worker its own summary,
    all under one lease: a redelivered job's two deliveries)."""
    head_seq = snapshot.session.head_seq

    def swap_as(worker: int) -> int:
        return swap_in(
            store, "s1", expected_revision_id=snapshot.session.active_revision_id,
            now=T0, run=job_run("s1"),
            revision=summary_revision(head_seq - worker, head_seq, label=f"worker-{worker}"),
        )

    return swap_as


def test_two_swaps_from_the_same_snapshot_let_exactly_one_win(store: Store) -> None:
    store.import_session("s1", {}, conversation(4), T0)
    for round_index in range(5):
        store.append_messages("s1", conversation(3, prefix=f"r{round_index}"), now=T0)
        snapshot = read_snapshot(store, "s1")
        expected = snapshot.session.active_revision_id
        outcomes = race(2, swapper_from(store, snapshot))

        winners = [o for o in outcomes if isinstance(o, int)]
        assert len(winners) == 1, outcomes
        # The loser finds the revision swapped, or the lease the winner released.
        assert sum(isinstance(o, RevisionConflict | LeaseLost) for o in outcomes) == 1, outcomes
        assert store.get_session("s1").active_revision_id == winners[0]
        assert store.revisions("s1")[0].parent_revision_id == expected
    assert len(store.revisions("s1")) == len(store.runs(session_id="s1")) == 5


def test_concurrent_first_appends_create_the_session_once(store: Store) -> None:
    outcomes = race(4, lambda i: store.append_messages(
        "new", [message("user", f"from {i}")], now=T0, create=True, metadata={"creator": i},
    ))
    assert all(isinstance(seqs, list) for seqs in outcomes), outcomes
    assert sorted(seq for seqs in outcomes if isinstance(seqs, list) for seq in seqs) == [
        1, 2, 3, 4]
    assert store.get_session("new").metadata["creator"] in range(4)


def test_exactly_one_of_many_racing_owners_gets_the_lease(store: Store) -> None:
    store.create_session("s1", {}, T0)
    outcomes = race(6, lambda i: take_lease(store, "s1", f"owner-{i}", 60, T0))
    assert outcomes.count(True) == 1 and outcomes.count(False) == 5
    assert store.get_session("s1").lease_owner == f"owner-{outcomes.index(True)}"


# An appender waits for the swapper's next swap every this many appends, so swaps land
# among the appends however the scheduler (or SQLite's busy handler) favours the appenders.
APPENDS_PER_SWAP = 15
SWAP_WAIT_S = 10.0


class SwapCount:
    """How many swaps the swapper made; appenders wait on it to interleave with it."""

    def __init__(self) -> None:
        self._count = 0
        self._changed = threading.Condition()

    def add(self) -> None:
        with self._changed:
            self._count += 1
            self._changed.notify_all()

    def wait_for(self, count: int) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._count >= count, timeout=SWAP_WAIT_S)


def append_randomly(
    store: Store, thread: int, appends: int, swaps: SwapCount
) -> list[tuple[list[int], list[NewMessage]]]:
    """Append ``appends`` batches of 1-3 messages (a few of them instructions)."""
    rng = random.Random(thread)
    done = []
    for index in range(appends):
        swaps.wait_for(index // APPENDS_PER_SWAP)
        batch = [
            message(rng.choice(("user", "assistant", "tool", "system")) if rng.random() < 0.2
                    else rng.choice(("user", "assistant")), f"t{thread}-{index}-{part}",
                    tokens=rng.randint(1, 50))
            for part in range(rng.randint(1, 3))
        ]
        done.append((store.append_messages("s1", batch, now=T0), batch))
    return done


def swap_until(store: Store, stop: threading.Event, count: SwapCount
               ) -> list[tuple[int, Snapshot]]:
    """Swap repeatedly, each time summarizing through the snapshot's head_seq."""
    swaps = []
    while not stop.is_set():
        snapshot = read_snapshot(store, "s1")
        head_seq = snapshot.session.head_seq
        revision_id = swap_in(
            store, "s1", expected_revision_id=snapshot.session.active_revision_id,
            now=T0, run=job_run("s1"), revision=summary_revision(head_seq, head_seq),
        )
        swaps.append((revision_id, snapshot))
        count.add()
        stop.wait(0.002)  # leave the row lock to the appenders now and then
    return swaps


def test_appends_racing_swaps_lose_no_message_and_hide_none(
    store: Store, database_url: str
) -> None:
    # Thousands of messages on PostgreSQL; SQLite commits are slower (one writer, fsync).
    threads, appends = 4, (60 if database_url.startswith("sqlite") else 250)
    store.import_session("s1", {}, conversation(1), T0)
    stop, count = threading.Event(), SwapCount()
    with ThreadPoolExecutor(threads + 1) as pool:
        swapper = pool.submit(swap_until, store, stop, count)
        appenders = [pool.submit(append_randomly, store, t, appends, count)
                     for t in range(threads)]
        appended = [future.result() for future in appenders]
        stop.set()
        swaps = swapper.result()

    history = store.messages("s1")
    by_seq = {record.seq: record for record in history}
    assert [record.seq for record in history] == list(range(1, len(history) + 1))
    sent = {seq: new for calls in appended for seqs, batch in calls
            for seq, new in zip(seqs, batch, strict=True)}
    assert len(history) == len(sent) + 1 >= threads * appends
    assert all(by_seq[seq].body == new.body for seq, new in sent.items())
    for calls in appended:  # one thread's appends come out in its own order
        seqs = [seq for call_seqs, _ in calls for seq in call_seqs]
        assert seqs == sorted(seqs)

    # Swaps landed among the appends: some saw part of them, not none or all.
    raced = [s for _, s in swaps if 1 < s.session.head_seq < len(history)]
    assert len(raced) >= 3, "the swapper never raced the appenders"
    assert_every_summary_saw_what_it_covers(swaps, by_seq)
    assert_projection_shows_the_rest(store, swaps[-1][0], history)


def assert_every_summary_saw_what_it_covers(
    swaps: list[tuple[int, Snapshot]], by_seq: dict[int, MessageRecord]
) -> None:
    """The key check: each message at or below a swap's through_seq and above its parent's
    was in the snapshot that produced it (none committed behind the summary)."""
    previous_through, previous_id = 0, None
    for revision_id, snapshot in swaps:
        assert snapshot.session.active_revision_id == previous_id
        through_seq = snapshot.session.head_seq
        seen = {m.seq: m for m in snapshot.messages}
        for seq in range(previous_through + 1, through_seq + 1):
            assert seq in seen, f"seq {seq} is covered by revision {revision_id} unseen"
            stored = by_seq[seq]
            assert (json.loads(seen[seq].body_json), seen[seq].tokens) == \
                (stored.body, stored.tokens)
        assert set(seen) - set(range(previous_through + 1, through_seq + 1)) == {
            seq for seq in range(1, previous_through + 1)
            if by_seq[seq].role in ("system", "developer")
        }
        previous_through, previous_id = through_seq, revision_id


def assert_projection_shows_the_rest(
    store: Store, last_revision_id: int, history: list[MessageRecord]
) -> None:
    revision = store.revisions("s1")[0]
    kept = [m for m in history if m.seq > revision.through_seq or m.role == "system"]
    covered = [m.body for m in kept if m.seq <= revision.through_seq]
    tail = [m.body for m in kept if m.seq > revision.through_seq]
    assert store.projection("s1") == [*covered, revision.block, *tail]
    state = store.get_session("s1")
    assert state.active_revision_id == last_revision_id
    assert state.total_tokens == sum(m.tokens for m in history)
    assert state.projection_tokens == sum(m.tokens for m in kept) + revision.block_tokens

