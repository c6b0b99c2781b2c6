"""The numba kernels of the 2-D acoustic example: one leapfrog step of
``u_tt + d u_t = v^2 lap(u) + f`` and its exact discrete transpose, on row
ranges of a grid.

:mod:`vlcc_adjoint._examples.seismic` (the serial problem) and
:mod:`vlcc_adjoint._examples.mpi_seismic` (the same problem on slabs of rows, one
per MPI rank) both call these kernels, so every row of a distributed run
sees the serial arithmetic and the MPI gradient is the serial one bit for
bit.  The physics, the discretisation and the adjoint's formulas are
written out in :mod:`vlcc_adjoint._examples.seismic`.

Layout.  Arrays are indexed ``[z, x]`` with ``x`` contiguous.  A kernel
updates grid rows ``j0 .. j1-1``; grid row ``j`` is row ``j + pad`` of the
fields (``pad`` halo rows above the block: 0 for the whole grid,
:data:`RADIUS` for a slab) and row ``j`` of ``cv`` / ``row_id`` / ``gacc``.
Field rows outside the arrays read as zero (the ``u = 0`` exterior), so an
unpadded grid needs no halo.  Each kernel streams rows through a ring of
:data:`RING_ROWS` zero-padded rows, so the stencil has no boundary
branches, its inner loop vectorises, and the zero exterior is exact (which
is what makes the transpose exact at the edges).

Serial numba, ``nogil`` (a checkpoint store's background threads run while
a step computes), no allocation per step, compiled kernels cached on disk.

References: Virieux & Operto (2009), "An overview of full-waveform
inversion in exploration geophysics", Geophysics 74(6); Plessix (2006), "A
review of the adjoint-state method for computing the gradient of a
functional with geophysical applications", GJI 167(2).
"""

from __future__ import annotations

import numba

__all__ = [
    "RADIUS",
    "RING_ROWS",
    "adjoint_rows",
    "forward_rows",
    "half_misfit",
    "inject_residual",
    "record_receivers",
    "wave_adjoint",
    "wave_forward",
    "wave_forward_many",
]

#: The stencil's radius per axis: the halo rows a slab needs on each side.
RADIUS = 2
#: Rows in a kernel's ring buffer (``2 RADIUS + 1``).
RING_ROWS = 2 * RADIUS + 1
# 4th-order Laplacian (times dx^2), 2-D: centre 2 * (-5/2), neighbours at
# distance 1 and 2: coefficients (-1/12, 4/3, -5/2, 4/3, -1/12) per axis.
_C0 = -5.0
_C1 = 4.0 / 3.0
_C2 = -1.0 / 12.0

# The helpers below are inlined into the kernels at numba's IR level; the compiled inner loops are
# the ones written out by hand (measured: same speed).


@numba.njit(inline="always")
def _fill_row(ring, field, q):
    # ring[q mod S, R:R+nx] = field[q]; rows outside the field are zero.
    nx = field.shape[1]
    dst = ring[(q + RING_ROWS) % RING_ROWS]
    if q >= 0 and q < field.shape[0]:
        src = field[q]
        for i in range(nx):
            dst[RADIUS + i] = src[i]
    else:
        for i in range(nx):
            dst[RADIUS + i] = 0.0


@numba.njit(inline="always")
def _fill_row_weighted(ring, beta, cv, a_tab, row_id, j, pad):
    # ring[(j + pad) mod S, R:R+nx] = a c beta on grid row j, the field the
    # transposed stencil acts on; zero outside the grid rows of cv.
    nx = beta.shape[1]
    dst = ring[(j + pad + RING_ROWS) % RING_ROWS]
    if j >= 0 and j < cv.shape[0]:
        src = beta[j + pad]
        cvr = cv[j]
        ar = a_tab[row_id[j]]
        for i in range(nx):
            dst[RADIUS + i] = ar[i] * cvr[i] * src[i]
    else:
        for i in range(nx):
            dst[RADIUS + i] = 0.0


@numba.njit(inline="always")
def _rows(ring, q):
    # The ring rows of field rows q-2 .. q+2.
    return (
        ring[(q - 2 + RING_ROWS) % RING_ROWS],
        ring[(q - 1 + RING_ROWS) % RING_ROWS],
        ring[(q + RING_ROWS) % RING_ROWS],
        ring[(q + 1) % RING_ROWS],
        ring[(q + 2) % RING_ROWS],
    )


@numba.njit(inline="always")
def _lap(rows, k):
    # L (times dx^2) at column k - R of the centre row of `rows` (from _rows).
    rm2, rm1, r0, rp1, rp2 = rows
    return (
        _C0 * r0[k]
        + _C1 * (r0[k - 1] + r0[k + 1] + rm1[k] + rp1[k])
        + _C2 * (r0[k - 2] + r0[k + 2] + rm2[k] + rp2[k])
    )


@numba.njit(nogil=True, cache=True, fastmath=False)
def forward_rows(prev, curr, cv, a_tab, b_tab, row_id, ring, j0, j1, pad):
    """Grid rows ``j0 .. j1-1`` of one leapfrog step, in place in ``prev``
    (``curr`` is ``u^k``, with its halo rows filled if ``pad > 0``).

    ``a_tab[row_id[j]]`` / ``b_tab[row_id[j]]`` are ``a`` / ``(1 - e) a`` on
    row ``j`` (:func:`damping_tables`).  `ring` is a ``(2R+1, nx+2R)``
    scratch, zero in its padding columns.  Only ``prev`` is written, so row
    ranges may be done in any order.
    """
    nx = curr.shape[1]
    for q in range(j0 + pad - RADIUS, j0 + pad + RADIUS):
        _fill_row(ring, curr, q)
    for j in range(j0, j1):
        q = j + pad
        _fill_row(ring, curr, q + RADIUS)
        rows = _rows(ring, q)
        r0 = rows[2]
        pj = prev[q]
        cvj = cv[j]
        aj = a_tab[row_id[j]]
        bj = b_tab[row_id[j]]
        for i in range(nx):
            k = i + RADIUS
            pj[i] = aj[i] * (2.0 * r0[k] + cvj[i] * _lap(rows, k)) - bj[i] * pj[i]


