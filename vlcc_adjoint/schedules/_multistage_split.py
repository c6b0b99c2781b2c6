"""The split search of :mod:`._multistage`: the least cost over the split ``m``.

For a segment of length ``l`` whose first stored state is saved on a level
``j``, the dynamic program of :class:`~vlcc_adjoint.schedules.Multistage`
needs ``min_m f_l(m)``, ``f_l(m) = fwd m + F(l - m, g) + F(m, h)`` over
``1 <= m < l`` (the module docstring of :mod:`._multistage` derives it and
explains why the minimum cannot be found by convexity).  The kernels here
find it exactly: windows carried over from the previous length through
suffix minima of the slopes, certified periods of the slopes, and branch
and bound over slope extremes (record highs, block extremes) for the rest;
each step drops only splits proven no better than one already evaluated.
"""

from __future__ import annotations

import numpy as np

from ._jit import njit

_SCAN = 16  # intervals with this few interior points are scanned rather than bounded
_SCAN_FAILED = 128  # ... and intervals this short whose bound fails
BLOCK = 5  # block extremes of the slopes over blocks of 2**BLOCK steps
_NEAR = 16  # intervals over at most this many blocks are bounded through block extremes
_PWIDE = 64  # windows this wide look for periods of the slopes
PMAX = 64  # longest period looked for
SAMPLE = 96  # half width of the sample of slopes whose period is computed
RETRY = 16  # lengths between two looks for a period by the same split
DEPTH = 192  # branch-and-bound stack: 2 entries per level of bisection, at most ~2 log2(n)


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
def grow(a, size):
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
def bisect(
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
    h,
    g,
    fwd,
    best,
    best_m,
    lo0,
    hi0,
    qh,
    work,
    fwork,
):
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
        if ((hi - 1) >> BLOCK) - (lo >> BLOCK) <= _NEAR:
            # the slopes over the interval, from their block extremes
            h_lo = np.inf
            h_hi = -np.inf
            for b in range(lo >> BLOCK, ((hi - 1) >> BLOCK) + 1):
                h_lo = min(h_lo, bmin[h, b])
                h_hi = max(h_hi, bmax[h, b])
            g_lo = np.inf
            g_hi = -np.inf
            for b in range((l - hi) >> BLOCK, ((l - lo - 1) >> BLOCK) + 1):
                g_lo = min(g_lo, bmin[g, b])
                g_hi = max(g_hi, bmax[g, b])
            beta = g_hi - fwd - h_lo
            gamma = fwd + h_hi - g_lo
        else:
            beta = (
                _premax(F, rec, recv, nrec, g, l - lo - 1)
                - fwd
                - _sufmin(F, nrec, stk, stkv, ntop, h, lo)
            )
            gamma = (
                fwd
                + _premax(F, rec, recv, nrec, h, hi - 1)
                - _sufmin(F, nrec, stk, stkv, ntop, g, l - hi)
            )
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
            work[top + 1, 0], work[top + 1, 1], fwork[top + 1, 0], fwork[top + 1, 1] = (
                lo,
                mid,
                flo,
                fm,
            )
        else:
            work[top, 0], work[top, 1], fwork[top, 0], fwork[top, 1] = lo, mid, flo, fm
            work[top + 1, 0], work[top + 1, 1], fwork[top + 1, 0], fwork[top + 1, 1] = (
                mid,
                hi,
                fm,
                fhi,
            )
        top += 2
    return best, best_m


@njit(cache=True, nogil=True, inline="always")
def split(
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
    h,
    g,
    fwd,
    best,
    guess,
    lb_prev,
    qh,
    work,
    fwork,
    lbh,
    cert,
    ci,
    iwork,
):
    """``min_m fwd m + F(l - m, g) + F(m, h)`` and an argmin, if below ``best``.

    Returns ``(best, -1)`` when no split beats ``best``.  ``lb_prev`` is a
    lower bound of the same minimum at length ``l - 1`` (``-inf``: none).
    Since ``f_l(m) = f_{l-1}(m) + d_g(l - 1 - m) = f_{l-1}(m - 1) + fwd +
    d_h(m - 1)``, every ``m`` with ``d_g(l - 1 - m) >= best - lb_prev`` or
    ``fwd + d_h(m - 1) >= best - lb_prev`` is no better than ``best``: the
    suffix minima of the slopes cut the range to a window; in a wide window
    a period of the slopes of ``g`` may drop a stretch (``_periodic_cut``);
    ``bisect`` searches the rest.
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
        return bisect(
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
            h,
            g,
            fwd,
            best,
            best_m,
            1,
            l - 2,
            qh,
            work,
            fwork,
        )
    delta = best - qh - lb_prev
    lo = max(1, l - _rises_from(F, nrec, stk, stkv, ntop, g, delta))
    hi = min(l - 2, max(1, _rises_from(F, nrec, stk, stkv, ntop, h, delta - fwd)))
    if lo > hi:
        return best, best_m
    if hi - lo >= _PWIDE:
        a, b = _periodic_cut(F, g, l, lo, hi, guess, best - qh, lbh, cert, ci, iwork)
        if a <= b:
            if lo < a:
                best, best_m = bisect(
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
                    h,
                    g,
                    fwd,
                    best,
                    best_m,
                    lo,
                    a - 1,
                    qh,
                    work,
                    fwork,
                )
            if b < hi:
                best, best_m = bisect(
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
                    h,
                    g,
                    fwd,
                    best,
                    best_m,
                    b + 1,
                    hi,
                    qh,
                    work,
                    fwork,
                )
            return best, best_m
    return bisect(
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
        h,
        g,
        fwd,
        best,
        best_m,
        lo,
        hi,
        qh,
        work,
        fwork,
    )


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
    if 2 * (b - a + 1) < hi - lo + 1 and l - cert[ci, 3] >= RETRY:
        cert[ci, 3] = l
        # the smallest period of the slopes around the last optimum (KMP)
        center = min(max(l - 1 - guess, 1), l - 2)
        y0 = max(1, center - SAMPLE)
        y1 = min(l - 2, center + SAMPLE)
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
        if p2 > PMAX or 2 * p2 > size:
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
    lb = lbh[ci, (l - p) % PMAX]
    if lb == -np.inf or lb + F[g, x1 + p] - F[g, x1] < bar:
        return 1, 0
    return max(lo, l - x2 - 1), min(hi, l - p - x1)
