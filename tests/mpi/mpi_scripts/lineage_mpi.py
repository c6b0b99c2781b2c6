"""Versions of a distributed state: commit on P ranks, load on Q (tests/mpi/test_lineage_mpi.py).

    mpiexec -n 4 python tests/mpi/mpi_scripts/lineage_mpi.py commit PATH [deltas]
    mpiexec -n 3 python tests/mpi/mpi_scripts/lineage_mpi.py load PATH
    mpiexec -n 2 python tests/mpi/mpi_scripts/lineage_mpi.py fail PATH
    mpiexec -n 4 python tests/mpi/mpi_scripts/lineage_mpi.py commit PATH local=DIR
    mpiexec -n 3 python tests/mpi/mpi_scripts/lineage_mpi.py crash PATH local=DIR
    mpiexec -n 2 python tests/mpi/mpi_scripts/lineage_mpi.py newest PATH

``commit`` writes three versions (``main``: v1, v2 where only rows 0..4 of
``u`` changed; ``alt``: v3 from v1 with another parameter), tags v1, and
prints the ids and the bytes each commit wrote.  ``load`` reads every
version on this many ranks (the default decomposition and a 2-D one) and
checks each block against the global functions below, bit for bit.
``fail`` makes one rank's commit fail and checks that every rank raises and
that no version was added.  ``local=DIR`` commits through the node-local
tier (staged in ``DIR``, flushed as packs); ``two-nodes`` makes the tier
see the ranks as two nodes (two flush threads, two packs per version).  ``crash`` commits v1 through the
node-local tier and waits for it, commits v2 and then the last rank kills
itself (SIGKILL) while v2 is being flushed: the others write the error their
``wait`` raised to ``PATH.crash<rank>.json`` and exit.  ``newest`` loads the newest
version on this many ranks and checks it is v1.  Each rank prints one JSON
line.
"""

import json
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

from vlcc_adjoint.lineage import History
from vlcc_adjoint.mpi import AgreedError, Decomposition, DistributedArray


def fields(version: str) -> dict:
    """The global arrays of each version."""
    u = np.add.outer(np.arange(50) * 1000.0, np.arange(7))
    c = np.add.outer(np.arange(9.0), 1j * np.arange(10.0))
    if version == "v2":
        u[:5] += 1.0
    if version == "v3":
        c = c * 2
    return {"u": u, "c": c}


def params(version: str) -> dict:
    return {"kappa": 0.5 if version == "v3" else 0.25, "levels": np.arange(5, dtype=np.int16)}


def state_of(version: str, comm) -> dict:
    rank, size = comm.Get_rank(), comm.Get_size()
    ds = {
        "u": Decomposition.split((50, 7), (size, 1)),
        "c": Decomposition.split((9, 10), MPI.Compute_dims(size, 2)),
    }
    glob = fields(version)
    out = {
        k: DistributedArray(np.ascontiguousarray(glob[k][d.slices(rank)]), d, rank)
        for k, d in ds.items()
    }
    return {**out, "t": {"v1": 1.0, "v2": 2.0, "v3": 1.5}[version], "params": params(version)}


def check(state: dict, version: str, comm, decomposition=None) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    glob = fields(version)
    for k, arr in glob.items():
        d = state[k]
        assert isinstance(d, DistributedArray), (k, type(d))
        assert d.rank == rank and d.decomposition.nranks == size, d
        if decomposition is not None:
            assert d.decomposition == decomposition(arr.shape), d.decomposition
        want = arr[d.slices]
        assert d.local.dtype == want.dtype and d.local.tobytes() == want.tobytes(), (k, version)
    assert state["t"] == {"v1": 1.0, "v2": 2.0, "v3": 1.5}[version]
    assert state["params"]["kappa"] == params(version)["kappa"]
    np.testing.assert_array_equal(state["params"]["levels"], np.arange(5, dtype=np.int16))


