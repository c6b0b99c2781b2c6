"""One semantics, three interpreters: the same tables through ``simulate``
(:func:`table_trace`), the Python executor and the JAX backward pass must
do the same thing.

The solver's state is its own step counter (``u_i = i``), so every forward
step and every adjoint step can check, and record, the state it was given:
a wrong Load, a stale restore or a skipped Advance shows up in the trace.
"""

import numpy as np
import pytest

from vlcc_adjoint.execute import run_adjoint
from vlcc_adjoint.schedules import (
    Level,
    Multistage,
    Online,
    Periodic,
    Revolve,
    StoreAll,
    Trace,
    io_plan,
    table_trace,
)
from vlcc_adjoint.storage import DeviceTier, MemoryTier, TieredStore

SCHEDULES = {
    "revolve-1": lambda: Revolve(9, 1),
    "revolve-3": lambda: Revolve(40, 3),
    "revolve-n": lambda: Revolve(12, 12),
    "store-all": lambda: StoreAll(15),
    "periodic": lambda: Periodic(23, 5),
    "online": lambda: Online(37, snapshots=4),
    "multistage": lambda: Multistage(30, [Level(2), Level(3, 4.0, 4.0)], forward_cost=2.0),
    "multistage-3": lambda: Multistage(25, [Level(1), Level(2, 1.0, 1.0), Level(2, 5.0, 5.0)]),
}


class _CountingSolver:
    """``u_i = [i]``; records every forward step and the state of every
    adjoint step.  Forward steps on a copy (the executor's evaluation of
    ``u_n`` for the objective) are kept apart."""

    def __init__(self):
        self.forward_steps, self.extra_steps = [], []
        self.reverse_steps, self.reverse_states = [], []

    def copy(self, state):
        return {"u": state["u"].copy(), "copy": np.ones(1, bool)}

    def forward(self, state, step):
        assert int(state["u"][0]) == step, f"forward step {step} given u_{int(state['u'][0])}"
        (self.extra_steps if state["copy"][0] else self.forward_steps).append(step)
        return {"u": state["u"] + 1, "copy": state["copy"]}

    def adjoint(self, state, adj, step):
        self.reverse_steps.append(step)
        self.reverse_states.append(int(state["u"][0]))
        return adj


class _CountingStore:
    """A store that counts the executor's calls per level."""

    def __init__(self, store, levels):
        self.store = store
        self.reads, self.writes = [0] * levels, [0] * levels

    def save(self, step, state, level=0):
        self.writes[level] += 1
        self.store.save(step, state, level=level)

    def load(self, step, level=None, out=None):
        self.reads[level] += 1
        return self.store.load(step, level=level, out=out)

    def delete(self, step, level=None):
        self.store.delete(step, level=level)

    def move(self, step, src, dst):
        self.reads[src] += 1
        self.writes[dst] += 1
        self.store.move(step, src, dst)

    def __getattr__(self, name):  # wait, close, stats
        return getattr(self.store, name)


def python_trace(schedule) -> Trace:
    """Run `schedule` through :func:`run_adjoint` and return what it did."""
    solver = _CountingSolver()
    levels = len(schedule.levels)
    store = _CountingStore(
        TieredStore([MemoryTier() for _ in range(levels)], plan=io_plan(schedule)), levels
    )
    u0 = {"u": np.zeros(1, np.int64), "copy": np.zeros(1, bool)}
    run_adjoint(solver, schedule, u0, np.zeros(1), store=store)
    assert solver.extra_steps in ([], [schedule.n_steps - 1])
    return Trace(
        np.array(solver.forward_steps, np.int64),
        np.array(solver.reverse_steps, np.int64),
        tuple(store.reads),
        tuple(store.writes),
        reverse_states=np.array(solver.reverse_states, np.int64),
    )


@pytest.mark.parametrize("name", SCHEDULES)
def test_python_executor_follows_the_table_exactly(name):
    schedule = SCHEDULES[name]()
    python_trace(schedule).assert_equal(table_trace(schedule))


@pytest.mark.parametrize("name", SCHEDULES)
def test_jax_backward_pass_follows_the_table_exactly(name):
    pytest.importorskip("jax")
    from vlcc_adjoint.jax import jax_trace

    schedule = SCHEDULES[name]()
    store = None
    if len(schedule.levels) > 1:
        # Every level in the store, with the schedule's plan: level 0 lives
        # on the device (a DeviceTier follows its actions), levels 1.. in memory.
        host = [MemoryTier() for _ in schedule.levels[1:]]
        store = TieredStore([DeviceTier(), *host], plan=io_plan(schedule))
    expected = table_trace(schedule)
    jax_trace(schedule, store).assert_equal(expected)
    python_trace(schedule).assert_equal(jax_trace(schedule, store))


def test_a_trace_names_the_first_difference():
    schedule = Revolve(10, 2)
    good = table_trace(schedule)
    bad = Trace(good.forward_steps[::-1].copy(), good.reverse_steps, good.reads, good.writes)
    with pytest.raises(AssertionError, match="forward_steps at position 0"):
        bad.assert_equal(good)
