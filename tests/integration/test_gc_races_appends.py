"""Session retention in gc racing live appends, on SQLite and PostgreSQL: gc erases only
what is idle at the moment it erases, so an append acknowledged while gc runs is never
lost (an acknowledged append disappears only through an explicit delete)."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from db import GcBatch, GcPolicy, SessionNotFound, Store
from tests.integration.test_store import message

pytestmark = pytest.mark.integration

SESSIONS = 600
APPENDERS = 6
BATCH_SIZE = 5
LEAST_RACED = 400
# gc waits after each batch until this many more appends were acknowledged, so that on
# either database hundreds of appends land while it runs (SQLite serializes them).
APPENDS_PER_BATCH = 5
AIM_BATCHES = 4  # appends aim at gc's current batch and the ones after it
DAY = timedelta(days=1)


@dataclass
class Appends:
    """What the appenders were told was stored, and where gc was at the time."""

    lock: threading.Condition = field(default_factory=threading.Condition)
    acknowledged: list[tuple[str, int, str]] = field(default_factory=list)
    in_gc_batch: int = 0  # acknowledged while gc was working through that session's batch
    refused: int = 0  # SessionNotFound: gc had erased the session first
    gc_after: int = 0  # the keyset cursor of gc's last committed batch
    gc_done: bool = False


def idle_sessions(store: Store, count: int, *, at: datetime) -> list[str]:
    """``count`` sessions of one message each, last appended to at ``at``; their keys
    are 1..count in creation order (the order gc walks them)."""
    ids = [f"idle-{index:05d}" for index in range(count)]
    for session_id in ids:
        store.import_session(session_id, {}, [message("user", f"{session_id} opens")], at)
    return ids


def append_beside_gc(store: Store, ids: list[str], appends: Appends, seed: int) -> None:
    """Append one message at a time to sessions of the batch gc is working through or
    of the next few, until gc is done."""
    rng = random.Random(seed)
    turn = 0
    while not appends.gc_done:
        after = appends.gc_after
        index = min(after + rng.randrange(AIM_BATCHES * BATCH_SIZE), len(ids) - 1)
        session_id, turn = ids[index], turn + 1
        text = f"{session_id} turn {seed}-{turn}"
        try:
            [seq] = store.append_messages(session_id, [message("user", text)],
                                          now=datetime.now(UTC))
        except SessionNotFound:
            with appends.lock:
                appends.refused += 1
            continue
        with appends.lock:
            appends.acknowledged.append((session_id, seq, text))
            appends.in_gc_batch += int(after < index + 1 <= after + BATCH_SIZE)
            appends.lock.notify_all()


def lost_appends(store: Store, acknowledged: list[tuple[str, int, str]]) -> list[str]:
    """The acknowledged appends no longer stored as they were acknowledged."""
    stored: dict[str, dict[int, str] | None] = {}
    lost: list[str] = []
    for session_id, seq, text in acknowledged:
        if session_id not in stored:
            try:
                stored[session_id] = {m.seq: m.body["content"]
                                      for m in store.messages(session_id)}
            except SessionNotFound:
                stored[session_id] = None
        history = stored[session_id]
        if history is None or history.get(seq) != text:
            lost.append(f"{session_id} seq {seq}")
    return lost


def test_gc_racing_hundreds_of_appends_erases_no_acknowledged_one(
    store: Store, database_url: str,
) -> None:
    now = datetime.now(UTC)
    ids = idle_sessions(store, SESSIONS, at=now - 2 * DAY)
    policy = GcPolicy(keep_revisions=1, revision_retention_s=DAY.total_seconds(),
                      run_retention_s=DAY.total_seconds(), batch_size=BATCH_SIZE,
                      session_retention_s=DAY.total_seconds())
    appends = Appends()

    def follow(batch: GcBatch) -> None:
        if batch.table != "sessions" or batch.next_after is None:
            return
        with appends.lock:
            least = len(appends.acknowledged) + APPENDS_PER_BATCH
            appends.gc_after = batch.next_after
            appends.lock.wait_for(lambda: len(appends.acknowledged) >= least, timeout=5)

    threads = [threading.Thread(target=append_beside_gc, args=(store, ids, appends, seed))
               for seed in range(APPENDERS)]
    for thread in threads:
        thread.start()
    try:
        batches = store.collect_garbage(policy, now, on_batch=follow)
    finally:
        appends.gc_done = True
        for thread in threads:
            thread.join(60)

    erased = sum(b.removed for b in batches if b.table == "sessions")
    lost = lost_appends(store, appends.acknowledged)
    print(f"\n{database_url.split(':')[0]}: {len(appends.acknowledged)} appends acknowledged "
          f"while gc ran ({appends.in_gc_batch} into the batch gc was erasing), "
          f"{appends.refused} refused (session already erased), {erased} sessions erased, "
          f"{len(lost)} acknowledged appends erased")
    assert len(appends.acknowledged) >= LEAST_RACED
    assert 0 < erased < SESSIONS
    assert lost == []
    survivors = {s.session_id for s in store.list_sessions(limit=SESSIONS)}
    assert {session_id for session_id, _, _ in appends.acknowledged} <= survivors
    assert len(survivors) == SESSIONS - erased
