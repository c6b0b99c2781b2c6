"""Every schedule class is valid under simulate, for randomised parameters."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlcc_adjoint.schedules import (
    ActionKind,
    Advance,
    Level,
    Multistage,
    Online,
    Periodic,
    Revolve,
    StoreAll,
    actions_to_table,
    binomial_forward_count,
    io_plan,
)

SETTINGS = settings(max_examples=40, deadline=None)


def _check_valid(schedule, slots=None):
    stats = schedule.stats()  # raises InvalidScheduleError on any violation
    assert stats.adjoint_count == schedule.n_steps
    assert stats.forward_count >= schedule.n_steps - 1
    if slots is not None:
        assert all(p <= s for p, s in zip(stats.peak_slots, slots))
    assert np.array_equal(actions_to_table(list(schedule)), schedule.table)
    return stats


@SETTINGS
@given(n=st.integers(1, 3000), c=st.integers(1, 60))
def test_revolve_is_valid_and_binomial_for_random_sizes(n, c):
    stats = _check_valid(Revolve(n, c), [c])
    assert stats.forward_count == binomial_forward_count(n, c)


@SETTINGS
@given(
    n=st.integers(1, 120),
    levels=st.lists(
        st.tuples(st.integers(1, 4), st.floats(0, 20), st.floats(0, 20)), min_size=1, max_size=3
    ),
    fwd=st.floats(0.1, 5),
    adj=st.floats(0, 5),
)
def test_multistage_is_valid_for_random_hierarchies(n, levels, fwd, adj):
    levels = [Level(s, w, r) for s, w, r in levels]
    schedule = Multistage(n, levels, fwd, adj)
    stats = _check_valid(schedule, [lv.slots for lv in levels])
    assert stats.predicted_time == pytest.approx(schedule.optimal_time, rel=1e-9)


@SETTINGS
@given(n=st.integers(1, 5000), c=st.integers(1, 60))
def test_online_is_valid_and_within_its_repetition_bound(n, c):
    schedule = Online(n, snapshots=c)
    stats = _check_valid(schedule, [c])
    assert stats.forward_count <= schedule.forward_bound(n)


@SETTINGS
@given(
    n=st.integers(1, 2000),
    every=st.integers(1, 300),
    level=st.integers(0, 2),
    buffer=st.integers(0, 2),
)
def test_periodic_is_valid_with_its_closed_form_cost(n, every, level, buffer):
    schedule = Periodic(n, every, level=level, buffer_level=buffer)
    stats = _check_valid(schedule)
    k = min(every, n)
    q = -(-n // k)
    assert stats.forward_count == (n - 1) + (q - 1) * (k - 1)
    if level != buffer:
        assert stats.peak_slots[level] == q
        # a segment stores its interior states but the last, which is in hand
        assert stats.peak_slots[buffer] == max(k - 2, 0)


@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000])
def test_store_all_recomputes_nothing(n):
    stats = _check_valid(StoreAll(n))
    assert stats.forward_count == n - 1
    assert stats.peak_slots == (max(n - 1, 1),)


def test_online_forward_sweep_is_the_same_whatever_the_stop():
    """The decisions at u_i depend on i alone: the forward part of the
    schedule that stops at n is what capture() decided step by step."""
    for c in (1, 2, 3, 8, 25):
        online = Online(snapshots=c)
        decided = []
        for n in range(1, 400):
            decided.extend(online.capture(n - 1))
            stopped = Online(n, snapshots=c)
            forward = [a for a in stopped[: stopped.reverse_start] if not isinstance(a, Advance)]
            assert forward == decided, (c, n)
        assert online.stop(399).table.shape == Online(399, snapshots=c).table.shape


def test_online_without_steps_has_no_table_and_says_what_to_do():
    with pytest.raises(AttributeError, match="stop"):
        Online(snapshots=5).table
    online = Online(snapshots=5)
    online.capture(0)
    with pytest.raises(ValueError, match="in order"):
        online.capture(2)


def test_online_costs_close_to_the_offline_optimum_at_scale():
    n, c = 10**6, 100
    stats = Online(n, snapshots=c).stats()
    # the bound of the module docstring, and the measured gap to Revolve
    assert stats.forward_count <= Online(snapshots=c).forward_bound(n)
    assert stats.forward_count <= 1.1 * binomial_forward_count(n, c)


@pytest.mark.parametrize(
    "schedule",
    [
        Revolve(300, 7),
        Multistage(150, [Level(2), Level(3, 4, 4)], forward_cost=2),
        Online(500, snapshots=6),
        Periodic(100, 9, level=1, buffer_level=0),
    ],
)
def test_io_plan_lists_every_read_in_order_with_record_lifetimes(schedule):
    stats = schedule.stats()
    plan = io_plan(schedule)
    t = schedule.table
    for lv, reads in enumerate(plan.levels):
        assert len(reads) == stats.reads[lv]
        assert np.all(np.diff(reads.index) > 0)
        rows = t[reads.index]
        assert np.all(rows["a"] == reads.step)
        is_read = (rows["kind"] == ActionKind.LOAD) | (rows["kind"] == ActionKind.MOVE)
        assert is_read.all() and np.all(rows["level"] == lv)
        # Following the chain from a record's first read visits all its reads.
        for r in np.unique(reads.record)[:50]:
            rec = plan.records[r]
            q = reads.position(int(rec["first_read"]))
            seen = []
            while q >= 0:
                seen.append(int(reads.index[q]))
                q = reads.next_read_of_record[q]
            assert seen == list(reads.index[reads.record == r])
            assert seen[-1] == rec["last_read"] and len(seen) == rec["reads"]
            assert rec["start"] < seen[0] and seen[-1] <= rec["end"]
            assert plan.next_use(r, seen[0] + 1) == (seen[1] if len(seen) > 1 else -1)
    for lv in range(len(plan.levels)):
        assert np.count_nonzero(plan.records["level"] == lv) == stats.writes[lv]


def test_next_reads_returns_the_next_k_in_order():
    schedule = Revolve(1000, 10)
    reads = io_plan(schedule).levels[0]
    after = int(reads.index[100]) - 1
    index, step = reads.next_reads(after, 5)
    assert list(index) == list(reads.index[100:105])
    assert all(schedule[int(i)].step == s for i, s in zip(index, step))


def test_online_takes_steps_first_and_the_old_order_warns():
    new = Online(40, snapshots=4)
    assert (new.n_steps, new.snapshots) == (40, 4)
    for old in (lambda: Online(4, 40), lambda: Online(4, steps=40)):
        with pytest.warns(DeprecationWarning, match=r"write Online\(40, snapshots=4\)"):
            schedule = old()
        assert np.array_equal(schedule.table, new.table)
    with pytest.warns(DeprecationWarning, match=r"write Online\(snapshots=4\)"):
        assert Online(4).n_steps is None
    assert Online(snapshots=4).n_steps is None
    with pytest.raises(TypeError, match="needs snapshots"):
        Online()
    with pytest.raises(TypeError, match="give steps once"):
        Online(40, 50, snapshots=4)
