"""Multistage: the schedule's rows, from the cost table to a compact form.

The dynamic program of :mod:`._multistage` fills the cost table ``F``; the
schedule is the recursion that re-runs, segment by segment, the split
search along the optimal path (:func:`_base`, as in the dynamic program).
A segment ``(s, l, k, A)`` starts at step ``s``, spans ``l`` steps, has its
base (the state ``u_s``) on level ``k`` and the free slots ``A`` (one digit
per level, :func:`digit`).  Its rows: a ``Load`` of the base unless it is
in hand; for ``l = 1``, ``Delete`` and ``Reverse``; otherwise, when moving
the base to another level pays, its ``Save`` there and ``Delete`` here; then
either (no further save) the restarts of :func:`~._revolve.restart_rows`,
or an ``Advance`` to the split ``s + m`` and a ``Save`` of ``u_{s+m}`` on the
save level, followed by the right segment ``(s + m, l - m)`` (in hand) and
then the left one ``(s, m)``.

A :class:`~vlcc_adjoint.schedules.Multistage` keeps neither ``F`` (``8 n L
P`` bytes) nor the table (about 90 bytes a step): the decision of a segment
``(l, k, A)`` (where its base moves, where it saves, where it splits)
depends on ``(l, k, A)`` alone, not on the step it starts at, so
:func:`decide` walks the recursion once and keeps one decision per distinct
segment, and :func:`_fill` writes the rows of the recursion from those
decisions as a resumable emitter, chunk by chunk (:mod:`._chunks`).
"""

from __future__ import annotations

import numpy as np

from ..errors import VlccRuntimeError
from ._jit import njit
from ._multistage_split import DEPTH, bisect
from ._revolve import put_row, restart_rows
from .actions import ADVANCE, DELETE, LOAD, REVERSE, SAVE

__all__ = ["Decisions"]


