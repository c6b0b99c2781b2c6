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
better than one (same slots, more writes), so one move level suffices.  Only
*valid* states are computed: the base takes a slot of its own level, so
``A_k < slots[k]``; no split or move of a valid state leads to an invalid one.

Speed.  The work is the minimum over the split ``m``, for every length ``l``,
state ``(k, A)`` and save level ``j``: with ``g = (j, A - e_j)`` and ``h =
(k, A)``, ``f_l(m) = fwd m + F(l - m, g) + F(m, h)`` on ``1 <= m < l``.  It is
not convex (the slopes ``d(y) = F(y + 1) - F(y)`` of the cost functions rise
only on average: they wiggle between neighbouring values in long, periodic
patterns), and its minimum is often attained on a long flat stretch, where
no bound on ``f`` built from slope extremes can be tight.  Every step below
drops splits only with a proof that they are no better than one already
evaluated, so the minimum stays exact:

* *From the previous length.*  ``f_l(m) = f_{l-1}(m) + d_g(l - 1 - m) =
  f_{l-1}(m - 1) + fwd + d_h(m - 1)``, so with ``LB`` a lower bound of ``min
  f_{l-1}`` (the previous search's result) every ``m`` with ``d_g(l - 1 - m)
  >= best - LB`` or ``fwd + d_h(m - 1) >= best - LB`` is no better than
  ``best`` (found at the previous optimum and its successor).  Suffix
  minima of each cost function's slopes (a monotone stack, ``O(1)``
  amortised per length) turn this into a window ``[l - x_g, y_h]`` found by
  two binary searches; for most searches it is empty.
* *Periods.*  In a wide window, a period ``p`` of the slopes of ``g`` around
  the previous optimum (KMP on a sample, then certified by comparing slopes
  one by one, and extended as ``l`` grows) makes the ``p``-step difference
  ``F(x + p, g) - F(x, g)`` one constant ``S`` over a stretch; there
  ``f_l(m) = f_{l-p}(m) + S >= LB_{l-p} + S``, which drops the flat stretches
  whole (cf. the weak periodicity of optimal two-level schedules, Aupy &
  Herrmann, Optim. Methods Softw. 32(3), 2017; here it is not assumed,
  only used where the slopes are checked to be periodic).
* *Branch and bound* over what remains: on ``[lo, hi]`` a step ``m -> m + 1``
  changes ``f`` by ``fwd + d_h(m) - d_g(l - m - 1)``, within ``[-beta,
  gamma]`` from the slope extremes over the interval (kept per block of 32
  lengths, or as prefix maxima and suffix minima), so ``f >= max(f(lo) -
  beta (m - lo), f(hi) - gamma (hi - m))`` inside; short intervals are
  scanned.
* *Dominance.*  Saving on ``j`` is never better than saving on ``i``, or than
  moving the base to a faster level ``kt`` and saving there on ``i``, when
  ``c_j + min_x (F(x, g_j) - F(x, g_i)) [+ min_x (F(x, h) - F(x, t))] >=
  c_i`` with ``c`` the constant costs of the options: running minima of
  these differences, ``O(1)`` per length, skip such options (ties drop one
  side only).  States with no free slot are the no-save closed form.
* *Lattice.*  When all costs are multiples of one ``q = 2^-e`` and every sum
  stays exact in float64, costs lie on the lattice ``q Z``, and a lower
  bound above ``best - q / 2`` already proves ``>= best``.

With non-dyadic costs (``0.1``, ``1.3``) the proofs compare float sums, so
the optimum is exact up to the rounding of those sums (relative ``1e-15``);
with integer or dyadic costs the table is exact.  ``tests/test_multistage.py``
checks every entry of the table against a brute-force minimum over all
``m`` (up to ``n = 4000``), and the optimum against an exhaustive search over
all schedules for tiny ``n``.

Measured cost (CPU seconds of one run on a shared 2-core machine,
``benchmarks/bench_multistage.py``, side by side with the previous branch and
bound, whose bound ``fwd lo + F(l - hi) + F(lo)`` ignores slopes and degrades
to scanning most ``m`` of wide intervals; equal ``optimal_time`` throughout):

    configuration                               n = 10^3   10^4    10^5
    A: [3, (4, 10, 10)], fwd 3      previous       0.031   0.94    94.5
                                    now            0.011   0.11     1.15
    B: [10, (20, 5, 5)], fwd 1      previous       0.54    78    ~11000 (n^2.2)
                                    now            0.16    1.9     27

