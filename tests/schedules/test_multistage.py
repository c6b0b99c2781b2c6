"""Multistage against an exhaustive search over schedules and a brute-force DP.

Two independent referees:

* ``_exhaustive``: Dijkstra over every machine state reachable with
  ``Advance / Save / Load / Delete / Reverse`` (the rules of
  :mod:`vlcc_adjoint.schedules.actions`), for tiny ``n``: the least predicted
  time of *any* schedule.  It checks the recurrence itself.
* ``_brute_force``: the recurrence of the module docstring with the minimum
  over the split ``m`` taken over every ``m`` (no bounds, no pruning), for
  ``n`` up to a few thousand.  It checks the exactness of the split search.
"""

from __future__ import annotations

import heapq
import itertools
import random

import numba
import numpy as np
import pytest

from vlcc_adjoint.schedules import Level, Multistage


def _exhaustive(n, levels, fwd, adj):
    """Least predicted time over all schedules (Dijkstra on machine states)."""
    L = len(levels)
    slots = [lv.slots for lv in levels]
    start = (0, tuple(frozenset() for _ in range(L)), n - 1)
    dist = {start: 0.0}
    tick = itertools.count()
    heap = [(0.0, next(tick), start)]
    while heap:
        d, _, state = heapq.heappop(heap)
        if d > dist[state]:
            continue
        cur, stored, due = state
        if due < 0:
            return d + n * adj
        nxt = []
        if cur is not None and cur < due:  # u_i beyond the next adjoint is never needed
            nxt.append((fwd, (cur + 1, stored, due)))
        if cur == due:
            # Reverse; states above the next adjoint step are useless: drop them
            kept = tuple(frozenset(i for i in lv if i < due) for lv in stored)
            nxt.append((0.0, (None, kept, due - 1)))
        for k in range(L):
            if cur is not None and cur not in stored[k] and len(stored[k]) < slots[k]:
                lv = list(stored)
                lv[k] = stored[k] | {cur}
                nxt.append((levels[k].write_cost, (cur, tuple(lv), due)))
            for i in stored[k]:
                if i != cur:
                    nxt.append((levels[k].read_cost, (i, stored, due)))
                lv = list(stored)
                lv[k] = stored[k] - {i}
                nxt.append((0.0, (cur, tuple(lv), due)))
        for cost, new in nxt:
            nd = d + cost
            if nd < dist.get(new, np.inf):
                dist[new] = nd
                heapq.heappush(heap, (nd, next(tick), new))
    raise AssertionError("no schedule")


