"""Symbolic replay of a schedule: validation and statistics.

One pass over the table in a numba kernel (:func:`replay_rows`), following
the rules of :mod:`vlcc_adjoint.schedules.actions` exactly; each stored step
carries a bit mask of the levels that hold it, so a replay costs
``O(len(table) + n)`` time and ``n + 1`` bytes of state, whatever the number
of slots.  The replay reads the schedule chunk by chunk
(:meth:`Schedule.chunk`) with its state carried across, so a schedule that
produces its rows in chunks is checked without its table.
Short tables are replayed by the kernel's own Python function, so a small
schedule never waits for numba to load (:mod:`._jit`); the tests check that
the two runs of the one kernel agree on valid and broken tables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from ..errors import VlccError, VlccTypeError
from ._interrupt import call_kernel
from ._jit import PythonBudget, njit
from .actions import ADVANCE, DELETE, LOAD, MOVE, REVERSE, SAVE, action_from_row

#: Tables longer than this replay on a worker thread (:mod:`._interrupt`);
#: shorter ones take well under a millisecond, less than starting a thread.
THREADED_ROWS = 100_000

__all__ = [
    "InvalidScheduleError",
    "ScheduleStats",
    "Replayable",
    "replay_pieces",
    "replay_rows",
    "simulate",
]


class Replayable(Protocol):
    """What :func:`simulate` reads of a schedule (a
    :class:`~vlcc_adjoint.schedules.Schedule` has it all).

    Named here, not imported: the schedule class asks :func:`simulate` for
    its statistics, so this module must not import it back."""

    @property
    def n_steps(self) -> int | None: ...

    @property
    def levels(self) -> Sequence[Any]: ...

    @property
    def forward_cost(self) -> float: ...

    @property
    def adjoint_cost(self) -> float: ...

    def __len__(self) -> int: ...

    def blocks(self, rows: int = ..., start: int = ...) -> Iterator[np.ndarray]: ...


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
# ``peak``, ``reads``, ``writes`` (one word per level each, from ``REGS`` on).
CUR, DUE, FWD, ADJ = range(4)
#: Registers before the per-level counters in ``regs``.
REGS = 4
#: The columns of a table the replay reads, in the order it takes them.
COLUMNS = ("kind", "a", "b", "level", "dst")


@njit(cache=True, nogil=True)
def replay_rows(kind, a, b, level, dst, n, slots, mask, regs):
    """Replay one block of rows from the state ``(mask, regs)``, updating it;
    return ``(error, row of the block)``, ``(0, -1)`` if the block is valid.

    The one replay: compiled by numba for long tables, run as its own
    Python function (:meth:`LazyKernel.python`) for short ones.  It indexes
    its arguments element by element, so the Python run takes the columns as
    lists, `mask` as a ``bytearray`` and `regs` as a list
    (:func:`replay_pieces`); the compiled one takes arrays.
    """
    nlv = len(slots)
    used = REGS
    peak = REGS + nlv
    reads = REGS + 2 * nlv
    writes = REGS + 3 * nlv
    cur = regs[CUR]
    due = regs[DUE]
    fwd = regs[FWD]
    adj = regs[ADJ]
    err = 0
    i = 0
    for i in range(len(kind)):
        k = kind[i]
        s = a[i]
        lv = level[i]
        if s < 0 or s > n:
            err = 15
            break
        if k == SAVE or k == LOAD or k == DELETE or k == MOVE:
            if lv < 0 or lv >= nlv:
                err = 13
                break
        if k == ADVANCE:
            e = b[i]
            if cur < 0:
                err = 1
                break
            if cur != s:
                err = 2
                break
            if e <= s or e > n:
                err = 3
                break
            fwd += e - s
            cur = e
        elif k == SAVE:
            bit = 1 << lv
            if cur != s:
                err = 4
                break
            if mask[s] & bit:
                err = 5
                break
            if regs[used + lv] >= slots[lv]:
                err = 6
                break
            mask[s] |= bit
            regs[used + lv] += 1
            regs[writes + lv] += 1
            if regs[used + lv] > regs[peak + lv]:
                regs[peak + lv] = regs[used + lv]
        elif k == LOAD:
            if not mask[s] & (1 << lv):
                err = 7
                break
            regs[reads + lv] += 1
            cur = s
        elif k == DELETE:
            bit = 1 << lv
            if not mask[s] & bit:
                err = 8
                break
            mask[s] &= 0xFF ^ bit  # not ~bit: stays a uint8 in every run
            regs[used + lv] -= 1
        elif k == MOVE:
            d = dst[i]
            if d < 0 or d >= nlv:
                err = 13
                break
            bit = 1 << lv
            dbit = 1 << d
            if not mask[s] & bit:
                err = 9
                break
            if mask[s] & dbit:
                err = 10
                break
            if regs[used + d] >= slots[d]:
                err = 6
                break
            mask[s] = (mask[s] & (0xFF ^ bit)) | dbit
            regs[used + lv] -= 1
            regs[used + d] += 1
            regs[reads + lv] += 1
            regs[writes + d] += 1
            if regs[used + d] > regs[peak + d]:
                regs[peak + d] = regs[used + d]
        elif k == REVERSE:
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
    regs[CUR] = cur
    regs[DUE] = due
    regs[FWD] = fwd
    regs[ADJ] = adj
    if err:
        return err, i
    return 0, -1


#: Ski rental between the two runs of :func:`replay_rows` (:mod:`._jit`):
#: tables are replayed by its Python function until the rows replayed so in
#: this process would exceed this many, and from then on, and for any longer
#: table, by the compiled kernel.  The Python run indexes lists, a few
#: tenths of a microsecond a row; priced with Revolve's ``_python_steps``
#: (about 4.4 rows a step), so that a schedule built in Python is replayed
#: in Python too.
_python_rows = PythonBudget(200_000)


def replay_pieces(pieces, n: int, slots: np.ndarray, python: bool):
    """Replay consecutive pieces of a table of a schedule of `n` steps with
    per-level `slots`; return the error code, the global index of the
    offending row, the row itself (or None) and the registers (an array).

    `python` picks the run of :func:`replay_rows`: its Python function on
    lists, or the compiled kernel on the pieces' columns.
    """
    nlv = len(slots)
    if python:
        kernel = replay_rows.python
        mask: np.ndarray | bytearray = bytearray(n + 1)
        regs: np.ndarray | list = [0] * (REGS + 4 * nlv)
        limits: np.ndarray | list = slots.tolist()
    else:
        kernel = replay_rows
        mask = np.zeros(n + 1, dtype=np.uint8)
        regs = np.zeros(REGS + 4 * nlv, dtype=np.int64)
        limits = slots
    regs[DUE] = n - 1
    offset = 0
    err, index, row = 0, -1, None
    for piece in pieces:
        columns = [piece[name] for name in COLUMNS]
        if python:
            columns = [column.tolist() for column in columns]
        err, i = kernel(*columns, n, limits, mask, regs)
        if err:
            err, index, row = int(err), offset + int(i), piece[i]
            break
        offset += len(piece)
    else:
        if regs[DUE] >= 0:
            err, index = 16, offset
    return err, index, row, np.array(regs, dtype=np.int64)


def simulate(schedule: Replayable) -> ScheduleStats:
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
    n = getattr(schedule, "n_steps", None)
    if not callable(getattr(schedule, "blocks", None)) or not isinstance(n, int):
        raise VlccTypeError(
            f"simulate takes a Schedule with its number of steps, got "
            f"{type(schedule).__name__}; wrap a raw table as Schedule(table, n_steps, levels), "
            "and complete an Online schedule without steps with .stop(n)"
        )
    memo = vars(schedule)
    cached = memo.get("_simulated")
    if cached is not None:
        return cached
    m = len(schedule)
    big = np.iinfo(np.int64).max
    slots = np.array([big if lv.slots is None else lv.slots for lv in schedule.levels], np.int64)
    nlv = len(slots)
    python = _python_rows.take(m, replay_rows)
    # Long tables replay on a worker thread, so that Ctrl-C is clean (_interrupt).
    err, index, row, regs = call_kernel(
        replay_pieces,
        schedule.blocks(),
        n,
        slots,
        python,
        threaded=m > THREADED_ROWS and not python,
    )
    cur, due, fwd, adj = (int(x) for x in regs[:REGS])
    peak = regs[REGS + nlv : REGS + 2 * nlv]
    reads = regs[REGS + 2 * nlv : REGS + 3 * nlv]
    writes = regs[REGS + 3 * nlv : REGS + 4 * nlv]
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
            lv = int(row["dst"]) if row["kind"] == MOVE and err == 6 else int(row["level"])
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
    # A schedule's rows do not change (its table is read-only, or produced
    # from its parameters): replay them once, however many readers ask.
    memo["_simulated"] = stats
    return stats
