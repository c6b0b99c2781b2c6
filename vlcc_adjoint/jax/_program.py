"""Compile a schedule's action table into a compact program for the JAX loops.

This module is pure numpy/numba (no JAX): it runs at trace time, once per
``checkpointed_scan`` call, and its output is a small integer array that the
compiled backward pass indexes with a loop counter.

Why a program and not the table itself.  The table speaks of *steps*
(``Save(17, 0)``); a device buffer speaks of *slots* (row 3 of a
``(slots, *state.shape)`` array).  And the table is fine-grained: one row per
action, most of them cheap bookkeeping.  A loop iteration per row would pay a
``lax.cond`` per row and let the loop counter, not the work, dominate.  So
the table is replayed here once, symbolically, under the rules of
:mod:`vlcc_adjoint.schedules.actions`, and rewritten as *instructions*: each
one does, in this fixed order, at most

    LOAD slot  ->  ADVANCE a..b  ->  SAVE slot

which is the shape of a schedule's inner loop (``Load(s)``, ``Advance(s,
j)``, ``Save(j)``).  Consecutive actions that fit this order share one
instruction; ``Delete`` only frees a slot and costs nothing at run time;
consecutive ``Advance`` actions merge.  Which slot each record occupies is
:func:`~vlcc_adjoint.schedules.assign_slots` of the schedule's
:func:`~vlcc_adjoint.schedules.io_plan` (the one slot map, shared with the
store's device tier): exactly ``peak_slots[0]`` slots.

``Reverse`` actions are not instructions.  A valid schedule runs the adjoint
steps in the order ``n - 1, ..., 0``, so the backward pass is a loop of
exactly ``n`` iterations, the ``k``-th running the instructions that
prepare adjoint step ``n - 1 - k`` (``bounds[k] .. bounds[k + 1]``) and then
that adjoint step, unconditionally.  (With the adjoint step under a
``lax.cond`` instead, XLA copies the cotangents through the untaken branch
and back into the loop carry on every instruction: measured at 1 MiB of
copies per instruction on the 256^2 wave, more than a step costs.)

The program is split where the forward sweep ends and the backward pass
begins: at the first ``Reverse``, or right after the first ``Advance`` that
reaches ``u_n`` (an :class:`~vlcc_adjoint.schedules.Online` sweep runs to
the end before it knows where the end is).  The forward part runs in the
custom_vjp's forward rule, where it also writes the scan's outputs ``ys``;
the backward part runs in the backward rule.
"""

from __future__ import annotations

import dataclasses

import numba
import numpy as np

from ..errors import VlccRuntimeError, VlccValueError
from ..schedules import (
    ADVANCE,
    DELETE,
    LOAD,
    MOVE,
    REVERSE,
    SAVE,
    IOPlan,
    Schedule,
    assign_slots,
    io_plan,
    simulate,
)

__all__ = ["Program", "compile_program"]

#: Instruction columns (int32): the slot to load into the state in hand
#: (``C_LOAD``, -1: none), the advance range ``[C_A, C_B)`` (equal: none),
#: the slot to save the state in hand into (``C_SAVE``, -1: none); for host
#: instructions (levels >= 1, see below) the host kind (``C_HKIND``, -1:
#: none), the host action's id (``C_HID``) and the device slot (``C_HSLOT``).
#: (Columns, named apart from the action kinds ``LOAD`` and ``SAVE``.)
C_LOAD, C_A, C_B, C_SAVE, C_HKIND, C_HID, C_HSLOT = range(7)
N_FIELDS = 7

#: Host instruction kinds: the state in hand to a host level (``Save(i, k)``),
#: a host level into the state in hand (``Load(i, k)``), a device slot to a
#: host level (``Move(i, 0, k)``), a host level into a device slot
#: (``Move(i, k, 0)``).  Host actions that move no device data (``Delete(i,
#: k)``, ``Move(i, k, j)`` for ``k, j >= 1``) are not instructions: the host
#: runs them, in table order, at its next callback.
H_SAVE, H_LOAD, H_FROM_SLOT, H_TO_SLOT = range(4)

#: How the forward part of a program ends.
SPLIT_AT_REVERSE = 0  # holding u_{n-1}: the forward rule steps once more for u_n
SPLIT_AT_END = 1  # holding u_n: the forward sweep already produced it


@numba.njit(cache=True, nogil=True)
def _emit(out, count, write, f_load, f_a, f_b, f_save, h_kind, h_id, h_slot):
    if write:
        out[count, 0] = f_load
        out[count, 1] = f_a
        out[count, 2] = f_b
        out[count, 3] = f_save
        out[count, 4] = h_kind
        out[count, 5] = h_id
        out[count, 6] = h_slot
    return count + 1


