"""An import meets a database outage: it stops with the store's transient error instead
of reporting every later record as rejected; a record the database refuses is reported
alone."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from db import StoreError, StoreUnavailable
from tests.support.fake_store import FakeStore
from tests.support.generated import generated_session
from tests.unit.session_strategies import shared_counter
from worker.compaction import IntakePolicy, ProblemKind
from worker.platform.ingest import ImportStatus, import_sessions

NOW = datetime(2026, 11, 22, tzinfo=UTC)


def test_an_unavailable_database_stops_the_import_with_its_error() -> None:
    store = FakeStore()
    store.fail_with("import_session", StoreUnavailable("connection refused"))
    records = [generated_session(f"s{i}", 2) for i in range(3)]

    reports = import_sessions(records, store=store, counter=shared_counter(),
                              policy=IntakePolicy(), now=NOW)

    with pytest.raises(StoreUnavailable, match="connection refused"):
        next(reports)


def test_a_record_the_database_refuses_is_rejected_alone() -> None:
    store = FakeStore()
    store.fail_with("import_session", StoreError("value out of range"))
    [refused] = list(import_sessions([generated_session("s0", 2)], store=store,
                                     counter=shared_counter(), policy=IntakePolicy(),
                                     now=NOW))
    store.fail_with("import_session", None)
    [imported] = list(import_sessions([generated_session("s1", 2)], store=store,
                                      counter=shared_counter(), policy=IntakePolicy(),
                                      now=NOW))

    assert refused.status is ImportStatus.REJECTED
    assert [p.kind for p in refused.problems] == [ProblemKind.STORE_REFUSED]
    assert imported.status is ImportStatus.IMPORTED