i.e. about ``n^1`` for A and ``n^1.2`` to ``n^1.4`` for B (the windows left
after the bounds widen slowly with ``n``; the rest is ``O(n L P)``
bookkeeping, bound by memory latency at large ``n``), and memory ``8 n L P``
bytes for ``F`` (``P = prod(slots + 1)``; 370 MB for B at ``10^5``) plus
``n L P / 2`` for the block extremes.  The schedule is
emitted from ``F`` by re-running the splits along the optimal path.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._jit import njit
import numpy as np

from ._interrupt import call_kernel, stop_flag
from ._revolve import _put, build_table
from ._schedule import Level, Schedule, check_cost, check_positive_int

__all__ = ["Multistage"]

_SCAN = 16  # intervals with this few interior points are scanned rather than bounded
_SCAN_FAILED = 128  # ... and intervals this short whose bound fails
_BLOCK = 5  # block extremes of the slopes over blocks of 2**_BLOCK steps
_NEAR = 16  # intervals over at most this many blocks are bounded through block extremes
_PWIDE = 64  # windows this wide look for periods of the slopes
_PMAX = 64  # longest period looked for
_SAMPLE = 96  # half width of the sample of slopes whose period is computed
_RETRY = 16  # lengths between two looks for a period by the same split
_DEPTH = 192  # branch-and-bound stack: 2 entries per level of bisection, at most ~2 log2(n)


# --------------------------------------------------------------------------
# Slope summaries of one cost function F(., s).  The slopes are
# d(y) = F(y + 1) - F(y), y >= 1; at length l those with y <= l - 2 are known.
# rec[s, :nrec[s]]: the positions of the record highs of d (prefix maxima),
#                   so  max d(1..x) = d(last record <= x);  never changes.
# stk[s, :ntop[s]]: the positions of the suffix minima of the known d,
#                   values strictly increasing, so  min d(x..last) = d(first
#                   entry >= x);  a new slope pops the entries it undercuts.
# --------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _premax(F, rec, recv, nrec, s, x):
    """``max d(1 .. x)`` of state ``s``."""
    if nrec[s] < 0:  # convex state: d increases
        return F[s, x + 1] - F[s, x]
    lo = 0
    hi = nrec[s] - 1
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if rec[s, mid] <= x:
            lo = mid
        else:
            hi = mid - 1
    return recv[s, lo]


@njit(cache=True, nogil=True, inline="always")
def _sufmin(F, nrec, stk, stkv, ntop, s, x):
    """``min d(x .. last known)`` of state ``s``."""
    if nrec[s] < 0:
        return F[s, x + 1] - F[s, x]
    lo = 0
    hi = ntop[s] - 1
    while lo < hi:
        mid = (lo + hi) >> 1
        if stk[s, mid] >= x:
            hi = mid
        else:
            lo = mid + 1
    return stkv[s, lo]


@njit(cache=True, nogil=True, inline="always")
def _rises_from(F, nrec, stk, stkv, ntop, s, v):
    """The least ``x >= 1`` with ``d(y) >= v`` for every known ``y >= x``."""
    if nrec[s] < 0:
        lo = 1
        hi = ntop[s] + 1
        while lo < hi:
            mid = (lo + hi) >> 1
            if F[s, mid + 1] - F[s, mid] >= v:
                hi = mid
            else:
                lo = mid + 1
        return lo
    lo = 0
    hi = ntop[s] - 1
    last = -1
    while lo <= hi:
        mid = (lo + hi) >> 1
        if stkv[s, mid] < v:
            last = mid
            lo = mid + 1
        else:
            hi = mid - 1
    return 1 if last < 0 else stk[s, last] + 1


@njit(cache=True, nogil=True)
def _grow(a, size):
    b = np.empty((a.shape[0], size), a.dtype)
    b[:, : a.shape[1]] = a
    return b


# --------------------------------------------------------------------------
# The split search: min over m of f(m) = fwd m + F(l - m, g) + F(m, h).
# --------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _scan(F, l, h, g, fwd, lo, hi, best, best_m):
    """``min(best, f(m))`` over the interior ``lo < m < hi``, and its ``m``."""
    for m in range(lo + 1, hi):
        v = fwd * m + F[g, l - m] + F[h, m]
        if v < best:
            best = v
            best_m = m
    return best, best_m