@numba.njit(nogil=True, cache=True, fastmath=False)
def wave_forward(prev, curr, cv, a_tab, b_tab, row_id, ring, src_z, src_x, src_val):
    """One leapfrog step in place: ``prev <- u^{k+1}`` (``curr`` is ``u^k``).

    The arguments are those of :func:`forward_rows`; `src_val` is
    ``dt^2 f`` at the source point for this step.
    """
    forward_rows(prev, curr, cv, a_tab, b_tab, row_id, ring, 0, curr.shape[0], 0)
    prev[src_z, src_x] += a_tab[row_id[src_z], src_x] * src_val


@numba.njit(nogil=True, cache=True, fastmath=False)
def wave_forward_many(
    prev, curr, cv, a_tab, b_tab, row_id, ring, src_z, src_x, src_values, start, stop
):
    """Steps ``start .. stop-1`` in one call (the GIL stays released throughout).

    Returns ``(prev, curr)`` of the final state: the two arrays swap roles
    every step.
    """
    for step in range(start, stop):
        wave_forward(prev, curr, cv, a_tab, b_tab, row_id, ring, src_z, src_x, src_values[step])
        prev, curr = curr, prev
    return prev, curr


@numba.njit(nogil=True, cache=True, fastmath=False)
def adjoint_rows(alpha, beta, curr, w, cv, a_tab, b_tab, row_id, wring, bring, gacc, j0, j1, pad):
    """Grid rows ``j0 .. j1-1`` of the transpose of :func:`forward_rows` in
    place, plus the imaging condition.

    On entry ``(alpha, beta)`` is the adjoint of ``(A', B')``; on return
    `alpha` holds the adjoint of ``B`` and `beta` that of ``A`` on those
    rows (the caller swaps them).  `curr` is ``B`` (``u^k`` of the state of
    this step, halos filled if ``pad > 0``); ``gacc += a beta' L(B)`` is the
    gradient w.r.t. ``c = (v dt/dx)^2``.  `w` is ``a c beta'`` laid out like
    the fields (an MPI slab: its halo rows hold the neighbours' values), or
    ``None`` to form it from `beta` as the rows stream through the ring:
    that needs one in-order sweep over all rows (rows of `beta` are
    overwritten right behind the ring).  With `w` given, row ranges may be
    done in any order.  ``L`` is symmetric, so the
    transposed stencil ``L(a c beta')`` is the stencil itself.
    """
    nx = curr.shape[1]
    for q in range(j0 + pad - RADIUS, j0 + pad + RADIUS):
        if w is None:
            _fill_row_weighted(wring, beta, cv, a_tab, row_id, q - pad, pad)
        else:
            _fill_row(wring, w, q)
        _fill_row(bring, curr, q)
    for j in range(j0, j1):
        q = j + pad
        # Row q+R of a*c*beta' enters the ring before row q of beta is
        # overwritten below; rows > q of beta are still untouched.
        if w is None:
            _fill_row_weighted(wring, beta, cv, a_tab, row_id, j + RADIUS, pad)
        else:
            _fill_row(wring, w, q + RADIUS)
        _fill_row(bring, curr, q + RADIUS)
        wrows = _rows(wring, q)
        brows = _rows(bring, q)
        aj = alpha[q]
        bj = beta[q]
        gj = gacc[j]
        ar = a_tab[row_id[j]]
        br = b_tab[row_id[j]]
        for i in range(nx):
            k = i + RADIUS
            bt = bj[i]
            abt = ar[i] * bt
            aj[i] = aj[i] + 2.0 * abt + _lap(wrows, k)
            bj[i] = -br[i] * bt
            gj[i] += abt * _lap(brows, k)


@numba.njit(nogil=True, cache=True, fastmath=False)
def wave_adjoint(alpha, beta, curr, cv, a_tab, b_tab, row_id, wring, bring, gacc):
    """The transpose of :func:`wave_forward` in place (see :func:`adjoint_rows`)."""
    adjoint_rows(
        alpha, beta, curr, None, cv, a_tab, b_tab, row_id, wring, bring, gacc, 0, curr.shape[0], 0
    )


@numba.njit(nogil=True, cache=True, fastmath=False)
def inject_residual(adj_curr, curr, rec_z, rec_x, dobs, k, scale):
    # adj_curr += scale * R^T (R curr - dobs[k])
    for r in range(rec_z.size):
        z = rec_z[r]
        x = rec_x[r]
        adj_curr[z, x] += scale * (curr[z, x] - dobs[k, r])


@numba.njit(nogil=True, cache=True, fastmath=False)
def half_misfit(curr, rec_z, rec_x, dobs, k):
    s = 0.0
    for r in range(rec_z.size):
        d = curr[rec_z[r], rec_x[r]] - dobs[k, r]
        s += d * d
    return 0.5 * s


@numba.njit(nogil=True, cache=True, fastmath=False)
def record_receivers(curr, rec_z, rec_x, out, k):
    for r in range(rec_z.size):
        out[k, r] = curr[rec_z[r], rec_x[r]]
