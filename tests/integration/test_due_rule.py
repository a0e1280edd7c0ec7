"""The due rule by size, stated in Python (``scheduler.selection.due_why``) and in SQL by
the scan (``db/scan.py``), gives the same answer on PostgreSQL and SQLite for every
projection, growth since the last compaction and history, the thresholds' edges included:
a session never compacted is due only over the trigger."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine

from db import DueWhy, Store
from scheduler.selection import ScanPolicy, due_why
from tests.support.scheduling import put_session

pytestmark = pytest.mark.integration

NOW = datetime(2025, 6, 1, 2, 0, tzinfo=UTC)
# Every session is quiet, unleased, unqueued and its breaker closed: only its size decides.
POLICY = ScanPolicy(trigger_tokens=1_000, dirty_ratio=0.5, tail_budget_tokens=0,
                    quiet_period_s=600, breaker_cooldown_s=3_600, marker_ttl_s=7_200,
                    batch_size=7, max_jobs=1_000)
PROJECTIONS = [1, 499, 500, 501, 999, 1_000, 1_001, 5_000]
SINCE = [0, 499, 500, 501, 1_000, 1_001]


def test_the_scan_finds_exactly_the_sessions_the_python_rule_calls_due(
    store: Store, engine: Engine
) -> None:
    grid = {f"p{projection}-s{since}-{'compacted' if compacted else 'never'}":
            (projection, since, compacted)
            for projection in PROJECTIONS for since in SINCE for compacted in (True, False)}
    for session_id, (projection, since, compacted) in grid.items():
        put_session(store, engine, session_id, projection, now=NOW, since_tokens=since,
                    compacted=compacted)

    in_sql = {row.session_id: row.why
              for row in store.iter_due_sessions(POLICY.criteria, NOW, page_size=7)}
    in_python = {session_id: why for session_id, (projection, since, compacted) in grid.items()
                 if (why := due_why(projection, since, compacted=compacted, policy=POLICY))}

    assert in_sql == in_python
    # The grid straddles every edge: both tiers occur, and growth alone never makes a
    # session never compacted due.
    assert {DueWhy.OVER_TRIGGER, DueWhy.DIRTY} == set(in_python.values())
    assert not any(why is DueWhy.DIRTY and session_id.endswith("never")
                   for session_id, why in in_python.items())
    assert "p999-s1000-never" not in in_sql and "p999-s1000-compacted" in in_sql
