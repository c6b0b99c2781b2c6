"""Multilevel spline-interpolation prediction with linear quantisation (numba).

The predictor of :class:`ErrorBounded` (format 2), after SZ3's interpolation
predictor:

- K. Zhao, S. Di, M. Dmitriev, T.-L. D. Tonellot, Z. Chen and F. Cappello,
  "Optimizing error-bounded lossy compression for scientific data by
  dynamic spline interpolation", ICDE 2021.
- X. Liang, K. Zhao, S. Di, S. Li, R. Underwood, A. M. Gok, J. Tian, J. Deng,
  J. C. Calhoun, D. Tao, Z. Chen and F. Cappello, "SZ3: A modular framework
  for composing prediction-based error-bounded lossy compressors", IEEE
  Transactions on Big Data 9(2), 2022.

The array is viewed as ``(nz, ny, nx)``.  Values are visited coarse to fine:
first the origin (predicted by 0), then for each level with stride
``s = 2^(L-1), ..., 2, 1`` (``2^L >= max(nz, ny, nx)``) three passes, one
per axis.  The pass along axis ``d`` visits the points whose coordinate on
``d`` is an odd multiple of ``s``, on the axes before ``d`` a multiple of
``s`` and on the axes after ``d`` a multiple of ``2s``; every point other than
the origin is visited exactly once, and every neighbour a pass reads (at
``+-s`` and ``+-3s`` along ``d``) was visited before.  A point ``i`` is
predicted from the *reconstructed* values ``a, b, c, d`` at ``i - 3s, i - s,
i + s, i + 3s`` by the cubic through them (Zhao et al., eq. 3)::

    p = (9 (b + c) - (a + d)) / 16           both outer neighbours in the array
    p = (b + c) / 2                          only i + s: linear
    p = b                                    neither: constant

and quantised on the lattice of step ``s_q = 2 eb (1 - 2^-8)`` around ``p``::

    q = rint((x - p) / s_q),    x' = dtype(p + q s_q).

The encoder computes ``x'`` exactly as the decoder will (same expressions,
rounded to the array's dtype, no fast-math: the order of operations is fixed)
and checks ``|x - x'| <= eb`` in float64 for every value; a value that fails
(NaN, +-inf, ``|x - p| / s_q > 2^50``, overflow, a rounding failure at the
bound) becomes an *exception*: its code is ``q = 0``, so that the values
predicted from it see ``x' = dtype(p)`` in the encoder and the decoder alike,
and its true value is stored verbatim and patched in after decoding.

Why this predictor: Lorenzo's prediction (the previous format) adds the
rounding noise of three reconstructed neighbours (variance ``4/12`` lattice
units in 2-D), so even a perfectly smooth field leaves codes of +-1.  The cubic
weights have ``sum w^2 = 0.64`` and the cubic's error on a smooth field is
``O(s^4 u'''')``; on the benchmark wavefield at 1e-4 of its range 80% of the
codes are 0 (Lorenzo: 41%) and their entropy drops from 3.7 to 1.7 bits.

Buffer layout.  Every pass is a loop without a carried dependency (its
points are predicted only from earlier passes), but on the array itself its
loads and stores are strided (by 2 at the finest level), which LLVM does not
vectorise: such a loop ran at 2-3 ns per value against 0.4-0.55 on contiguous
rows.  So the sweep keeps, for the step from the grid ``G_l`` (stride
``2^l``) to ``G_{l-1}``, the even-x points of ``G_{l-1}`` as a contiguous
array ``XE`` (rows along x).  The passes along z and y then interpolate
between whole contiguous rows of ``XE``; the pass along x predicts the odd
points of a row from its contiguous even points, and the finished row of
``G_{l-1}`` (even and odd interleaved) is written straight to where the next
step needs it: row ``(2z, 2y)`` of the next ``XE``, or the output at the
finest level.  Two such buffers alternate; the encoder gathers its inputs
row by row.  The
codes are written in visiting order as bytes: ``zigzag(q)`` (``2q`` for
``q >= 0``, ``-2q - 1`` otherwise) when below 255, else 255 and ``q`` in a
separate escape list (the coarse levels, a fraction of a percent of the
values).  The bytes then go through an entropy stage (:mod:`._error_bounded`).
"""

from __future__ import annotations

import numba
import numpy as np

_U = np.uint64
LIMIT = 2.0**50  # |x - p| / s_q beyond this is an exception
ESCAPE = 255


@numba.njit(cache=True, nogil=True)
def levels(nz, ny, nx):
    """``L``: the least integer with ``2^L >= max(nz, ny, nx)``."""
    m = max(nz, ny, nx)
    lev = 0
    while (1 << lev) < m:
        lev += 1
    return lev


@numba.njit(cache=True, nogil=True, inline="always")
def _kind(i, n):
    """0 cubic, 1 linear, 2 constant: what the neighbours of the odd index
    ``i`` (grid units) on an axis of length ``n`` allow."""
    if i + 1 >= n:
        return 2
    if i >= 3 and i + 3 < n:
        return 0
    return 1


