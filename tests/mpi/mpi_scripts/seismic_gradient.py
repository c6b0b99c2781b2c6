"""MPI half of tests/mpi/test_mpi.py: the distributed seismic gradient, written to --out.

    mpiexec -n 4 python tests/mpi/mpi_scripts/seismic_gradient.py --out DIR [--store shared]

Rank 0 writes ``gradient.npy`` (gathered dJ/dv), ``result.json`` (objective,
reduced statistics, the hierarchy's state after the run).  The problem is
the one of ``tests/mpi/test_mpi.py::_problem_kwargs`` (receivers along the
bottom, uneven ``numpy.array_split`` slabs).
"""

import argparse
import json
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_problem import problem_kwargs  # noqa: E402

from vlcc_adjoint import run_adjoint  # noqa: E402
from vlcc_adjoint._examples.mpi_seismic import DistributedSeismic  # noqa: E402
from vlcc_adjoint.mpi import DistributedStore, SharedZarrTier, list_checkpoints  # noqa: E402
from vlcc_adjoint.schedules import Level, Multistage, Revolve, io_plan  # noqa: E402
from vlcc_adjoint.storage import MemoryTier  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--store", choices=["memory", "shared"], default="shared")
    ap.add_argument("--commit-every", type=int, default=None)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    kw = problem_kwargs()
    solver = DistributedSeismic(comm, **kw)
    solver.d_obs  # noqa: B018
    if args.store == "memory":
        schedule = Revolve(kw["nt"], 6)
        store = None
    else:
        schedule = Multistage(kw["nt"], [Level(3, 0.1, 0.1), Level(6, 1.0, 1.0)])
        tiers = [MemoryTier(), SharedZarrTier(os.path.join(args.out, "ckpt"), comm)]
        store = DistributedStore(
            comm, tiers, io_plan(schedule), timeout=120, commit_every=args.commit_every
        )
    solver.reset_gradient()
    result = run_adjoint(
        solver, schedule, solver.initial_state(), solver.final_adjoint, store=store, comm=comm
    )
    grad = solver.gather_gradient()
    objective = solver.objective()
    if comm.rank == 0:
        np.save(os.path.join(args.out, "gradient.npy"), grad)
        r = result.reduced
        doc = {
            "objective": objective,
            "nranks": r.nranks,
            "stall_max": r.stall_seconds_max,
            "bytes_written": list(r.bytes_written),
            "bytes_read": list(r.bytes_read),
            "records_committed": r.records_committed,
            "schedule_writes": list(result.schedule_stats.writes),
        }
        if args.store == "shared":
            ckpt = os.path.join(args.out, "ckpt")
            doc["left"] = list_checkpoints(ckpt)
            doc["pending"] = sorted(os.listdir(os.path.join(ckpt, ".vlcc-pending")))
        with open(os.path.join(args.out, "result.json"), "w") as f:
            json.dump(doc, f)


if __name__ == "__main__":
    main()