@njit(cache=True, nogil=True)
def _bisect(F, rec, recv, nrec, stk, stkv, ntop, bmin, bmax, l, h, g, fwd, best, best_m, lo0, hi0, qh, work,
            fwork):
    """Exact ``min f(m)`` over ``m`` in ``[lo0, hi0]`` if below ``best``.

    Branch and bound over intervals whose two ends are evaluated.  On
    ``[lo, hi]`` a step ``m -> m + 1`` changes ``f`` by ``fwd + d_h(m) -
    d_g(l - m - 1)``, which lies in ``[-beta, gamma]`` with

        beta  = max d_g(1 .. l - lo - 1) - fwd - min d_h(lo .. ),
        gamma = fwd + max d_h(1 .. hi - 1) - min d_g(l - hi .. ),

    so inside the interval ``f(m) >= max(f(lo) - beta (m - lo), f(hi) -
    gamma (hi - m))``; the interval is dropped when that bound reaches
    ``best`` (``beta <= 0`` or ``gamma <= 0``: ``f`` is monotone there).
    """
    flo = fwd * lo0 + F[g, l - lo0] + F[h, lo0]
    if flo < best:
        best = flo
        best_m = lo0
    if hi0 <= lo0:
        return best, best_m
    fhi = fwd * hi0 + F[g, l - hi0] + F[h, hi0]
    if fhi < best:
        best = fhi
        best_m = hi0
    work[0, 0] = lo0
    work[0, 1] = hi0
    fwork[0, 0] = flo
    fwork[0, 1] = fhi
    top = 1
    while top > 0:
        top -= 1
        lo = work[top, 0]
        hi = work[top, 1]
        if hi - lo < 2:
            continue
        flo = fwork[top, 0]
        fhi = fwork[top, 1]
        if hi - lo <= _SCAN:
            best, best_m = _scan(F, l, h, g, fwd, lo, hi, best, best_m)
            continue
        if ((hi - 1) >> _BLOCK) - (lo >> _BLOCK) <= _NEAR:
            # the slopes over the interval, from their block extremes
            h_lo = np.inf
            h_hi = -np.inf
            for b in range(lo >> _BLOCK, ((hi - 1) >> _BLOCK) + 1):
                h_lo = min(h_lo, bmin[h, b])
                h_hi = max(h_hi, bmax[h, b])
            g_lo = np.inf
            g_hi = -np.inf
            for b in range((l - hi) >> _BLOCK, ((l - lo - 1) >> _BLOCK) + 1):
                g_lo = min(g_lo, bmin[g, b])
                g_hi = max(g_hi, bmax[g, b])
            beta = g_hi - fwd - h_lo
            gamma = fwd + h_hi - g_lo
        else:
            beta = _premax(F, rec, recv, nrec, g, l - lo - 1) - fwd - _sufmin(F, nrec, stk, stkv, ntop, h, lo)
            gamma = fwd + _premax(F, rec, recv, nrec, h, hi - 1) - _sufmin(F, nrec, stk, stkv, ntop, g, l - hi)
        if beta <= 0.0:
            continue  # f does not decrease on [lo, hi]: f >= f(lo) >= best
        if gamma <= 0.0:
            continue
        width = hi - lo
        t = (flo - fhi + gamma * width) / (beta + gamma)
        if t < 0.0:
            t = 0.0
        elif t > width:
            t = width
        if flo - beta * t >= best - qh:
            continue
        if hi - lo <= _SCAN_FAILED:
            # bounds fail on short intervals mostly where f is flat: scan
            best, best_m = _scan(F, l, h, g, fwd, lo, hi, best, best_m)
            continue
        mid = (lo + hi) >> 1
        fm = fwd * mid + F[g, l - mid] + F[h, mid]
        if fm < best:
            best = fm
            best_m = mid
        # the half with the lower known end is searched first (it is pushed last)
        if flo <= fhi:
            work[top, 0], work[top, 1], fwork[top, 0], fwork[top, 1] = mid, hi, fm, fhi
            work[top + 1, 0], work[top + 1, 1], fwork[top + 1, 0], fwork[top + 1, 1] = lo, mid, flo, fm
        else:
            work[top, 0], work[top, 1], fwork[top, 0], fwork[top, 1] = lo, mid, flo, fm
            work[top + 1, 0], work[top + 1, 1], fwork[top + 1, 0], fwork[top + 1, 1] = mid, hi, fm, fhi
        top += 2
    return best, best_m


