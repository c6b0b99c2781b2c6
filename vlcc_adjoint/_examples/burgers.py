"""1-D viscous Burgers: the gradient of a final-time misfit w.r.t. the initial condition.

The physics
-----------
``u_t + (u^2 / 2)_x = nu u_xx`` on the periodic unit interval, ``N`` cells
of width ``dx = 1 / N``.  A data-assimilation problem: find the initial
condition ``u_0`` whose evolution matches a target at the final time (and,
optionally, sensor readings along the way).

The discretisation
------------------
Conservative finite volumes with the energy-conserving (skew-symmetric)
central flux

    F(a, b) = (a^2 + a b + b^2) / 6,
    R(u)_i = -(F(u_i, u_{i+1}) - F(u_{i-1}, u_i)) / dx + nu (u_{i+1} - 2 u_i + u_{i-1}) / dx^2,

which conserves ``sum u`` and, without viscosity, ``sum u^2`` - and, unlike
an upwind flux, is a polynomial of the state, so the discrete map is smooth
and a Taylor test sees clean second-order remainders.  Time stepping is the
three-stage SSP Runge-Kutta method of Shu & Osher (1988):

    u1 = u + dt R(u),  u2 = 3/4 u + 1/4 (u1 + dt R(u1)),  u' = 1/3 u + 2/3 (u2 + dt R(u2)).

The adjoint (the exact transpose of the linearised step)
--------------------------------------------------------
Adjoint step ``i`` gets ``u_i`` and ``lambda_{i+1}``, recomputes the two
stages, and runs them backwards:

    l2 = 2/3 (l' + dt J(u2)^T l'),    l1 = 1/4 (l2 + dt J(u1)^T l2),
    l  = 1/3 l' + 3/4 l2 + l1 + dt J(u)^T l1,

with ``(J(w)^T m)_k = (m_{k+1} - m_k)(2 w_k + w_{k+1}) / 6dx
+ (m_k - m_{k-1})(w_{k-1} + 2 w_k) / 6dx + nu (m_{k+1} - 2 m_k + m_{k-1}) / dx^2``
(each face flux enters its two cells with opposite signs).

The objective
-------------
``J(u_0) = dx/2 ||u_n - u_target||^2 + w dt/2 sum_{k=0..n} sum_s (u_k(x_s) - y_k[s])^2``:
the target and the sensor readings ``y`` come from a "true" initial
condition; the running (sensor) term is off unless ``sensors`` are given.
``lambda_0`` is the (Euclidean) gradient ``dJ/du_0``; divide by ``dx`` for
the L2 gradient function.

Kernels are serial numba, ``nogil``; the forward step writes ``u'`` over
``u`` (the last stage reads ``u`` only pointwise) with two stage buffers
owned by the problem; the adjoint step updates ``lambda`` in place.

Reference: Shu & Osher (1988), J. Comput. Phys. 77; Hairer, Lubich & Wanner
on adjoints of Runge-Kutta methods (the discrete adjoint of an explicit RK
method is the transposed stage recursion, as above).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numba
import numpy as np

from ..errors import VlccValueError

if TYPE_CHECKING:
    from ..execute import AdjointResult

__all__ = ["BurgersProblem", "rk3_adjoint", "rk3_forward"]


@numba.njit(inline="always")
def _residual(w, im, i, ip, idx, nu_idx2):
    a, b, c = w[im], w[i], w[ip]
    flux_r = (b * b + b * c + c * c) * (1.0 / 6.0)
    flux_l = (a * a + a * b + b * b) * (1.0 / 6.0)
    return -(flux_r - flux_l) * idx + nu_idx2 * (c - 2.0 * b + a)


@numba.njit(inline="always")
def _residual_t(w, m, im, i, ip, idx, nu_idx2):
    # (J(w)^T m)_i
    return (
        (m[ip] - m[i]) * (2.0 * w[i] + w[ip]) * (idx / 6.0)
        + (m[i] - m[im]) * (w[im] + 2.0 * w[i]) * (idx / 6.0)
        + nu_idx2 * (m[ip] - 2.0 * m[i] + m[im])
    )


@numba.njit(nogil=True, cache=True, fastmath=False)
def _stage(out, w, base, cw, cb, dt, idx, nu_idx2):
    # out = cb * base + cw * (w + dt R(w)), periodic.  out may alias base, not w.
    n = w.size
    out[0] = cb * base[0] + cw * (w[0] + dt * _residual(w, n - 1, 0, 1, idx, nu_idx2))
    for i in range(1, n - 1):
        out[i] = cb * base[i] + cw * (w[i] + dt * _residual(w, i - 1, i, i + 1, idx, nu_idx2))
    out[n - 1] = cb * base[n - 1] + cw * (
        w[n - 1] + dt * _residual(w, n - 2, n - 1, 0, idx, nu_idx2)
    )


@numba.njit(nogil=True, cache=True, fastmath=False)
def _stage_t(out, m, w, cm, cj, dt, idx, nu_idx2):
    # out += cm * m + cj * dt * J(w)^T m, periodic.  out must not alias m.
    n = m.size
    out[0] += cm * m[0] + cj * dt * _residual_t(w, m, n - 1, 0, 1, idx, nu_idx2)
    for i in range(1, n - 1):
        out[i] += cm * m[i] + cj * dt * _residual_t(w, m, i - 1, i, i + 1, idx, nu_idx2)
    out[n - 1] += cm * m[n - 1] + cj * dt * _residual_t(w, m, n - 2, n - 1, 0, idx, nu_idx2)


@numba.njit(nogil=True, cache=True, fastmath=False)
def rk3_forward(u, u1, u2, dt, idx, nu_idx2):
    """One SSP-RK3 step in place: ``u <- u'``; `u1`, `u2` are scratch."""
    _stage(u1, u, u, 1.0, 0.0, dt, idx, nu_idx2)  # u1 = u + dt R(u)
    _stage(u2, u1, u, 0.25, 0.75, dt, idx, nu_idx2)  # u2 = 3/4 u + 1/4 (u1 + dt R(u1))
    _stage(u, u2, u, 2.0 / 3.0, 1.0 / 3.0, dt, idx, nu_idx2)  # u' = 1/3 u + 2/3 (u2 + dt R(u2))


