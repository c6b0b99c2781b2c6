"""Devito's Revolver, one import swapped

Devito checkpoints its adjoints through pyrevolve: the wavefield is a
`DevitoCheckpoint`, the operators are wrapped as `CheckpointOperator`s, and
`Revolver(cp, fwd, rev, n_checkpoints, n_timesteps)` runs the forward sweep
(`apply_forward`) and the reverse sweep (`apply_reverse`).
`vlcc_adjoint.devito.Revolver` takes the same arguments; swapping the import
is the whole change, and any vlcc schedule or store can then be passed
(`schedule=`, `store=`).

A tiny 2-D acoustic model (41 x 41 points, 150 time samples, a faster disc
in the true model) gives the gradient of the misfit
`J(m) = |d(m) - d_obs|^2 / 2` with respect to the squared slowness `m`
three ways: Devito with the wavefield saved at every step (no
checkpointing: the referee), pyrevolve's `Revolver`, and ours, with 5
snapshots.  Devito compiles the operators with gcc on first use.
"""

import os

os.environ.setdefault("DEVITO_LANGUAGE", "C")
os.environ.setdefault("DEVITO_ARCH", "gcc")
os.environ.setdefault("DEVITO_LOGGING", "ERROR")

import numpy as np  # noqa: E402
import pyrevolve  # noqa: E402
from devito import (  # noqa: E402
    CheckpointOperator,
    DevitoCheckpoint,
    Eq,
    Function,
    Grid,
    Inc,
    Operator,
    SparseTimeFunction,
    TimeFunction,
    solve,
)

import vlcc_adjoint.devito  # noqa: E402

NX, NT, H, NBL = 41, 150, 10.0, 8
grid = Grid(shape=(NX, NX), extent=((NX - 1) * H, (NX - 1) * H), dtype=np.float32)
z = np.arange(NX)[None, :] * H + 0 * np.arange(NX)[:, None]
x = np.arange(NX)[:, None] * H + 0 * z
vp0 = np.where(z < 0.45 * NX * H, 1.5, 2.5)  # km/s, two layers
vp_true = np.where((x - 200.0) ** 2 + (z - 250.0) ** 2 < 60.0**2, 3.0, vp0)
m = Function(name="m", grid=grid, space_order=4)
m.data[:] = 1.0 / vp0**2
damp = Function(name="damp", grid=grid)
edge = np.minimum(
    np.minimum(np.arange(NX), np.arange(NX)[::-1])[:, None],
    np.minimum(np.arange(NX), np.arange(NX)[::-1])[None, :],
)
damp.data[:] = 0.2 * np.clip((NBL - edge) / NBL, 0.0, 1.0) ** 2  # absorbing border
dt = np.float32(0.4 * H / 3.0)
t = np.arange(NT) * dt
a = (np.pi * 0.025 * (t - 40.0)) ** 2
src = SparseTimeFunction(name="src", grid=grid, npoint=1, nt=NT)
src.coordinates.data[:] = [200.0, (NBL + 2) * H]
src.data[:, 0] = (1 - 2 * a) * np.exp(-a)  # a Ricker wavelet
xr = np.linspace(NBL * H, (NX - 1 - NBL) * H, 21)
rec = SparseTimeFunction(name="rec", grid=grid, npoint=21, nt=NT)
residual = SparseTimeFunction(name="residual", grid=grid, npoint=21, nt=NT)
rec.coordinates.data[:] = residual.coordinates.data[:] = np.stack(
    [xr, np.full(21, (NBL + 2) * H)], 1
)
v = TimeFunction(name="v", grid=grid, time_order=2, space_order=4)
grad = Function(name="grad", grid=grid)
s = grid.stepping_dim.spacing


def forward_op(u):
    pde = m * u.dt2 - u.laplace + damp * u.dt
    return Operator(
        [Eq(u.forward, solve(pde, u.forward))]
        + src.inject(field=u.forward, expr=src * s**2 / m)
        + rec.interpolate(expr=u)
    )


def gradient_op(u):
    pde = m * v.dt2 - v.laplace + damp * v.dt.T
    return Operator(
        [Eq(v.backward, solve(pde, v.backward))]
        + residual.inject(field=v.backward, expr=residual * s**2 / m)
        + [Inc(grad, -u * v.dt2)]
    )


def reset(*fields):
    for f in fields + (v, grad, rec, residual):
        f.data_with_halo[:] = 0.0


# The observed data: a forward run in the true model.
u = TimeFunction(name="u", grid=grid, time_order=2, space_order=4)  # 3 time levels
fwd, rev = forward_op(u), gradient_op(u)
reset(u)
m_true = Function(name="m_true", grid=grid, space_order=4)
m_true.data[:] = 1.0 / vp_true**2
fwd.apply(u=u, m=m_true, dt=dt)
d_obs = rec.data.copy()

# 1. The referee: the wavefield saved at all NT steps, no checkpointing.
u_all = TimeFunction(name="u", grid=grid, time_order=2, space_order=4, save=NT)
reset(u_all)
forward_op(u_all).apply(u=u_all, dt=dt)
residual.data[:] = rec.data - d_obs
gradient_op(u_all).apply(u=u_all, v=v, grad=grad, residual=residual, dt=dt)
g_saved = grad.data.copy()
print(f"misfit J = {0.5 * np.sum(residual.data.astype(np.float64) ** 2):.6e}")


# 2 and 3. Devito's checkpointed gradient: the code is the same for both Revolvers.
def checkpointed_gradient(Revolver, n_checkpoints):
    reset(u)
    cp = DevitoCheckpoint([u])
    wrap_fw = CheckpointOperator(fwd, u=u, src=src, rec=rec, dt=dt)
    wrap_rev = CheckpointOperator(rev, u=u, v=v, grad=grad, residual=residual, dt=dt)
    wrp = Revolver(cp, wrap_fw, wrap_rev, n_checkpoints, NT - 2)
    wrp.apply_forward()
    # The residual has an object of its own: the reverse sweep reruns the
    # forward operator, which writes rec again (with pyrevolve as with vlcc).
    residual.data[:] = rec.data - d_obs
    wrp.apply_reverse()
    return grad.data.copy(), wrp


g_pyrevolve, _ = checkpointed_gradient(pyrevolve.Revolver, 5)
g_vlcc, wrp = checkpointed_gradient(vlcc_adjoint.devito.Revolver, 5)  # the one-line swap

scale = np.abs(g_saved).max()
print(wrp)
print(
    f"forward steps: {wrp.result.forward_steps} for {NT - 2} time steps "
    f"({wrp.schedule.stats().recompute_ratio:.2f} per step)"
)
print(f"max |vlcc - saved|     / max |g| = {np.abs(g_vlcc - g_saved).max() / scale:.1e}")
print(f"max |vlcc - pyrevolve| / max |g| = {np.abs(g_vlcc - g_pyrevolve).max() / scale:.1e}")
print("bitwise equal to pyrevolve:", np.array_equal(g_vlcc, g_pyrevolve))
assert np.abs(g_vlcc - g_saved).max() <= 1e-5 * scale
assert np.array_equal(g_vlcc, g_pyrevolve)