@njit(cache=True, nogil=True, inline="always")
def _split(F, rec, recv, nrec, stk, stkv, ntop, bmin, bmax, l, h, g, fwd, best, guess, lb_prev, qh, work,
           fwork, lbh, cert, ci, iwork):
    """``min_m fwd m + F(l - m, g) + F(m, h)`` and an argmin, if below ``best``.

    Returns ``(best, -1)`` when no split beats ``best``.  ``lb_prev`` is a
    lower bound of the same minimum at length ``l - 1`` (``-inf``: none).
    Since ``f_l(m) = f_{l-1}(m) + d_g(l - 1 - m) = f_{l-1}(m - 1) + fwd +
    d_h(m - 1)``, every ``m`` with ``d_g(l - 1 - m) >= best - lb_prev`` or
    ``fwd + d_h(m - 1) >= best - lb_prev`` is no better than ``best``: the
    suffix minima of the slopes cut the range to a window; in a wide window
    a period of the slopes of ``g`` may drop a stretch (``_periodic_cut``);
    ``_bisect`` searches the rest.
    """
    best_m = -1
    if l == 2:
        v = fwd + F[g, 1] + F[h, 1]
        if v < best:
            return v, 1
        return best, -1
    v = fwd * (l - 1) + F[g, 1] + F[h, l - 1]  # the split new at this length
    if v < best:
        best = v
        best_m = l - 1
    for m in range(guess, guess + 2):  # the last optimum and its successor
        if 1 <= m <= l - 2:
            v = fwd * m + F[g, l - m] + F[h, m]
            if v < best:
                best = v
                best_m = m
    if lb_prev == -np.inf:
        return _bisect(F, rec, recv, nrec, stk, stkv, ntop, bmin, bmax, l, h, g, fwd, best, best_m, 1, l - 2, qh,
                       work, fwork)
    delta = best - qh - lb_prev
    lo = max(1, l - _rises_from(F, nrec, stk, stkv, ntop, g, delta))
    hi = min(l - 2, max(1, _rises_from(F, nrec, stk, stkv, ntop, h, delta - fwd)))
    if lo > hi:
        return best, best_m
    if hi - lo >= _PWIDE:
        a, b = _periodic_cut(F, g, l, lo, hi, guess, best - qh, lbh, cert, ci, iwork)
        if a <= b:
            if lo < a:
                best, best_m = _bisect(F, rec, recv, nrec, stk, stkv, ntop, bmin, bmax, l, h, g, fwd, best,
                                       best_m, lo, a - 1, qh, work, fwork)
            if b < hi:
                best, best_m = _bisect(F, rec, recv, nrec, stk, stkv, ntop, bmin, bmax, l, h, g, fwd, best,
                                       best_m, b + 1, hi, qh, work, fwork)
            return best, best_m
    return _bisect(F, rec, recv, nrec, stk, stkv, ntop, bmin, bmax, l, h, g, fwd, best, best_m, lo, hi, qh, work,
                   fwork)


@njit(cache=True, nogil=True)
def _periodic_cut(F, g, l, lo, hi, guess, bar, lbh, cert, ci, iwork):
    """The splits in ``[lo, hi]`` that ``f_l(m) >= LB_{l-p} + F(l - m, g) - F(l -
    p - m, g) >= bar`` drops, with ``p`` a period of the slopes of ``g``.

    ``cert[ci] = (p, x1, x2, tried)`` certifies ``d_g(y) = d_g(y - p)`` for
    ``y`` in ``[x1 + p, x2]``: the ``p``-step difference ``F(x + p, g) - F(x,
    g)`` is then one constant for ``x`` in ``[x1, x2 - p + 1]``.  Returns the
    dropped interval ``(a, b)`` (``a > b``: none).
    """
    p = cert[ci, 0]
    a = 1
    b = 0
    if p > 0:
        x2 = cert[ci, 2]
        while x2 < l - 2 and F[g, x2 + 2] - F[g, x2 + 1] == F[g, x2 + 2 - p] - F[g, x2 + 1 - p]:
            x2 += 1
        cert[ci, 2] = x2
        a, b = _cut_range(F, g, l, lo, hi, bar, lbh, ci, p, cert[ci, 1], x2)
    if 2 * (b - a + 1) < hi - lo + 1 and l - cert[ci, 3] >= _RETRY:
        cert[ci, 3] = l
        # the smallest period of the slopes around the last optimum (KMP)
        center = min(max(l - 1 - guess, 1), l - 2)
        y0 = max(1, center - _SAMPLE)
        y1 = min(l - 2, center + _SAMPLE)
        size = y1 - y0 + 1
        if size < 8:
            return a, b
        iwork[0] = 0
        q = 0
        for i in range(1, size):
            v = F[g, y0 + i + 1] - F[g, y0 + i]
            while q > 0 and v != F[g, y0 + q + 1] - F[g, y0 + q]:
                q = iwork[q - 1]
            if v == F[g, y0 + q + 1] - F[g, y0 + q]:
                q += 1
            iwork[i] = q
        p2 = size - iwork[size - 1]
        if p2 > _PMAX or 2 * p2 > size:
            return a, b
        x1 = y0
        x2 = y1
        while x2 < l - 2 and F[g, x2 + 2] - F[g, x2 + 1] == F[g, x2 + 2 - p2] - F[g, x2 + 1 - p2]:
            x2 += 1
        while x1 > 1 and F[g, x1] - F[g, x1 - 1] == F[g, x1 + p2] - F[g, x1 + p2 - 1]:
            x1 -= 1
        a2, b2 = _cut_range(F, g, l, lo, hi, bar, lbh, ci, p2, x1, x2)
        if b2 - a2 > b - a:
            cert[ci, 0] = p2
            cert[ci, 1] = x1
            cert[ci, 2] = x2
            a = a2
            b = b2
    return a, b


