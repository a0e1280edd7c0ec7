"""The breaker's transitions, table-driven and under random event sequences."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.compaction.breaker import (
    Admission,
    Breaker,
    BreakerState,
    admit,
    breaker_after_failure,
    breaker_after_stray_failure,
    breaker_after_success,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
COOLDOWN_S = 60
TRIAL_S = 195  # longer than a cooldown, as one LLM call's worst case is by default
CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("before", "threshold", "after"),
    [
        (Breaker(), 3, Breaker(CLOSED, 1, None)),
        (Breaker(CLOSED, 1, None), 3, Breaker(CLOSED, 2, None)),
        (Breaker(CLOSED, 2, None), 3, Breaker(OPEN, 3, at(10))),
        (Breaker(), 1, Breaker(OPEN, 1, at(10))),
        (Breaker(HALF_OPEN, 3, at(0)), 3, Breaker(OPEN, 4, at(10))),
        (Breaker(HALF_OPEN, 3, at(0)), 100, Breaker(OPEN, 4, at(10))),
        (Breaker(OPEN, 3, at(0)), 3, Breaker(OPEN, 4, at(10))),
    ],
)
def test_a_failure_counts_and_opens_at_the_threshold(
    before: Breaker, threshold: int, after: Breaker
) -> None:
    assert breaker_after_failure(before, at(10), threshold) == after


@pytest.mark.parametrize(
    "before",
    [Breaker(), Breaker(CLOSED, 2, None), Breaker(HALF_OPEN, 5, at(0)), Breaker(OPEN, 5, at(0))],
)
def test_a_success_closes_and_resets(before: Breaker) -> None:
    assert breaker_after_success(before) == Breaker(CLOSED, 0, None)


@pytest.mark.parametrize(
    ("before", "now_s", "expected"),
    [
        (Breaker(CLOSED, 2, None), 0, Admission(True, Breaker(CLOSED, 2, None))),
        (Breaker(OPEN, 3, at(0)), 59, Admission(False, Breaker(OPEN, 3, at(0)))),
        (Breaker(OPEN, 3, at(0)), 60, Admission(True, Breaker(HALF_OPEN, 3, at(60)))),
        (Breaker(HALF_OPEN, 3, at(60)), 61, Admission(False, Breaker(HALF_OPEN, 3, at(60)))),
        (Breaker(HALF_OPEN, 3, at(60)), 120, Admission(True, Breaker(HALF_OPEN, 3, at(120)))),
        (Breaker(OPEN, 3, None), 0, Admission(True, Breaker(HALF_OPEN, 3, at(0)))),
    ],
)
def test_admission_lets_one_trial_through_after_the_cooldown(
    before: Breaker, now_s: float, expected: Admission
) -> None:
    assert admit(before, at(now_s), COOLDOWN_S) == expected


@pytest.mark.parametrize(
    ("before", "now_s", "expected"),
    [
        (Breaker(OPEN, 3, at(0)), 60, Admission(True, Breaker(HALF_OPEN, 3, at(60)))),
        (Breaker(HALF_OPEN, 3, at(60)), 120, Admission(False, Breaker(HALF_OPEN, 3, at(60)))),
        (Breaker(HALF_OPEN, 3, at(60)), 254, Admission(False, Breaker(HALF_OPEN, 3, at(60)))),
        (Breaker(HALF_OPEN, 3, at(60)), 255, Admission(True, Breaker(HALF_OPEN, 3, at(255)))),
    ],
)
def test_a_trial_holds_the_half_open_breaker_for_its_longest_run_not_a_cooldown(
    before: Breaker, now_s: float, expected: Admission
) -> None:
    assert admit(before, at(now_s), COOLDOWN_S, trial_s=TRIAL_S) == expected


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (Breaker(HALF_OPEN, 5, at(0)), Breaker(HALF_OPEN, 6, at(0))),
        (Breaker(OPEN, 5, at(0)), Breaker(OPEN, 6, at(10))),
        (Breaker(CLOSED, 4, None), Breaker(OPEN, 5, at(10))),
    ],
)
def test_a_stray_failure_counts_but_leaves_a_trial_its_hold(before: Breaker,
                                                           after: Breaker) -> None:
    assert breaker_after_stray_failure(before, at(10), 5) == after


def test_a_zero_cooldown_half_opens_at_once() -> None:
    assert admit(Breaker(OPEN, 3, at(0)), at(0), 0).allowed


def test_a_threshold_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        breaker_after_failure(Breaker(), T0, 0)


def test_the_full_cycle_closed_open_half_open_open_half_open_closed() -> None:
    breaker = Breaker()
    for second in range(3):
        assert admit(breaker, at(second), COOLDOWN_S).allowed
        breaker = breaker_after_failure(breaker, at(second), 3)
    assert breaker.state is OPEN
    assert not admit(breaker, at(30), COOLDOWN_S).allowed
    trial = admit(breaker, at(62), COOLDOWN_S)
    assert trial.allowed and trial.breaker.state is HALF_OPEN
    breaker = breaker_after_failure(trial.breaker, at(63), 3)
    assert (breaker.state, breaker.opened_at) == (OPEN, at(63))
    trial = admit(breaker, at(123), COOLDOWN_S)
    assert trial.allowed
    assert breaker_after_success(trial.breaker) == Breaker()


EVENTS = st.lists(
    st.tuples(st.sampled_from(["admit", "fail", "succeed"]), st.integers(0, 90)), max_size=40
)


@given(EVENTS, st.integers(1, 5))
def test_random_event_sequences_keep_the_breaker_consistent(
    events: list[tuple[str, int]], threshold: int
) -> None:
    breaker, now = Breaker(), T0
    for kind, step_s in events:
        now += timedelta(seconds=step_s)
        if kind == "admit":
            admission = admit(breaker, now, COOLDOWN_S)
            if breaker.state is CLOSED:
                assert admission == Admission(True, breaker)
            elif admission.allowed:
                assert admission.breaker.state is HALF_OPEN
                assert breaker.opened_at is not None
                assert now - breaker.opened_at >= timedelta(seconds=COOLDOWN_S)
            breaker = admission.breaker
        elif kind == "fail":
            previous = breaker
            breaker = breaker_after_failure(breaker, now, threshold)
            assert breaker.failures == previous.failures + 1
            assert (breaker.state is OPEN) is (
                previous.state is not CLOSED or breaker.failures >= threshold)
        else:
            breaker = breaker_after_success(breaker)
        assert (breaker.state is CLOSED) is (breaker.opened_at is None)
        assert breaker.state is not CLOSED or breaker.failures < threshold
