"""A time-stepping adjoint with @timestep

An explicit Euler integration of `du/dt = sin(u)` for 2,000 steps, with the
objective `J = |u_n|^2 / 2`. `@timestep` declares the forward step and
`.adjoint` its transpose; `run_adjoint` runs Revolve with 10 snapshots and
returns `dJ/du_0`, which is checked against central finite differences of
`J` along a random direction.
"""

import numpy as np

from vlcc_adjoint import Revolve, run_adjoint, timestep

DT = 1e-3


@timestep
def step(u, i):
    """u_i -> u_{i+1}: an Euler step of du/dt = sin(u)."""
    return u + DT * np.sin(u)


@step.adjoint
def step_adjoint(u, lam, i):
    """lambda_{i+1} -> lambda_i, with u_i in hand."""
    return lam + DT * np.cos(u) * lam


def objective(u0, n):
    u = u0
    for i in range(n):
        u = step(u, i)
    return 0.5 * float(u @ u)


n = 2000
u0 = np.linspace(0.0, 1.0, 50)
schedule = Revolve(n, 10)
result = run_adjoint(step, schedule, u0, adj_final=lambda u: u)  # dJ/du_n = u_n
print(schedule.stats())
print("forward steps evaluated:", result.forward_steps)

rng = np.random.default_rng(0)
du = rng.standard_normal(u0.shape)
h = 1e-6
fd = (objective(u0 + h * du, n) - objective(u0 - h * du, n)) / (2 * h)
ad = float(result.adjoint @ du)
print(f"adjoint <dJ/du0, du> = {ad:.10f}")
print(f"finite difference    = {fd:.10f}")
rel = abs(ad - fd) / abs(fd)
print(f"relative difference  = {rel:.1e}")
assert rel < 1e-6, rel
