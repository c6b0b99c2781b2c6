"""The seismic FWI gradient on MPI: slabs, halo exchange, one shared checkpoint hierarchy.

    mpiexec -n 4 python examples/mpi_seismic.py                 # 200 x 200, 1000 steps
    mpiexec -n 2 python examples/mpi_seismic.py --nx 120 --nz 120 --nt 400 --check
    NUMBA_NUM_THREADS=1 mpiexec -n 4 python examples/mpi_seismic.py   # ranks sharing cores

The 2-D acoustic problem of ``examples/seismic_fwi.py`` with its rows split
over the ranks as Devito splits them (``numpy.array_split``: blocks may
differ by a row).  Each rank advances its slab with the serial kernels,
exchanging two halo rows with its neighbours by non-blocking
``Isend``/``Irecv`` while it updates the rows that need none; the adjoint
step exchanges the halos of ``a c beta'`` too (the Laplacian is symmetric,
so its transpose is a stencil like the forward one), and the gradient is
the serial one bit for bit.  ``vlcc_adjoint/_examples/mpi_seismic.py`` (the
demo problem, built on :mod:`vlcc_adjoint.mpi` alone) explains both.

The schedule is a two-level ``Multistage``: a few snapshots in each rank's
memory, more on a zarr hierarchy shared by all ranks (``--dir``), written
behind the computation by each rank's store and committed collectively.
Every rank follows the same schedule (checked at the start).  At the end:

- the gradient, gathered on rank 0, against the serial store-everything
  referee (``--check``), printed as ``max |diff| / max |g|``;
- the final wavefield written as a checkpoint by all ranks
  (``write_checkpoint``) and read back on rank 0 alone, serially, as a
  restart on a machine of another size would (``read_checkpoint``).
"""

import shutil
import time

import numpy as np
from mpi4py import MPI

from vlcc_adjoint import Level, Multistage, io_plan, run_adjoint
from vlcc_adjoint._examples.demo import MIN_GRID
from vlcc_adjoint._examples.mpi_seismic import DistributedSeismic
from vlcc_adjoint.cli import Integer, Parser
from vlcc_adjoint.mpi import (
    DistributedArray,
    DistributedStore,
    SharedZarrTier,
    read_checkpoint,
    write_checkpoint,
)
from vlcc_adjoint.storage import MemoryTier


def build_parser() -> Parser:
    parser = Parser(description=__doc__.splitlines()[0])
    side = Integer(MIN_GRID, why="the absorbing layer takes 8 cells on each side")
    parser.add_argument("--nx", type=side, default=200, help="grid points in x")
    parser.add_argument("--nz", type=side, default=200, help="grid points in z")
    parser.add_argument("--nt", type=Integer(1), default=1000, help="time steps")
    parser.add_argument(
        "--memory-slots", type=Integer(1), default=8, help="snapshots in each rank's RAM"
    )
    parser.add_argument(
        "--disk-slots", type=Integer(1), default=24, help="snapshots on the shared hierarchy"
    )
    parser.add_argument(
        "--dir",
        default="mpi_seismic_checkpoints",
        help="the shared zarr hierarchy (a path every rank sees)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare with the serial store-everything gradient on rank 0",
    )
    parser.add_argument("--keep", action="store_true", help="keep the hierarchy afterwards")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    say = print if rank == 0 else (lambda *a, **k: None)

    solver = DistributedSeismic(comm, nx=args.nx, nz=args.nz, nt=args.nt)
    blocks = comm.gather(solver.nl)
    say(f"{solver.problem!r}\n{size} ranks, slabs of {blocks} rows (Devito's split)")
    solver.d_obs  # noqa: B018 - simulate the observed data (a distributed forward run)

    # Costs in units of one forward step: RAM is almost free, the shared file
    # system costs about two steps per snapshot.
    schedule = Multistage(
        args.nt, [Level(args.memory_slots, 0.05, 0.05), Level(args.disk_slots, 2.0, 2.0)]
    )
    stats = schedule.stats()
    say(
        f"schedule: Multistage, {stats.forward_count} forward steps "
        f"({stats.recompute_ratio:.2f} per step), writes per level {stats.writes}"
    )
    tiers = [MemoryTier(), SharedZarrTier(args.dir, comm)]
    store = DistributedStore(comm, tiers, io_plan(schedule))

    solver.reset_gradient()
    t0 = time.perf_counter()
    result = run_adjoint(
        solver, schedule, solver.initial_state(), solver.final_adjoint, store=store, comm=comm
    )
    wall = time.perf_counter() - t0
    r = result.reduced
    say(
        f"gradient in {wall:.2f} s; slowest rank: forward {r.forward_seconds_max:.2f} s, adjoint "
        f"{r.adjoint_seconds_max:.2f} s, waiting for neighbours {r.comm_wait_seconds_max:.2f} s, "
        f"store stall {r.stall_seconds_max:.3f} s, commit {r.commit_seconds_max:.3f} s"
    )
    say(
        f"checkpoint traffic (all ranks): written {[f'{b / 2**20:.1f} MiB' for b in r.bytes_written]}"
        f", read {[f'{b / 2**20:.1f} MiB' for b in r.bytes_read]} per level"
    )

    grad = solver.gather_gradient()
    if rank == 0 and args.check:
        reference = solver.problem.reference_gradient()
        diff = np.abs(grad - reference).max() / np.abs(reference).max()
        print(f"vs the serial store-everything gradient: max |diff| / max |g| = {diff:.3e}")

    # A restart point: u_n written by all ranks, read back by one.
    final = result.final_state
    state = {
        "prev": DistributedArray(final.prev[2:-2], solver.decomposition, rank),
        "curr": DistributedArray(final.curr[2:-2], solver.decomposition, rank),
        "step": args.nt,
    }
    name = write_checkpoint(args.dir, state, comm, step=args.nt)
    if rank == 0:
        back = read_checkpoint(args.dir, name)  # serial: one block, the whole grid
        field = back["curr"].local
        print(
            f"checkpoint {name!r}: written by {size} ranks, read by 1: u_n of shape "
            f"{field.shape}, max |u_n| = {np.abs(field).max():.3e}"
        )
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)
    comm.Barrier()


if __name__ == "__main__":
    main()
