"""The plan clock: where the run is in the schedule's I/O, and what comes next.

A schedule is known before the run starts, so its whole future I/O is too
(:func:`vlcc_adjoint.schedules.io_plan`).  :class:`PlanClock` rebuilds from
an :class:`~vlcc_adjoint.schedules.IOPlan` the sequence of I/O actions in
schedule order (``Save``/``Move`` at each record's start, ``Delete`` at its
end, ``Load`` at each read) and checks every store call against the next
one: a call that diverges raises :class:`PlanMismatchError` naming the
action the plan expected.  The position in that sequence (the *cursor*) and
the schedule action index of the last call (*now*) are the clock that the
read-ahead cache and the job queue order their work by: a record's
priority is the action index of its next read.

All lookups on the hot path are list indexing: the plan's arrays are turned
into Python lists once, and a record's next read is advanced in O(1) from
the per-level ``next_read_of_record`` chains of the plan.  Each planned
action is one integer (:func:`action_code`), so checking a call against the
plan is one comparison.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left

import numpy as np

from ...errors import VlccTypeError, VlccValueError
from .._belady import NEVER
from ._common import DELETE, LOAD, MOVE, SAVE, PlanMismatchError, describe

__all__ = ["PlanClock", "action_code", "plan_ops"]


def action_code(kind, step, level, dst, nlv: int):
    """An I/O action as one integer (or integer array): ``kind`` in the
    lowest 3 bits, then ``dst + 1`` and ``level`` in base ``nlv + 1``, then
    ``step``.  Distinct actions of a store of `nlv` levels have distinct
    codes (``0 <= kind < 8``, ``-1 <= dst < nlv``, ``0 <= level < nlv``)."""
    return ((step * (nlv + 1) + level) * (nlv + 1) + (dst + 1)) * 8 + kind


def plan_ops(plan):
    """The plan's I/O actions in schedule order, rebuilt from its records and
    reads: ``(index, kind, step, level, dst, record)`` arrays."""
    records = plan.records
    m = len(plan.record_of_action)
    kind = np.zeros(m, np.int8)
    step = np.full(m, -1, np.int64)
    level = np.full(m, -1, np.int64)
    dst = np.full(m, -1, np.int64)
    rec = np.full(m, -1, np.int64)
    r = np.arange(len(records))
    start = records["start"]
    kind[start] = SAVE
    step[start] = records["step"]
    level[start] = records["level"]
    rec[start] = r
    moves = np.zeros(m, bool)
    for lv in plan.levels:
        if len(lv) == 0:
            continue
        idx = lv.index
        src_rec = lv.record
        is_move = (kind[idx] == SAVE) & (records["end"][src_rec] == idx)
        mi = idx[is_move]
        moves[mi] = True
        dst[mi] = level[mi]
        level[mi] = lv.level
        kind[mi] = MOVE
        li = idx[~is_move]
        kind[li] = LOAD
        step[li] = lv.step[~is_move]
        level[li] = lv.level
        rec[li] = src_rec[~is_move]
    end = records["end"]
    has_end = end < m
    dels = end[has_end]
    not_move = ~moves[dels]
    di = dels[not_move]
    kind[di] = DELETE
    step[di] = records["step"][has_end][not_move]
    level[di] = records["level"][has_end][not_move]
    rec[di] = r[has_end][not_move]
    sel = np.flatnonzero(kind)
    return sel, kind[sel], step[sel], level[sel], dst[sel], rec[sel]


class PlanClock:
    """The store's position in its plan (or no plan: every call accepted).

    **Arguments:**

    - `plan`: an :class:`~vlcc_adjoint.schedules.IOPlan`, or ``None``.
    - `nlv`: the number of tiers (a plan may not use more levels).
    - `lock`: the engine's lock, held while :meth:`rewind` puts the clock back.
    """

    def __init__(self, plan, nlv: int, lock):
        self.plan = plan
        self.ops = None
        self.nlv = nlv
        self.cursor = 0
        self.now = -1
        self._lock = lock
        if plan is None:
            return
        if hasattr(plan, "make_store") and hasattr(plan, "schedule"):
            raise VlccTypeError(
                "TieredStore(plan=) takes an IOPlan, not the BudgetPlan vlcc_adjoint.plan() "
                "returns; use budget_plan.make_store() (the store its schedule needs), or "
                "TieredStore(tiers, plan=io_plan(budget_plan.schedule))"
            )
        if not all(hasattr(plan, a) for a in ("levels", "records", "record_of_action")):
            raise VlccTypeError(
                f"plan must be an IOPlan, got {type(plan).__name__}; pass "
                "vlcc_adjoint.schedules.io_plan(schedule)"
            )
        if len(plan.levels) > nlv:
            raise VlccValueError(
                f"the plan uses {len(plan.levels)} levels but the store has "
                f"{nlv} tiers; pass one tier per schedule level"
            )
        ops = plan_ops(plan)
        self.ops = ops  # (index, kind, step, level, dst, record) arrays, for messages
        index, kind, step, level, dst, record = ops
        self.codes = action_code(kind.astype(np.int64), step, level, dst, nlv).tolist()
        # A code is linear in the step: the code of a call without a
        # destination (Save, Load, Delete) is ``step * per_step +
        # offsets[kind][level]``, both taken from action_code, so that
        # follow computes it without a call.
        self.per_step = action_code(0, 1, 0, -1, nlv) - action_code(0, 0, 0, -1, nlv)
        self.offsets = [[action_code(k, 0, lv, -1, nlv) for lv in range(nlv)] for k in range(8)]
        self.index = index.tolist()
        self.records = record.tolist()
        # Per record: the position of its first read among its level's
        # reads (-1: never read), looked up once per save, not searched.
        first = plan.records["first_read"]
        q = np.full(len(first), -1, np.int64)
        for lv in plan.levels:
            mine = (plan.records["level"] == lv.level) & (first >= 0)
            q[mine] = np.searchsorted(lv.index, first[mine], side="left")
        self.first_q = q.tolist()
        # Each level's reads as Python lists (indexed once per load) ...
        self.reads = [(lv.index.tolist(), lv.next_read_of_record.tolist()) for lv in plan.levels]
        # ... and the record each read reads (the prefetcher's lookahead).
        self.read_records = [lv.record.tolist() for lv in plan.levels]

    @property
    def levels(self) -> int:
        """The number of storage levels of the plan's schedule (0: no plan)."""
        return 0 if self.plan is None else len(self.plan.levels)

    def mark(self):
        return self.cursor, self.now

    def restart(self) -> None:
        """Back to the plan's first action (lock held by the caller): the
        schedule runs again from its start."""
        self.cursor, self.now = 0, -1

    def rewind(self, mark) -> None:
        """Undo a plan step whose call failed before changing anything."""
        with self._lock:
            self.cursor, self.now = mark

    def follow(self, kind, step, level, dst=-1) -> int:
        """Match a call against the plan's next I/O action; returns the record.
        `step` and `level` are validated by the caller (an int >= 0, and a
        level of the store)."""
        if self.ops is None:
            return -1
        c = self.cursor
        codes = self.codes
        if c >= len(codes):
            call = describe(kind, step, level, dst)
            raise PlanMismatchError(
                f"{call} is past the end of the plan (all {len(codes)} of its I/O actions are "
                "done); construct the store with the io_plan of the schedule being run, or "
                "with plan=None"
            )
        if dst < 0:
            code = step * self.per_step + self.offsets[kind][level]
        else:
            code = action_code(kind, step, level, dst, self.nlv)
        if codes[c] != code:
            index, kinds, steps, levels, dsts, _ = self.ops
            call = describe(kind, step, level, dst)
            want = describe(int(kinds[c]), int(steps[c]), int(levels[c]), int(dsts[c]))
            raise PlanMismatchError(
                f"{call} does not follow the plan: it expected action {int(index[c])}, "
                f"{want}. Call the store in "
                "schedule order with the schedule's levels (one call per Save/Load/Delete/Move), "
                "or construct it without plan="
            )
        self.cursor = c + 1
        # Written by the store's caller alone (its API lock serialises the
        # calls); a worker reads it once per look, under the engine's lock.
        self.now = self.index[c]
        return self.records[c]

    def expected_level(self, step, kind) -> int | None:
        """The level of the next planned action if it is `kind` on `step`."""
        if self.ops is not None:
            c = self.cursor
            _, kinds, steps, levels, _, _ = self.ops
            if c < len(kinds) and kinds[c] == kind and steps[c] == step:
                return int(levels[c])
        return None

    def sync(self, action_index: int) -> bool:
        """Check that no I/O action before `action_index` was skipped and
        advance ``now`` (lock held by the caller).  Returns whether the
        store has a plan."""
        if self.ops is None:
            return False
        index, kind, step, level, dst, _ = self.ops
        c = self.cursor
        if c < len(index) and self.index[c] < action_index:
            raise PlanMismatchError(
                f"sync({action_index}): the plan's action {self.index[c]}, "
                f"{describe(int(kind[c]), int(step[c]), int(level[c]), int(dst[c]))}, was not performed; "
                "call the store for every Save/Load/Delete/Move of the schedule, in order"
            )
        self.now = max(self.now, action_index - 1)
        return True

    # -- a record's reads ---------------------------------------------------------

    def first_read(self, record: int) -> int:
        """The position of `record`'s first read among its level's reads."""
        return self.first_q[record]

    def priority(self, entry) -> int:
        """Action index at which `entry`'s data is next needed (FIFO without a plan)."""
        if self.plan is None:
            return NEVER
        return self.next_use(entry)

    def next_use(self, entry) -> int:
        if entry.read_q < 0:
            return NEVER
        return self.reads[entry.level][0][entry.read_q]

    def advance_read(self, entry) -> int:
        """Lock held: after a read of `entry` at the current action, its next use."""
        if entry.record < 0 or entry.read_q < 0:
            return NEVER
        index, next_read = self.reads[entry.level]
        q = entry.read_q
        if index[q] != self.now:  # resynchronise (defensive)
            q = self.plan.levels[entry.level].position(self.now)
        entry.read_q = next_read[q] if q < len(index) else -1
        return NEVER if entry.read_q < 0 else index[entry.read_q]

    def upcoming_reads(self, levels, lookahead: int):
        """Lock held: ``(action index, record)`` of the next `lookahead`
        reads on `levels`, soonest first (lazy: the caller usually stops
        after one or two)."""
        now = self.now + 1
        streams = []
        for k in levels:
            if k >= len(self.reads):
                continue
            index = self.reads[k][0]
            p = bisect_left(index, now)
            if p < len(index):
                streams.append(
                    zip(index[p : p + lookahead], self.read_records[k][p : p + lookahead])
                )
        if not streams:
            return iter(())
        reads = streams[0] if len(streams) == 1 else heapq.merge(*streams)
        return itertools.islice(reads, lookahead)
