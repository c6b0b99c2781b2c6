"""Revolve: optimal binomial checkpointing on one storage level.

Reference: A. Griewank and A. Walther, "Algorithm 799: revolve: an
implementation of checkpointing for the reverse or adjoint mode of
computational differentiation", ACM TOMS 26(1), 19-45, 2000.

With ``c`` slots (``u_0`` occupies one) the least number of forward steps
outside adjoint steps needed to reverse ``l`` steps is

    t(l, c) = r * l - C(c + r, c + 1),    r = min { r : beta(c, r) >= l },

where ``beta(c, r) = C(c + r, c)`` is the most steps ``c`` slots reverse with
every state computed at most ``r`` times (Griewank & Walther, Prop. 1).  The
schedule is the recursion

    reverse(s, l, c):  advance m steps from u_s, save u_{s+m},
                       reverse(s+m, l-m, c-1), then reverse(s, m, c)

whose cost ``m + t(m, c) + t(l - m, c - 1)`` is minimal for

    m = min(l - 1, max(1, l - beta(c - 1, r), beta(c, r - 2))).          (*)

Why (*): ``t(., c)`` is convex and piecewise linear with slope ``r(l, c)``,
so the split is optimal exactly when the left part ``m`` lies where
``t(., c)`` has slope ``r - 1`` and the right part ``l - m`` where
``t(., c - 1)`` has slope ``r``; (*) picks the smallest such ``m``, and
``tests/schedules/test_revolve.py`` checks the total against ``t(n, c)`` for every
``n <= 2000``, ``c <= 40``.  With one slot left a segment is reversed by
restarting from its base for every step (``t(l, 1) = l (l - 1) / 2``).

The recursion runs on an explicit stack (depth at most ``2 (c + r)``) in
numba kernels, each one description run two ways (:mod:`._jit`).  For small
``n`` the whole-table emitter :func:`_emit_revolve` runs as its own Python
function: no numba, so the first schedule of a process costs a millisecond
or two, not the few hundred milliseconds of loading numba and its cached
kernels (or seconds of compiling them on a fresh install).  For large ``n``
(and once a process has built enough steps in Python, or has the kernel
loaded already: :data:`_python_steps`) the compiled kernel runs the
recursion as a resumable emitter (:func:`_revolve_fill`): the schedule
keeps the emitter's state (the stack, ``O(c + r)`` words) at the start of
every chunk of 65,536 rows, found by one counting run at construction, and
regenerates any chunk from it on demand (:mod:`._chunks`), so ten million
steps cost neither Python objects nor a table: ``Revolve(10**7, 100)``
holds about 5 MB of states instead of 840 MiB of rows.  The tests check
that the Python run, the compiled whole-table kernel and the concatenated
chunks agree byte for byte, on both sides of the threshold.
"""

from __future__ import annotations

import math
import operator
from collections import defaultdict

import numpy as np

from ._chunks import ChunkedTable
from ._jit import LazyKernel, PythonBudget, njit
from ._schedule import Level, Schedule, check_positive_int
from .actions import ACTION_DTYPE, ADVANCE, DELETE, FIELDS, LOAD, REVERSE, SAVE

__all__ = ["Revolve", "binomial_forward_count", "default_snapshots"]


@njit(cache=True, nogil=True)
def _beta(c, r, cap):
    """``C(c + r, c)`` for ``r >= 0`` (0 for ``r < 0``), saturated at ``cap``."""
    if r < 0:
        return 0
    value = 1
    for i in range(1, r + 1):
        # C(c+i, i) = C(c+i-1, i-1) * (c+i) / i is exact; stop before overflow.
        value = value * (c + i) // i
        if value >= cap:
            return cap
    return value


@njit(cache=True, nogil=True)
def _repetitions(l, c):
    """The least ``r`` with ``beta(c, r) >= l``."""
    r = 0
    value = 1
    while value < l:
        r += 1
        value = value * (c + r) // r
    return r


@njit(cache=True, nogil=True)
def _split(l, c):
    """The optimal first advance (*) of a segment of ``l`` steps, ``c >= 2`` slots."""
    r = _repetitions(l, c)
    m = max(1, l - _beta(c - 1, r, l + 1), _beta(c, r - 2, l + 1))
    return min(l - 1, m)


@njit(cache=True, nogil=True)
def copy_row(out, src, dst):
    """Row `src` of `out` into row `dst` (a table or a ``defaultdict(dict)``,
    as for :func:`put_row`), field by field."""
    a = out[src]
    b = out[dst]
    b["kind"] = a["kind"]
    b["a"] = a["a"]
    b["b"] = a["b"]
    b["level"] = a["level"]
    b["dst"] = a["dst"]


