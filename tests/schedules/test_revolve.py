"""Revolve against Griewank's binomial optimum and an independent DP."""

from functools import cache

import numpy as np
import pytest

from vlcc_adjoint.schedules import (
    Advance,
    InvalidScheduleError,
    Reverse,
    Revolve,
    Schedule,
    actions_to_table,
    binomial_forward_count,
)


def test_revolve_forward_count_is_binomial_optimum_for_n_up_to_2000_c_up_to_40():
    for n in range(1, 2001):
        for c in range(1, 41):
            stats = Revolve(n, c).stats()
            assert stats.forward_count == binomial_forward_count(n, c), (n, c)
            assert stats.adjoint_count == n
            assert stats.peak_slots[0] <= c


def test_binomial_forward_count_has_closed_forms_at_the_extremes_even_for_huge_n():
    # One slot: every step i is recomputed from u_0, sum_{i<n} i = n (n - 1) / 2;
    # n - 1 slots or more: each step once, n - 1 (u_n is never advanced from).
    for n in (2, 17, 10**6, 2 * 10**9, 10**15):
        assert binomial_forward_count(n, 1) == n * (n - 1) // 2
    for n in (2, 17, 1000):
        assert binomial_forward_count(n, n - 1) == n - 1
    # c = 2: beta(2, r) = (r + 1)(r + 2) / 2 >= n picks r; t = r n - C(r + 2, 3).
    n = 10**12
    r = next(r for r in range(2 * 10**6) if (r + 1) * (r + 2) // 2 >= n)
    assert binomial_forward_count(n, 2) == r * n - (r + 2) * (r + 1) * r // 6


@cache
def _least_forward_count(l: int, c: int) -> int:
    """Reverse ``l`` steps from a stored base with ``c`` slots (base included),
    minimised over *every* first checkpoint position (Griewank 1992's DP)."""
    if l == 1:
        return 0
    if c == 1:
        return l * (l - 1) // 2
    return min(
        m + _least_forward_count(l - m, c - 1) + _least_forward_count(m, c) for m in range(1, l)
    )


def test_revolve_forward_count_equals_exhaustive_dp_for_n_up_to_60():
    for n in range(1, 61):
        for c in range(1, 12):
            assert Revolve(n, c).stats().forward_count == _least_forward_count(n, c), (n, c)


def test_revolve_ten_million_steps_without_recursion_limits():
    schedule = Revolve(10**7, 100)
    stats = schedule.stats()
    assert stats.forward_count == binomial_forward_count(10**7, 100)
    # Built and replayed from its chunks, never as a whole table.
    assert not schedule.materialised
    assert sum(len(block) for block in schedule.blocks()) == len(schedule) == stats.actions


def test_simulate_rejects_reverse_without_state():
    table = actions_to_table([Advance(0, 1), Reverse(0)])
    with pytest.raises(InvalidScheduleError) as info:
        Schedule(table, 2).stats()
    assert info.value.index == 1
    assert "Reverse(0)" in str(info.value)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "10", None, True])
def test_bad_steps_is_value_error_naming_steps(bad):
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        Revolve(bad, 3)


@pytest.mark.parametrize("bad", [0, -2, 2.5])
def test_bad_snapshots_is_value_error_naming_snapshots(bad):
    with pytest.raises(ValueError, match="snapshots must be an integer >= 1"):
        Revolve(10**7, bad)


def test_table_is_read_only_and_round_trips_to_actions():
    schedule = Revolve(50, 4)
    with pytest.raises(ValueError):
        schedule.table["a"][0] = 3
    again = actions_to_table(list(schedule))
    assert np.array_equal(again, schedule.table)
    assert repr(schedule[0]) == "Save(step=0, level=0)"
