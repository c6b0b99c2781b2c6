"""Symbolic replay of a schedule: validation and statistics.

One pass over the table in a numba kernel, following the rules of
:mod:`vlcc_adjoint.schedules.actions` exactly; each stored step carries a
bit mask of the levels that hold it, so a replay costs ``O(len(table) +
n)`` time and ``n + 1`` bytes of state, whatever the number of slots.  The
replay reads the schedule chunk by chunk (:meth:`Schedule.chunk`) with its
state carried across, so a schedule that produces its rows in chunks is
checked without its table.
Short tables are replayed by a plain-Python twin of the kernel, so a small
schedule never waits for numba to load (:mod:`._jit`); the tests check that
both give the same result on valid and broken tables.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import VlccError, VlccTypeError
from ._interrupt import call_kernel
from ._jit import PythonBudget, njit
from ._schedule import Schedule
from .actions import ActionKind, action_from_row

#: Tables longer than this replay on a worker thread (:mod:`._interrupt`);
#: shorter ones take well under a millisecond, less than starting a thread.
THREADED_ROWS = 100_000

__all__ = ["InvalidScheduleError", "ScheduleStats", "simulate"]


class InvalidScheduleError(VlccError, ValueError):
    """A schedule breaks the rules of :mod:`vlcc_adjoint.schedules.actions`.

    ``index`` is the offending action's row in the table (or the table's
    length when the schedule ends with adjoint steps missing).
    """

    def __init__(self, message: str, index: int):
        super().__init__(message)
        self.index = index


@dataclasses.dataclass(frozen=True)
class ScheduleStats:
    """What a schedule does, counted by :func:`simulate`.

    ``predicted_time`` is ``forward_count * forward_cost + adjoint_count *
    adjoint_cost + sum_k(writes[k] * write_cost[k] + reads[k] * read_cost[k])``.
    """

    n_steps: int
    actions: int
    forward_count: int
    adjoint_count: int
    peak_slots: tuple[int, ...]
    reads: tuple[int, ...]
    writes: tuple[int, ...]
    predicted_time: float

    @property
    def recompute_ratio(self) -> float:
        """Forward steps evaluated outside adjoint steps, per step."""
        return self.forward_count / self.n_steps


_ERRORS = {
    1: "Advance({a}, {b}) with no state in hand; Load a stored state first",
    2: "Advance({a}, {b}) but the state in hand is u_{cur}",
    3: "Advance({a}, {b}) must satisfy start < stop <= n = {n}",
    4: "Save({a}, {lv}) but the state in hand is u_{cur}",
    5: "Save({a}, {lv}): u_{a} is already stored on level {lv}",
    6: "Save/Move of u_{a} overflows level {lv}: its {slots} slots are all taken",
    7: "Load({a}, {lv}) of a state that level {lv} does not hold",
    8: "Delete({a}, {lv}) of a state that level {lv} does not hold",
    9: "Move({a}, {lv}, {dst}) of a state that level {lv} does not hold",
    10: "Move({a}, {lv}, {dst}): level {dst} already holds u_{a}",
    11: "Reverse({a}) needs u_{a} in hand, but the state in hand is {curtext}",
    12: "Reverse({a}) out of order: the next adjoint step due is {due}",
    13: "action uses level {lv}, but the schedule has levels 0..{nlv_1}",
    14: "unknown action kind {kind}",
    15: "step {a} is outside 0..n = {n}",
    16: "the schedule ends before adjoint steps {due}..0 were done",
}


# The replay's state, carried from one block of rows to the next: ``mask``
# (a bit per level for each step, ``n + 1`` bytes) and ``regs``: the state in
# hand, the adjoint step due, the forward and adjoint counts, then ``used``,
# ``peak``, ``reads``, ``writes`` (one word per level each).
_CUR, _DUE, _FWD, _ADJ = range(4)


def _replay_state(n, nlv):
    mask = np.zeros(n + 1, dtype=np.uint8)
    regs = np.zeros(4 + 4 * nlv, dtype=np.int64)
    regs[_DUE] = n - 1
    return mask, regs


@njit(cache=True, nogil=True)
def _replay_block(kind, a, b, level, dst, n, slots, mask, regs):
    """Replay one block of rows from the state ``(mask, regs)``, updating it;
    return ``(error, row of the block)``, ``(0, -1)`` if the block is valid."""
    nlv = slots.shape[0]
    used = regs[4 : 4 + nlv]
    peak = regs[4 + nlv : 4 + 2 * nlv]
    reads = regs[4 + 2 * nlv : 4 + 3 * nlv]
    writes = regs[4 + 3 * nlv : 4 + 4 * nlv]
    cur = regs[0]
    due = regs[1]
    fwd = regs[2]
    adj = regs[3]
    err = 0
    i = 0
    for i in range(kind.shape[0]):
        k = kind[i]
        s = a[i]
        lv = level[i]
        if s < 0 or s > n:
            err = 15
            break
        if k == 1 or k == 2 or k == 3 or k == 4:
            if lv < 0 or lv >= nlv:
                err = 13
                break
        if k == 0:  # Advance
            if cur < 0:
                err = 1
                break
            if cur != s:
                err = 2
                break
            if b[i] <= s or b[i] > n:
                err = 3
                break
            fwd += b[i] - s
            cur = b[i]
        elif k == 1:  # Save
            bit = np.uint8(1 << lv)
            if cur != s:
                err = 4
                break
            if mask[s] & bit:
                err = 5
                break
            if used[lv] >= slots[lv]:
                err = 6
                break
            mask[s] |= bit
            used[lv] += 1
            writes[lv] += 1
            if used[lv] > peak[lv]:
                peak[lv] = used[lv]
        elif k == 2:  # Load
            if not mask[s] & np.uint8(1 << lv):
                err = 7
                break
            reads[lv] += 1
            cur = s
        elif k == 3:  # Delete
            bit = np.uint8(1 << lv)
            if not mask[s] & bit:
                err = 8
                break
            mask[s] &= ~bit
            used[lv] -= 1
        elif k == 4:  # Move
            d = dst[i]
            if d < 0 or d >= nlv:
                err = 13
                break
            bit = np.uint8(1 << lv)
            dbit = np.uint8(1 << d)
            if not mask[s] & bit:
                err = 9
                break
            if mask[s] & dbit:
                err = 10
                break
            if used[d] >= slots[d]:
                err = 6
                break
            mask[s] = (mask[s] & ~bit) | dbit
            used[lv] -= 1
            used[d] += 1
            reads[lv] += 1
            writes[d] += 1
            if used[d] > peak[d]:
                peak[d] = used[d]
        elif k == 5:  # Reverse
            if cur != s:
                err = 11
                break
            if s != due:
                err = 12
                break
            adj += 1
            due -= 1
            cur = -1
        else:
            err = 14
            break
    regs[0] = cur
    regs[1] = due
    regs[2] = fwd
    regs[3] = adj
    if err:
        return err, i
    return 0, -1


def _replay_block_python(kind, a, b, level, dst, n, slots, mask, regs):
    """:func:`_replay_block` in plain Python: the same checks, the same result."""
    nlv = len(slots)
    limit = [int(x) for x in slots]
    used = regs[4 : 4 + nlv].tolist()
    peak = regs[4 + nlv : 4 + 2 * nlv].tolist()
    reads = regs[4 + 2 * nlv : 4 + 3 * nlv].tolist()
    writes = regs[4 + 3 * nlv : 4 + 4 * nlv].tolist()
    cur, due, fwd, adj = (int(x) for x in regs[:4])
    state = mask
    mask = bytearray(state.tobytes())  # indexed faster than the array
    err = 0
    i = 0
    for i, (k, s, e, lv, d) in enumerate(
        zip(kind.tolist(), a.tolist(), b.tolist(), level.tolist(), dst.tolist())
    ):
        if s < 0 or s > n:
            err = 15
        elif 1 <= k <= 4 and not 0 <= lv < nlv:
            err = 13
        elif k == 0:  # Advance
            if cur < 0:
                err = 1
            elif cur != s:
                err = 2
            elif e <= s or e > n:
                err = 3
            else:
                fwd += e - s
                cur = e
        elif k == 1:  # Save
            bit = 1 << lv
            if cur != s:
                err = 4
            elif mask[s] & bit:
                err = 5
            elif used[lv] >= limit[lv]:
                err = 6
            else:
                mask[s] |= bit
                used[lv] += 1
                writes[lv] += 1
                if used[lv] > peak[lv]:
                    peak[lv] = used[lv]
        elif k == 2:  # Load
            if not mask[s] & (1 << lv):
                err = 7
            else:
                reads[lv] += 1
                cur = s
        elif k == 3:  # Delete
            bit = 1 << lv
            if not mask[s] & bit:
                err = 8
            else:
                mask[s] &= ~bit
                used[lv] -= 1
        elif k == 4:  # Move
            bit = 1 << lv
            if not 0 <= d < nlv:
                err = 13
            elif not mask[s] & bit:
                err = 9
            elif mask[s] & (1 << d):
                err = 10
            elif used[d] >= limit[d]:
                err = 6
            else:
                mask[s] = (mask[s] & ~bit) | (1 << d)
                used[lv] -= 1
                used[d] += 1
                reads[lv] += 1
                writes[d] += 1
                if used[d] > peak[d]:
                    peak[d] = used[d]
        elif k == 5:  # Reverse
            if cur != s:
                err = 11
            elif s != due:
                err = 12
            else:
                adj += 1
                due -= 1
                cur = -1
        else:
            err = 14
        if err:
            break
    regs[:] = [cur, due, fwd, adj] + used + peak + reads + writes
    state[:] = np.frombuffer(mask, np.uint8)
    if err:
        return err, i
    return 0, -1


def _whole(block, kind, a, b, level, dst, n, slots):
    mask, regs = _replay_state(n, len(slots))
    err, i = block(kind, a, b, level, dst, n, slots, mask, regs)
    if not err and regs[_DUE] >= 0:
        err, i = 16, len(kind)
    nlv = len(slots)
    return (
        (int(err), int(i) if err else -1)
        + tuple(int(x) for x in regs[:4])
        + (
            regs[4 + nlv : 4 + 2 * nlv].copy(),
            regs[4 + 2 * nlv : 4 + 3 * nlv].copy(),
            regs[4 + 3 * nlv : 4 + 4 * nlv].copy(),
        )
    )


def _replay_kernel(kind, a, b, level, dst, n, slots):
    """Replay a whole table with the kernel; return ``(error, index, cur, due,
    fwd, adj, peak, reads, writes)``."""
    return _whole(_replay_block, kind, a, b, level, dst, n, slots)


def _replay_python(kind, a, b, level, dst, n, slots):
    """:func:`_replay_kernel` in plain Python: the same checks, the same result."""
    return _whole(_replay_block_python, kind, a, b, level, dst, n, slots)


#: Ski rental between the two replays: tables are replayed in Python until
#: the rows replayed so (in this process) would exceed this many, which costs
#: about as much as loading numba and the kernel; from then on, and for any
#: longer table, by the kernel.
_python_rows = PythonBudget(200_000)


def _pieces(schedule: Schedule):
    """The schedule's rows in the pieces cheapest to read: the table itself
    when it is held, else its chunks (:meth:`Schedule.chunk`)."""
    if schedule.materialised:
        yield schedule.table
        return
    for k in range(len(schedule.chunk_starts()) - 1):
        yield schedule.chunk(k)


def _replay_schedule(schedule: Schedule, slots, block):
    """Replay every piece of `schedule` through `block`; return the error
    code, the global index, the offending row (or None) and the registers."""
    n = schedule.n_steps
    mask, regs = _replay_state(n, len(slots))
    offset = 0
    for piece in _pieces(schedule):
        err, i = block(
            piece["kind"],
            piece["a"],
            piece["b"],
            piece["level"],
            piece["dst"],
            n,
            slots,
            mask,
            regs,
        )
        if err:
            return int(err), offset + int(i), piece[i], regs
        offset += len(piece)
    if regs[_DUE] >= 0:
        return 16, offset, None, regs
    return 0, -1, None, regs


def simulate(schedule: Schedule) -> ScheduleStats:
    """Replay `schedule` symbolically, check it and count what it does.

    **Arguments:**

    - `schedule`: any :class:`~vlcc_adjoint.schedules.Schedule`.

    **Returns:** a :class:`ScheduleStats`.

    **Raises:** :class:`InvalidScheduleError`, naming the offending action and
    its index, on any violation of the rules in
    :mod:`vlcc_adjoint.schedules.actions`: a step without its state, a Load
    of a state not stored, a level over its slots, an adjoint step out of
    order, a schedule that ends before adjoint step 0.
    """
    if not isinstance(schedule, Schedule):
        raise VlccTypeError(
            f"simulate takes a Schedule, got {type(schedule).__name__}; wrap a raw "
            "table as Schedule(table, n_steps, levels)"
        )
    cached = schedule.__dict__.get("_simulated")
    if cached is not None:
        return cached
    n = schedule.n_steps
    m = len(schedule)
    big = np.iinfo(np.int64).max
    slots = np.array([big if lv.slots is None else lv.slots for lv in schedule.levels], np.int64)
    nlv = len(slots)
    block = _replay_block_python if _python_rows.take(m, _replay_block) else _replay_block
    # Long tables replay on a worker thread, so that Ctrl-C is clean (_interrupt).
    err, index, row, regs = call_kernel(
        _replay_schedule, schedule, slots, block, threaded=m > THREADED_ROWS
    )
    cur, due, fwd, adj = (int(x) for x in regs[:4])
    peak = regs[4 + nlv : 4 + 2 * nlv]
    reads = regs[4 + 2 * nlv : 4 + 3 * nlv]
    writes = regs[4 + 3 * nlv : 4 + 4 * nlv]
    if err:
        fields = dict(
            n=n, cur=cur, due=due, nlv_1=nlv - 1, curtext=("nothing" if cur < 0 else f"u_{cur}")
        )
        where = ""
        if row is not None:
            fields.update(
                a=int(row["a"]),
                b=int(row["b"]),
                lv=int(row["level"]),
                dst=int(row["dst"]),
                kind=int(row["kind"]),
            )
            lv = (
                int(row["dst"])
                if row["kind"] == ActionKind.MOVE and err == 6
                else int(row["level"])
            )
            fields["lv"] = lv if err == 6 else fields["lv"]
            fields["slots"] = int(slots[lv]) if 0 <= lv < len(slots) else 0
            try:
                where = f" ({action_from_row(row)!r})"
            except ValueError:
                where = ""
        message = _ERRORS[err].format(**fields)
        raise InvalidScheduleError(f"invalid schedule at action {index}{where}: {message}", index)
    predicted = (
        fwd * schedule.forward_cost
        + adj * schedule.adjoint_cost
        + sum(
            w * lv.write_cost + r * lv.read_cost for w, r, lv in zip(writes, reads, schedule.levels)
        )
    )
    stats = ScheduleStats(
        n_steps=n,
        actions=m,
        forward_count=int(fwd),
        adjoint_count=int(adj),
        peak_slots=tuple(int(p) for p in peak),
        reads=tuple(int(r) for r in reads),
        writes=tuple(int(w) for w in writes),
        predicted_time=float(predicted),
    )
    if "_source" in schedule.__dict__:
        # Its rows are a function of its parameters: replay them once.
        schedule.__dict__["_simulated"] = stats
    return stats
