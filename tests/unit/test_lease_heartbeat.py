"""The lease heartbeat renews while the block runs, survives a failed renewal, stops
when the lease is lost and when the block ends."""

from __future__ import annotations

import time

from db import StoreUnavailable
from worker.heartbeat import LeaseHeartbeat
from worker.settings import Settings


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