@njit(cache=True, nogil=True)
def put_row(out, pos, write, kind, a, b, level):
    """Write the row ``(kind, a, b, level, -1)`` at `pos` of `out` when
    `write` is true (a counting run only advances); return ``pos + 1``.

    `out` is a table (compiled) or a ``defaultdict(dict)`` (the Python run,
    :func:`build_table`); either way ``out[pos]`` is the row, written in
    place, field by field, in the order of :data:`ACTION_DTYPE`."""
    if write:
        row = out[pos]
        row["kind"] = kind
        row["a"] = a
        row["b"] = b
        row["level"] = level
        row["dst"] = -1
    return pos + 1


#: A `limit` of :func:`restart_rows` that is never reached.
NO_LIMIT = 1 << 62


@njit(cache=True, nogil=True)
def restart_rows(out, pos, write, s, hi, j, level, limit):
    """Reverse steps ``j .. s`` (top down) of a segment whose base ``u_s`` is
    stored on `level`, with no further save: each step ``i`` is reached by
    advancing from the base, ``t(l, 1) = l (l - 1) / 2`` forward steps for
    ``l`` steps.  Step `hi`, the segment's last, starts from the state in
    hand (no Load); every other step starts with a Load of the base, and
    step ``s`` deletes it.  Stops before a step once fewer than 3 rows of room
    are left below `limit` (the resumable emitters); returns ``(pos, j)``, the
    next row and the next step to reverse (``j < s``: done)."""
    while j >= s:
        if pos + 3 > limit:
            return pos, j
        if j < hi:
            pos = put_row(out, pos, write, LOAD, s, -1, level)
        if j == s:
            pos = put_row(out, pos, write, DELETE, s, -1, level)
        else:
            pos = put_row(out, pos, write, ADVANCE, s, j, -1)
        pos = put_row(out, pos, write, REVERSE, j, -1, -1)
        j -= 1
    return pos, j


@njit(cache=True, nogil=True)
def emit_segment(out, pos, write, s, l, c, in_hand, level):
    """Reverse steps ``s + l - 1 .. s`` from the stored base ``u_s``.

    ``c`` counts the slots of ``level`` this segment may use, its base
    included; the segment ends by deleting its base.  Writes rows from
    ``pos`` on (only counts them when ``write`` is false) and returns the
    position after the last row.
    """
    depth = 2 * (c + _repetitions(l, c)) + 8
    st_s = np.empty(depth, np.int64)
    st_l = np.empty(depth, np.int64)
    st_c = np.empty(depth, np.int64)
    st_h = np.empty(depth, np.bool_)
    top = 0
    st_s[0], st_l[0], st_c[0], st_h[0] = s, l, c, in_hand
    top = 1
    while top > 0:
        top -= 1
        # int(): a no-op compiled; Python ints, not numpy scalars, in the Python run.
        s, l, c, h = int(st_s[top]), int(st_l[top]), int(st_c[top]), st_h[top]
        if not h:
            pos = put_row(out, pos, write, LOAD, s, -1, level)
        if l == 1 or c == 1:
            pos, _ = restart_rows(out, pos, write, s, s + l - 1, s + l - 1, level, NO_LIMIT)
            continue
        m = _split(l, c)
        pos = put_row(out, pos, write, ADVANCE, s, s + m, -1)
        pos = put_row(out, pos, write, SAVE, s + m, -1, level)
        # Left part (the rest of this segment) waits below the right part.
        st_s[top], st_l[top], st_c[top], st_h[top] = s, m, c, False
        st_s[top + 1], st_l[top + 1], st_c[top + 1], st_h[top + 1] = s + m, l - m, c - 1, True
        top += 2
    return pos


@njit(cache=True, nogil=True)
def _emit_revolve(out, write, n, c):
    pos = 0
    if n == 1:
        return put_row(out, pos, write, REVERSE, 0, -1, -1)
    pos = put_row(out, pos, write, SAVE, 0, -1, 0)  # Save u_0
    return emit_segment(out, pos, write, 0, n, c, True, 0)


# The resumable emitter (:mod:`._chunks`).  Its state is one int64 array:
# registers, then the stack of segments (s, l, c, in_hand), four words each.
_TOP, _LEAF, _LEAF_S, _LEAF_HI, _LEAF_J, _PHASE, _N, _C = range(8)
_REGS = 8
#: Most rows one unit of the emitter writes: a Load, an Advance and a Save
#: (a split), or a Load, an Advance or Delete and a Reverse (a restart).
_UNIT = 3


