"""`compactor gc` and `compactor delete` on both databases: what they remove, what they
print, and the refusal an operator overrides with --force."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from db import Store
from tests.integration.test_store import conversation, swap
from tests.support.cli import Compactor, compactor_for
from tests.support.store_jobs import take_lease

pytestmark = pytest.mark.integration

LONG_AGO = datetime.now(UTC) - timedelta(days=400)


@pytest.fixture
def compactor(database_url: str, tmp_path: Path) -> Compactor:
    return compactor_for(database_url, tmp_path / "data")


def three_revisions(store: Store, session_id: str) -> None:
    """A session with a chain of three revisions made long ago, and their three runs."""
    store.import_session(session_id, {}, conversation(8), LONG_AGO)
    for index in range(3):
        swap(store, session_id, 2 * (index + 1), now=LONG_AGO)


def test_gc_dry_run_counts_and_gc_removes_what_the_retention_allows(
    compactor: Compactor, store: Store,
) -> None:
    three_revisions(store, "s")
    settings = {"COMPACTOR_GC_KEEP_REVISIONS": "1"}
    counted = Compactor({**compactor.env, **settings}).json("gc", "--dry-run")
    assert (counted["sessions"], counted["revisions"], counted["runs"], counted["dry_run"]) == (
        0, 1, 3, True)
    assert len(store.revisions("s")) == 3

    result = Compactor({**compactor.env, **settings})("gc")

    assert result.exit_code == 0, result.output
    assert "removed 0 idle sessions, 1 revisions and 3 runs" in result.stdout
    assert "revisions: 1 in this batch" in result.stderr
    assert len(store.revisions("s")) == 2 and store.runs(session_id="s") == []


def test_delete_says_what_it_removed_and_the_session_is_gone(
    compactor: Compactor, store: Store,
) -> None:
    three_revisions(store, "s")
    result = compactor("delete", "s")

    assert result.exit_code == 0, result.output
    assert ("deleted s: 3 runs, 0 artifacts, 8 messages, 0 parked_jobs, 3 revisions, "
            "1 sessions") in result.stdout
    assert compactor("show", "s").exit_code == 1


def test_delete_is_refused_while_a_job_holds_the_lease_and_forced_deletes(
    compactor: Compactor, store: Store,
) -> None:
    three_revisions(store, "s")
    take_lease(store, "s", "worker-1:task-9", 600, datetime.now(UTC))

    refused = compactor("delete", "s")
    assert refused.exit_code == 4 and "--force" in refused.stderr
    assert store.get_session("s").head_seq == 8

    forced = compactor.json("delete", "s", "--force")
    assert forced["removed"] == {"runs": 3, "artifacts": 0, "messages": 8, "revisions": 3,
                                 "parked_jobs": 0, "sessions": 1}
    assert forced["broken_lease_owner"] == "worker-1:task-9"


def test_delete_of_an_unknown_session_is_a_one_line_error(compactor: Compactor) -> None:
    result = compactor("delete", "never")
    assert result.exit_code == 1 and "unknown session" in result.stderr