@numba.njit(nogil=True, cache=True, fastmath=False)
def rk3_adjoint(lam, u, u1, u2, l1, l2, dt, idx, nu_idx2):
    """The transposed SSP-RK3 step in place: ``lam <- J_step(u)^T lam``.

    Recomputes the stages ``u1``, ``u2`` from `u`; `l1`, `l2` are scratch.
    """
    _stage(u1, u, u, 1.0, 0.0, dt, idx, nu_idx2)
    _stage(u2, u1, u, 0.25, 0.75, dt, idx, nu_idx2)
    n = lam.size
    for i in range(n):
        l2[i] = 0.0
        l1[i] = 0.0
    _stage_t(l2, lam, u2, 2.0 / 3.0, 2.0 / 3.0, dt, idx, nu_idx2)  # l2 = 2/3 (l' + dt J(u2)^T l')
    for i in range(n):
        lam[i] = lam[i] * (1.0 / 3.0) + 0.75 * l2[i]
    _stage_t(l1, l2, u1, 0.25, 0.25, dt, idx, nu_idx2)  # l1 = 1/4 (l2 + dt J(u1)^T l2)
    _stage_t(lam, l1, u, 1.0, 1.0, dt, idx, nu_idx2)  # l += l1 + dt J(u)^T l1


@numba.njit(nogil=True, cache=True, fastmath=False)
def _sensor_term(lam, u, sensors, obs, k, scale):
    for s in range(sensors.size):
        lam[sensors[s]] += scale * (u[sensors[s]] - obs[k, s])


@numba.njit(nogil=True, cache=True, fastmath=False)
def _sensor_misfit(u, sensors, obs, k):
    total = 0.0
    for s in range(sensors.size):
        d = u[sensors[s]] - obs[k, s]
        total += d * d
    return 0.5 * total


