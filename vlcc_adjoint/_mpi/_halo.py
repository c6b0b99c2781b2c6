"""Halo exchange for block-decomposed stencil codes, and its exact adjoint.

A rank stores its block padded by ``w_a`` layers on both sides of every
exchanged axis ``a``.  The **exchange** ``E`` fills the halo layers from the
neighbours' boundary layers (non-blocking ``Isend``/``Irecv``, faces only:
enough for star stencils such as the 4th-order Laplacian, which reads no
diagonal neighbours); halos at the edge of the global grid are left alone
(they hold the boundary condition, zero for the seismic example).

The adjoint of a copy is an add
-------------------------------

As a linear map from the interiors of all ranks to the padded arrays, the
exchange *copies* ``x_q[boundary layer]`` into ``halo_p`` of the neighbour
``p``.  Its transpose therefore *adds*: given a padded array ``y_p`` on
every rank (the adjoint of a padded field, i.e. the contributions a
transposed stencil scattered into the halo), :meth:`HaloExchange.accumulate`
sends every halo layer back to the rank that owns those points, which adds
it into its boundary layer, and then zeroes all halos (their contributions
now live in the owners' interiors; halos at the edge of the grid held
exterior points, whose adjoint is dropped).  So for interiors ``x`` (halos
zero) and padded ``y``::

    sum_p <E(x)_p, y_p>  ==  sum_p <x_p, accumulate(y)_p>

to rounding, which ``tests/mpi/mpi_scripts/halo_dot.py`` checks on a 2 x 2 grid.
A discrete adjoint that runs the transposed stencil on a padded array
(contributions land in the halo) and then calls ``accumulate`` is exact at
the block boundaries; forgetting the accumulation (or copying instead of
adding) loses exactly the terms that cross them.

Both operations come in a split form, ``start_*`` then ``wait()``, so that
a solver computes its interior while the messages travel (the seismic
example does).  Waits go through the run's :class:`~._comm.Guard` when
there is one (a failed rank ends the wait at once), else poll with a
timeout.

Reference: the pattern is the one of Devito's ``HaloExchangeBuilder`` and
PETSc's ``DMGlobalToLocal`` / ``DMLocalToGlobal(ADD_VALUES)`` pair.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from ..errors import VlccValueError
from ._comm import active_guard, ensure_initialized, mpi_module, poll
from ._decomp import Decomposition

__all__ = ["HaloExchange"]


class _Pending:
    """Messages in flight; :meth:`wait` completes them and finishes the operation."""

    __slots__ = ("halo", "reqs", "after", "what", "done")

    def __init__(self, halo, reqs, after, what):
        self.halo = halo
        self.reqs = reqs
        self.after = after
        self.what = what
        self.done = False

    def wait(self) -> None:
        if self.done:
            return
        self.halo._wait(self.reqs, self.what)
        self.after()
        self.done = True


class HaloExchange:
    """Face halo exchange of padded blocks over a :class:`Decomposition`.

    **Arguments:**

    - `comm`: the mpi4py communicator of the decomposition (``size ==
      decomposition.nranks``).  Construction is collective.
    - `decomposition`: the global grid's :class:`Decomposition`.
    - `width`: halo layers per axis (one int for every axis, or a tuple;
      0 for an axis that is not padded).
    - `timeout`: seconds a wait may last when no run's guard is active.

    Padded local arrays have shape :attr:`padded_shape` (the block plus
    ``2 * width[a]`` along each axis); :meth:`interior` is the block.  Every
    block along a decomposed axis must be at least ``width[a]`` thick, so
    that each halo comes from one neighbour.
    """

    def __init__(
        self,
        comm: Any,
        decomposition: Decomposition,
        width: Sequence[int] | int,
        *,
        timeout: float | None = 600.0,
    ):
        ensure_initialized()
        if decomposition.nranks != comm.Get_size():
            raise VlccValueError(
                f"the decomposition has {decomposition.nranks} ranks but the "
                f"communicator {comm.Get_size()}; decompose over comm.Get_size() ranks"
            )
        nd = decomposition.ndim
        w = (
            (int(width),) * nd
            if isinstance(width, (int, np.integer))
            else tuple(int(x) for x in width)
        )
        if len(w) != nd or any(x < 0 for x in w):
            raise VlccValueError(f"width must be an int >= 0 or one per axis ({nd}), got {width!r}")
        self.decomposition = decomposition
        self.width = w
        self.parent = comm
        self.timeout = timeout
        self.rank = comm.Get_rank()
        self.shape = decomposition.local_shape(self.rank)
        self.padded_shape = tuple(n + 2 * x for n, x in zip(self.shape, w))
        self.wait_seconds = 0.0
        dup, req = comm.Idup()
        poll([req], "creating the halo exchange's communicator", timeout)
        self.comm = dup
        # per (axis, side): neighbour rank, region sent by the exchange, region received
        self._faces = []
        for a in range(nd):
            if w[a] == 0:
                continue
            for side in (-1, 1):
                q = decomposition.neighbour(self.rank, a, side)
                if q is None:
                    continue
                for r in (self.rank, q):
                    if decomposition.local_shape(r)[a] < w[a]:
                        raise VlccValueError(
                            f"rank {r}'s block is {decomposition.local_shape(r)[a]} thick along "
                            f"axis {a}, less than the halo width {w[a]}; use fewer ranks along "
                            "that axis or a larger grid"
                        )
                self._faces.append(
                    (
                        a,
                        side,
                        q,
                        self._region(a, side, send=True),
                        self._region(a, side, send=False),
                    )
                )

    def _region(self, axis: int, side: int, send: bool) -> tuple[slice, ...]:
        idx = []
        for b, (n, x) in enumerate(zip(self.shape, self.width)):
            if b != axis:
                idx.append(slice(x, x + n))
            elif send:  # my boundary layers
                idx.append(slice(x, 2 * x) if side < 0 else slice(n, n + x))
            else:  # my halo layers
                idx.append(slice(0, x) if side < 0 else slice(n + x, n + 2 * x))
        return tuple(idx)

    def interior(self, arr: np.ndarray) -> np.ndarray:
        """The block inside a padded array (a view)."""
        return arr[tuple(slice(x, x + n) for n, x in zip(self.shape, self.width))]

    def empty(self, dtype: DTypeLike = np.float64) -> np.ndarray:
        """A zero padded array."""
        return np.zeros(self.padded_shape, dtype)

    def _check(self, arr):
        if arr.shape != self.padded_shape:
            raise VlccValueError(
                f"expected a padded block of shape {self.padded_shape}, got {arr.shape}"
            )

    def _wait(self, reqs, what):
        t0 = time.perf_counter()
        try:
            guard = active_guard(self.parent)
            if guard is not None:
                guard.wait(reqs, what)
            else:
                poll(reqs, what, self.timeout)
        finally:
            self.wait_seconds += time.perf_counter() - t0

    @staticmethod
    def _tag(axis, side, kind):
        # messages travelling towards `side` along `axis`; kind 0 exchange, 1 accumulate
        return 100 + 4 * axis + 2 * kind + (0 if side > 0 else 1)

    # -- the exchange -------------------------------------------------------------

    def start(self, arr: np.ndarray) -> _Pending:
        """Start filling `arr`'s halos from the neighbours; ``.wait()`` the result."""
        MPI = mpi_module()
        self._check(arr)
        reqs = []
        unpack: list[tuple[tuple[slice, ...], np.ndarray]] = []  # received into a copy
        keep: list[np.ndarray] = []  # send buffers, alive until the wait
        for a, side, q, send, recv in self._faces:
            halo = arr[recv]
            if halo.flags.c_contiguous:
                reqs.append(self.comm.Irecv([halo, MPI.BYTE], source=q, tag=self._tag(a, -side, 0)))
            else:
                buf = np.empty(halo.shape, arr.dtype)
                reqs.append(self.comm.Irecv([buf, MPI.BYTE], source=q, tag=self._tag(a, -side, 0)))
                unpack.append((recv, buf))
        for a, side, q, send, recv in self._faces:
            part = arr[send]
            buf = part if part.flags.c_contiguous else np.ascontiguousarray(part)
            reqs.append(self.comm.Isend([buf, MPI.BYTE], dest=q, tag=self._tag(a, side, 0)))
            keep.append(buf)

        def after():
            for where, buf in unpack:
                arr[where] = buf
            keep.clear()

        return _Pending(self, reqs, after, "exchanging halos")

    def exchange(self, arr: np.ndarray) -> np.ndarray:
        """Fill `arr`'s halos from the neighbours (blocking); returns `arr`."""
        self.start(arr).wait()
        return arr

    # -- its adjoint -----------------------------------------------------------------

    def start_accumulate(self, arr: np.ndarray) -> _Pending:
        """Start the transpose of :meth:`exchange`: halo layers are added into
        the owners' boundary layers, then every halo of `arr` is zeroed (at
        ``.wait()``)."""
        MPI = mpi_module()
        self._check(arr)
        reqs, adds = [], []
        for a, side, q, send, recv in self._faces:
            buf = np.empty(arr[send].shape, arr.dtype)
            reqs.append(self.comm.Irecv([buf, MPI.BYTE], source=q, tag=self._tag(a, -side, 1)))
            adds.append((send, buf))
        keep = []
        for a, side, q, send, recv in self._faces:
            buf = np.ascontiguousarray(arr[recv]).copy()  # the halo is zeroed before the send ends
            reqs.append(self.comm.Isend([buf, MPI.BYTE], dest=q, tag=self._tag(a, side, 1)))
            keep.append(buf)

        def after():
            for where, buf in adds:
                arr[where] += buf
            self.zero_halos(arr)
            keep.clear()

        return _Pending(self, reqs, after, "accumulating halo contributions")

    def accumulate(self, arr: np.ndarray) -> np.ndarray:
        """The adjoint of :meth:`exchange` (blocking); returns `arr`."""
        self.start_accumulate(arr).wait()
        return arr

    def zero_halos(self, arr: np.ndarray) -> None:
        """Set every halo layer of `arr` (corners included) to zero."""
        for a, x in enumerate(self.width):
            if x == 0:
                continue
            lo = [slice(None)] * arr.ndim
            hi = [slice(None)] * arr.ndim
            lo[a] = slice(0, x)
            hi[a] = slice(arr.shape[a] - x, arr.shape[a])
            arr[tuple(lo)] = 0
            arr[tuple(hi)] = 0

    def free(self) -> None:
        """Release the duplicated communicator (collective)."""
        if self.comm is not None:
            self.comm.Free()
            self.comm = None

    def __repr__(self) -> str:
        return (
            f"HaloExchange(rank={self.rank}, block={self.shape}, width={self.width}, "
            f"neighbours={[q for _, _, q, _, _ in self._faces]})"
        )
