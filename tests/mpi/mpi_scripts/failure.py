"""A rank fails mid-run; every rank must exit with the error, never hang.

    mpiexec -n 4 python tests/mpi/mpi_scripts/failure.py MODE DIR

Modes:

- ``raise``: rank 2's forward step 30 raises ``ValueError``;
- ``hang``: rank 1's forward step 30 sleeps for ten minutes (a hung rank:
  the others time out after 3 s, then the failed ranks abort the job);
- ``schedule``: rank 1 builds a different schedule (``Revolve(n, 5)``);
- ``write``: the last rank's checkpoint write fails (``ENOSPC``) during
  ``write_checkpoint``.

Each rank that sees an exception prints one line ``rank R: Type: message``
and exits with status 3 (the test reads the lines and the exit status),
after waiting (at most 15 s) for the other ranks to print theirs: the
launcher ends the job at the first non-zero exit.
"""

import errno
import os
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_problem import problem_kwargs  # noqa: E402

from vlcc_adjoint._examples.mpi_seismic import DistributedSeismic  # noqa: E402
from vlcc_adjoint.mpi import (  # noqa: E402
    Decomposition,
    DistributedArray,
    DistributedStore,
    SharedZarrTier,
    run_adjoint,
    write_checkpoint,
)
from vlcc_adjoint.schedules import Revolve, io_plan  # noqa: E402
from vlcc_adjoint.storage import MemoryTier  # noqa: E402


class Faulty(DistributedSeismic):
    def __init__(self, comm, mode, **kw):
        super().__init__(comm, **kw)
        self.mode = mode

    def _fault(self, step):
        if step == 30 and self.mode == "raise" and self.rank == 2:
            raise ValueError("injected failure on rank 2 at step 30")
        if step == 30 and self.mode == "hang" and self.rank == 1:
            time.sleep(600)

    def forward(self, state, step):
        self._fault(step)
        return super().forward(state, step)

    def forward_many(self, state, start, stop):
        for step in range(start, stop):
            state = self.forward(state, step)
        return state


def main():
    mode, out = sys.argv[1], sys.argv[2]
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    try:
        if mode == "write":
            if rank == comm.Get_size() - 1:

                def broken(self, part, record):
                    raise OSError(errno.ENOSPC, "No space left on device (injected)")

                SharedZarrTier._write_part = broken  # the one method that writes a part
            d = Decomposition.split((20, 4), (comm.Get_size(), 1))
            state = {"u": DistributedArray(np.ones(d.local_shape(rank)), d, rank)}
            write_checkpoint(os.path.join(out, "ckpt"), state, comm, step=0, timeout=20)
        else:
            kw = problem_kwargs()
            solver = Faulty(comm, mode, **kw)
            snapshots = 5 if (mode == "schedule" and rank == 1) else 6
            schedule = Revolve(kw["nt"], snapshots)
            tiers = [MemoryTier(), SharedZarrTier(os.path.join(out, "ckpt"), comm, timeout=20)]
            store = DistributedStore(
                comm,
                tiers[:1] if mode == "schedule" else tiers,
                io_plan(schedule),
                timeout=3 if mode == "hang" else 20,
                abort_after=3 if mode == "hang" else 10,
            )
            solver.d_obs  # noqa: B018
            run_adjoint(
                solver,
                schedule,
                solver.initial_state(),
                solver.final_adjoint,
                store=store,
                comm=comm,
            )
    except BaseException as exc:  # noqa: BLE001 - the test reads this line
        msg = str(exc).splitlines()[0] if str(exc) else ""
        print(f"rank {rank}: {type(exc).__name__}: {msg}", flush=True)
        # mpiexec ends the whole job at the first non-zero exit: leave together
        # (for at most 15 s), so that every rank's line is printed.
        req = comm.Ibarrier()
        t0 = time.perf_counter()
        while not req.Test() and time.perf_counter() - t0 < 15:
            time.sleep(0.01)
        sys.exit(3)
    print(f"rank {rank}: finished without error", flush=True)


if __name__ == "__main__":
    main()
