"""The data lifecycle's events: one ``lifecycle.gc`` per collection and one
``lifecycle.delete`` per erase or refusal, ids and counts only."""

from __future__ import annotations

from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from db import GcPolicy, SessionLeased, Store
from tests.integration.test_store import T0, conversation, swap
from tests.support.store_jobs import take_lease
from worker.platform.lifecycle import collect_garbage, delete_session

pytestmark = pytest.mark.integration


def test_a_collection_logs_one_event_with_what_it_removed_and_its_policy(store: Store) -> None:
    store.import_session("s", {}, conversation(6), T0)
    for through_seq in (2, 4):
        swap(store, "s", through_seq)
    policy = GcPolicy(keep_revisions=0, revision_retention_s=0, run_retention_s=3_600,
                      batch_size=10)

    with capture_logs() as logs:
        report = collect_garbage(store, policy, T0 + timedelta(hours=2))

    [event] = logs
    assert (report.revisions, report.runs) == (1, 2)
    assert event["event"] == "lifecycle.gc"
    assert (event["revisions"], event["runs"], event["dry_run"]) == (1, 2, False)
    assert (event["keep_revisions"], event["run_retention_s"]) == (0, 3_600)


def test_a_delete_and_a_refused_one_each_log_one_event(store: Store) -> None:
    store.import_session("s", {}, conversation(4), T0)
    take_lease(store, "s", "worker:task-1", 60, T0)

    with capture_logs() as logs:
        with pytest.raises(SessionLeased):
            delete_session(store, "s", force=False, now=T0)
        delete_session(store, "s", force=True, now=T0)

    refused, deleted = logs
    assert (refused["event"], refused["outcome"], refused["session_id"]) == \
        ("lifecycle.delete", "refused", "s")
    assert (deleted["event"], deleted["outcome"], deleted["forced"]) == \
        ("lifecycle.delete", "deleted", True)
    assert deleted["removed"]["messages"] == 4
    assert deleted["broken_lease_owner"] == "worker:task-1"