class BurgersProblem:
    """1-D periodic viscous Burgers: ``dJ/du_0`` of a final-time (+ sensor) misfit.

    A solver for :func:`vlcc_adjoint.execute.run_adjoint`: states are 1-D
    float64 arrays of ``n_cells`` values; ``forward`` and ``adjoint`` update
    their argument in place and return it.  The gradient is ``lambda_0``,
    what the backward sweep returns.

    **Arguments:**

    - `n_cells`: grid size ``N`` (the size option: 512 is quick, 2^16 and
      10^4 steps make a checkpointing workload).
    - `n_steps`: time steps ``n``; default the fewest stable ones for `cfl`.
    - `t_final`: final time.
    - `nu`: viscosity.
    - `cfl`: ``dt`` as a fraction of the stability limit, when `n_steps` is
      not given.
    - `sensors`: cell indices observed at every step (the running misfit
      term), or ``None`` for the final-time misfit alone.
    - `sensor_weight`: ``w`` in front of the running term.
    - `u0_true`, `u0_guess`: initial conditions (the target's and the
      default evaluation point); default a two-mode profile and its first
      mode.

    Construction runs one forward sweep from `u0_true` (the target and the
    sensor data).  Not re-entrant: one run at a time per object (shared
    stage buffers).
    """

    #: The executor may restore checkpoints into the arrays of the state in
    #: hand (forward steps update states in place; adjoint steps only read them).
    restore_in_place = True

    def __init__(
        self,
        n_cells: int = 512,
        n_steps: int | None = None,
        t_final: float = 0.5,
        nu: float = 0.01,
        *,
        cfl: float = 0.9,
        sensors: np.ndarray | None = None,
        sensor_weight: float = 1.0,
        u0_true: np.ndarray | None = None,
        u0_guess: np.ndarray | None = None,
    ):
        if n_cells < 3:
            raise VlccValueError(f"n_cells must be >= 3, got {n_cells}")
        if nu < 0 or t_final <= 0:
            raise VlccValueError("need nu >= 0 and t_final > 0")
        self.n_cells = int(n_cells)
        self.dx = 1.0 / self.n_cells
        self.nu = float(nu)
        self.t_final = float(t_final)
        self.x = (np.arange(self.n_cells) + 0.5) * self.dx
        two_pi_x = 2.0 * math.pi * self.x
        if u0_true is None:
            u0_true = 0.2 + np.sin(two_pi_x) + 0.5 * np.sin(2.0 * two_pi_x + 1.0)
        if u0_guess is None:
            u0_guess = 0.2 + np.sin(two_pi_x)
        self.u0_true = self._check_state(u0_true, "u0_true")
        self.u0_guess = self._check_state(u0_guess, "u0_guess")

        umax = max(np.abs(self.u0_true).max(), np.abs(self.u0_guess).max(), 1e-12)
        # SSP-RK3 reaches sqrt(3) on the imaginary axis (centred advection,
        # eigenvalues up to i umax/dx) and 2.51 on the negative real axis
        # (diffusion, down to -4 nu/dx^2); the harmonic combination is a safe
        # bound for their sum.
        limit = 1.0 / (umax / (math.sqrt(3.0) * self.dx) + 4.0 * self.nu / (2.5 * self.dx**2))
        if not 0.0 < cfl <= 1.0:
            raise VlccValueError(f"cfl is a fraction of the stability limit, in (0, 1]; got {cfl}")
        if n_steps is None:
            n_steps = max(1, math.ceil(self.t_final / (cfl * limit)))
        self.n_steps = int(n_steps)
        self.nt = self.n_steps
        self.dt = self.t_final / self.n_steps
        if self.dt > limit:
            raise VlccValueError(
                f"dt = {self.dt:.3e} exceeds the stability limit {limit:.3e} of this grid; "
                f"use n_steps >= {math.ceil(self.t_final / limit)}"
            )

        self.sensors = (
            np.zeros(0, dtype=np.int64)
            if sensors is None
            else np.ascontiguousarray(sensors, dtype=np.int64)
        )
        if self.sensors.size and (self.sensors.min() < 0 or self.sensors.max() >= self.n_cells):
            raise VlccValueError("sensor indices must lie in [0, n_cells)")
        self.sensor_weight = float(sensor_weight)
        self.last_run: AdjointResult | None = None

        self._idx = 1.0 / self.dx
        self._nu_idx2 = self.nu / self.dx**2
        self._u1 = np.zeros(self.n_cells)
        self._u2 = np.zeros(self.n_cells)
        self._l1 = np.zeros(self.n_cells)
        self._l2 = np.zeros(self.n_cells)
        # The data: the true initial condition's final state and sensor readings.
        self.observations = np.zeros((self.n_steps + 1, self.sensors.size))
        u = self.u0_true.copy()
        for k in range(self.n_steps + 1):
            if k > 0:
                u = self.forward(u, k - 1)
            self.observations[k] = u[self.sensors]
        self.u_target = u

    def _check_state(self, u, name: str) -> np.ndarray:
        u = np.array(u, dtype=np.float64, order="C")
        if u.shape != (self.n_cells,):
            raise VlccValueError(f"{name} has shape {u.shape}, expected ({self.n_cells},)")
        return u

    # ------------------------------------------------------ the protocol
    def initial_state(self) -> np.ndarray:
        """``u_0`` at the default evaluation point (a fresh copy of `u0_guess`)."""
        return self.u0_guess.copy()

    def copy(self, state: np.ndarray) -> np.ndarray:
        """An independent copy of `state`."""
        return state.copy()

    def forward(self, state: np.ndarray, step: int) -> np.ndarray:
        """Forward step: ``u_step -> u_{step+1}`` in place (returns `state`)."""
        rk3_forward(state, self._u1, self._u2, self.dt, self._idx, self._nu_idx2)
        return state

    def forward_many(self, state: np.ndarray, start: int, stop: int) -> np.ndarray:
        """Forward steps ``start .. stop-1`` in place."""
        for step in range(start, stop):
            rk3_forward(state, self._u1, self._u2, self.dt, self._idx, self._nu_idx2)
        return state

    def adjoint(self, state: np.ndarray, adj: np.ndarray, step: int) -> np.ndarray:
        """Adjoint step: ``lambda_{step+1} -> lambda_step`` given ``u_step``, in place.

        Includes the sensor term of ``u_step``; `state` is only read.
        """
        rk3_adjoint(
            adj, state, self._u1, self._u2, self._l1, self._l2, self.dt, self._idx, self._nu_idx2
        )
        if self.sensors.size:
            _sensor_term(
                adj, state, self.sensors, self.observations, step, self.sensor_weight * self.dt
            )
        return adj

    def final_adjoint(self, state: np.ndarray) -> np.ndarray:
        """``lambda_n = dJ/du_n``."""
        adj = self.dx * (state - self.u_target)
        if self.sensors.size:
            _sensor_term(
                adj,
                state,
                self.sensors,
                self.observations,
                self.n_steps,
                self.sensor_weight * self.dt,
            )
        return adj

    # -------------------------------------------------------- gradients
    def _misfit_term(self, u: np.ndarray, k: int) -> float:
        if not self.sensors.size:
            return 0.0
        return self.sensor_weight * self.dt * _sensor_misfit(u, self.sensors, self.observations, k)

    def objective(self, u0: np.ndarray | None = None) -> float:
        """``J(u_0)`` (default: `u0_guess`)."""
        u = self.initial_state() if u0 is None else self._check_state(u0, "u0")
        total = self._misfit_term(u, 0)
        for k in range(self.n_steps):
            u = self.forward(u, k)
            total += self._misfit_term(u, k + 1)
        return total + 0.5 * self.dx * float(np.dot(u - self.u_target, u - self.u_target))

    def reference_gradient(self, u0: np.ndarray | None = None, return_objective: bool = False):
        """``dJ/du_0`` by the store-everything loop: the referee of checkpointed runs.

        **Returns:** ``lambda_0`` (``(n_cells,)``), or ``(J, lambda_0)`` with
        `return_objective`.
        """
        u = self.initial_state() if u0 is None else self._check_state(u0, "u0")
        states = [u]
        total = self._misfit_term(u, 0)
        for k in range(self.n_steps):
            u = self.forward(u.copy(), k)
            states.append(u)
            total += self._misfit_term(u, k + 1)
        total += 0.5 * self.dx * float(np.dot(u - self.u_target, u - self.u_target))
        adj = self.final_adjoint(states[-1])
        for i in range(self.n_steps - 1, -1, -1):
            adj = self.adjoint(states[i], adj, i)
        return (total, adj) if return_objective else adj

    def gradient_with(
        self, schedule, store=None, u0: np.ndarray | None = None, progress: bool = False
    ) -> np.ndarray:
        """``dJ/du_0`` through :func:`vlcc_adjoint.execute.run_adjoint` under `schedule`.

        The terminal condition is :meth:`final_adjoint`, a callable of ``u_n``;
        the run's :class:`~vlcc_adjoint.execute.AdjointResult` is kept in
        :attr:`last_run`.
        """
        from ..execute import run_adjoint

        u = self.initial_state() if u0 is None else self._check_state(u0, "u0")
        result = run_adjoint(self, schedule, u, self.final_adjoint, store=store, progress=progress)
        self.last_run = result
        return result.adjoint

    def __repr__(self) -> str:
        return (
            f"BurgersProblem(n_cells={self.n_cells}, n_steps={self.n_steps}, dt={self.dt:.3e}, "
            f"nu={self.nu}, sensors={self.sensors.size})"
        )
