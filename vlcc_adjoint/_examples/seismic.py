"""2-D acoustic full-waveform inversion: forward wave propagation and its exact discrete adjoint.

The physics
-----------
Constant-density acoustic waves with a damping sponge,

    u_tt + d(x) u_t = v(x)^2 lap(u) + f(x, t),

on an ``nz x nx`` grid (spacing ``dx`` in both directions, arrays indexed
``[z, x]`` with ``x`` contiguous), with ``u = 0`` outside the grid.  A Ricker
wavelet is injected at one grid point and a line of receivers records ``u``.

The discretisation (one forward step)
-------------------------------------
Leapfrog in time, 4th-order centred differences in space, and the damping
term centred in time (``u_t ~ (u^{k+1} - u^{k-1}) / 2 dt``), which keeps the
step explicit and *linear* in the state:

    B' = a * (2 B - (1 - e) A + c L B + dt^2 f),      A' = B,

where the state is the pair ``(A, B) = (u^{k-1}, u^k)``, ``e = d dt / 2``,
``a = 1 / (1 + e)``, ``c = (v dt / dx)^2`` and ``L`` is the 9-point
(4th order, radius 2 per axis) Laplacian stencil times ``dx^2``,
coefficients ``(-1/12, 4/3, -5/2, 4/3, -1/12)`` per axis.  The damping
profile is separable, ``d = d_z(z) + d_x(x)``, quadratic over ``nbl`` cells
(a Cerjan-type sponge in its ``d u_t`` form).  ``d_z`` takes only ``nbl + 1``
distinct values, so ``a`` and ``(1 - e) a`` live in two small tables with one
row per distinct ``d_z`` (all interior rows share one, which stays in L1):
no division in the kernels and no 2-D coefficient array to stream.
``u = 0`` outside the grid makes ``L`` a symmetric matrix.

The adjoint (the exact transpose of that step)
----------------------------------------------
For the adjoint state ``(alpha, beta)`` (gradients w.r.t. ``(A, B)``):

    alpha = -(1 - e) a beta',     beta = alpha' + 2 a beta' + L (a c beta'),

and the model gradient (the imaging condition) accumulates
``dJ/dc += a beta' (L B)`` pointwise, with ``B`` the current field of the
state the adjoint step is given (``u_i`` in the convention of
:mod:`vlcc_adjoint.solver`: adjoint step ``i`` gets ``u_i`` and
``lambda_{i+1}``).  The gradient is kept w.r.t. ``c`` and converted once,
when read, to the gradient w.r.t. the **velocity** ``v`` (``dc/dv = 2 c / v``).

The objective
-------------
``J(v) = dt/2 * sum_{k=0..n} sum_r (u_k(x_r) - d_obs[k, r])^2``, with the
observed data ``d_obs`` simulated in a "true" model (the background plus a
Gaussian anomaly) and the synthetic data in the current model.  The
receiver term of state ``k`` enters the adjoint as a source: adjoint step
``i`` adds ``dt R^T (R u_i - d_obs[i])`` to ``beta``; the term of ``u_n``
is :meth:`SeismicProblem.final_adjoint`.

Kernels
-------
In :mod:`vlcc_adjoint._examples.wave_kernels` (shared with the MPI slabs of
:mod:`vlcc_adjoint._examples.mpi_seismic`).  Serial numba, ``nogil`` (a
checkpoint store's background threads run while a step computes), no allocation per step: the forward writes ``u^{k+1}`` over
``u^{k-1}`` (pointwise safe) and the two arrays of the state swap roles; the
adjoint does the same.  Each kernel streams rows through a ring of
``2R + 1`` zero-padded rows (``R = 2``), so the stencil has no boundary
branches, its inner loop vectorises, and the zero exterior is exact (which
is what makes the transpose exact at the edges).

References: Virieux & Operto (2009), "An overview of full-waveform inversion
in exploration geophysics", Geophysics 74(6); Cerjan et al. (1985), "A
nonreflecting boundary condition for discrete acoustic and elastic wave
equations", Geophysics 50(4); Plessix (2006), "A review of the adjoint-state
method for computing the gradient of a functional with geophysical
applications", GJI 167(2).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np

from ..errors import VlccValueError
from .wave_kernels import RADIUS as _R
from .wave_kernels import RING_ROWS as _S
from .wave_kernels import half_misfit as _half_misfit
from .wave_kernels import inject_residual as _inject_residual
from .wave_kernels import record_receivers as _record
from .wave_kernels import wave_adjoint as _wave_adjoint
from .wave_kernels import wave_forward as _wave_forward
from .wave_kernels import wave_forward_many as _wave_forward_many

if TYPE_CHECKING:
    from ..execute import AdjointResult

__all__ = ["SeismicProblem", "WaveState", "damping_tables", "ricker"]

# Leapfrog with the 4th-order stencil is stable for v dt / dx <= 2 / sqrt(2 * 16/3).
CFL_LIMIT = 2.0 / math.sqrt(32.0 / 3.0)


@dataclasses.dataclass
class WaveState:
    """One state of the leapfrog loop: the previous and the current field.

    ``u_k`` is ``WaveState(prev=u^{k-1}, curr=u^k)``.  The adjoint state has
    the same type: ``prev``/``curr`` hold the gradients w.r.t. those fields.
    """

    prev: np.ndarray
    curr: np.ndarray


def ricker(t: np.ndarray, f0: float, t0: float) -> np.ndarray:
    """Ricker wavelet of peak frequency `f0` (Hz) centred at `t0` (s)."""
    arg = (math.pi * f0 * (t - t0)) ** 2
    return (1.0 - 2.0 * arg) * np.exp(-arg)


# --------------------------------------------------------------------------
# the problem
# --------------------------------------------------------------------------


def damping_tables(dampz: np.ndarray, dampx: np.ndarray, dt: float):
    """``(a_tab, b_tab, row_id)``: ``a = 1/(1 + e)`` and ``(1 - e) a``,
    ``e = dt (d_z + d_x) / 2``, with one table row per distinct ``d_z``;
    row ``j`` of the grid uses table row ``row_id[j]``."""
    values, row_id = np.unique(np.asarray(dampz, dtype=np.float64), return_inverse=True)
    e = 0.5 * dt * (values[:, None] + np.asarray(dampx, dtype=np.float64)[None, :])
    a_tab = 1.0 / (1.0 + e)
    return a_tab, (1.0 - e) * a_tab, row_id.astype(np.int64)


def _sponge(n: int, nbl: int, d0: float) -> np.ndarray:
    # Quadratic ramp over nbl cells on both ends, zero inside.
    d = np.zeros(n)
    if nbl > 0:
        ramp = d0 * (np.arange(nbl, 0, -1) / nbl) ** 2
        d[:nbl] = ramp
        d[n - nbl :] = ramp[::-1]
    return d


class SeismicProblem:
    """2-D acoustic FWI: the velocity gradient of a receiver-data misfit.

    A solver for :func:`vlcc_adjoint.execute.run_adjoint`: states are
    :class:`WaveState`, ``forward`` / ``adjoint`` update their argument in
    place and return it, ``copy`` makes an independent state.  The gradient
    w.r.t. the velocity, accumulated by the adjoint steps, is read from
    :attr:`gradient`; call :meth:`reset_gradient` (or :meth:`set_model`)
    before a new backward sweep.

    **Arguments:**

    - `nx`, `nz`: grid size (points, sponge included).
    - `nt`: number of time steps ``n`` (states ``u_0 .. u_n``).
    - `dx`: grid spacing in metres (both directions).
    - `f0`: Ricker peak frequency in Hz; default ``v_min / (15 dx)``
      (about 6 points per shortest wavelength).
    - `courant`: ``v_max dt / dx``; stable up to :data:`CFL_LIMIT` (0.612).
    - `nbl`: sponge width in cells; default ``clip(min(nx, nz) // 8, 8, 40)``.
    - `v_background`, `v_true`: ``(nz, nx)`` velocity models in m/s; default
      a linear gradient 2000 -> 2500 m/s with depth, and that plus a Gaussian
      +250 m/s anomaly in the middle.
    - `src`: ``(z, x)`` source grid point; default just below the top sponge,
      mid-width.
    - `receivers`: ``(z_indices, x_indices)``; default a line at the source
      depth across the interior.

    The current model (used by ``forward``/``adjoint``) starts as the
    background; change it with :meth:`set_model`.  Not re-entrant: one run
    at a time per problem object (the kernels share scratch rows).

    **Example:**

    ```python
    p = SeismicProblem(nx=120, nz=120, nt=500)
    g = p.reference_gradient()            # dJ/dv at the background model
    ```
    """

    #: The executor may restore checkpoints into the arrays of the state in
    #: hand (forward steps update states in place; adjoint steps only read them).
    restore_in_place = True

    def __init__(
        self,
        nx: int = 200,
        nz: int = 200,
        nt: int = 1000,
        dx: float = 10.0,
        *,
        f0: float | None = None,
        courant: float = 0.4,
        nbl: int | None = None,
        v_background: np.ndarray | None = None,
        v_true: np.ndarray | None = None,
        src: tuple[int, int] | None = None,
        receivers: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        if nx < 2 * _R + 1 or nz < 2 * _R + 1 or nt < 1:
            raise VlccValueError(
                f"need nx, nz >= {2 * _R + 1} and nt >= 1, got nx={nx}, nz={nz}, nt={nt}"
            )
        if not 0.0 < courant < CFL_LIMIT:
            raise VlccValueError(
                f"courant must lie in (0, {CFL_LIMIT:.4f}) for stability, got {courant}"
            )
        self.nx, self.nz, self.nt, self.dx = int(nx), int(nz), int(nt), float(dx)
        self.n_steps = self.nt
        self.nbl = int(np.clip(min(nx, nz) // 8, 8, 40)) if nbl is None else int(nbl)
        if 2 * self.nbl >= min(nx, nz):
            raise VlccValueError(
                f"the sponge (nbl={self.nbl} per side) leaves no interior in a {nz}x{nx} grid"
            )

        z = np.arange(nz)[:, None] * self.dx
        x = np.arange(nx)[None, :] * self.dx
        if v_background is None:
            v_background = np.broadcast_to(2000.0 + 500.0 * z / max(z[-1, 0], 1.0), (nz, nx))
        if v_true is None:
            zc, xc = z[nz // 2, 0], x[0, nx // 2]
            sigma = min(nx, nz) * self.dx / 12.0
            v_true = v_background + 250.0 * np.exp(
                -((z - zc) ** 2 + (x - xc) ** 2) / (2 * sigma**2)
            )
        self.v_background = self._check_model(v_background, "v_background")
        self.v_true = self._check_model(v_true, "v_true")

        vmax = max(self.v_background.max(), self.v_true.max())
        vmin = min(self.v_background.min(), self.v_true.min())
        self.dt = courant * self.dx / vmax
        self.f0 = vmin / (15.0 * self.dx) if f0 is None else float(f0)
        self.t0 = 1.5 / self.f0
        # Damping strength: the usual PML estimate 3 v ln(1/R) / (2 L), R = 1e-3.
        d0 = 3.0 * vmax * math.log(1e3) / (2.0 * max(self.nbl, 1) * self.dx)
        self._dampz = _sponge(nz, self.nbl, d0)
        self._dampx = _sponge(nx, self.nbl, d0)
        self._a_tab, self._b_tab, self._row_id = damping_tables(self._dampz, self._dampx, self.dt)

        if src is None:
            src = (self.nbl + 2, nx // 2)
        self.src_z, self.src_x = int(src[0]), int(src[1])
        if receivers is None:
            xs = np.arange(self.nbl, nx - self.nbl)
            receivers = (np.full(xs.size, self.nbl + 2), xs)
        self.rec_z = np.ascontiguousarray(receivers[0], dtype=np.int64)
        self.rec_x = np.ascontiguousarray(receivers[1], dtype=np.int64)
        if not (0 <= self.src_z < nz and 0 <= self.src_x < nx):
            raise VlccValueError(f"source {src} lies outside the {nz}x{nx} grid")
        if (
            self.rec_z.shape != self.rec_x.shape
            or self.rec_z.size == 0
            or self.rec_z.min() < 0
            or self.rec_z.max() >= nz
            or self.rec_x.min() < 0
            or self.rec_x.max() >= nx
        ):
            raise VlccValueError(
                "receivers must be two equal-length, non-empty index arrays inside the grid"
            )

        self.wavelet = ricker(np.arange(nt) * self.dt, self.f0, self.t0)
        # dt^2 f at the source point, f = v_min^2 w(t) delta(x) / dx^2 (the
        # factor v_min^2 keeps the wavefield of order one; fixed, so the
        # source does not depend on the model being inverted).
        self._src_values = (vmin * self.dt / self.dx) ** 2 * self.wavelet

        shape_ring = (_S, nx + 2 * _R)
        self._fring = np.zeros(shape_ring)
        self._wring = np.zeros(shape_ring)
        self._bring = np.zeros(shape_ring)
        self._gacc = np.zeros((nz, nx))
        self._d_obs: np.ndarray | None = None
        self.last_run: AdjointResult | None = None
        self.set_model(self.v_background)

    # ----------------------------------------------------------- models
    def _check_model(self, v, name: str) -> np.ndarray:
        v = np.array(v, dtype=np.float64, order="C")
        if v.shape != (self.nz, self.nx):
            raise VlccValueError(
                f"{name} has shape {v.shape}, expected (nz, nx) = {(self.nz, self.nx)}"
            )
        if not np.all(np.isfinite(v)) or v.min() <= 0.0:
            raise VlccValueError(f"{name} must be finite and positive (m/s)")
        return v

    def squared_courant(self, v: np.ndarray) -> np.ndarray:
        """``c = (v dt / dx)^2`` of the model `v`, pointwise: the coefficient
        of the Laplacian in the step (``cv`` in the kernels)."""
        return (v * (self.dt / self.dx)) ** 2

    @property
    def cv(self) -> np.ndarray:
        """``c`` of the current model (:meth:`squared_courant` of :attr:`v`)."""
        return self._cvcur

    def set_model(self, v: np.ndarray) -> None:
        """Make `v` (``(nz, nx)``, m/s) the current model and zero the gradient."""
        v = self._check_model(v, "v")
        if v.max() * self.dt / self.dx > CFL_LIMIT:
            raise VlccValueError(
                f"v_max = {v.max():.1f} m/s breaks the CFL limit for dt = {self.dt:.3e} s; "
                "build the problem with a smaller courant number or with this model as v_true"
            )
        self.v = v
        self._cvcur = self.squared_courant(v)
        self.reset_gradient()

    @property
    def damping(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(a_tab, b_tab, row_id)`` of this grid (:func:`damping_tables`),
        the coefficient tables every kernel of
        :mod:`~vlcc_adjoint._examples.wave_kernels` takes."""
        return self._a_tab, self._b_tab, self._row_id

    @property
    def source_values(self) -> np.ndarray:
        """Per step, the source term ``dt^2 f`` at the source point (a
        forward step adds it times ``a`` there)."""
        return self._src_values

    @property
    def d_obs(self) -> np.ndarray:
        """Observed data, ``(nt + 1, n_receivers)``: the true model's receiver traces."""
        if self._d_obs is None:
            self._d_obs = self._sweep(self.squared_courant(self.v_true))
        return self._d_obs

    # ------------------------------------------------------ the protocol
    def initial_state(self) -> WaveState:
        """``u_0``: the medium at rest."""
        return WaveState(np.zeros((self.nz, self.nx)), np.zeros((self.nz, self.nx)))

    def copy(self, state: WaveState) -> WaveState:
        """An independent copy of `state`."""
        return WaveState(state.prev.copy(), state.curr.copy())

    def forward(self, state: WaveState, step: int) -> WaveState:
        """Forward step `step`: ``u_step -> u_{step+1}``, in place (returns `state`)."""
        _wave_forward(
            state.prev,
            state.curr,
            self._cvcur,
            self._a_tab,
            self._b_tab,
            self._row_id,
            self._fring,
            self.src_z,
            self.src_x,
            self._src_values[step],
        )
        state.prev, state.curr = state.curr, state.prev
        return state

    def forward_many(self, state: WaveState, start: int, stop: int) -> WaveState:
        """Forward steps ``start .. stop-1``: ``u_start -> u_stop``, in place."""
        if not 0 <= start <= stop <= self.nt:
            raise VlccValueError(f"steps {start}..{stop} are outside 0..{self.nt}")
        state.prev, state.curr = _wave_forward_many(
            state.prev,
            state.curr,
            self._cvcur,
            self._a_tab,
            self._b_tab,
            self._row_id,
            self._fring,
            self.src_z,
            self.src_x,
            self._src_values,
            start,
            stop,
        )
        return state

    def adjoint(self, state: WaveState, adj: WaveState, step: int) -> WaveState:
        """Adjoint step `step`: ``lambda_{step+1} -> lambda_step`` given ``u_step``.

        Updates `adj` in place (and returns it), adds this step's contribution
        to the velocity gradient and the receiver residual of ``u_step``.
        `state` is only read.
        """
        _wave_adjoint(
            adj.prev,
            adj.curr,
            state.curr,
            self._cvcur,
            self._a_tab,
            self._b_tab,
            self._row_id,
            self._wring,
            self._bring,
            self._gacc,
        )
        adj.prev, adj.curr = adj.curr, adj.prev
        _inject_residual(adj.curr, state.curr, self.rec_z, self.rec_x, self.d_obs, step, self.dt)
        return adj

    def final_adjoint(self, state: WaveState) -> WaveState:
        """``lambda_n = dJ/du_n`` (the receiver residual of the last state)."""
        adj = WaveState(np.zeros((self.nz, self.nx)), np.zeros((self.nz, self.nx)))
        _inject_residual(adj.curr, state.curr, self.rec_z, self.rec_x, self.d_obs, self.nt, self.dt)
        return adj

    # -------------------------------------------------------- gradients
    @property
    def gradient(self) -> np.ndarray:
        """``dJ/dv`` accumulated by the adjoint steps so far (a new ``(nz, nx)`` array)."""
        return self._gacc * (2.0 * self._cvcur / self.v)

    def reset_gradient(self) -> None:
        """Zero the gradient accumulator (before a backward sweep)."""
        self._gacc[...] = 0.0

    def _sweep(self, cv: np.ndarray, dobs: np.ndarray | None = None, keep: list | None = None):
        # Forward run in model cv: the traces (dobs None) or the misfit J;
        # keep, if a list, receives a copy of every curr field u^0 .. u^n.
        state = self.initial_state()
        traces = np.zeros((self.nt + 1, self.rec_z.size)) if dobs is None else None
        total = 0.0
        for k in range(self.nt + 1):
            if k > 0:
                _wave_forward(
                    state.prev,
                    state.curr,
                    cv,
                    self._a_tab,
                    self._b_tab,
                    self._row_id,
                    self._fring,
                    self.src_z,
                    self.src_x,
                    self._src_values[k - 1],
                )
                state.prev, state.curr = state.curr, state.prev
            if keep is not None:
                keep.append(state.curr.copy())
            if dobs is None:
                _record(state.curr, self.rec_z, self.rec_x, traces, k)
            else:
                total += _half_misfit(state.curr, self.rec_z, self.rec_x, dobs, k)
        return traces if dobs is None else total * self.dt

    def traces(self, v: np.ndarray | None = None) -> np.ndarray:
        """Synthetic receiver data ``(nt + 1, n_receivers)`` in `v` (default: the current model)."""
        cv = self._cvcur if v is None else self.squared_courant(self._check_model(v, "v"))
        return self._sweep(cv)

    def objective(self, v: np.ndarray | None = None) -> float:
        """``J(v) = dt/2 sum_k sum_r (u_k(x_r) - d_obs[k, r])^2`` (default: the current model).

        Does not change the current model.
        """
        cv = self._cvcur if v is None else self.squared_courant(self._check_model(v, "v"))
        return self._sweep(cv, self.d_obs)

    def reference_gradient(self, v: np.ndarray | None = None, return_objective: bool = False):
        """``dJ/dv`` by the store-everything loop: the referee of checkpointed runs.

        Runs forward keeping every state (``nt + 1`` fields, ``(nt+1) nz nx``
        floats), then the adjoint steps ``nt-1 .. 0`` through :meth:`adjoint`.
        Sets the current model to `v` when given.

        **Returns:** the gradient ``(nz, nx)``, or ``(J, gradient)`` with
        `return_objective`.
        """
        if v is not None:
            self.set_model(v)
        fields: list[np.ndarray] = []
        value = self._sweep(self._cvcur, self.d_obs, keep=fields)
        zero = np.zeros((self.nz, self.nx))
        self.reset_gradient()
        adj = self.final_adjoint(WaveState(fields[-2], fields[-1]))
        for i in range(self.nt - 1, -1, -1):
            adj = self.adjoint(WaveState(fields[i - 1] if i > 0 else zero, fields[i]), adj, i)
        grad = self.gradient
        return (value, grad) if return_objective else grad

    def gradient_with(
        self, schedule, store=None, v: np.ndarray | None = None, progress: bool = False
    ) -> np.ndarray:
        """``dJ/dv`` through :func:`vlcc_adjoint.execute.run_adjoint` under `schedule`.

        The terminal condition is :meth:`final_adjoint`, a callable of ``u_n``;
        the run's :class:`~vlcc_adjoint.execute.AdjointResult` (counts,
        timings, store statistics) is kept in :attr:`last_run`.  Sets the
        current model to `v` when given.
        """
        from ..execute import run_adjoint

        if v is not None:
            self.set_model(v)
        self.reset_gradient()
        self.last_run = run_adjoint(
            self, schedule, self.initial_state(), self.final_adjoint, store=store, progress=progress
        )
        return self.gradient

    def __repr__(self) -> str:
        return (
            f"SeismicProblem(nz={self.nz}, nx={self.nx}, nt={self.nt}, dx={self.dx}, "
            f"dt={self.dt:.3e}, f0={self.f0:.1f}, nbl={self.nbl}, receivers={self.rec_z.size})"
        )