@numba.njit(cache=True)
def _brute_force_table(n, slots, write, read, fwd):
    L = slots.shape[0]
    strides = np.empty(L, np.int64)
    P = 1
    for k in range(L):
        strides[k] = P
        P *= slots[k] + 1
    F = np.zeros((n + 1, L, P))
    B = np.empty((L, P))
    for l in range(2, n + 1):
        for k in range(L):
            for a in range(P):
                best = read[k] * (l - 1) + fwd * l * (l - 1) / 2.0
                for j in range(L):
                    if (a // strides[j]) % (slots[j] + 1) == 0:
                        continue
                    a2 = a - strides[j]
                    for m in range(1, l):
                        v = fwd * m + write[j] + F[l - m, j, a2] + read[k] + F[m, k, a]
                        if v < best:
                            best = v
                B[k, a] = best
        for k in range(L):
            for a in range(P):
                best = B[k, a]
                if (a // strides[k]) % (slots[k] + 1) < slots[k]:
                    for j in range(L):
                        if j != k and (a // strides[j]) % (slots[j] + 1) > 0:
                            best = min(best, write[j] + B[j, a - strides[j] + strides[k]])
                F[l, k, a] = best
    return F, strides


def _brute_force(n, levels, fwd, adj):
    """The recurrence of the module docstring, every split tried."""
    if n == 1:
        return adj
    slots = np.array([lv.slots for lv in levels], np.int64)
    write = np.array([lv.write_cost for lv in levels])
    read = np.array([lv.read_cost for lv in levels])
    F, strides = _brute_force_table(n, slots, write, read, float(fwd))
    full = int(np.sum(slots * strides))
    return min(write[j] + F[n, j, full - strides[j]] for j in range(len(levels))) + n * adj


def _check(n, levels, fwd, adj, expected):
    schedule = Multistage(n, levels, fwd, adj)
    assert schedule.optimal_time == pytest.approx(expected, rel=1e-12, abs=1e-12), (
        n,
        levels,
        fwd,
        adj,
    )
    stats = schedule.stats()
    assert stats.predicted_time == pytest.approx(expected, rel=1e-9), (n, levels, fwd, adj)
    assert all(p <= lv.slots for p, lv in zip(stats.peak_slots, levels))


TINY = [
    ([Level(1), Level(1, 2.0, 3.0)], 1.0, 1.0),
    ([Level(1), Level(2, 1.0, 1.0)], 3.0, 1.0),
    ([Level(2), Level(1, 4.0, 0.5)], 1.0, 0.5),
    ([Level(1, 0.5, 0.5), Level(2, 2.0, 7.0)], 2.0, 1.0),
    ([Level(2, 1.0, 0.0), Level(2, 0.0, 3.0)], 1.5, 0.0),
    ([Level(1), Level(1, 1.0, 1.0), Level(1, 5.0, 5.0)], 1.0, 1.0),
    ([Level(3)], 1.0, 1.0),
    ([Level(2, 3.0, 2.0)], 0.7, 1.0),
]


@pytest.mark.parametrize("levels, fwd, adj", TINY)
def test_multistage_equals_exhaustive_search_over_all_schedules(levels, fwd, adj):
    for n in range(1, 8):
        _check(n, levels, fwd, adj, _exhaustive(n, levels, fwd, adj))


def test_multistage_equals_exhaustive_search_on_random_tiny_hierarchies():
    rng = random.Random(20240601)
    for _ in range(25):
        levels = [
            Level(
                rng.randint(1, 2),
                rng.choice([0.0, 1.0, 2.5, 6.0]),
                rng.choice([0.0, 1.0, 3.0, 4.5]),
            )
            for _ in range(rng.randint(1, 2))
        ]
        fwd = rng.choice([0.5, 1.0, 2.0, 3.0])
        adj = rng.choice([0.0, 1.0])
        n = rng.randint(1, 7)
        _check(n, levels, fwd, adj, _exhaustive(n, levels, fwd, adj))


def test_multistage_equals_brute_force_dp_on_random_hierarchies():
    """Integer, dyadic and arbitrary float costs; up to three levels."""
    rng = random.Random(7)
    for case in range(60):
        L = rng.choice([1, 2, 2, 2, 3])
        kind = case % 3
        levels = []
        for i in range(L):
            if kind == 0:
                w, r = float(rng.randint(0, 12)), float(rng.randint(0, 12))
            elif kind == 1:
                w, r = rng.randint(0, 40) / 4, rng.randint(0, 40) / 4
            else:
                w, r = rng.uniform(0, 15), rng.uniform(0, 15)
            if i == 0 and rng.random() < 0.6:
                w = r = 0.0
            levels.append(Level(rng.randint(1, 5 if L < 3 else 3), w, r))
        fwd = [float(rng.randint(1, 4)), rng.randint(1, 12) / 4, rng.uniform(0.1, 5)][kind]
        adj = rng.choice([0.0, 1.0, 2.5])
        n = rng.choice([rng.randint(1, 40), rng.randint(40, 400)])
        _check(n, levels, fwd, adj, _brute_force(n, levels, fwd, adj))


@pytest.mark.parametrize(
    "n, levels, fwd",
    [
        (1500, [Level(3), Level(4, 10, 10)], 3.0),  # the benchmark configuration A
        (800, [Level(10), Level(20, 5, 5)], 1.0),  # the benchmark configuration B
        (1200, [Level(4), Level(6, 2, 3)], 1.0),
        (700, [Level(2, 0.5, 0.25), Level(3, 3, 1), Level(3, 9, 9)], 2.0),
        (1000, [Level(5), Level(5, 1.3, 2.9)], 0.7),  # costs no power of two divides
    ],
)
def test_multistage_equals_brute_force_dp_at_medium_sizes(n, levels, fwd):
    _check(n, levels, fwd, 1.0, _brute_force(n, levels, fwd, 1.0))


@pytest.mark.parametrize(
    "n, levels, fwd",
    [
        (1200, [Level(3), Level(4, 10, 10)], 3.0),
        (1500, [Level(10), Level(20, 5, 5)], 1.0),
        (4000, [Level(3), Level(6, 5, 5)], 1.0),
        (500, [Level(3, 0.25, 0.75), Level(2, 1.5, 2.5), Level(2, 6, 4)], 1.25),
        (3000, [Level(4), Level(7, 1.3, 2.9)], 0.7),  # no lattice: float costs
    ],
)
def test_every_entry_of_the_cost_table_equals_brute_force(n, levels, fwd):
    """Not only the root: every length and every slot state the split search
    filled, i.e. every search exact (rows of states that hold their base on a
    level with all its slots free are never used and not filled).  These
    sizes reach the periodic cut, the dominance of options and the windows."""
    from vlcc_adjoint.schedules import _multistage as ms

    slots = np.array([lv.slots for lv in levels], np.int64)
    write = np.array([lv.write_cost for lv in levels])
    read = np.array([lv.read_cost for lv in levels])
    ref, strides = _brute_force_table(n, slots, write, read, fwd)
    q = ms._quantum(n, [fwd, *write, *read])
    F = ms._solve(n, slots, write, read, fwd, q / 2, ms.stop_flag())[0]
    L, P = len(levels), ref.shape[2]
    for k in range(L):
        for a in range(P):
            if (a // strides[k]) % (slots[k] + 1) < slots[k]:
                np.testing.assert_allclose(
                    F[k * P + a], ref[:, k, a], rtol=1e-12, atol=0, err_msg=f"state k={k} a={a}"
                )


def test_the_issue_example_is_exactly_optimal():
    """Issue 2: forward cost 3, adjoint cost 1, n = 200, 3 RAM + 4 disk slots,
    disk write/read cost 10: an optimum of 3,000 in checkpoint_schedules'
    makespan, which also counts a taped forward step (cost 3) inside each of
    the 200 adjoint steps (``tests/schedules/cs_referee.py``): 3,000 - 200 * 3 here."""
    schedule = Multistage(200, [Level(3), Level(4, 10, 10)], forward_cost=3, adjoint_cost=1)
    assert schedule.optimal_time == 3000.0 - 200 * 3
    assert schedule.stats().predicted_time == schedule.optimal_time


def test_long_loop_matches_h_revolve_and_is_a_valid_schedule():
    """At n = 2000 on [10 RAM, 20 disk (5, 5)] with equal forward and adjoint
    costs, H-Revolve (Herrmann & Pallez 2020, run through the independent
    ``checkpoint_schedules`` referee) is optimal; Multistage must not cost
    more.  Its makespan omits the ``n`` adjoint steps we count."""
    from cs_referee import cs_hrevolve

    n, levels = 2000, [Level(10), Level(20, 5, 5)]
    schedule = Multistage(n, levels)
    theirs = cs_hrevolve(n, 10, 20, 1.0, 1.0, 5.0, 5.0)["time"]
    assert schedule.optimal_time <= theirs + n * 1.0
    stats = schedule.stats()
    assert stats.predicted_time == schedule.optimal_time
    assert stats.peak_slots[0] <= 10 and stats.peak_slots[1] <= 20


def test_ten_thousand_steps_give_a_valid_schedule_with_the_predicted_cost():
    """The split search at n = 10^4 (where a plain minimum over every split
    is out of reach in a test) still emits a schedule that simulates to its
    own optimum, within the slots, and beats both single-level extremes."""
    n = 10_000
    schedule = Multistage(n, [Level(3), Level(4, 10, 10)], forward_cost=3, adjoint_cost=1)
    stats = schedule.stats()
    assert stats.predicted_time == schedule.optimal_time
    assert stats.peak_slots[0] <= 3 and stats.peak_slots[1] <= 4
    ram_only = Multistage(n, [Level(3)], forward_cost=3, adjoint_cost=1).optimal_time
    assert schedule.optimal_time < ram_only


def test_progress_reports_the_lengths_solved_and_leaves_the_schedule_unchanged():
    """``progress(done, total)`` sees the lengths solved rise to ``total = n``
    (the last call is ``(n, n)``), and watching the solve changes nothing in
    its result."""
    n, levels = 3000, [Level(6), Level(12, 5.0, 5.0)]
    calls = []
    watched = Multistage(n, levels, forward_cost=2, progress=lambda d, t: calls.append((d, t)))
    plain = Multistage(n, levels, forward_cost=2)
    assert calls and calls[-1] == (n, n)
    assert all(total == n and 0 <= done <= n for done, total in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert watched.optimal_time == plain.optimal_time
    np.testing.assert_array_equal(watched.table, plain.table)


def test_an_error_raised_by_progress_stops_the_solve_and_is_raised():
    """A caller's `progress` may cancel a solve: what it raises stops the
    dynamic program (through the kernel's stop flag) and reaches the caller,
    long before the solve would have ended."""
    seen = []

    class Enough(Exception):
        pass

    def cancel(done, total):
        seen.append(done)
        raise Enough(f"stop at {done} of {total}")

    with pytest.raises(Enough, match="stop at"):
        Multistage(20_000, [Level(30), Level(60, 10.0, 10.0)], progress=cancel)
    assert len(seen) == 1 and seen[0] < 20_000