@numba.njit(cache=True, nogil=True)
def _compile(kind, a, b, level, dst, slot, n, host, out, bounds, write):
    """Replay the table and group its actions into instructions.

    ``slot[r]`` is the device slot action ``r`` touches on level 0
    (:func:`~vlcc_adjoint.schedules.assign_slots`).  Writes instructions
    into ``out`` and, for the adjoint step ``n - 1 - k``, ``bounds[k + 1]``
    = the number of instructions that run before it (``bounds[0]`` = where
    the forward sweep ends).  Returns ``(count, split, split_kind,
    host_actions, error_row)``; ``error_row`` is the first action on a level
    other than 0 when ``host`` is false (-1 if none).  When ``write`` is
    false only counts.
    """
    count = 0
    reversed_ = 0
    hid = 0  # host actions so far (their ids, in table order)
    split = -1
    split_kind = SPLIT_AT_REVERSE
    # The instruction being built, and its phase (0 empty, 1 loaded,
    # 2 advanced, 3 saved).
    f_load, f_a, f_b, f_save = -1, 0, 0, -1
    phase = 0
    for r in range(kind.shape[0]):
        k = kind[r]
        on_host = k == MOVE or ((k == SAVE or k == LOAD or k == DELETE) and level[r] != 0)
        if on_host and not host:
            return count, split, split_kind, hid, r
        if on_host:
            # Host work that moves device data is its own instruction, after
            # whatever device instruction is being built.
            moves_data = k == SAVE or k == LOAD or (k == MOVE and (level[r] == 0 or dst[r] == 0))
            if moves_data and phase > 0:
                count = _emit(out, count, write, f_load, f_a, f_b, f_save, -1, -1, -1)
                f_load, f_a, f_b, f_save = -1, 0, 0, -1
                phase = 0
            if k == SAVE:
                count = _emit(out, count, write, -1, 0, 0, -1, H_SAVE, hid, -1)
            elif k == LOAD:
                count = _emit(out, count, write, -1, 0, 0, -1, H_LOAD, hid, -1)
            elif k == MOVE and level[r] == 0:
                count = _emit(out, count, write, -1, 0, 0, -1, H_FROM_SLOT, hid, slot[r])
            elif k == MOVE and dst[r] == 0:
                count = _emit(out, count, write, -1, 0, 0, -1, H_TO_SLOT, hid, slot[r])
            hid += 1
            continue
        # Does this action fit the device instruction being built?
        flush = False
        if k == ADVANCE:
            flush = phase >= 3 or (phase == 2 and f_b != a[r])
        elif k == SAVE:
            flush = phase >= 3
        elif k == LOAD:
            flush = phase >= 1
        elif k == REVERSE:
            flush = True
        if flush and phase > 0:
            count = _emit(out, count, write, f_load, f_a, f_b, f_save, -1, -1, -1)
            f_load, f_a, f_b, f_save = -1, 0, 0, -1
            phase = 0
        if k == ADVANCE:
            if phase != 2:
                f_a = a[r]
            f_b = b[r]
            phase = 2
        elif k == SAVE:
            f_save = slot[r]
            phase = 3
        elif k == LOAD:
            f_load = slot[r]
            phase = 1
        elif k == REVERSE:  # ends the instructions that prepare it
            if split < 0:
                split = count
                split_kind = SPLIT_AT_REVERSE
                if write:
                    bounds[0] = count
            if write:
                bounds[reversed_ + 1] = count
            reversed_ += 1
        # (A Delete only frees its slot, which the slot map already knows.)
        # An Advance that reaches u_n during the forward sweep ends the sweep.
        if k == ADVANCE and split < 0 and b[r] == n:
            count = _emit(out, count, write, f_load, f_a, f_b, f_save, -1, -1, -1)
            f_load, f_a, f_b, f_save = -1, 0, 0, -1
            phase = 0
            split = count
            split_kind = SPLIT_AT_END
            if write:
                bounds[0] = count
    # Whatever follows the last Reverse (at most Deletes) changes nothing on
    # the device; host Deletes there are flushed at the end of the pass.
    return count, split, split_kind, hid, -1


