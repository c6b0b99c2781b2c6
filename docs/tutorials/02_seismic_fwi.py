"""A seismic FWI gradient under a memory budget

The 2-D acoustic full-waveform-inversion problem of `vlcc demo`
(`vlcc_adjoint._examples.seismic.SeismicProblem`) on a tiny grid: 60 x 60
points, 300 time steps, one state 58 kB, all of them 17 MB. The velocity
gradient is computed with Revolve and 8 states in memory, then with the
schedule `vlcc_adjoint.plan` picks for a budget of 4 states in memory and
40 on a zarr store in a temporary directory (costs measured on the solver),
and both are compared with the store-everything reference.
"""

import os
import tempfile

import matplotlib.pyplot as plt
import numpy as np

from vlcc_adjoint import plan
from vlcc_adjoint._examples.seismic import SeismicProblem
from vlcc_adjoint.schedules import Revolve

p = SeismicProblem(nx=60, nz=60, nt=300)
state_mb = 2 * p.nx * p.nz * 8 / 1e6
print(
    f"grid {p.nz}x{p.nx}, {p.nt} steps, one state = {state_mb:.3f} MB, "
    f"all states = {state_mb * (p.nt + 1):.1f} MB"
)

reference = p.reference_gradient()

revolve = Revolve(p.nt, 8)
g1 = p.gradient_with(revolve)
print(
    f"Revolve(300, 8): {p.last_run.forward_steps} forward steps, "
    f"max |g - ref| / max |ref| = {np.abs(g1 - reference).max() / np.abs(reference).max():.1e}"
)

with tempfile.TemporaryDirectory() as tmp:
    state_bytes = 2 * p.nx * p.nz * 8
    budget = plan(
        p.nt, 4 * state_bytes, 40 * state_bytes, solver=p, u0=p.initial_state(), disk_path=tmp
    )
    print("chosen:", budget.schedule)
    print(budget.schedule.stats())
    store = budget.make_store(os.path.join(tmp, "ckpt.zarr"))
    g2 = p.gradient_with(budget.schedule, store=store)
    store.close()
print(
    f"plan(memory=4 states, disk=40 states): max |g - ref| / max |ref| = "
    f"{np.abs(g2 - reference).max() / np.abs(reference).max():.1e}"
)
assert np.allclose(g1, reference, rtol=0, atol=1e-12 * np.abs(reference).max())
assert np.allclose(g2, reference, rtol=0, atol=1e-12 * np.abs(reference).max())

fig, ax = plt.subplots(figsize=(4, 3.4))
im = ax.imshow(g2, cmap="seismic", vmin=-np.abs(g2).max(), vmax=np.abs(g2).max())
ax.set_title("dJ/dv (two-level checkpointing)")
fig.colorbar(im, ax=ax)
fig.tight_layout()
fig.savefig(os.path.join(os.environ.get("VLCC_DOCS_FIGURES", "."), "seismic_gradient.png"), dpi=100)
