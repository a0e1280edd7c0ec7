"""The breaker's admission rule, stated in Python by the core (``admit``) and in SQL by the
scan (``db/scan.py``), gives the same answer on PostgreSQL and SQLite for every state,
opening time and clock, the cooldown's edge included."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine

from db import DueCriteria, Store
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
