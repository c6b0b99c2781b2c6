"""The halo exchange's adjoint is its transpose: a dot-product test on a 2-D grid.

    mpiexec -n 4 python tests/mpi/mpi_scripts/halo_dot.py

For random interiors x (halos zero) and random padded arrays y on every
rank, ``sum_p <E(x)_p, y_p> == sum_p <x_p, A(y)_p>`` with E the exchange and
A = accumulate.  Uneven blocks, different widths per axis, float64 and
complex128.  Prints one JSON line on rank 0; exits non-zero on failure.
"""

import json
import sys

import numpy as np
from mpi4py import MPI

from vlcc_adjoint.mpi import Decomposition, HaloExchange


def main():
    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    dims = MPI.Compute_dims(size, 2)
    d = Decomposition.split((23, 17), dims)
    halo = HaloExchange(comm, d, (2, 1))
    rng = np.random.default_rng(rank)
    out = {}
    for dtype in (np.float64, np.complex128):
        x = halo.empty(dtype)
        y = rng.standard_normal(halo.padded_shape).astype(dtype)
        if dtype is np.complex128:
            y = y + 1j * rng.standard_normal(halo.padded_shape)
        halo.interior(x)[...] = rng.standard_normal(halo.shape)
        ex = halo.exchange(x.copy())
        ay = halo.accumulate(y.copy())
        lhs = comm.allreduce(np.vdot(y, ex))
        rhs = comm.allreduce(np.vdot(ay, x))
        scale = comm.allreduce(float(np.abs(y).sum() * np.abs(x).max()), op=MPI.MAX)
        err = abs(lhs - rhs) / scale
        # the exchange copies exact values: the halo rows of ex equal the owners' rows
        out[np.dtype(dtype).name] = {"lhs": str(lhs), "rhs": str(rhs), "rel": err}
        if err > 1e-13:
            print(json.dumps(out), file=sys.stderr)
            sys.exit(1)
        # accumulate left every halo zero
        inner = halo.interior(ay).copy()
        ay2 = ay.copy()
        halo.interior(ay2)[...] = 0
        assert not ay2.any(), "accumulate must zero the halos"
        del inner
    if rank == 0:
        print(json.dumps({"dims": list(dims), "checks": out}))


if __name__ == "__main__":
    main()