def revolve_state(n: int, c: int) -> np.ndarray:
    """The initial state of :func:`_revolve_fill` for ``n`` steps, ``c`` slots."""
    # Below a segment with c slots the stack holds only segments with more
    # slots (a split pushes its left part, c slots, under its right part,
    # c - 1), so it never holds more than c + 1 segments.
    depth = c + 2
    state = np.zeros(_REGS + 4 * depth, np.int64)
    state[_N] = n
    state[_C] = c
    return state


@njit(cache=True, nogil=True)
def _revolve_fill(out, write, state, limit):
    """Continue the Revolve recursion from `state`: :func:`emit_segment` of
    the whole schedule, paused after any unit once fewer than ``_UNIT`` rows
    of room are left below `limit`.  Returns the rows produced."""
    pos = 0
    phase = state[5]
    if phase == 2:
        return 0
    if phase == 0:
        n = state[6]
        if n == 1:
            state[5] = 2
            return put_row(out, pos, write, REVERSE, 0, -1, -1)  # Reverse(0)
        pos = put_row(out, pos, write, SAVE, 0, -1, 0)  # Save u_0
        state[0] = 1
        state[8], state[9], state[10], state[11] = 0, n, state[7], 1
        state[5] = 1
    top = state[0]
    while True:
        if state[1] != 0:  # a restart under way
            pos, j = restart_rows(out, pos, write, state[2], state[3], state[4], 0, limit)
            if j >= state[2]:  # paused: no room left
                state[4] = j
                state[0] = top
                return pos
            state[1] = 0
        if top == 0:
            state[5] = 2
            break
        if pos + 3 > limit:
            break
        top -= 1
        b = 8 + 4 * top
        s, l, c, h = state[b], state[b + 1], state[b + 2], state[b + 3]
        if h == 0:
            pos = put_row(out, pos, write, LOAD, s, -1, 0)
        if l == 1 or c == 1:
            state[1], state[2], state[3], state[4] = 1, s, s + l - 1, s + l - 1
            continue
        if b + 8 > state.shape[0]:  # pragma: no cover - the depth bound above
            return -1
        m = _split(l, c)
        pos = put_row(out, pos, write, ADVANCE, s, s + m, -1)
        pos = put_row(out, pos, write, SAVE, s + m, -1, 0)
        # Left part (the rest of this segment) waits below the right part.
        state[b], state[b + 1], state[b + 2], state[b + 3] = s, m, c, 0
        state[b + 4], state[b + 5], state[b + 6], state[b + 7] = s + m, l - m, c - 1, 1
        top += 2
    state[0] = top
    return pos


#: Steps of Revolve tables built by :func:`_emit_revolve`'s Python function
#: per process (ski rental, :class:`._jit.PythonBudget`).  A step costs about
#: 4.4 rows; a schedule's first build, replay and I/O plan in Python (about
#: 10 us a step) cost about as long as importing numba and loading the three
#: compiled kernels from its cache (about 0.4 s) at this many steps
#: (``benchmarks/bench_schedules.py --only cold`` measures both sides), so
#: this budget and the 200,000 rows of ``simulate``'s and ``io_plan``'s agree.
_python_steps = PythonBudget(40_000)


def revolve_table(n: int, c: int, python: bool | None = None) -> np.ndarray:
    """The Revolve table for ``n`` steps and ``c <= max(n - 1, 1)`` slots.

    `python` picks the run of the one emitter (:func:`_emit_revolve`):
    ``True`` its Python function, ``False`` the compiled kernel, ``None`` as
    :data:`_python_steps` decides.
    """
    if python is None:
        python = _python_steps.take(n, _revolve_fill)
    return build_table(_emit_revolve, n, c, python=python)


def revolve_chunks(n: int, c: int) -> ChunkedTable:
    """The Revolve rows for ``n`` steps, ``c <= max(n - 1, 1)`` slots, as a
    :class:`._chunks.ChunkedTable` of the numba emitter."""
    return ChunkedTable(_revolve_fill, revolve_state(n, c))


def build_table(emit: LazyKernel, *args, python: bool = False) -> np.ndarray:
    """The table an emitter ``emit(out, write, *args) -> rows`` writes.

    Compiled (`python` false): run twice, counting the rows, then writing
    them into a table of that length.  As its Python function (`python`):
    run once, writing into a ``defaultdict(dict)``, a dict per row that
    :func:`put_row` fills (numpy's record fields cost about a microsecond
    each from the interpreter, a dict's some tens of nanoseconds), then
    packed into a table.
    """
    if python:
        rows: defaultdict[int, dict[str, int]] = defaultdict(dict)
        count = emit.python(rows, True, *args)
        fields = operator.itemgetter(*FIELDS)
        return np.fromiter((fields(rows[i]) for i in range(count)), ACTION_DTYPE, count)
    dummy = np.empty(1, ACTION_DTYPE)
    count = emit(dummy, False, *args)
    table = np.empty(count, ACTION_DTYPE)
    written = emit(table, True, *args)
    assert written == count
    return table