@njit(cache=True, nogil=True, inline="always")
def digit(a, k, strides, slots):
    return (a // strides[k]) % (slots[k] + 1)


@njit(cache=True, nogil=True)
def _base(
    F,
    rec,
    recv,
    nrec,
    stk,
    stkv,
    ntop,
    bmin,
    bmax,
    l,
    k,
    a,
    slots,
    strides,
    write,
    read,
    fwd,
    work,
    fwork,
):
    """``B(l, k, A)``: its value, the save level (-1: no save) and the split."""
    P = F.shape[0] // slots.shape[0]
    best = read[k] * (l - 1) + fwd * l * (l - 1) / 2.0
    best_j = -1
    best_m = 0
    for j in range(slots.shape[0]):
        if digit(a, j, strides, slots) == 0:
            continue
        c = write[j] + read[k]
        v, m = bisect(
            F,
            rec,
            recv,
            nrec,
            stk,
            stkv,
            ntop,
            bmin,
            bmax,
            l,
            k * P + a,
            j * P + a - strides[j],
            fwd,
            best - c,
            -1,
            1,
            l - 1,
            0.0,
            work,
            fwork,
        )
        if m > 0:
            best = v + c
            best_j = j
            best_m = m
    return best, best_j, best_m


@njit(cache=True, nogil=True)
def decide(n, F, strides, slots, write, read, fwd, rec, recv, nrec, stk, stkv, ntop, bmin, bmax):
    """Walk the recursion (the module docstring) without writing rows; return the first
    level ``k0`` and, for every segment of length ``l >= 2`` on the way, its
    key ``l S + k P + a`` and decision: the level its base moves to (-1:
    none), its save level (-1: none, restart from the base) and its split.
    A decision depends on the key alone, not on where the segment starts."""
    L = slots.shape[0]
    P = F.shape[0] // L
    S = F.shape[0]
    work = np.empty((DEPTH, 2), np.int64)
    fwork = np.empty((DEPTH, 2))
    size = 1024
    keys = np.empty(size, np.int64)
    dt = np.empty(size, np.int8)
    dj = np.empty(size, np.int8)
    dm = np.empty(size, np.int64)
    count = 0
    if n == 1:
        return 0, keys[:0], dt[:0], dj[:0], dm[:0]
    full = 0
    for k in range(L):
        full += slots[k] * strides[k]
    best = np.inf
    k0 = -1
    for j in range(L):
        if slots[j] > 0:
            v = write[j] + F[j * P + full - strides[j], n]
            if v < best:
                best = v
                k0 = j
    total = 0
    for k in range(L):
        total += slots[k]
    depth = 2 * total + 8
    st = np.empty((depth, 4), np.int64)  # s, l, k, a
    st[0, 0], st[0, 1], st[0, 2], st[0, 3] = 0, n, k0, full - strides[k0]
    top = 1
    while top > 0:
        top -= 1
        s, l, k, a = st[top, 0], st[top, 1], st[top, 2], st[top, 3]
        if l == 1:
            continue
        key = l * S + k * P + a
        b, bj, bm = _base(
            F,
            rec,
            recv,
            nrec,
            stk,
            stkv,
            ntop,
            bmin,
            bmax,
            l,
            k,
            a,
            slots,
            strides,
            write,
            read,
            fwd,
            work,
            fwork,
        )
        target = -1
        if digit(a, k, strides, slots) < slots[k]:
            tj = -1
            tm = 0
            for j in range(L):
                if j != k and digit(a, j, strides, slots) > 0:
                    a2 = a - strides[j] + strides[k]
                    v = write[j] + F[j * P + a2, l]
                    if v < b:
                        b2, bj2, bm2 = _base(
                            F,
                            rec,
                            recv,
                            nrec,
                            stk,
                            stkv,
                            ntop,
                            bmin,
                            bmax,
                            l,
                            j,
                            a2,
                            slots,
                            strides,
                            write,
                            read,
                            fwd,
                            work,
                            fwork,
                        )
                        if write[j] + b2 < b:
                            b = write[j] + b2
                            target, tj, tm = j, bj2, bm2
            if target >= 0:
                a = a - strides[target] + strides[k]
                k = target
                bj = tj
                bm = tm
        if count == size:
            size *= 2
            keys2 = np.empty(size, np.int64)
            dt2 = np.empty(size, np.int8)
            dj2 = np.empty(size, np.int8)
            dm2 = np.empty(size, np.int64)
            keys2[:count] = keys[:count]
            dt2[:count] = dt[:count]
            dj2[:count] = dj[:count]
            dm2[:count] = dm[:count]
            keys, dt, dj, dm = keys2, dt2, dj2, dm2
        keys[count] = key
        dt[count] = target
        dj[count] = bj
        dm[count] = bm
        count += 1
        if bj < 0:
            continue
        st[top, 0], st[top, 1], st[top, 2], st[top, 3] = s, bm, k, a
        st[top + 1, 0], st[top + 1, 1], st[top + 1, 2], st[top + 1, 3] = (
            s + bm,
            l - bm,
            bj,
            a - strides[bj],
        )
        top += 2
    return k0, keys[:count], dt[:count], dj[:count], dm[:count]


# The resumable emitter (:mod:`._chunks`): registers, then the stack of
# segments (s, l, k, a, in_hand), five words each.
_REGS = 10


def _fill_state(n: int, slots: np.ndarray, strides: np.ndarray, k0: int) -> np.ndarray:
    depth = 2 * int(np.sum(slots)) + 8
    state = np.zeros(_REGS + 5 * depth, np.int64)
    state[6] = n
    state[7] = k0
    state[8] = int(np.sum(slots * strides))
    return state


@njit(cache=True, nogil=True)
def _fill(out, write, state, limit, keys, dt, dj, dm, strides, S, P):
    """Continue the recursion (the module docstring) from `state` with the decisions of
    :func:`decide` (looked up by key, a binary search), paused after any
    unit once fewer than 5 rows of room are left below `limit` (a unit: a
    Load, a move's Save and Delete, an Advance and a Save).  Registers: top,
    restart (flag, s, last step, next step, level), phase, n, k0, full."""
    pos = 0
    phase = state[5]
    if phase == 2:
        return 0
    if phase == 0:
        n = state[6]
        if n == 1:
            state[5] = 2
            return put_row(out, pos, write, REVERSE, 0, -1, -1)  # Reverse(0)
        k0 = state[7]
        pos = put_row(out, pos, write, SAVE, 0, -1, k0)  # Save u_0
        b = _REGS
        state[b], state[b + 1], state[b + 2], state[b + 3], state[b + 4] = (
            0,
            n,
            k0,
            state[8] - strides[k0],
            1,
        )
        state[0] = 1
        state[5] = 1
    top = state[0]
    while True:
        if state[1] != 0:  # a restart under way (no further save)
            pos, i = restart_rows(out, pos, write, state[2], state[3], state[4], state[9], limit)
            if i >= state[2]:  # paused: no room left
                state[4] = i
                state[0] = top
                return pos
            state[1] = 0
        if top == 0:
            state[5] = 2
            break
        if pos + 5 > limit:
            break
        top -= 1
        b = _REGS + 5 * top
        s, l, k, a, h = state[b], state[b + 1], state[b + 2], state[b + 3], state[b + 4]
        if h == 0:
            pos = put_row(out, pos, write, LOAD, s, -1, k)
        if l == 1:
            state[1], state[2], state[3], state[4], state[9] = 1, s, s, s, k
            continue
        d = np.searchsorted(keys, l * S + k * P + a)
        target = dt[d]
        if target >= 0:
            pos = put_row(out, pos, write, SAVE, s, -1, target)
            pos = put_row(out, pos, write, DELETE, s, -1, k)
            a = a - strides[target] + strides[k]
            k = target
        bj = dj[d]
        if bj < 0:
            state[1], state[2], state[3], state[4], state[9] = 1, s, s + l - 1, s + l - 1, k
            continue
        bm = dm[d]
        if b + 10 > state.shape[0]:  # pragma: no cover - the stack's depth bound
            return -1
        pos = put_row(out, pos, write, ADVANCE, s, s + bm, -1)
        pos = put_row(out, pos, write, SAVE, s + bm, -1, bj)
        state[b], state[b + 1], state[b + 2], state[b + 3], state[b + 4] = s, bm, k, a, 0
        state[b + 5], state[b + 6], state[b + 7] = s + bm, l - bm, bj
        state[b + 8], state[b + 9] = a - strides[bj], 1
        top += 2
    state[0] = top
    return pos


class Decisions:
    """A Multistage schedule in compact form: one decision per distinct
    segment ``(l, k, A)`` of its recursion, sorted by key, and the resumable
    emitter that turns them into rows (:mod:`._chunks`).

    **Attributes:** `keys` (``l S + k P + a``), `target`, `save`, `split`.
    """

    def __init__(self, n, slots, strides, k0, keys, target, save, split):
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        first = np.ones(len(keys), bool)
        first[1:] = keys[1:] != keys[:-1]
        group = np.cumsum(first) - 1
        for values in (target, save, split):
            values = values[order]
            if np.any(values != values[first][group]):  # pragma: no cover - _base is a function
                raise VlccRuntimeError("Multistage decided one segment two ways")
        self.keys = keys[first]
        self.target = target[order][first]
        self.save = save[order][first]
        self.split = split[order][first]
        self.strides = np.asarray(strides, np.int64)
        self.P = int(np.prod(np.asarray(slots) + 1))
        self.S = len(slots) * self.P
        self.state = _fill_state(n, np.asarray(slots, np.int64), self.strides, k0)

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.target.nbytes + self.save.nbytes + self.split.nbytes)

    def fill(self, out, write, state, limit):
        return _fill(
            out,
            write,
            state,
            limit,
            self.keys,
            self.target,
            self.save,
            self.split,
            self.strides,
            self.S,
            self.P,
        )
