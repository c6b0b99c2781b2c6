"""The seismic example decomposed in slabs: forward and exact adjoint on MPI.

:class:`DistributedSeismic` is :class:`vlcc_adjoint._examples.seismic.SeismicProblem`
(2-D acoustic wave, leapfrog, 4th-order Laplacian, damping sponge, Ricker
source, a line of receivers) with the grid's rows (axis ``z``) split over
the ranks.  The physics, models, time step and source come from a
``SeismicProblem`` built with the same arguments on every rank, so the MPI
gradient can be compared with the serial one number for number.  It is
example physics, not library code: it reaches the MPI layer only through
its public face, :mod:`vlcc_adjoint.mpi`, as a user's distributed solver
would (``examples/mpi_seismic.py`` runs it).

Layout.  A rank holds rows ``[z0, z1)`` of every field, padded with
``R = 2`` halo rows above and below (the stencil's radius):
``(z1 - z0 + 4, nx)`` arrays whose interior rows are contiguous, so halo
messages need no packing.  Halo rows at the top and bottom of the global
grid stay zero: the serial code's ``u = 0`` outside the grid.

The kernels are the serial module's (:mod:`vlcc_adjoint._examples.wave_kernels`),
called on row ranges of the padded block (``pad = R``), so every row sees
the serial arithmetic and the gradient is the serial one bit for bit.

Forward step: start the halo exchange of ``u^k``; update the rows that need
no halo; wait; update the two rows at each end; inject the source on the
rank that owns it.

Adjoint step (see the serial module for the formulas
``alpha = -(1-e) a beta'``, ``beta = alpha' + 2 a beta' + L(a c beta')``,
``dJ/dc += a beta' L(B)``): the transposed stencil ``L(a c beta')`` is the
stencil itself (``L`` is symmetric, the zero exterior included), so a rank
needs its neighbours' boundary rows of ``w = a c beta'``, exactly as the
forward step needs theirs of ``u``.  Each rank forms ``w`` on its block
and exchanges its halos together with those of ``B = u_i`` (for the
imaging condition ``L(B)``); rows that need neither halo are updated while
the messages travel.  (The other way to write it, applying the stencil to
the local ``w`` on every padded row and adding what lands in the halos into
the neighbours' rows with :meth:`~vlcc_adjoint.mpi.HaloExchange.accumulate`,
costs a second pass over the block and sums the boundary rows in another
order.)

The velocity gradient stays distributed (:attr:`DistributedSeismic.gradient`
is a :class:`~vlcc_adjoint.mpi.DistributedArray`) or is gathered
(:meth:`DistributedSeismic.gather_gradient`).  Receivers and the source
live on the ranks that own their rows; observed data is simulated by a
distributed forward sweep in the true model (each rank records its own
receivers), so no rank ever holds a global field during a run.
"""

from __future__ import annotations

import numba
import numpy as np

from ..errors import VlccValueError
from ..mpi import (
    Decomposition,
    DistributedAdjointResult,
    DistributedArray,
    HaloExchange,
    ensure_initialized,
    run_adjoint,
)
from .seismic import SeismicProblem, WaveState
from .wave_kernels import RADIUS as _R
from .wave_kernels import RING_ROWS as _S
from .wave_kernels import (
    adjoint_rows,
    forward_rows,
    half_misfit,
    inject_residual,
    record_receivers,
)

__all__ = ["DistributedSeismic"]


@numba.njit(nogil=True, cache=True, fastmath=False)
def _weight(w, beta, cv, a_tab, row_id):
    """``w = a c beta`` on the interior rows of the padded ``w`` (its halos
    are left to the exchange)."""
    nl = cv.shape[0]
    nx = cv.shape[1]
    for j in range(nl):
        p = j + _R
        ar = a_tab[row_id[j]]
        for i in range(nx):
            w[p, i] = ar[i] * cv[j, i] * beta[p, i]