def main() -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    mode, path = sys.argv[1], sys.argv[2]
    deltas = "deltas" in sys.argv[3:]
    local = next((a[len("local=") :] for a in sys.argv[3:] if a.startswith("local=")), None)
    local_comm = None
    if "two-nodes" in sys.argv[3:]:  # ranks 0-1 and 2-3 stage as two nodes
        local_comm = comm.Split(rank * 2 // size, 0)
    if mode == "crash":
        crash(path, local, comm)
        return
    with History(
        path,
        comm=comm,
        deltas=deltas or None,
        chunk_bytes=256,
        timeout=60,
        local=local,
        local_comm=local_comm,
    ) as h:
        if mode == "commit":
            ids, written = {}, {}
            for version, kw in (
                ("v1", {}),
                ("v2", {}),
                ("v3", {"branch": "alt"}),
            ):
                if version == "v3":
                    h.branch("alt", at=ids["v1"])
                before = h.stats.get("new_bytes", 0)
                ids[version] = h.commit(state_of(version, comm), message=version, **kw)
                written[version] = int(comm.allreduce(h.stats.get("new_bytes", 0) - before))
            tag = h.tag("first", ids["v1"])
            assert tag == ids["v1"] and h.head == "alt"
            same = comm.allgather(ids)
            assert all(x == ids for x in same), same
            log = [v.id for v in h.log("main")]
            assert log == [ids["v2"], ids["v1"]], log
            out = {"rank": rank, "ids": ids, "written": written}
        elif mode == "load":
            ids = {v.message: v.id for v in h.log(all=True)}
            for version, vid in ids.items():
                check(h.load(vid), version, comm)
                grid = MPI.Compute_dims(size, 2)
                check(
                    h.load(vid, decomposition=lambda s: Decomposition.split(s, grid)),
                    version,
                    comm,
                    lambda s: Decomposition.split(s, grid),
                )
            check(h.checkout("alt"), "v3", comm)
            check(h.checkout("first"), "v1", comm)
            assert h.head is None
            out = {"rank": rank, "verified": sorted(ids)}
        elif mode == "newest":
            newest = h.log()[0]
            assert newest.message == "v1", newest.message
            check(h.load(newest.id), "v1", comm)
            out = {"rank": rank, "newest": newest.message, "versions": len(h)}
        elif mode == "fail":
            before = len(h)
            state = state_of("v1", comm)
            if rank == size - 1:
                state["bad"] = object()  # not a state: flatten raises on this rank only
            try:
                h.commit(state, message="never")
            except AgreedError as err:
                failed = str(err)
            else:
                raise AssertionError("the commit did not fail")
            assert len(h) == before and "never" not in [v.message for v in h.log(all=True)]
            # a state whose blocks belong to another communicator size is refused too
            try:
                h.commit(
                    {
                        "u": DistributedArray(
                            np.zeros(3), Decomposition.split((3 * (size + 1),), size + 1), rank
                        )
                    }
                )
            except AgreedError as err:
                other = str(err)
            else:
                raise AssertionError("a block of another decomposition was committed")
            out = {"rank": rank, "failed": failed, "other": other, "versions": len(h)}
        else:
            raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(out), flush=True)


def crash(path: str, local: str | None, comm) -> None:
    """v1 committed and flushed, v2 committed; the last rank dies during v2's flush."""
    rank, size = comm.Get_rank(), comm.Get_size()
    h = History(path, comm=comm, chunk_bytes=256, timeout=15, local=local)
    h.commit(state_of("v1", comm), message="v1")
    h.wait()
    h.commit(state_of("v2", comm), message="v2")
    if rank == size - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        h.wait()
    except Exception as err:  # the error every survivor reports
        out = {
            "rank": rank,
            "error": f"{type(err).__name__}: {err}",
            "after": time.monotonic() - t0,
        }
        # a file, not stdout: mpiexec may drop the output of a job that lost a rank
        with open(f"{path}.crash{rank}.json", "w") as f:
            json.dump(out, f)
        os._exit(3)  # a rank is gone: no collective clean-up, no MPI_Finalize
    raise AssertionError("wait() returned although a rank was killed")


if __name__ == "__main__":
    main()