@dataclasses.dataclass(frozen=True)
class Program:
    """A schedule compiled for the JAX interpreter (all numpy, all static).

    **Attributes:**

    - `code`: ``int32[instructions, N_FIELDS]``, columns ``C_LOAD, C_A,
      C_B, C_SAVE, C_HKIND, C_HID, C_HSLOT`` (module docstring).
    - `bounds`: ``int32[n + 1]``.  Instructions ``[0, bounds[0])`` are the
      forward sweep; the ``k``-th iteration of the backward pass runs
      instructions ``[bounds[k], bounds[k + 1])`` and then the adjoint step
      ``n - 1 - k`` (a valid schedule reverses in that order) on the state
      in buffer row ``rev_row[k]``.
    - `split_kind`: ``SPLIT_AT_REVERSE`` (the sweep ends holding
      ``u_{n-1}``) or ``SPLIT_AT_END`` (it ends holding ``u_n``).
    - `rev_row_coded`: see :func:`_reverse_from_buffer`; use :attr:`rev_row`.
    - `slots`: the schedule's level-0 slots (its level-0 peak).
    - `rows`: rows of the device buffer: `slots`, plus one scratch row when
      some adjoint step's state is not in a slot (see
      :func:`_reverse_from_buffer`).
    - `n_steps`: ``n``.
    - `forward_count`: forward steps the program's advances evaluate, the
      schedule's forward count.
    - `host_actions`: the schedule's actions on levels >= 1 (Save, Load,
      Delete, Move), in table order, as rows ``(kind, step, level, dst)``;
      a host instruction's ``C_HID`` indexes this.  Empty for device-only
      schedules.
    - `host_index`: the index in the schedule's table of each host action.
    - `plan`: the schedule's :class:`~vlcc_adjoint.schedules.IOPlan` (its
      level-0 slots are :func:`~vlcc_adjoint.schedules.assign_slots` of it).
    """

    code: np.ndarray
    bounds: np.ndarray
    split_kind: int
    slots: int
    n_steps: int
    forward_count: int
    host_actions: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 4), np.int64))
    rev_row_coded: np.ndarray | None = None
    rows: int = 0
    host_index: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    plan: IOPlan | None = None

    @property
    def rev_row(self) -> np.ndarray:
        """``int32[n]``: the buffer row holding ``u_{n-1-k}`` at adjoint step ``k``."""
        r = self._coded()
        return np.where(r < 0, -1 - r, r).astype(np.int32)

    @property
    def rev_reads(self) -> np.ndarray:
        """``bool[n]``: whether adjoint step ``k``'s read stands for a ``Load``."""
        return np.asarray(self._coded() < 0)

    def _coded(self) -> np.ndarray:
        if self.rev_row_coded is None:
            raise VlccRuntimeError(
                "this Program was built without its reverse rows (rev_row_coded)"
            )
        return self.rev_row_coded

    @property
    def levels(self) -> int:
        """Storage levels the program uses (1: device only)."""
        if len(self.host_actions) == 0:
            return 1
        return int(max(self.host_actions[:, 2].max(), self.host_actions[:, 3].max())) + 1

    @property
    def split(self) -> int:
        return int(self.bounds[0])

    @property
    def forward(self) -> np.ndarray:
        return self.code[: self.split]

    @property
    def backward(self) -> np.ndarray:
        return self.code[self.split :]

    def uses(self, part: np.ndarray, field: int) -> bool:
        """Whether any instruction of `part` uses `field` (static pruning)."""
        if len(part) == 0:
            return False
        if field == C_A:
            return bool(np.any(part[:, C_B] > part[:, C_A]))
        return bool(np.any(part[:, field] >= 0))


