"""Write a checkpoint on P ranks, read it back on Q ranks (tests/mpi/test_mpi.py).

    mpiexec -n 4 python tests/mpi/mpi_scripts/checkpoint_io.py write PATH
    mpiexec -n 2 python tests/mpi/mpi_scripts/checkpoint_io.py read PATH NAME

The state mixes the three layouts the hierarchy handles: a 2-D array in
uneven ``numpy.array_split`` slabs (stored after moving to the aligned
layout), a 3-D float32 array in aligned blocks (stored as is, gcd chunks),
a complex array on a 2-D process grid with uneven blocks on both axes, and
replicated values.  Every rank checks its block against the global
function that made it.
"""

import json
import sys

import numpy as np
from mpi4py import MPI

from vlcc_adjoint.mpi import Decomposition, DistributedArray, read_checkpoint, write_checkpoint


def expected():
    u = np.add.outer(np.arange(50) * 1000.0, np.arange(7))
    v = np.arange(40 * 6 * 5, dtype=np.float32).reshape(40, 6, 5)
    c = np.add.outer(np.arange(9.0), 1j * np.arange(10.0))
    return {"u": u, "v": v, "c": c}


def decompositions(size):
    return {
        "u": Decomposition.split((50, 7), (size, 1)),
        "v": Decomposition.aligned((40, 6, 5), (size, 1, 1), multiple=2),
        "c": Decomposition.split((9, 10), MPI.Compute_dims(size, 2)),
    }


def main():
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    mode, path = sys.argv[1], sys.argv[2]
    glob = expected()
    if mode == "write":
        ds = decompositions(size)
        state = {
            k: DistributedArray(np.ascontiguousarray(glob[k][ds[k].slices(rank)]), ds[k], rank)
            for k in ds
        }
        state["t"] = 0.25
        state["meta"] = {"levels": np.arange(5, dtype=np.int16), "name": "wave"}
        name = write_checkpoint(path, state, comm, step=7)
        if rank == 0:
            print(json.dumps({"name": name}))
        return
    name = sys.argv[3]
    state = read_checkpoint(path, name, comm=comm)
    for k, arr in glob.items():
        d = state[k]
        assert isinstance(d, DistributedArray), type(d)
        assert d.decomposition.nranks == size and d.rank == rank
        assert d.local.dtype == arr.dtype, (k, d.local.dtype)
        np.testing.assert_array_equal(d.local, arr[d.slices])
    assert state["t"] == 0.25 and state["meta"]["name"] == "wave"
    np.testing.assert_array_equal(state["meta"]["levels"], np.arange(5, dtype=np.int16))
    # a reader's own decomposition, 2-D this time
    dims = MPI.Compute_dims(size, 2)
    mine = read_checkpoint(
        path,
        name,
        comm=comm,
        decomposition=lambda shape: Decomposition.split(shape, dims + [1] * (len(shape) - 2)),
    )
    for k, arr in glob.items():
        np.testing.assert_array_equal(mine[k].local, arr[mine[k].slices])
    ok = comm.allreduce(1)
    if rank == 0:
        print(json.dumps({"verified_ranks": ok}))


if __name__ == "__main__":
    main()
