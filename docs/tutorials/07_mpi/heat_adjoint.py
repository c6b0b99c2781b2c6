"""A 1-D reaction-diffusion adjoint on MPI ranks (run with mpiexec -n P)."""

import os
import sys

import numpy as np
from mpi4py import MPI

from vlcc_adjoint import Level, Multistage, io_plan, run_adjoint
from vlcc_adjoint.mpi import (
    Decomposition,
    DistributedArray,
    DistributedStore,
    HaloExchange,
    SharedZarrTier,
    read_checkpoint,
    write_checkpoint,
)
from vlcc_adjoint.storage import MemoryTier

N, STEPS, A, DT = 96, 400, 0.2, 0.05  # grid points, time steps, diffusion number, dt
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
decomp = Decomposition.split((N,), comm.Get_size())  # numpy.array_split's blocks
halo = HaloExchange(comm, decomp, 1)  # one ghost cell each side


def laplacian(block):
    """L block: the 3-point stencil, zero outside the global domain (symmetric)."""
    padded = halo.empty()
    halo.interior(padded)[...] = block
    halo.exchange(padded)  # ghost cells from the neighbours
    return padded[:-2] - 2 * padded[1:-1] + padded[2:]


class Heat:
    """u_{i+1} = u_i + A L u_i - DT u_i^3 on this rank's block."""

    def forward(self, state, step):
        u = state.local
        return DistributedArray(u + A * laplacian(u) - DT * u**3, decomp, rank)

    def adjoint(self, state, lam, step):
        # lambda_i = (I + A L - 3 DT diag(u_i^2))^T lambda_{i+1}; L^T = L
        return lam + A * laplacian(lam) - 3 * DT * state.local**2 * lam


x = np.linspace(0.0, 1.0, N)[decomp.slices(rank)]
u0 = DistributedArray(np.sin(np.pi * x) + 0.5 * np.sin(7 * np.pi * x), decomp, rank)
path = sys.argv[1]  # a directory every rank sees

# 4 snapshots in each rank's memory, 8 more on one zarr hierarchy shared by all ranks.
schedule = Multistage(STEPS, [Level(4, 0.05, 0.05), Level(8, 2.0, 2.0)])
store = DistributedStore(
    comm, [MemoryTier(), SharedZarrTier(os.path.join(path, "run"), comm)], io_plan(schedule)
)
result = run_adjoint(
    Heat(),
    schedule,
    u0,
    lambda u: u.local.copy(),  # J = |u_n|^2 / 2
    store=store,
    comm=comm,
)
grad = DistributedArray(result.adjoint, decomp, rank).gather(comm)  # dJ/du_0 on rank 0
r = result.reduced
if rank == 0:
    print(
        f"{r.nranks} ranks, blocks of {[decomp.local_shape(q)[0] for q in range(r.nranks)]} points"
    )
    print(
        f"{result.schedule_stats.forward_count} forward steps for {STEPS}; "
        f"writes per level {list(result.schedule_stats.writes)}"
    )
    print(f"bytes written per level, all ranks: {list(r.bytes_written)}")

# A restart point: u_n written by every rank into the shared hierarchy ...
name = write_checkpoint(
    os.path.join(path, "restart"), {"u": result.final_state, "step": STEPS}, comm, step=STEPS
)
if rank == 0:
    # ... read back by one process, serially, as a restart on another machine would.
    back = read_checkpoint(os.path.join(path, "restart"), name)
    print(f"checkpoint {name!r}: u_n of global shape {back['u'].local.shape}, step {back['step']}")

    # The referee: the same loop on the whole grid in one process, every state kept.
    def lap(u):
        p = np.pad(u, 1)
        return p[:-2] - 2 * p[1:-1] + p[2:]

    us = [np.sin(np.pi * np.linspace(0, 1, N)) + 0.5 * np.sin(7 * np.pi * np.linspace(0, 1, N))]
    for i in range(STEPS):
        us.append(us[-1] + A * lap(us[-1]) - DT * us[-1] ** 3)
    lam = us[-1].copy()
    for i in reversed(range(STEPS)):
        lam = lam + A * lap(lam) - 3 * DT * us[i] ** 2 * lam
    np.testing.assert_array_equal(back["u"].local, us[-1])
    err = np.abs(grad - lam).max() / np.abs(lam).max()
    print(f"vs the serial store-everything gradient: max |diff| / max |g| = {err:.1e}")
    assert err < 1e-12, err
