"""The action machine: one loop runs a schedule's rows against a client, in
push mode (every action called) and in pull mode (some kinds handed back to
the caller: reverse communication), with the failing action named."""

import numpy as np
import pytest

from tests.schedules.tables import moves_between_levels
from vlcc_adjoint.errors import VlccError
from vlcc_adjoint.schedules import (
    ADVANCE,
    DELETE,
    LOAD,
    MOVE,
    REVERSE,
    SAVE,
    ActionKind,
    Advance,
    Delete,
    Level,
    Load,
    Machine,
    Move,
    Multistage,
    Reverse,
    Revolve,
    Save,
    Schedule,
    _trace,
    actions_to_table,
    perform,
    table_to_actions,
    table_trace,
)
from vlcc_adjoint.schedules._jit import PythonBudget


class Log:
    """A client that logs every call as the action it stands for."""

    def __init__(self, fail_at=None):
        self.calls = []
        self.fail_at = fail_at

    def _log(self, action):
        if action == self.fail_at:
            raise OSError(f"cannot do {action!r}")
        self.calls.append(action)

    def advance(self, a, b):
        self._log(Advance(a, b))

    def save(self, i, k):
        self._log(Save(i, k))

    def load(self, i, k):
        self._log(Load(i, k))

    def delete(self, i, k):
        self._log(Delete(i, k))

    def move(self, i, k, d):
        self._log(Move(i, k, d))

    def reverse(self, i):
        self._log(Reverse(i))


def _moving_schedule():
    return moves_between_levels()


SCHEDULES = [
    lambda: Revolve(1, 1),
    lambda: Revolve(57, 4),
    lambda: Multistage(40, [Level(2), Level(3, 0.5, 0.5)]),
    _moving_schedule,
]


def test_the_kinds_are_named_once():
    assert [int(k) for k in ActionKind] == [ADVANCE, SAVE, LOAD, DELETE, MOVE, REVERSE]
    assert [k.name for k in ActionKind] == ["ADVANCE", "SAVE", "LOAD", "DELETE", "MOVE", "REVERSE"]
    assert all(type(k) is int for k in (ADVANCE, SAVE, LOAD, DELETE, MOVE, REVERSE))
    assert Save(3, 1).row()[0] == SAVE and type(Save(3, 1).row()[0]) is int


@pytest.mark.parametrize("make", SCHEDULES)
def test_push_mode_calls_the_client_once_per_row_in_table_order(make):
    schedule = make()
    log = Log()
    machine = Machine(schedule, log)
    machine.run()
    assert log.calls == table_to_actions(schedule.table)
    assert machine.index == len(schedule) - 1


@pytest.mark.parametrize("make", SCHEDULES)
def test_pull_mode_hands_back_the_returned_kinds_after_the_rows_before_them(make):
    schedule = make()
    log = Log()
    machine = Machine(schedule, log, returns=(ADVANCE, REVERSE))
    for kind, a, b, level, dst in machine:
        assert kind in (ADVANCE, REVERSE)
        # The caller's turn: every row before this one is done, in order.
        assert machine.index == len(log.calls)
        assert schedule[machine.index] == (Advance(a, b) if kind == ADVANCE else Reverse(a))
        log.calls.append(schedule[machine.index])
    assert log.calls == table_to_actions(schedule.table)


def test_pull_mode_is_an_iterator_that_ends_with_the_schedule():
    schedule = Revolve(5, 2)
    machine = Machine(schedule, Log(), returns=(ADVANCE, REVERSE))
    first = next(machine)
    assert first[0] == ADVANCE
    rest = list(machine)
    assert [kind for kind, *_ in rest].count(REVERSE) == 5
    assert list(machine) == []  # a machine runs its rows once
    with pytest.raises(StopIteration):
        next(machine)


def test_every_kind_can_be_handed_back():
    schedule = _moving_schedule()
    rows = list(Machine(schedule, object(), returns=list(ActionKind)))
    assert [tuple(r) for r in rows] == [tuple(int(x) for x in r) for r in schedule.table]


def test_run_refuses_a_machine_that_hands_rows_back():
    with pytest.raises(VlccError, match="iterate the machine"):
        Machine(Revolve(4, 2), Log(), returns=(REVERSE,)).run()


