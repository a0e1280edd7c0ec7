"""Leases, run records and the breaker, against SQLite and PostgreSQL alike."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from db import BreakerUpdate, LeaseLost, RevisionConflict, SessionNotFound, Store
from tests.integration.test_store import T0, conversation, job_run, summary_revision, swap
from tests.support.store_jobs import swap_in, take_lease

pytestmark = pytest.mark.integration


def test_a_lease_is_exclusive_until_it_expires_or_is_released(store: Store) -> None:
    store.create_session("s1", {}, T0)
    assert take_lease(store, "s1", "a", 60, T0)
    assert not take_lease(store, "s1", "b", 60, T0 + timedelta(seconds=59))
    assert take_lease(store, "s1", "a", 60, T0 + timedelta(seconds=30))  # renewal
    assert not take_lease(store, "s1", "b", 60, T0 + timedelta(seconds=89))
    assert take_lease(store, "s1", "b", 60, T0 + timedelta(seconds=90))  # expired: stolen
    assert store.get_session("s1").lease_owner == "b"
    assert not store.release_lease("s1", "a")
    assert store.release_lease("s1", "b")
    state = store.get_session("s1")
    assert (state.lease_owner, state.lease_expires_at) == (None, None)
    assert take_lease(store, "s1", "a", 60, T0)
    with pytest.raises(SessionNotFound):
        take_lease(store, "nope", "a", 60, T0)


@pytest.mark.parametrize("case", ["expired", "stolen", "released"])
def test_swap_with_a_lost_lease_raises_lease_lost_and_writes_nothing(
    store: Store, case: str
) -> None:
    store.import_session("s1", {}, conversation(6), T0)
    take_lease(store, "s1", "job-a", 60, T0)
    now = T0 + timedelta(seconds=30)
    if case == "expired":
        now = T0 + timedelta(seconds=60)
    elif case == "stolen":
        now = T0 + timedelta(seconds=61)
        assert take_lease(store, "s1", "job-b", 60, now)
    else:
        store.release_lease("s1", "job-a")
    before = store.get_session("s1")
    with pytest.raises(LeaseLost):
        swap(store, "s1", 4, lease_owner="job-a", now=now)
    assert store.get_session("s1") == before
    assert store.revisions("s1") == [] and store.runs() == []


def test_swap_while_holding_the_lease_succeeds(store: Store) -> None:
    store.import_session("s1", {}, conversation(6), T0)
    assert take_lease(store, "s1", "job-a", 60, T0)
    revision_id = swap(store, "s1", 4, lease_owner="job-a", now=T0 + timedelta(seconds=59))
    assert store.get_session("s1").active_revision_id == revision_id


def test_runs_and_breaker_updates_are_recorded_together(store: Store) -> None:
    store.create_session("s1", {}, T0)
    opened = BreakerUpdate(state="open", failures=3, opened_at=T0)
    first = store.record_run(job_run("s1", "failed", at=T0), breaker=opened)
    second = store.record_run(job_run("s1", "skipped", at=T0 + timedelta(minutes=1)))
    store.record_run(job_run("ghost", "rejected"), breaker=opened)  # unknown session

    state = store.get_session("s1")
    assert (state.breaker_state, state.breaker_failures, state.breaker_opened_at) == (
        "open", 3, T0)
    assert [r.id for r in store.runs(session_id="s1")] == [second, first]
    assert [r.session_id for r in store.runs(outcome="rejected")] == ["ghost"]
    assert len(store.runs(limit=2)) == 2
    recorded = store.runs(session_id="s1", outcome="failed")[0]
    assert dataclasses.asdict(recorded) == {"id": first, **dataclasses.asdict(
        job_run("s1", "failed", at=T0))}
    with pytest.raises(ValueError, match="breaker"):
        store.set_breaker("s1", BreakerUpdate(state="ajar", failures=0, opened_at=None))


def test_a_successful_swap_resets_the_breaker_and_a_failed_one_leaves_it(store: Store) -> None:
    store.import_session("s1", {}, conversation(6), T0)
    half_open = BreakerUpdate(state="half_open", failures=3, opened_at=T0)
    store.set_breaker("s1", half_open)
    with pytest.raises(RevisionConflict):
        swap_in(store, "s1", expected_revision_id=12345, now=T0, run=job_run("s1"),
                revision=summary_revision(4, 6))
    assert store.get_session("s1").breaker_state == "half_open"
    swap(store, "s1", 4)
    state = store.get_session("s1")
    assert (state.breaker_state, state.breaker_failures, state.breaker_opened_at) == (
        "closed", 0, None)
    with pytest.raises(SessionNotFound):
        store.set_breaker("nope", half_open)