def compile_program(schedule: Schedule, host: bool = False) -> Program:
    """Check `schedule` with :func:`simulate` and compile it for the JAX loops.

    **Arguments:** `schedule`; `host`: whether actions on levels >= 1 are
    allowed (they become host instructions; ``checkpointed_scan`` runs them
    through a ``TieredStore``).

    **Raises:** :class:`~vlcc_adjoint.schedules.InvalidScheduleError` for an
    invalid schedule; ``ValueError`` for actions on levels other than 0
    when `host` is false.
    """
    stats = simulate(schedule)
    t = schedule.table
    n = schedule.n_steps
    plan = io_plan(schedule)
    slots = assign_slots(plan, 0)
    args = (
        t["kind"].astype(np.int64),
        t["a"].astype(np.int64),
        t["b"].astype(np.int64),
        t["level"].astype(np.int64),
        t["dst"].astype(np.int64),
        slots.action_slot,
        n,
        host,
    )
    dummy = np.empty((0, N_FIELDS), np.int32)
    count, split, split_kind, nhost, bad = _compile(*args, dummy, np.empty(0, np.int32), False)
    if bad >= 0:
        raise VlccValueError(
            f"{schedule!r} uses storage level {int(max(t['level'][bad], t['dst'][bad]))} "
            f"(action {bad}: {schedule[bad]!r}); the device buffer holds level 0 only. Use a "
            "level-0 schedule (Revolve, StoreAll, Periodic, Online, or Multistage with one "
            "Level), or pass store=TieredStore(...) for the slower levels"
        )
    code = np.empty((count, N_FIELDS), np.int32)
    bounds = np.empty(n + 1, np.int32)
    _compile(*args, code, bounds, True)
    kinds = t["kind"]
    on_host = (kinds == MOVE) | (np.isin(kinds, [SAVE, LOAD, DELETE]) & (t["level"] != 0))
    host_index = np.flatnonzero(on_host).astype(np.int64)
    rows = t[on_host]
    host_actions = (
        np.stack(
            [
                rows["kind"].astype(np.int64),
                rows["a"],
                rows["level"].astype(np.int64),
                rows["dst"].astype(np.int64),
            ],
            axis=1,
        )
        if len(rows)
        else np.zeros((0, 4), np.int64)
    )
    assert len(host_actions) == nhost
    forward = int(np.sum(code[:, C_B] - code[:, C_A]))
    assert forward == stats.forward_count, (forward, stats.forward_count)
    assert slots.slots == (stats.peak_slots[0] if stats.peak_slots else 0), (
        slots.slots,
        stats.peak_slots,
    )
    assert split >= 0 and np.all(np.diff(bounds) >= 0)
    code, bounds, rev_row, rows = _reverse_from_buffer(code, bounds, slots.slots, n)
    for a in (code, bounds, rev_row, host_actions, host_index):
        a.flags.writeable = False
    return Program(
        code,
        bounds,
        int(split_kind),
        slots.slots,
        n,
        forward,
        host_actions,
        rev_row,
        rows,
        host_index,
        plan,
    )


def _reverse_from_buffer(code, bounds, slots, n):
    """Make every adjoint step read its state from a buffer row.

    The adjoint step's VJP then reads ``buf[row]`` directly (XLA fuses the
    slice into the VJP's kernels) instead of a copy in the loop carry.  Per
    adjoint step, in order of preference:

    * the instructions end with a pure ``Load(i)``: drop it, read slot
      ``i``'s row (the typical ``Load(i), Delete(i), Reverse(i)``: one
      state copy saved per step);
    * they end with a device instruction that saves the state in hand:
      read that slot;
    * otherwise (the state in hand comes from an advance or a host load):
      save it into a scratch row ``slots`` and read that.

    Returns ``(code, bounds, rev_row, rows)``; ``rows`` is the buffer's
    height, ``slots`` or ``slots + 1`` with the scratch row.  ``rev_row[k]``
    is negative, ``-1 - row``, where the adjoint step's read replaced a
    dropped ``Load`` (so that a recording interpreter can count the Load).
    """
    scratch = slots
    out = [code[: bounds[0]]]
    new_bounds = np.empty(n + 1, np.int32)
    rev_row = np.empty(n, np.int32)
    used_scratch = False
    save_scratch = np.array([[-1, 0, 0, scratch, -1, -1, -1]], np.int32)
    for k in range(n):
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        part = code[lo:hi].copy()
        if k == 0 and lo == hi:
            # The state in hand is where the forward sweep ended: the sweep
            # itself puts it into a row.
            last = out[0][-1] if len(out[0]) else None
            if last is not None and last[C_HKIND] < 0 and last[C_SAVE] >= 0:
                rev_row[0] = last[C_SAVE]
            elif last is not None and last[C_HKIND] < 0 and last[C_SAVE] < 0:
                out[0] = out[0].copy()
                out[0][-1, C_SAVE] = scratch
                rev_row[0], used_scratch = scratch, True
            else:
                out[0] = np.concatenate([out[0], save_scratch])
                rev_row[0], used_scratch = scratch, True
            new_bounds[0] = len(out[0])
            new_bounds[1] = new_bounds[0]
            continue
        if k == 0:
            new_bounds[0] = len(out[0])
        last = part[-1]
        if last[C_HKIND] < 0 and last[C_LOAD] >= 0 and last[C_B] == last[C_A] and last[C_SAVE] < 0:
            rev_row[k] = -1 - last[C_LOAD]
            part = part[:-1]
        elif last[C_HKIND] < 0 and last[C_SAVE] >= 0:
            rev_row[k] = last[C_SAVE]
        elif last[C_HKIND] < 0:
            part[-1, C_SAVE] = scratch
            rev_row[k], used_scratch = scratch, True
        else:
            part = np.concatenate([part, save_scratch])
            rev_row[k], used_scratch = scratch, True
        out.append(part)
        new_bounds[k + 1] = new_bounds[k] + len(part)
    code = np.ascontiguousarray(np.concatenate(out), np.int32).reshape(-1, N_FIELDS)
    return code, new_bounds, rev_row, slots + (1 if used_scratch else 0)