@njit(cache=True, nogil=True)
def _cut_range(F, g, l, lo, hi, bar, lbh, ci, p, x1, x2):
    if l - p < 2 or x2 - p + 1 < x1:
        return 1, 0
    lb = lbh[ci, (l - p) % _PMAX]
    if lb == -np.inf or lb + F[g, x1 + p] - F[g, x1] < bar:
        return 1, 0
    return max(lo, l - x2 - 1), min(hi, l - p - x1)


@njit(cache=True, nogil=True, inline="always")
def _digit(a, k, strides, slots):
    return (a // strides[k]) % (slots[k] + 1)


@njit(cache=True, nogil=True)
def _dominance(slots, strides, write, read, valid):
    """Which split options may make another one redundant, and through which
    pairs of cost functions.

    Option ``(s, j)``: state ``s = (k, A)`` saves on ``j``, total cost
    ``c = write[j] + read[k]`` plus ``fwd m + F(l - m, g) + F(m, s)`` with
    ``g = (j, A - e_j)``.  A dominator is another option of ``s`` (``H`` the
    same) or an option of ``s``'s base moved to a faster level ``kt``, state
    ``t``, whose cost includes the move, ``write[kt]``.  The option is redundant
    when ``c + min_x (F(x, g) - F(x, g')) + min_x (F(x, s) - F(x, t)) >= c'``
    over all lengths used; the pairs of functions whose running minimum of the
    difference is kept are ``pa[e] - pb[e]``.  Ties drop only the higher own
    option; moves only go to faster levels, so no two options drop each other.
    """
    L = slots.shape[0]
    S = valid.shape[0]
    P = S // L
    cap = S * L * (L * L + 1) + 1
    pa = np.empty(cap, np.int64)
    pb = np.empty(cap, np.int64)
    dom_start = np.zeros(S * L + 1, np.int64)
    dom_h = np.empty(cap, np.int64)
    dom_g = np.empty(cap, np.int64)
    dom_cost = np.empty(cap)
    dom_tie = np.empty(cap, np.bool_)
    npair = 0
    ne = 0
    for s in range(S):
        k = s // P
        a = s - k * P
        for j in range(L):
            dom_start[s * L + j] = ne
            if not valid[s] or _digit(a, j, strides, slots) == 0:
                continue
            g = j * P + a - strides[j]
            for i in range(L):  # the same base, saving on i
                if i != j and _digit(a, i, strides, slots) > 0:
                    pa[npair] = g
                    pb[npair] = i * P + a - strides[i]
                    dom_h[ne] = -1
                    dom_g[ne] = npair
                    dom_cost[ne] = write[i] + read[k]
                    dom_tie[ne] = i < j
                    npair += 1
                    ne += 1
            for kt in range(k):  # the base moved to a faster level kt, then saving on i
                if _digit(a, kt, strides, slots) == 0:
                    continue
                at = a - strides[kt] + strides[k]
                t = kt * P + at
                pa[npair] = s
                pb[npair] = t
                ph = npair
                npair += 1
                for i in range(L):
                    if _digit(at, i, strides, slots) > 0:
                        pa[npair] = g
                        pb[npair] = i * P + at - strides[i]
                        dom_h[ne] = ph
                        dom_g[ne] = npair
                        dom_cost[ne] = write[kt] + write[i] + read[kt]
                        dom_tie[ne] = True
                        npair += 1
                        ne += 1
    dom_start[S * L] = ne
    return (pa[:npair].copy(), pb[:npair].copy(), dom_start, dom_h[:ne].copy(),
            dom_g[:ne].copy(), dom_cost[:ne].copy(), dom_tie[:ne].copy())


@njit(cache=True, nogil=True)
def _solve(n, slots, write, read, fwd, qh, stop):
    """The table ``F[k P + a, l]`` for ``l = 0 .. n`` and the slope summaries
    (``_emit`` re-runs splits along the optimal path with them).  Returns
    early, with the table filled up to some ``l``, once ``stop[0] != 0``
    (:mod:`._interrupt`)."""
    L = slots.shape[0]
    strides = np.empty(L, np.int64)
    P = 1
    for k in range(L):
        strides[k] = P
        P *= slots[k] + 1
    S = L * P
    F = np.zeros((S, n + 1))
    cap = min(max(n, 1), 64)
    rec = np.zeros((S, cap), np.int32)
    stk = np.zeros((S, cap), np.int32)
    recv = np.zeros((S, cap))
    stkv = np.zeros((S, cap))
    nrec = np.zeros(S, np.int64)
    ntop = np.zeros(S, np.int64)
    for k in range(L):
        nrec[k * P] = -1  # no free slot: F = read (l - 1) + fwd l (l - 1) / 2, d increases
    bmin = np.full((S, (n >> _BLOCK) + 1), np.inf)
    bmax = np.full((S, (n >> _BLOCK) + 1), -np.inf)
    B = np.empty(S)
    guesses = np.ones((S, L), np.int64)
    lbs = np.full((S, L), -np.inf)
    # A state whose own level has all its slots free holds its base nowhere:
    # no valid state refers to it (splits and moves keep a slot for the base).
    valid = np.empty(S, np.bool_)
    for s in range(S):
        k = s // P
        valid[s] = _digit(s - k * P, k, strides, slots) < slots[k]
    pa, pb, dom_start, dom_h, dom_g, dom_cost, dom_tie = _dominance(slots, strides, write, read, valid)
    pmin = np.zeros(pa.shape[0])  # min over lengths x of F(x, pa) - F(x, pb); x = 1: 0
    work = np.empty((_DEPTH, 2), np.int64)
    fwork = np.empty((_DEPTH, 2))
    lbh = np.full((S * L, _PMAX), -np.inf)  # lower bounds of the split minima at l - p
    cert = np.zeros((S * L, 4), np.int64)  # periods of the slopes of g: p, x1, x2, tried at
    cert[:, 3] = -_RETRY
    iwork = np.empty(2 * _SAMPLE + 2, np.int64)
    # moves of each base: to the state t for a write on level kt
    mv_start = np.zeros(S + 1, np.int64)
    mv_t = np.empty(S * L, np.int64)
    mv_w = np.empty(S * L)
    mv_faster = np.empty(S * L, np.bool_)
    ne = 0
    for s in range(S):
        mv_start[s] = ne
        k = s // P
        a = s - k * P
        if valid[s]:
            for kt in range(L):
                if kt != k and _digit(a, kt, strides, slots) > 0:
                    mv_t[ne] = kt * P + a - strides[kt] + strides[k]
                    mv_w[ne] = write[kt]
                    mv_faster[ne] = kt < k
                    ne += 1
    mv_start[S] = ne
    free = np.empty((S, L), np.bool_)  # level j has a free slot in state s
    for s in range(S):
        for j in range(L):
            free[s, j] = valid[s] and _digit(s % P, j, strides, slots) > 0
    for l in range(2, n + 1):
        if stop[0] != 0:
            break
        for s in range(S):
            if not valid[s]:
                continue
            k = s // P
            a = s - k * P
            best = read[k] * (l - 1) + fwd * l * (l - 1) / 2.0
            # Moves of the base to a faster level, whose B is known: a split of
            # this base need only be known to be no better.
            for e in range(mv_start[s], mv_start[s + 1]):
                if mv_faster[e]:
                    best = min(best, mv_w[e] + B[mv_t[e]])
            for j in range(L):
                if not free[s, j]:
                    continue
                c = write[j] + read[k]
                # Skip saving on j when another option, of this base or of the base
                # moved to a faster level, is no worse at every split m (module
                # docstring, "Dominance").
                dominated = False
                for e in range(dom_start[s * L + j], dom_start[s * L + j + 1]):
                    slack = c - dom_cost[e] + pmin[dom_g[e]]
                    if dom_h[e] >= 0:
                        slack += pmin[dom_h[e]]
                    if slack > 0.0 or (slack == 0.0 and dom_tie[e]):
                        dominated = True
                        break
                if dominated:
                    lbs[s, j] = -np.inf  # searched from scratch should it cease to be
                    lbh[s * L + j, l % _PMAX] = -np.inf
                    continue
                v, m = _split(F, rec, recv, nrec, stk, stkv, ntop, bmin, bmax, l, s,
                              j * P + a - strides[j], fwd, best - c, guesses[s, j], lbs[s, j],
                              qh, work, fwork, lbh, cert, s * L + j, iwork)
                lbs[s, j] = v
                lbh[s * L + j, l % _PMAX] = v
                if m > 0:
                    guesses[s, j] = m
                    best = v + c
            B[s] = best
        for s in range(S):
            if valid[s]:
                best = B[s]
                for e in range(mv_start[s], mv_start[s + 1]):
                    best = min(best, mv_w[e] + B[mv_t[e]])
                F[s, l] = best
        for e in range(pa.shape[0]):
            pmin[e] = min(pmin[e], F[pa[e], l] - F[pb[e], l])
        if l < n:  # slope d(l - 1) is needed from length l + 1 on
            need = 0
            for s in range(S):
                if nrec[s] >= 0:
                    need = max(need, nrec[s], ntop[s])
            if need >= rec.shape[1]:
                size = min(2 * rec.shape[1], n)
                rec = _grow(rec, size)
                stk = _grow(stk, size)
                recv = _grow(recv, size)
                stkv = _grow(stkv, size)
            # append the slope d(l - 1) to the summaries (inlined: a call with
            # this many arrays costs as much as the work)
            y = l - 1
            b = y >> _BLOCK
            for s in range(S):
                if not valid[s]:
                    continue
                v = F[s, y + 1] - F[s, y]
                bmin[s, b] = min(bmin[s, b], v)
                bmax[s, b] = max(bmax[s, b], v)
                if nrec[s] < 0:
                    ntop[s] = y
                    continue
                c = nrec[s]
                if c == 0 or v > recv[s, c - 1]:
                    rec[s, c] = y
                    recv[s, c] = v
                    nrec[s] = c + 1
                t = ntop[s]
                while t > 0 and stkv[s, t - 1] >= v:
                    t -= 1
                stk[s, t] = y
                stkv[s, t] = v
                ntop[s] = t + 1
    return F, strides, rec, recv, nrec, stk, stkv, ntop, bmin, bmax


@njit(cache=True, nogil=True)
def _base(F, rec, recv, nrec, stk, stkv, ntop, bmin, bmax, l, k, a, slots, strides, write, read, fwd, work,
          fwork):
    """``B(l, k, A)``: its value, the save level (-1: no save) and the split."""
    P = F.shape[0] // slots.shape[0]
    best = read[k] * (l - 1) + fwd * l * (l - 1) / 2.0
    best_j = -1
    best_m = 0
    for j in range(slots.shape[0]):
        if _digit(a, j, strides, slots) == 0:
            continue
        c = write[j] + read[k]
        v, m = _bisect(F, rec, recv, nrec, stk, stkv, ntop, bmin, bmax, l, k * P + a, j * P + a - strides[j], fwd,
                       best - c, -1, 1, l - 1, 0.0, work, fwork)
        if m > 0:
            best = v + c
            best_j = j
            best_m = m
    return best, best_j, best_m


@njit(cache=True, nogil=True)
def _emit(out, write_rows, n, F, strides, slots, write, read, fwd, rec, recv, nrec, stk, stkv, ntop,
          bmin, bmax):
    L = slots.shape[0]
    P = F.shape[0] // L
    work = np.empty((_DEPTH, 2), np.int64)
    fwork = np.empty((_DEPTH, 2))
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
            v = write[j] + F[j * P + full - strides[j], n]
            if v < best:
                best = v
                k0 = j
    pos = _put(out, pos, write_rows, 1, 0, -1, k0)  # Save u_0
    total = 0
    for k in range(L):
        total += slots[k]
    depth = 2 * total + 8
    st = np.empty((depth, 5), np.int64)  # s, l, k, a, in_hand
    st[0, 0], st[0, 1], st[0, 2], st[0, 3], st[0, 4] = 0, n, k0, full - strides[k0], 1
    top = 1
    while top > 0:
        top -= 1
        s, l, k, a, h = st[top, 0], st[top, 1], st[top, 2], st[top, 3], st[top, 4]
        if h == 0:
            pos = _put(out, pos, write_rows, 2, s, -1, k)  # Load
        if l == 1:
            pos = _put(out, pos, write_rows, 3, s, -1, k)  # Delete
            pos = _put(out, pos, write_rows, 5, s, -1, -1)  # Reverse
            continue
        b, bj, bm = _base(F, rec, recv, nrec, stk, stkv, ntop, bmin, bmax, l, k, a, slots, strides, write, read, fwd,
                          work, fwork)
        if _digit(a, k, strides, slots) < slots[k]:
            # Moving the base may pay off: to the level whose segment is cheapest.
            target = -1
            tj = -1
            tm = 0
            for j in range(L):
                if j != k and _digit(a, j, strides, slots) > 0:
                    a2 = a - strides[j] + strides[k]
                    v = write[j] + F[j * P + a2, l]
                    if v < b:
                        b2, bj2, bm2 = _base(F, rec, recv, nrec, stk, stkv, ntop, bmin, bmax, l, j, a2, slots, strides,
                                             write, read, fwd, work, fwork)
                        if write[j] + b2 < b:
                            b = write[j] + b2
                            target, tj, tm = j, bj2, bm2
            if target >= 0:
                pos = _put(out, pos, write_rows, 1, s, -1, target)  # Save
                pos = _put(out, pos, write_rows, 3, s, -1, k)  # Delete
                a = a - strides[target] + strides[k]
                k = target
                bj = tj
                bm = tm
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
        st[top, 0], st[top, 1], st[top, 2], st[top, 3], st[top, 4] = s, bm, k, a, 0
        st[top + 1, 0], st[top + 1, 1], st[top + 1, 2] = s + bm, l - bm, bj
        st[top + 1, 3], st[top + 1, 4] = a - strides[bj], 1
        top += 2
    return pos


def _quantum(n: int, values) -> float:
    """A ``q = 2**-e`` of which every cost is an exact multiple, with all sums of
    them exact in float64 up to the no-save cost of ``n`` steps; 0 if none."""
    top = max(values) * (n + 1) * (n + 1) + 1.0
    for e in range(0, 31):
        scale = 2.0**e
        if all(float(v * scale).is_integer() for v in values):
            return 1.0 / scale if top * scale < 2.0**52 else 0.0
    return 0.0


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

    **Cost:** measured in the module docstring (two levels at ``n = 10^5``
    in seconds to tens of seconds); memory about ``8.5 n L P`` bytes with
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
        # the cost table and the block extremes of its slopes
        table_bytes = (8 * (n + 1) + 16 * ((n >> _BLOCK) + 1)) * len(levels) * states
        if table_bytes > max_table_bytes:
            raise ValueError(
                f"Multistage(steps={n}) over slots {slots.tolist()} needs a "
                f"{table_bytes / 2**30:.1f} GiB cost table; give fewer slots on the "
                "slow levels, fewer steps, or raise max_table_bytes"
            )
        write = np.array([lv.write_cost for lv in levels])
        read = np.array([lv.read_cost for lv in levels])
        q = _quantum(n, [fwd, *write, *read])
        # On a worker thread, so that Ctrl-C stops it cleanly (see _interrupt).
        stop = stop_flag()
        F, strides, rec, recv, nrec, stk, stkv, ntop, bmin, bmax = call_kernel(
            _solve, n, slots, write, read, fwd, q / 2, stop, stop=stop)
        P = states
        full = int(np.sum(slots * strides))
        self.optimal_time = float(
            min(write[j] + F[j * P + full - strides[j], n]
                for j in range(len(levels)) if slots[j] > 0)
        ) + n * adjoint_cost if n > 1 else n * adjoint_cost
        table = build_table(_emit, n, F, strides, slots, write, read, fwd, rec, recv, nrec, stk,
                            stkv, ntop, bmin, bmax)
        super().__init__(table, n, levels, fwd, adjoint_cost)

    def _params(self) -> str:
        return f"steps={self.n_steps}, levels={list(self.levels)}"