@numba.njit(cache=True, nogil=True, inline="always")
def _dim(n, lev):
    """The length of an axis of ``n`` points on the grid of stride ``2^lev``."""
    return (n + (1 << lev) - 1) >> lev


@numba.njit(cache=True, nogil=True)
def _predict_rows(a, b, c, d, pb, m, kind):
    """``pb[:m]``: the prediction from the rows ``a, b, c, d`` at ``-3, -1, +1,
    +3`` grid units (``a``, ``d`` unused unless cubic, ``c`` if constant)."""
    if kind == 0:
        for j in range(m):
            pb[j] = (
                (np.float64(b[j]) + np.float64(c[j])) * 9.0 - (np.float64(a[j]) + np.float64(d[j]))
            ) * 0.0625
    elif kind == 1:
        for j in range(m):
            pb[j] = (np.float64(b[j]) + np.float64(c[j])) * 0.5
    else:
        for j in range(m):
            pb[j] = np.float64(b[j])


@numba.njit(cache=True, nogil=True)
def _predict_odd(e, pb, mo, mx):
    """``pb[:mo]``: the predictions of the odd points ``i = 2j + 1`` of a row
    of ``mx`` points from its even points ``e`` (``e[j]`` at ``2j``)."""
    if mo == 0:
        return
    # i = 1 has no neighbour at -3; the cubic needs i + 3 < mx, i.e. 2j + 4 < mx
    hi = min((mx - 5) // 2 if mx >= 5 else 0, mo - 1)
    for j in range(1, hi + 1):
        pb[j] = (
            (np.float64(e[j]) + np.float64(e[j + 1])) * 9.0
            - (np.float64(e[j - 1]) + np.float64(e[j + 2]))
        ) * 0.0625
    j = 0  # then the right edge: j = 0 and hi < j < mo are linear or constant
    while j < mo:
        if _kind(2 * j + 1, mx) == 2:
            pb[j] = np.float64(e[j])
        else:
            pb[j] = (np.float64(e[j]) + np.float64(e[j + 1])) * 0.5
        j = max(j + 1, hi + 1)


@numba.njit(cache=True, nogil=True)
def _gather(x, xs, base, st, m):
    """``xs[j] = x[base + j st]``, ``j < m``."""
    if st == 2:  # the finest level: a constant stride, which LLVM vectorises
        xb = x[base : base + 2 * m]
        for j in range(m):
            xs[j] = xb[2 * j]
        return
    ub = _U(base)
    us = _U(st)
    for j in range(m):
        xs[j] = x[ub + _U(j) * us]


@numba.njit(cache=True, nogil=True)
def _encode_row(xs, rs, pb, m, step, inv, eb, cs, esc, ne, exc, nexc, base, st):
    """Quantise ``xs[:m]`` against ``pb``: reconstructions into ``rs``, codes
    into ``cs``; escapes and exceptions (flat index ``base + j st``) appended.
    **Returns** ``(escapes, exceptions)`` counts after the row."""
    bad = 0
    big = 0
    for j in range(m):
        v = np.float64(xs[j])
        p = pb[j]
        t = (v - p) * inv
        ok = abs(t) <= LIMIT  # NaN fails the test too
        q = np.rint(t if ok else 0.0)
        rs[j] = p + q * step
        e = abs(v - np.float64(rs[j]))
        bad += 0 if e <= eb else 1
        # the zigzag in float arithmetic (exact: |q| <= 2^50), so that the loop
        # vectorises without 64-bit float <-> integer conversions
        z = max(2.0 * q, -2.0 * q - 1.0)
        big += 1 if z >= ESCAPE else 0
        cs[j] = np.uint8(np.int32(min(z, np.float64(ESCAPE))))
    if bad or big:  # rare: exceptions first (they take q = 0), then escapes
        for j in range(m):
            v = np.float64(xs[j])
            if not abs(v - np.float64(rs[j])) <= eb:
                rs[j] = pb[j] + 0.0 * step
                cs[j] = 0
                exc[nexc] = base + j * st
                nexc += 1
            elif cs[j] == ESCAPE:
                esc[ne] = np.int64(np.rint((v - pb[j]) * inv))
                ne += 1
    return ne, nexc


@numba.njit(cache=True, nogil=True)
def _decode_row(rs, pb, m, step, cs, esc, ne):
    """Inverse of :func:`_encode_row` (exceptions are patched later).
    **Returns** the escapes used after the row, or -1 if the list runs out."""
    big = 0
    for j in range(m):
        c = np.int32(cs[j])  # 32-bit: the conversion to float64 vectorises
        rs[j] = pb[j] + np.float64((c >> 1) ^ -(c & 1)) * step
        big += 1 if c == ESCAPE else 0
    if big:
        if ne + big > esc.size:
            return -1
        for j in range(m):
            if cs[j] == ESCAPE:
                rs[j] = pb[j] + np.float64(esc[ne]) * step
                ne += 1
    return ne


@numba.njit(cache=True, nogil=True)
def _interleave(dst, e, o, me, mo):
    """``dst[2j] = e[j]`` (``j < me``), ``dst[2j + 1] = o[j]`` (``j < mo``)."""
    for j in range(mo):
        dst[2 * j] = e[j]
        dst[2 * j + 1] = o[j]
    if me > mo:
        dst[2 * mo] = e[mo]


@numba.njit(cache=True, nogil=True)
def sweep(x, out, nz, ny, nx, step, eb, codes, esc, exc, bufa, bufb, pb, xs, rs, encode):
    """Visit every point in the order of the module docstring, encoding
    (``x`` -> ``codes``, ``esc``, ``exc``; ``out`` unused) or decoding
    (``codes``, ``esc`` -> ``out``; ``x``, ``exc`` unused).  ``bufa``,
    ``bufb``: x's dtype, ``nz ny ceil(nx / 2)`` values each; ``pb`` (float64),
    ``xs``, ``rs`` (x's dtype): ``ceil(nx / 2) + 1`` values each.
    **Returns** ``(codes written, escapes, exceptions)``; escapes is -1 when
    decoding runs out of them."""
    inv = 1.0 / step
    ne = np.int64(0)
    nexc = np.int64(0)
    top = levels(nz, ny, nx)
    # the origin: G_top has one point, the first even point of XE_{top-1}
    pb[0] = 0.0
    first = out if top == 0 else bufa
    if encode:
        xs[0] = x[0]
        ne, nexc = _encode_row(xs, rs, pb, 1, step, inv, eb, codes, esc, ne, exc, nexc, 0, 1)
    else:
        ne = _decode_row(rs, pb, 1, step, codes, esc, ne)
    first[0] = rs[0]
    k = np.int64(1)
    cur, nxt = bufa, bufb
    for lev in range(top, 0, -1):
        s = 1 << (lev - 1)  # stride of G_{lev-1} in the array
        mz, my, mx = _dim(nz, lev - 1), _dim(ny, lev - 1), _dim(nx, lev - 1)
        me, mo = (mx + 1) // 2, mx // 2
        # pass 0 (along z) and pass 1 (along y): rows of XE_{lev-1} in `cur`
        for d in range(2):
            for z in range(1 if d == 0 else 0, mz, 2 if d == 0 else 1):
                for y in range(0 if d == 0 else 1, my, 2):
                    if d == 0:
                        kind = _kind(z, mz)
                        o1 = my * me
                    else:
                        kind = _kind(y, my)
                        o1 = me
                    r0 = (z * my + y) * me
                    a = cur[max(r0 - 3 * o1, 0) :]
                    d_ = cur[r0 + 3 * o1 :] if kind == 0 else a
                    _predict_rows(
                        a, cur[r0 - o1 :], cur[r0 + o1 :] if kind < 2 else a, d_, pb, me, kind
                    )
                    row = cur[r0 : r0 + me]
                    cs = codes[k : k + me]
                    if encode:
                        base = (z * s * ny + y * s) * nx
                        _gather(x, xs, base, 2 * s, me)
                        ne, nexc = _encode_row(
                            xs, row, pb, me, step, inv, eb, cs, esc, ne, exc, nexc, base, 2 * s
                        )
                    else:
                        ne = _decode_row(row, pb, me, step, cs, esc, ne)
                        if ne < 0:
                            return k, ne, nexc
                    k += me
        # pass 2 (along x): the odd points of every row, then the whole row of
        # G_{lev-1} goes to its place: the output, or row (2z, 2y) of XE_{lev-2}
        nmy, nme = _dim(ny, lev - 2) if lev > 1 else ny, mx
        for z in range(mz):
            for y in range(my):
                r0 = (z * my + y) * me
                e = cur[r0 : r0 + me]
                if mo:
                    _predict_odd(e, pb, mo, mx)
                    cs = codes[k : k + mo]
                    if encode:
                        base = (z * s * ny + y * s) * nx + s
                        _gather(x, xs, base, 2 * s, mo)
                        ne, nexc = _encode_row(
                            xs, rs, pb, mo, step, inv, eb, cs, esc, ne, exc, nexc, base, 2 * s
                        )
                    else:
                        ne = _decode_row(rs, pb, mo, step, cs, esc, ne)
                        if ne < 0:
                            return k, ne, nexc
                    k += mo
                if lev > 1:
                    t0 = (2 * z * nmy + 2 * y) * nme
                    _interleave(nxt[t0 : t0 + mx], e, rs, me, mo)
                elif not encode:
                    t0 = (z * ny + y) * nx
                    _interleave(out[t0 : t0 + mx], e, rs, me, mo)
        cur, nxt = nxt, cur
    return k, ne, nexc