def binomial_forward_count(steps: int, snapshots: int) -> int:
    """Griewank's optimum ``t(n, c) = r n - C(c + r, c + 1)`` (exact integers)."""
    from math import comb

    n = check_positive_int(steps, "steps")
    c = check_positive_int(snapshots, "snapshots")
    # The least r with C(c + r, c) >= n, by doubling then bisection: r can
    # be n - 1 (one slot), so counting up would take n steps.
    hi = 1
    while comb(c + hi, c) < n:
        hi *= 2
    lo = 0 if comb(c, c) >= n else hi // 2  # comb(c + lo, c) < n <= comb(c + hi, c)
    while lo < hi:
        mid = (lo + hi) // 2
        if comb(c + mid, c) >= n:
            hi = mid
        else:
            lo = mid + 1
    r = lo
    return r * n - comb(c + r, c + 1)


def default_snapshots(steps: int, repetitions: int | None = None) -> int:
    """The number of Revolve snapshots to use when the caller gives none.

    One policy, from Revolve's binomial bound: with ``c`` snapshots and each
    forward step repeated at most ``r`` times, Revolve reverses up to
    ``beta(c, r) = binom(c + r, c)`` steps (Griewank 1992; Griewank and
    Walther 2000, Proposition 1).  The default is the least ``c >= 1`` with
    ``beta(c, r) >= steps``:

    - ``repetitions=None`` (balanced, ``r = c``): the least ``c`` with
      ``binom(2c, c) >= steps``.  Memory and recomputation both grow like
      ``log(steps)``; this is Revolve's own ``adjust`` and pyrevolve's
      default, so :class:`vlcc_adjoint.devito.Revolver` (a pyrevolve drop-in)
      and :class:`~vlcc_adjoint.devito.DevitoSolver` use it: PDE states are
      large, and memory is what runs out.
    - ``repetitions=2``: no step runs more than twice after its first forward
      sweep, with ``c ~ sqrt(2 steps)`` snapshots, the rule of
      ``equinox.internal.checkpointed_while_loop`` (Stumm and Walther 2010,
      eq. 2.2).  :func:`vlcc_adjoint.jax.checkpointed_scan` and the torch
      drop-ins use it: their states are small and recomputation on the
      accelerator is what costs.

    **Arguments:**

    - `steps`: forward steps ``n >= 1``.
    - `repetitions`: the most times a step may be recomputed (``>= 1``), or
      ``None`` for the balanced point ``r = c``.

    **Returns:** the snapshot count ``c`` (``>= 1``; at most ``steps``).

    References: A. Griewank, "Achieving logarithmic growth of temporal and
    spatial complexity in reverse automatic differentiation", Optim. Methods
    Softw. 1 (1992); A. Griewank and A. Walther, "Algorithm 799: revolve",
    ACM TOMS 26 (2000); P. Stumm and A. Walther, "New algorithms for optimal
    online checkpointing", SIAM J. Sci. Comput. 32 (2010).
    """
    steps = check_positive_int(steps, "steps")
    if repetitions is not None:
        repetitions = check_positive_int(repetitions, "repetitions")
    c = 1
    while c < steps and math.comb(c + (c if repetitions is None else repetitions), c) < steps:
        c += 1
    return c


class Revolve(Schedule):
    """Optimal binomial checkpointing with ``snapshots`` slots on one level.

    **Arguments:**

    - `steps`: the number of forward steps ``n`` (>= 1).
    - `snapshots`: slots for stored states, ``u_0``'s included (>= 1).

    The forward count is Griewank's optimum ``t(n, c)`` (see the module
    docstring); peak slot use is ``min(c, n - 1)``.  Small schedules hold
    their table, built in plain Python; large ones (the module docstring)
    hold the emitter's state every 65,536 rows, ``O((c + r) len / 65536)``
    words, and produce :meth:`blocks` with a numba kernel in ``O(len)``
    time; ``.table`` materialises all rows (19 bytes each) on first access.
    """

    def __init__(self, steps: int, snapshots: int):
        n = check_positive_int(steps, "steps")
        c = check_positive_int(snapshots, "snapshots")
        self.snapshots = c
        slots = min(c, max(n - 1, 1))
        rows: np.ndarray | ChunkedTable
        if _python_steps.take(n, _revolve_fill):
            rows = revolve_table(n, slots, python=True)
        else:
            rows = revolve_chunks(n, slots)
        super().__init__(rows, n, (Level(c),))

    def _params(self) -> str:
        return f"steps={self.n_steps}, snapshots={self.snapshots}"
