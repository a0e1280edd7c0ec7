"""The breaker's admission rule, stated in Python by the core (``admit``) and in SQL by the
scan (``db/scan.py``) and the job's snapshot (``db/job_snapshot.py``), gives the same
answer on PostgreSQL and SQLite for every state, opening time and clock, the cooldown's
edge included; a snapshot the breaker refuses reads no message."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine

from db import DueCriteria, MessageText, SnapshotSkipRule, Store
from tests.support.scheduling import put_session
from worker.compaction.breaker import Breaker, BreakerState, admit

pytestmark = pytest.mark.integration

T0 = datetime(2025, 6, 1, 2, 0, tzinfo=UTC)
COOLDOWN_S = 3_600
COOLDOWN = timedelta(seconds=COOLDOWN_S)
TICK = timedelta(microseconds=1)
# Every session is over the trigger, quiet, unleased and unqueued: only its breaker
# decides whether the scan may enqueue it.
CRITERIA = DueCriteria(trigger_tokens=1_000, dirty_tokens=500, quiet_period_s=0,
                       breaker_cooldown_s=COOLDOWN_S, marker_ttl_s=7_200)
OPENED_AT: dict[str, datetime | None] = {
    "never": None,
    "cooled-long-ago": T0 - COOLDOWN - timedelta(seconds=1),
    "at-the-edge": T0 - COOLDOWN,
    "a-tick-short": T0 - COOLDOWN + TICK,
    "a-second-short": T0 - COOLDOWN + timedelta(seconds=1),
    "just-now": T0,
}
NOWS = [T0 - TICK, T0, T0 + TICK, T0 + timedelta(seconds=1), T0 + COOLDOWN - TICK]


def breaker_grid() -> dict[str, Breaker]:
    return {f"{state.value}-{label}": Breaker(state, 3, opened_at)
            for state in BreakerState for label, opened_at in OPENED_AT.items()}


@pytest.mark.parametrize("now", NOWS, ids=lambda now: f"T0{(now - T0).total_seconds():+}s")
def test_the_scan_admits_exactly_the_sessions_the_worker_breaker_admits(
    store: Store, engine: Engine, now: datetime
) -> None:
    grid = breaker_grid()
    for session_id, breaker in grid.items():
        put_session(store, engine, session_id, 5_000, now=T0, breaker_state=breaker.state.value,
                    breaker_failures=breaker.failures, breaker_opened_at=breaker.opened_at)

    in_sql = {row.session_id for row in store.iter_due_sessions(CRITERIA, now, page_size=100)}
    in_python = {session_id for session_id, breaker in grid.items()
                 if admit(breaker, now, COOLDOWN_S).allowed}

    assert in_sql == in_python
    # The grid straddles the edge, so both answers occur for an open breaker.
    open_ones = {session_id for session_id in grid if session_id.startswith("open-")}
    assert open_ones & in_python and open_ones - in_python


def unread(text: MessageText) -> int:
    raise AssertionError(f"message {text.seq} was read for a job its breaker refuses")


def kept_seq(text: MessageText) -> int:
    return text.seq


@pytest.mark.parametrize("now", NOWS, ids=lambda now: f"T0{(now - T0).total_seconds():+}s")
@pytest.mark.parametrize("leased", [False, True], ids=["snapshot", "lease-with-snapshot"])
def test_a_job_snapshot_reads_the_messages_exactly_when_the_worker_breaker_admits(
    store: Store, engine: Engine, now: datetime, leased: bool
) -> None:
    grid = breaker_grid()
    for session_id, breaker in grid.items():
        put_session(store, engine, session_id, 5_000, now=T0, breaker_state=breaker.state.value,
                    breaker_failures=breaker.failures, breaker_opened_at=breaker.opened_at)

    for session_id, breaker in grid.items():
        admitted = admit(breaker, now, COOLDOWN_S).allowed
        read = kept_seq if admitted else unread
        skip_rule = SnapshotSkipRule(cooldown_start=now - COOLDOWN)
        snapshot = (store.start_job_with_snapshot(session_id, "w1:task-1", 60, now,
                                                  to_message=read, skip_rule=skip_rule)
                    if leased else store.job_snapshot(session_id, to_message=read,
                                                      skip_rule=skip_rule))

        assert snapshot is not None
        assert snapshot.breaker_refused is not admitted, session_id
        assert not snapshot.under_trigger
        assert (snapshot.messages, snapshot.recent_revisions) == (([1], ()) if admitted
                                                                   else ([], ()))
        assert snapshot.session.breaker_state == breaker.state.value
        assert snapshot.session.lease_owner == ("w1:task-1" if leased else None)
        # Without a cooldown start (the fallback policy) every breaker lets it read.
        assert store.job_snapshot(session_id, to_message=kept_seq).messages == [1]
