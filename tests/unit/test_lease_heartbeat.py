"""The lease heartbeat renews while the block runs, survives a failed renewal, stops
when the lease is lost and when the block ends."""

from __future__ import annotations

import time

from db import StoreUnavailable
from worker.job.heartbeat import LeaseHeartbeat, _Beater
from worker.settings.config import Settings


def test_it_renews_until_the_block_ends_through_a_failed_renewal() -> None:
    calls: list[float] = []

    def renew() -> bool:
        calls.append(time.monotonic())
        if len(calls) == 2:
            raise StoreUnavailable("database down for a moment")
        return True

    with LeaseHeartbeat(renew, 0.05) as heartbeat:
        time.sleep(0.5)
    ended = len(calls)
    time.sleep(0.2)
    assert ended >= 4 and len(calls) == ended
    assert heartbeat.renewals == ended - 1


def test_it_stops_once_another_owner_holds_the_lease() -> None:
    calls: list[bool] = []

    def renew() -> bool:
        calls.append(False)
        return False

    with LeaseHeartbeat(renew, 0.02):
        time.sleep(0.3)
    assert len(calls) == 1


def test_the_default_period_is_a_third_of_the_lease_and_a_longer_one_is_refused() -> None:
    assert Settings(lease_ttl_s=90).effective_lease_heartbeat_s == 30
    try:
        Settings(lease_ttl_s=30, lease_heartbeat_s=20)
    except ValueError as exc:
        assert "lease_heartbeat_s" in str(exc)
    else:
        raise AssertionError("a heartbeat slower than a third of the TTL was accepted")


def test_a_renewal_hung_when_the_block_ends_holds_it_for_one_period_at_most() -> None:
    def renew() -> bool:
        time.sleep(1.0)  # a database that does not answer
        return True

    with LeaseHeartbeat(renew, 0.05):
        time.sleep(0.1)  # the first beat is under way
        ending = time.monotonic()
    assert time.monotonic() - ending < 0.5



def test_a_heartbeat_due_before_the_one_the_thread_waits_for_is_beaten_on_time() -> None:
    # A heartbeat thread of its own (the process's may be held by another test's hung
    # renewal) waits for the long period's first beat; a shorter period added meanwhile
    # wakes it, and its beats come on their own time.
    beater = _Beater()
    slow, fast = LeaseHeartbeat(lambda: True, 30.0), LeaseHeartbeat(lambda: True, 0.05)
    beater.add(slow)
    time.sleep(0.1)  # the thread now waits for the slow one's beat
    beater.add(fast)
    deadline = time.monotonic() + 5
    while fast.renewals < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    beater.remove(fast)
    beater.remove(slow)
    assert (fast.renewals >= 3, slow.renewals) == (True, 0)
