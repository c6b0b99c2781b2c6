"""``assign_slots``: the one map of a level's records to the slots of a fixed buffer.

Referees: :func:`simulate`'s peak occupancy (the number of slots), the
records' lifetimes in :func:`io_plan` (no two records alive at once share a
slot) and the table itself (every action on the level names its record's
slot).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.schedules.tables import level0_moves
from vlcc_adjoint.errors import VlccValueError
from vlcc_adjoint.schedules import (
    DELETE,
    LOAD,
    MOVE,
    SAVE,
    Level,
    Multistage,
    Online,
    Periodic,
    Revolve,
    StoreAll,
    assign_slots,
    io_plan,
    simulate,
)
from vlcc_adjoint.schedules._slots import colour_intervals

SCHEDULES = [
    Revolve(1, 1),
    Revolve(57, 5),
    Revolve(300, 12),
    StoreAll(9),
    StoreAll(9, level=1),
    Periodic(23, 4),
    Periodic(20, 5, level=1, buffer_level=0),
    Online(31, snapshots=3),
    Multistage(60, [Level(2, 0.0, 0.0), Level(3, 0.5, 0.5), Level(60, 2.0, 2.0)]),
]


def _lifetimes(plan, level):
    rec = plan.records
    mine = np.flatnonzero(rec["level"] == level)
    return mine, rec["start"][mine], rec["end"][mine]


@pytest.mark.parametrize("schedule", [*SCHEDULES, None], ids=repr)
def test_slots_are_the_peak_and_live_records_never_share_one(schedule):
    schedule = schedule or level0_moves()
    plan = io_plan(schedule)
    stats = simulate(schedule)
    for level in range(plan.n_levels):
        slots = assign_slots(plan, level)
        assert slots.slots == stats.peak_slots[level]
        mine, start, end = _lifetimes(plan, level)
        got = slots.record_slot[mine]
        assert np.all((got >= 0) & (got < max(slots.slots, 1))) or len(mine) == 0
        assert np.all(np.delete(slots.record_slot, mine) == -1)
        # Records alive at the same time hold different slots.
        for a in range(len(mine)):
            overlap = (start < end[a]) & (start[a] < end)
            overlap[a] = False
            assert not np.any(got[overlap] == got[a]), (level, mine[a])


@pytest.mark.parametrize("schedule", [*SCHEDULES, None], ids=repr)
def test_every_action_on_the_level_names_its_records_slot(schedule):
    schedule = schedule or level0_moves()
    plan = io_plan(schedule)
    table = schedule.table
    for level in range(plan.n_levels):
        slots = assign_slots(plan, level)
        held = {}  # step -> slot, replayed from the table
        for r, row in enumerate(table):
            kind, step = int(row["kind"]), int(row["a"])
            into = (kind == SAVE and row["level"] == level) or (
                kind == MOVE and row["dst"] == level
            )
            away = (kind == DELETE and row["level"] == level) or (
                kind == MOVE and row["level"] == level
            )
            if into:
                held[step] = slots.action_slot[r]
                assert held[step] >= 0
            elif kind == LOAD and row["level"] == level:
                assert slots.action_slot[r] == held[step]
            elif away:
                assert slots.action_slot[r] == held.pop(step)
            else:
                assert slots.action_slot[r] == -1


def test_the_colouring_reuses_the_last_freed_slot():
    # Intervals [0,4) [1,3) [2,6) [5,7): when [5,7) starts, [1,3) (slot 1)
    # and then [0,4) (slot 0) have ended; the last freed, slot 0, is reused.
    start = np.array([0, 1, 2, 5])
    end = np.array([4, 3, 6, 7])
    slot = np.empty(4, np.int64)
    used = colour_intervals.python(start, end, np.argsort(end), slot)
    assert used == 3 and list(slot) == [0, 1, 2, 0]


def test_a_level_the_plan_does_not_have_is_refused():
    with pytest.raises(VlccValueError, match="not a level of this plan"):
        assign_slots(io_plan(Revolve(10, 3)), 1)