def test_a_failing_action_is_named_with_its_index():
    schedule = Revolve(30, 3)
    bad = schedule[17]
    machine = Machine(schedule, Log(fail_at=bad))
    with pytest.raises(OSError, match="cannot do"):
        machine.run()
    assert machine.index == 17
    assert machine.action() == bad
    assert machine.describe() == f"action 17 of the schedule: {bad!r}"


def test_describe_before_the_first_row_is_empty():
    machine = Machine(Revolve(4, 2), Log())
    assert machine.index == -1 and machine.action() is None and machine.describe() == ""


def test_a_slice_of_rows_runs_from_start_to_stop():
    schedule = Revolve(40, 3)
    first_reverse = next(i for i, a in enumerate(schedule) if isinstance(a, Reverse))
    head, tail = Log(), Log()
    Machine(schedule, head, stop=first_reverse).run()
    machine = Machine(schedule, tail, start=first_reverse)
    machine.run()
    assert head.calls + tail.calls == table_to_actions(schedule.table)
    assert machine.index == len(schedule) - 1
    with pytest.raises(VlccError, match="start"):
        Machine(schedule, Log(), start=5, stop=4)
    with pytest.raises(VlccError, match="stop"):
        Machine(schedule, Log(), stop=len(schedule) + 1)


def test_blocks_are_bounded_and_progress_counts_every_row(monkeypatch):
    from vlcc_adjoint.schedules import _revolve

    # A schedule that produces its rows in chunks: the machine reads it
    # through blocks() and never builds the whole table.
    monkeypatch.setattr(_revolve, "_python_steps", PythonBudget(0))
    schedule = Revolve(30_000, 6)
    assert not schedule.materialised
    counts = []
    log = Log()
    Machine(schedule, log, block_rows=1000, progress=counts.append).run()
    assert not schedule.materialised
    assert max(counts) <= 1000 and sum(counts) == len(schedule) == len(log.calls)
    assert log.calls[:50] == schedule[:50] and log.calls[-50:] == schedule[-50:]


def test_an_unknown_kind_is_refused_naming_the_row():
    table = actions_to_table([Reverse(0)])
    table.flags.writeable = True
    table["kind"][0] = 9
    machine = Machine(Schedule(table, 1), Log())
    with pytest.raises(VlccError, match="unknown action kind 9"):
        machine.run()
    assert machine.index == 0


def test_a_client_without_a_method_fails_when_its_kind_comes():
    class Forward:
        def advance(self, a, b):
            pass

        save = load = delete = advance

    Machine(Schedule(actions_to_table([Advance(0, 1)]), 1), Forward()).run()  # never reverses
    with pytest.raises(VlccError, match="no reverse\\(\\) method") as info:
        Machine(Revolve(3, 2), Forward()).run()
    assert isinstance(info.value, TypeError)


def test_perform_runs_loose_actions_through_the_same_loop():
    log = Log()
    perform(log, [Save(0, 0), Delete(3, 1), Advance(0, 1)])
    assert log.calls == [Save(0, 0), Delete(3, 1), Advance(0, 1)]
    perform(log, [])
    assert len(log.calls) == 3


def test_table_trace_is_the_machines_recording_checked_against_simulate(monkeypatch):
    schedule = _moving_schedule()
    trace = table_trace(schedule)
    assert trace.reverse_steps.tolist() == [2, 1, 0]
    assert trace.reverse_states.tolist() == [2, 1, 0]  # the state the rules put in hand
    assert trace.forward_steps.tolist() == [0, 1, 0]
    assert trace.reads == (2, 4) and trace.writes == (2, 3)

    real = _trace.simulate

    def miscounting(s):
        stats = real(s)
        return type(stats)(**{**stats.__dict__, "reads": (0, 0)})

    monkeypatch.setattr(_trace, "simulate", miscounting)
    with pytest.raises(VlccError, match="read .* differently"):
        table_trace(schedule)


def test_the_trace_records_the_state_in_hand_not_the_table():
    # The rules' state in hand at Reverse(i) is u_i for any valid table; a
    # recorder that tracks it gives the same steps.
    for make in SCHEDULES:
        trace = table_trace(make())
        assert np.array_equal(trace.reverse_states, trace.reverse_steps)


def test_returns_takes_action_kinds_only():
    with pytest.raises(VlccError, match="not an action kind"):
        Machine(Revolve(4, 2), Log(), returns=(7,))
    machine = Machine(Revolve(4, 2), Log(), returns=(ActionKind.REVERSE,))
    assert machine.returns == {REVERSE}
