"""Multistage: exact cost-optimal checkpointing over a storage hierarchy.

Cost model (the one :func:`simulate` predicts): a forward step costs
``forward_cost``, an adjoint step ``adjoint_cost``; a ``Save`` to level ``k``
costs ``write_cost[k]``, a ``Load`` from it ``read_cost[k]``; level ``k``
holds at most ``slots[k]`` states; ``Delete`` is free.  ``Multistage``
returns a schedule of least predicted time among **all** schedules built from
``Advance / Save / Load / Delete / Reverse`` under this model, for any number
of levels and any costs, ``forward_cost != adjoint_cost`` included.  This is
the problem of Stumm & Walther (multistage, 2009), Aupy, Herrmann, Hovland &
Robert (Disk-Revolve, 2016) and Herrmann & Pallez (H-Revolve, ACM TOMS
46(2), 2020); their algorithms are optimal within restricted classes or
cost ratios, this one over all schedules (checked against an exhaustive
search over every schedule in ``tests/test_multistage.py``).

The dynamic program.  Call a *segment* ``(l, k, A)`` the task "reverse
steps ``s + l - 1 .. s`` with ``u_s`` in hand and stored on level ``k``,
``A[j]`` further slots free on each level ``j``".  Adjoint steps run in
reverse, so once the first state after ``s`` that the segment stores,
``u_{s+m}`` on level ``j``, is saved, everything right of it is reversed
first, with ``u_{s+m}`` as base and one slot fewer on ``j``; then its slot
is free again and the rest, ``(m, k, A)``, restarts from a Load of ``u_s``.
A segment may also move its base to a faster level once (``Save`` there,
``Delete`` the old copy).  With ``F`` the least cost of a segment with its
base in hand:

    B(1, k, A) = 0
    B(l, k, A) = min( read[k] (l - 1) + fwd l (l - 1) / 2,              (no save)
                      min_{j: A_j > 0, 1 <= m < l}  fwd m + write[j]
                          + F(l - m, j, A - e_j) + read[k] + F(m, k, A) )
    F(l, k, A) = min( B(l, k, A),  min_{j != k, A_j > 0} write[j] + B(l, j, A - e_j + e_k) )

and the whole schedule costs ``min_j write[j] + F(n, j, S - e_j)`` (``u_0``
must be stored somewhere) plus ``n adjoint_cost``.  A chain of moves is never
better than one (same slots, more writes), so one move level suffices.

Speed.  The minimum over ``m`` is not convex in general (about one split in
ten has several local minima), so instead of a convexity shortcut the search
is an exact branch and bound: ``F`` does not decrease with ``l``, hence for
``m`` in ``[lo, hi]``

    fwd m + F(l - m, j, .) + F(m, k, .) >= fwd lo + F(l - hi, j, .) + F(lo, k, .),

and intervals whose bound cannot beat the best split found are skipped.
Starting from the previous length's optimum, this visits a few dozen ``m``
per state.  Time ``O(n L P log n)`` in practice with ``P = prod_k (slots[k]
+ 1)`` slot states, memory ``8 n L P`` bytes for ``F``; the schedule is then
emitted from ``F`` by re-running the same searches along the chosen path.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

from ._revolve import _put, build_table
from ._schedule import Level, Schedule, check_cost, check_positive_int

__all__ = ["Multistage"]

_SCAN = 16  # intervals this short are scanned rather than split


@numba.njit(cache=True, nogil=True)
def _best_split(F, l, k, a, j, a2, fwd, guess):
    """``min_m fwd m + F[l-m, j, a2] + F[m, k, a]`` and an argmin, exactly."""
    if guess < 1 or guess > l - 1:
        guess = (l + 1) // 2
    best_m = guess
    best = fwd * guess + F[l - guess, j, a2] + F[guess, k, a]
    st_lo = np.empty(128, np.int64)
    st_hi = np.empty(128, np.int64)
    st_lo[0] = 1
    st_hi[0] = l - 1
    top = 1
    while top > 0:
        top -= 1
        lo = st_lo[top]
        hi = st_hi[top]
        if fwd * lo + F[l - hi, j, a2] + F[lo, k, a] >= best:
            continue
        if hi - lo < _SCAN:
            for m in range(lo, hi + 1):
                v = fwd * m + F[l - m, j, a2] + F[m, k, a]
                if v < best:
                    best = v
                    best_m = m
            continue
        mid = (lo + hi) // 2
        # Explore the half holding the guess first: it tightens `best` soonest.
        if guess <= mid:
            st_lo[top], st_hi[top] = mid + 1, hi
            st_lo[top + 1], st_hi[top + 1] = lo, mid
        else:
            st_lo[top], st_hi[top] = lo, mid
            st_lo[top + 1], st_hi[top + 1] = mid + 1, hi
        top += 2
    return best, best_m


@numba.njit(cache=True, nogil=True)
def _base(F, l, k, a, slots, strides, write, read, fwd, guesses):
    """``B(l, k, A)``: its value, the save level (-1: no save) and the split."""
    best = read[k] * (l - 1) + fwd * l * (l - 1) / 2.0
    best_j = -1
    best_m = 0
    for j in range(slots.shape[0]):
        if (a // strides[j]) % (slots[j] + 1) == 0:
            continue
        a2 = a - strides[j]
        g = guesses[k, a, j] if guesses.shape[0] > 0 else 0
        v, m = _best_split(F, l, k, a, j, a2, fwd, g)
        if guesses.shape[0] > 0:
            guesses[k, a, j] = m + 1
        v += write[j] + read[k]
        if v < best:
            best = v
            best_j = j
            best_m = m
    return best, best_j, best_m


@numba.njit(cache=True, nogil=True)
def _solve(n, slots, write, read, fwd):
    """The table ``F[l, k, a]`` for ``l = 0 .. n``."""
    L = slots.shape[0]
    strides = np.empty(L, np.int64)
    P = 1
    for k in range(L):
        strides[k] = P
        P *= slots[k] + 1
    F = np.zeros((n + 1, L, P))
    B = np.empty((L, P))
    guesses = np.zeros((L, P, L), np.int64)
    for l in range(2, n + 1):
        for a in range(P):
            for k in range(L):
                B[k, a] = _base(F, l, k, a, slots, strides, write, read, fwd, guesses)[0]
        for a in range(P):
            for k in range(L):
                best = B[k, a]
                if (a // strides[k]) % (slots[k] + 1) < slots[k]:
                    for j in range(L):
                        if j != k and (a // strides[j]) % (slots[j] + 1) > 0:
                            v = write[j] + B[j, a - strides[j] + strides[k]]
                            if v < best:
                                best = v
                F[l, k, a] = best
    return F, strides


@numba.njit(cache=True, nogil=True)
def _emit(out, write_rows, n, F, strides, slots, write, read, fwd):
    L = slots.shape[0]
    no_guess = np.zeros((0, 0, 0), np.int64)
    pos = 0
    if n == 1:
        return _put(out, pos, write_rows, 5, 0, -1, -1)
    full = 0
    for k in range(L):
        full += slots[k] * strides[k]
    best = np.inf
    k0 = -1
    for j in range(L):
        if slots[j] > 0:
            v = write[j] + F[n, j, full - strides[j]]
            if v < best:
                best = v
                k0 = j
    pos = _put(out, pos, write_rows, 1, 0, -1, k0)  # Save u_0
    total = 0
    for k in range(L):
        total += slots[k]
    depth = 2 * total + 8
    st = np.empty((depth, 6), np.int64)  # s, l, k, a, in_hand, may_move
    st[0, 0], st[0, 1], st[0, 2], st[0, 3], st[0, 4], st[0, 5] = 0, n, k0, full - strides[k0], 1, 1
    top = 1
    while top > 0:
        top -= 1
        s, l, k, a, h, may_move = st[top, 0], st[top, 1], st[top, 2], st[top, 3], st[top, 4], st[top, 5]
        if h == 0:
            pos = _put(out, pos, write_rows, 2, s, -1, k)  # Load
        if l == 1:
            pos = _put(out, pos, write_rows, 3, s, -1, k)  # Delete
            pos = _put(out, pos, write_rows, 5, s, -1, -1)  # Reverse
            continue
        b, bj, bm = _base(F, l, k, a, slots, strides, write, read, fwd, no_guess)
        if may_move and F[l, k, a] < b:
            # Moving the base pays off: to the level whose segment is cheapest.
            best = np.inf
            target = -1
            for j in range(L):
                if j != k and (a // strides[j]) % (slots[j] + 1) > 0:
                    v = write[j] + _base(F, l, j, a - strides[j] + strides[k], slots,
                                         strides, write, read, fwd, no_guess)[0]
                    if v < best:
                        best = v
                        target = j
            pos = _put(out, pos, write_rows, 1, s, -1, target)  # Save
            pos = _put(out, pos, write_rows, 3, s, -1, k)  # Delete
            a = a - strides[target] + strides[k]
            k = target
            b, bj, bm = _base(F, l, k, a, slots, strides, write, read, fwd, no_guess)
        if bj < 0:
            # No further save: restart from the base for every step.
            for i in range(s + l - 1, s - 1, -1):
                if i < s + l - 1:
                    pos = _put(out, pos, write_rows, 2, s, -1, k)
                if i == s:
                    pos = _put(out, pos, write_rows, 3, s, -1, k)
                else:
                    pos = _put(out, pos, write_rows, 0, s, i, -1)
                pos = _put(out, pos, write_rows, 5, i, -1, -1)
            continue
        pos = _put(out, pos, write_rows, 0, s, s + bm, -1)  # Advance
        pos = _put(out, pos, write_rows, 1, s + bm, -1, bj)  # Save
        st[top, 0], st[top, 1], st[top, 2], st[top, 3], st[top, 4], st[top, 5] = s, bm, k, a, 0, 1
        st[top + 1, 0], st[top + 1, 1], st[top + 1, 2] = s + bm, l - bm, bj
        st[top + 1, 3], st[top + 1, 4], st[top + 1, 5] = a - strides[bj], 1, 1
        top += 2
    return pos


class Multistage(Schedule):
    """The least-time schedule over a hierarchy of storage levels.

    **Arguments:**

    - `steps`: the number of forward steps ``n`` (>= 1).
    - `levels`: one :class:`Level` per storage level, fastest first, each
      with a finite number of slots (>= 1).
    - `forward_cost`, `adjoint_cost`: time of one forward / adjoint step, in
      the unit of the levels' costs.

    **Optimality:** exact for the cost model in the module docstring, over all
    schedules of ``Advance / Save / Load / Delete / Reverse``;
    ``stats().predicted_time`` is that least time and :attr:`optimal_time`
    the dynamic program's value of it.

    **Cost:** time about ``n L P log n`` and memory ``8 n L P`` bytes with
    ``P = prod(slots + 1)``; a ``ValueError`` is raised beforehand when that
    table would exceed `max_table_bytes`.
    """

    def __init__(
        self,
        steps: int,
        levels: Sequence[Level],
        forward_cost: float = 1.0,
        adjoint_cost: float = 1.0,
        *,
        max_table_bytes: int = 4 * 2**30,
    ):
        n = check_positive_int(steps, "steps")
        levels = tuple(levels)
        if not levels:
            raise ValueError("Multistage needs at least one Level(slots, write_cost, read_cost)")
        for i, level in enumerate(levels):
            if not isinstance(level, Level):
                raise ValueError(
                    f"levels[{i}] is {level!r}; give Level(slots, write_cost, read_cost)"
                )
            if level.slots is None:
                raise ValueError(
                    f"levels[{i}] has unbounded slots; Multistage plans for finite "
                    "slots (use StoreAll for unbounded storage)"
                )
        fwd = check_cost(forward_cost, "forward_cost")
        check_cost(adjoint_cost, "adjoint_cost")
        # No level needs more slots than there are states to store.
        slots = np.array([min(lv.slots, max(n - 1, 1)) for lv in levels], np.int64)
        states = int(np.prod(slots + 1))
        table_bytes = 8 * (n + 1) * len(levels) * states
        if table_bytes > max_table_bytes:
            raise ValueError(
                f"Multistage(steps={n}) over slots {slots.tolist()} needs a "
                f"{table_bytes / 2**30:.1f} GiB cost table; give fewer slots on the "
                "slow levels, fewer steps, or raise max_table_bytes"
            )
        write = np.array([lv.write_cost for lv in levels])
        read = np.array([lv.read_cost for lv in levels])
        F, strides = _solve(n, slots, write, read, fwd)
        full = int(np.sum(slots * strides))
        self.optimal_time = float(
            min(write[j] + F[n, j, full - strides[j]] for j in range(len(levels)) if slots[j] > 0)
        ) + n * adjoint_cost if n > 1 else n * adjoint_cost
        table = build_table(_emit, n, F, strides, slots, write, read, fwd)
        super().__init__(table, n, levels, fwd, adjoint_cost)

    def _params(self) -> str:
        return f"steps={self.n_steps}, levels={list(self.levels)}"
