"""A seismic FWI gradient under a memory budget

The 2-D acoustic full-waveform-inversion problem of `vlcc demo`
(`vlcc_adjoint._examples.seismic.SeismicProblem`) on a tiny grid: 60 x 60
points, 300 time steps. The velocity gradient is computed with Revolve and
only 8 states in memory, then with a two-level plan (4 states in memory, the
rest on a zarr store in a temporary directory), and both are compared with
the store-everything reference.
"""

import os
import tempfile

import matplotlib.pyplot as plt
import numpy as np

from vlcc_adjoint.schedules import Level, Multistage, Revolve
from vlcc_adjoint.storage import MemoryTier, TieredStore, ZarrTier
from vlcc_adjoint.schedules import io_plan
from vlcc_adjoint._examples.seismic import SeismicProblem

p = SeismicProblem(nx=60, nz=60, nt=300)
state_mb = 2 * p.nx * p.nz * 8 / 1e6
print(f"grid {p.nz}x{p.nx}, {p.nt} steps, one state = {state_mb:.3f} MB, "
      f"all states = {state_mb * (p.nt + 1):.1f} MB")

reference = p.reference_gradient()

revolve = Revolve(p.nt, 8)
g1 = p.gradient_with(revolve)
print(f"Revolve(300, 8): {p.last_run.forward_steps} forward steps, "
      f"max |g - ref| / max |ref| = {np.abs(g1 - reference).max() / np.abs(reference).max():.1e}")

two_level = Multistage(p.nt, [Level(4), Level(40, write_cost=2, read_cost=2)])
with tempfile.TemporaryDirectory() as tmp:
    store = TieredStore([MemoryTier(), ZarrTier(os.path.join(tmp, "ckpt.zarr"))], plan=io_plan(two_level))
    g2 = p.gradient_with(two_level, store=store)
    print(two_level.stats())
    store.close()
print(f"Multistage (4 in memory + zarr): max |g - ref| / max |ref| = "
      f"{np.abs(g2 - reference).max() / np.abs(reference).max():.1e}")
assert np.allclose(g1, reference, rtol=0, atol=1e-12 * np.abs(reference).max())
assert np.allclose(g2, reference, rtol=0, atol=1e-12 * np.abs(reference).max())

fig, ax = plt.subplots(figsize=(4, 3.4))
im = ax.imshow(g2, cmap="seismic", vmin=-np.abs(g2).max(), vmax=np.abs(g2).max())
ax.set_title("dJ/dv (two-level checkpointing)")
fig.colorbar(im, ax=ax)
fig.tight_layout()
fig.savefig(os.path.join(os.environ.get("VLCC_DOCS_FIGURES", "."), "seismic_gradient.png"), dpi=100)