class DistributedSeismic:
    """:class:`~vlcc_adjoint._examples.seismic.SeismicProblem` on slabs of rows, one per rank.

    A solver for ``vlcc_adjoint.mpi.run_adjoint`` (and
    ``run_adjoint(..., comm=comm)``): states are this rank's
    :class:`~vlcc_adjoint._examples.seismic.WaveState` with halo-padded
    arrays; ``on_save`` stores the interior blocks as
    :class:`~vlcc_adjoint.mpi.DistributedArray` (so checkpoints know their
    place in the global grid), ``on_load`` copies them back.

    **Arguments:**

    - `comm`: the mpi4py communicator (construction is collective).
    - `decomposition`: how rows are split (a :class:`Decomposition` of
      ``(nz, nx)`` with one rank along ``x``); default
      ``Decomposition.split((nz, nx), (size, 1))``, Devito's rule.  Every
      block needs at least 2 rows.
    - `**problem`: the arguments of ``SeismicProblem`` (``nx``, ``nz``,
      ``nt``, ``dx``, ``f0``, ``courant``, ``nbl``, models, ``src``,
      ``receivers``).
    """

    restore_in_place = True

    def __init__(self, comm, decomposition: Decomposition | None = None, **problem):
        ensure_initialized()
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        p = SeismicProblem(**problem)
        self.problem = p
        self.nx, self.nz, self.nt, self.dt = p.nx, p.nz, p.nt, p.dt
        self.n_steps = p.nt
        if decomposition is None:
            decomposition = Decomposition.split((p.nz, p.nx), (self.size, 1))
        if decomposition.global_shape != (p.nz, p.nx) or decomposition.dims != (self.size, 1):
            raise VlccValueError(
                f"the decomposition must split the rows of the ({p.nz}, {p.nx}) grid "
                f"over {self.size} ranks (dims ({self.size}, 1)), got {decomposition!r}"
            )
        self.decomposition = decomposition
        (self.z0, self.z1), _ = decomposition.block(self.rank)
        self.nl = self.z1 - self.z0
        self.halo = HaloExchange(comm, decomposition, (_R, 0))
        # Rows that need no halo (updated while the messages travel), and the
        # R rows at each end (after); a block of at most 2R rows is all edge.
        self._inner: tuple[int, int]
        self._edges: tuple[tuple[int, int], ...]
        if self.nl > 2 * _R:
            self._inner, self._edges = (_R, self.nl - _R), ((0, _R), (self.nl - _R, self.nl))
        else:
            self._inner, self._edges = (0, 0), ((0, self.nl),)
        rows = slice(self.z0, self.z1)
        self._a_tab, self._b_tab, row_id = p.damping
        self._row_id = np.ascontiguousarray(row_id[rows])
        self._src_values = p.source_values
        self._own_src = self.z0 <= p.src_z < self.z1
        self._src_p = p.src_z - self.z0 + _R
        mine = (p.rec_z >= self.z0) & (p.rec_z < self.z1)
        self.receivers = np.flatnonzero(mine)  # indices into the global receiver list
        self._rec_p = np.ascontiguousarray(p.rec_z[mine] - self.z0 + _R, dtype=np.int64)
        self._rec_x = np.ascontiguousarray(p.rec_x[mine], dtype=np.int64)
        ring = (_S, p.nx + 2 * _R)
        self._fring = np.zeros(ring)
        self._wring = np.zeros(ring)
        self._bring = np.zeros(ring)
        self._w = self.halo.empty()
        self._gacc = np.zeros((self.nl, p.nx))
        self._d_obs: np.ndarray | None = None
        self.last_run: DistributedAdjointResult | None = None
        self.set_model(p.v_background)

    # ------------------------------------------------------------- models
    def set_model(self, v: np.ndarray) -> None:
        """Make the global model `v` (``(nz, nx)``, replicated) current; zero the gradient."""
        self.problem.set_model(v)
        self._v = np.ascontiguousarray(self.problem.v[self.z0 : self.z1])
        self._cvcur = np.ascontiguousarray(self.problem.cv[self.z0 : self.z1])
        self.reset_gradient()

    def reset_gradient(self) -> None:
        self._gacc[...] = 0.0

    @property
    def d_obs(self) -> np.ndarray:
        """This rank's receivers' observed traces, ``(nt + 1, n_local_receivers)``."""
        if self._d_obs is None:
            cv = self.problem.squared_courant(self.problem.v_true)[self.z0 : self.z1]
            cv = np.ascontiguousarray(cv)
            self._d_obs = self._sweep(cv)
        return self._d_obs

    # --------------------------------------------------------- the protocol
    def initial_state(self) -> WaveState:
        return WaveState(self.halo.empty(), self.halo.empty())

    def copy(self, state: WaveState) -> WaveState:
        return WaveState(state.prev.copy(), state.curr.copy())

    def _step(self, state: WaveState, cv, src_value) -> None:
        pending = self.halo.start(state.curr)
        forward_rows(
            state.prev,
            state.curr,
            cv,
            self._a_tab,
            self._b_tab,
            self._row_id,
            self._fring,
            *self._inner,
            _R,
        )
        pending.wait()
        for j0, j1 in self._edges:
            forward_rows(
                state.prev,
                state.curr,
                cv,
                self._a_tab,
                self._b_tab,
                self._row_id,
                self._fring,
                j0,
                j1,
                _R,
            )
        if self._own_src:
            j = self.problem.src_z - self.z0
            sx = self.problem.src_x
            state.prev[self._src_p, sx] += self._a_tab[self._row_id[j], sx] * src_value
        state.prev, state.curr = state.curr, state.prev

    def forward(self, state: WaveState, step: int) -> WaveState:
        """Forward step `step` on this rank's slab (in place; exchanges halos)."""
        self._step(state, self._cvcur, self._src_values[step])
        return state

    def forward_many(self, state: WaveState, start: int, stop: int) -> WaveState:
        for step in range(start, stop):
            self._step(state, self._cvcur, self._src_values[step])
        return state

    def adjoint(self, state: WaveState, adj: WaveState, step: int) -> WaveState:
        """Adjoint step `step`: the transpose of :meth:`forward`, plus the
        imaging condition and this rank's receiver residuals."""
        B = state.curr
        alpha, beta = adj.prev, adj.curr
        _weight(self._w, beta, self._cvcur, self._a_tab, self._row_id)
        # Two exchanges in flight on one communicator, with the same tags:
        # MPI matches messages in the order they are posted, B's first on
        # every rank.
        pending_b = self.halo.start(B)
        pending_w = self.halo.start(self._w)
        adjoint_rows(
            alpha,
            beta,
            B,
            self._w,
            self._cvcur,
            self._a_tab,
            self._b_tab,
            self._row_id,
            self._wring,
            self._bring,
            self._gacc,
            *self._inner,
            _R,
        )
        pending_b.wait()
        pending_w.wait()
        for j0, j1 in self._edges:
            adjoint_rows(
                alpha,
                beta,
                B,
                self._w,
                self._cvcur,
                self._a_tab,
                self._b_tab,
                self._row_id,
                self._wring,
                self._bring,
                self._gacc,
                j0,
                j1,
                _R,
            )
        adj.prev, adj.curr = beta, alpha
        inject_residual(adj.curr, B, self._rec_p, self._rec_x, self.d_obs, step, self.dt)
        return adj

    def final_adjoint(self, state: WaveState) -> WaveState:
        """``lambda_n = dJ/du_n`` on this rank's slab."""
        adj = WaveState(self.halo.empty(), self.halo.empty())
        inject_residual(
            adj.curr, state.curr, self._rec_p, self._rec_x, self.d_obs, self.nt, self.dt
        )
        return adj

    def on_save(self, state: WaveState, step: int) -> dict:
        """The interior blocks, placed in the global grid."""
        d, r = self.decomposition, self.rank
        return {
            "prev": DistributedArray(state.prev[_R : _R + self.nl], d, r),
            "curr": DistributedArray(state.curr[_R : _R + self.nl], d, r),
        }

    def on_load(self, stored: dict, step: int, out: WaveState | None) -> WaveState:
        if out is None:
            out = self.initial_state()
        out.prev[_R : _R + self.nl] = stored["prev"].local
        out.curr[_R : _R + self.nl] = stored["curr"].local
        return out

    # ----------------------------------------------------------- gradients
    @property
    def gradient(self) -> DistributedArray:
        """This rank's block of ``dJ/dv``."""
        return DistributedArray(
            self._gacc * (2.0 * self._cvcur / self._v), self.decomposition, self.rank
        )

    def gather_gradient(self, root: int = 0) -> np.ndarray | None:
        """The global ``dJ/dv`` on rank `root` (``None`` elsewhere).  Collective."""
        return self.gradient.gather(self.comm, root)

    def _sweep(self, cv, dobs=None):
        """A forward run in model `cv` (local rows): this rank's traces, or
        (with `dobs`) the global misfit ``J`` (an allreduce)."""
        state = self.initial_state()
        traces = np.zeros((self.nt + 1, self._rec_p.size)) if dobs is None else None
        total = 0.0
        for k in range(self.nt + 1):
            if k > 0:
                self._step(state, cv, self._src_values[k - 1])
            if dobs is None:
                record_receivers(state.curr, self._rec_p, self._rec_x, traces, k)
            else:
                total += half_misfit(state.curr, self._rec_p, self._rec_x, dobs, k)
        if dobs is None:
            return traces
        return self.comm.allreduce(total) * self.dt

    def objective(self) -> float:
        """``J`` at the current model (collective; the same value on every rank)."""
        return self._sweep(self._cvcur, self.d_obs)

    def gradient_with(self, schedule, store=None, progress: bool = False, **run_options):
        """``dJ/dv`` (this rank's :class:`DistributedArray` block) through
        ``vlcc_adjoint.mpi.run_adjoint`` under `schedule`; the run's result is
        kept in :attr:`last_run`."""
        self.reset_gradient()
        self.d_obs  # noqa: B018 - simulate the observed data before the run, on every rank
        self.last_run = run_adjoint(
            self,
            schedule,
            self.initial_state(),
            self.final_adjoint,
            store=store,
            progress=progress,
            comm=self.comm,
            **run_options,
        )
        return self.gradient

    def __repr__(self) -> str:
        return (
            f"DistributedSeismic(rank={self.rank}/{self.size}, rows={self.z0}:{self.z1}, "
            f"nz={self.nz}, nx={self.nx}, nt={self.nt})"
        )


def compile_kernels() -> None:
    """Compile (or load from numba's cache) the kernels once, without MPI."""
    prev = np.zeros((8, 6))
    curr = np.zeros((8, 6))
    cv = np.zeros((4, 6))
    tab = np.ones((1, 6))
    rid = np.zeros(4, np.int64)
    ring = np.zeros((_S, 6 + 2 * _R))
    forward_rows(prev, curr, cv, tab, tab, rid, ring, 0, 4, _R)
    _weight(prev, curr, cv, tab, rid)
    adjoint_rows(prev, curr, curr, prev, cv, tab, tab, rid, ring, ring, cv, 0, 4, _R)
    idx = np.zeros(1, np.int64) + 2
    out = np.zeros((1, 1))
    record_receivers(curr, idx, idx, out, 0)
    half_misfit(curr, idx, idx, out, 0)
    inject_residual(prev, curr, idx, idx, out, 0, 1.0)
