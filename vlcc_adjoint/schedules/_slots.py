"""Slot assignment: which slot of a storage level holds each of its records.

A schedule says how many records a level holds at once (its peak,
``simulate(schedule).peak_slots[k]``), not where.  A consumer that keeps a
level in a fixed buffer of slots (the rows of JAX's device buffer, the
store's device-slot tier for level 0, a C solver's registered regions)
must also map each record to one slot, so that no two records alive at the
same time share it.  This module is that map, written once: the JAX
program compiles its rows from it and the device tier reports it, so the
two can never disagree.

The records of a level are intervals of action indices, ``[start, end)``
from the ``Save`` (or ``Move`` into the level) to the ``Delete`` (or
``Move`` away), read from :attr:`IOPlan.records`.  Two records conflict
when their intervals overlap; assigning slots is colouring this interval
graph.  Taking the intervals in order of their start and giving each a
slot that is free at its start (the most recently freed one: a LIFO free
list, so a freed slot is reused while it is warm in a cache) uses exactly
as many slots as the most intervals that overlap at one point, the level's
peak: when an interval starts, the slots in use belong to intervals that
contain its start, at most ``peak - 1`` of them (interval graphs are
perfect; Golumbic, *Algorithmic Graph Theory and Perfect Graphs*, 2nd ed.,
Elsevier 2004, Ch. 8).

The scan is one numba kernel (:func:`colour_intervals`), run as its own
Python function for short plans (:mod:`._jit`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import VlccValueError
from ._io_plan import IOPlan
from ._jit import PythonBudget, njit

__all__ = ["SlotMap", "assign_slots", "colour_intervals"]


@dataclasses.dataclass(frozen=True)
class SlotMap:
    """Which slot of one storage level each record and action uses.

    **Attributes:**

    - `level`: the storage level.
    - `slots`: the number of slots the level needs (its peak occupancy).
    - `record_slot`: ``int64[records]``, for each row of
      :attr:`IOPlan.records` its slot on `level`, ``-1`` for records on
      other levels.
    - `action_slot`: ``int64[len(schedule)]``, for each action its slot on
      `level`: the slot a ``Save`` or a ``Move`` into the level writes, a
      ``Load`` reads, a ``Delete`` frees or a ``Move`` away reads and frees;
      ``-1`` for actions that do not touch a slot of `level`.
    """

    level: int
    slots: int
    record_slot: np.ndarray
    action_slot: np.ndarray


@njit(cache=True, nogil=True)
def colour_intervals(start, end, by_end, slot):
    """Give each interval ``[start[r], end[r])`` a slot (written to
    ``slot[r]``) that no overlapping interval holds, in order of `start`
    (sorted ascending), with a LIFO list of freed slots; `by_end` lists the
    intervals sorted by `end`.  Returns the number of slots used."""
    count = len(start)
    free = np.empty(count, np.int64)
    nfree = 0
    used = 0
    j = 0
    for r in range(count):
        s = start[r]
        while j < count and end[by_end[j]] <= s:
            free[nfree] = slot[by_end[j]]
            nfree += 1
            j += 1
        if nfree > 0:
            nfree -= 1
            slot[r] = free[nfree]
        else:
            slot[r] = used
            used += 1
    return used


#: Ski rental between the two runs of :func:`colour_intervals` (as for
#: :func:`.io_plan`'s scan): records coloured by its Python function per
#: process before the compiled kernel takes over.
_python_records = PythonBudget(100_000)


def assign_slots(plan: IOPlan, level: int = 0) -> SlotMap:
    """The slot of each record and action of `plan` on `level` (module docstring).

    **Arguments:**

    - `plan`: the schedule's :class:`IOPlan` (``io_plan(schedule)``).
    - `level`: the storage level (default 0, the fastest).

    **Returns:** a :class:`SlotMap` whose `slots` equals the schedule's
    ``peak_slots[level]``.
    """
    if not 0 <= int(level) < plan.n_levels:
        raise VlccValueError(
            f"level {level} is not a level of this plan ({plan.n_levels} levels, 0 .. "
            f"{plan.n_levels - 1})"
        )
    level = int(level)
    records = plan.records
    mine = np.flatnonzero(records["level"] == level)
    start = np.ascontiguousarray(records["start"][mine])  # ascending: records in write order
    end = np.ascontiguousarray(records["end"][mine])
    by_end = np.argsort(end, kind="stable").astype(np.int64)
    slot = np.empty(len(mine), np.int64)
    if _python_records.take(len(mine), colour_intervals):
        slots = colour_intervals.python(start, end, by_end, slot)
    else:
        slots = colour_intervals(start, end, by_end, slot)
    record_slot = np.full(len(records), -1, np.int64)
    record_slot[mine] = slot
    m = len(plan.record_of_action)
    action_slot = np.full(m, -1, np.int64)
    action_slot[start] = slot  # the Save, or the Move into the level
    ended = end < m
    action_slot[end[ended]] = slot[ended]  # the Delete, or the Move away
    reads = plan.levels[level]
    action_slot[reads.index] = record_slot[reads.record]  # the Loads
    for a in (record_slot, action_slot):
        a.flags.writeable = False
    return SlotMap(level, int(slots), record_slot, action_slot)
