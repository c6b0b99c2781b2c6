"""Lineage for MPI codes: versions of a distributed state, restarted on another rank count

`History(path, comm=comm)` keeps the history of a domain-decomposed run.
Every rank calls `commit(state)` with its own blocks (the state's
`DistributedArray` leaves) and the values all ranks hold alike (time, step,
parameters); the ranks write their blocks' chunks in parallel into the
repository's deduplicated chunk store, and rank 0 publishes **one** version
whose manifest names every rank's blocks and the decomposition.  The
version becomes visible in one atomic step after every rank's chunks are
written; a rank that fails makes the commit fail on every rank, with the
same error, and nothing is added.  Branches, tags and `gc` are collective
too; `log`, `diff` and `compare` read as in a serial History.

Loading is where the rank count may change: `load(ref, decomposition=d)`
(or `checkout`) on `Q` ranks gives each rank its block of `d`, reading only
the rows of the stored blocks that overlap it, and a serial
`History(path).load(ref)` returns the global numpy arrays.

This page runs `examples/mpi_heat_lineage.py`, a 2-D heat equation with a
halo exchange that commits every 10 steps: 4 ranks to step 40, a restart on
3 ranks from the newest version to step 60, a branch at step 40 with
another diffusivity, and then, serially, the history, a diff of the two
branches and the global field checked bit for bit against one serial run.
The same example suspends on `SIGUSR1`/`SIGTERM` (every rank commits, then
exits with status 0) and resumes on the next launch.

**The node-local tier.**  `History(path, comm=comm, local="/dev/shm")`
makes a commit copy each rank's blocks into node-local storage (a RAM disk
or a local SSD) and return; a background thread on each node's first rank
packs the node's ranks' blocks into **one** file on the shared path (a pack:
chunks concatenated, with a checksummed index), and rank 0 publishes the
version at the next collective call (`commit`, `wait`, `close`, `gc`, a
branch or tag).  One version is in flight at a time: a second `commit`
first finishes the previous one.  A flush's failure is raised by that call
on every rank; a crash leaves only what was published before, each version
readable, and `gc` removes the partial rest.  The run below commits through
`--local` and reads the packed history on 3 ranks and serially, as any
other.  Install with `pip install "vlcc-adjoint[mpi]"`.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from vlcc_adjoint.lineage import History

example = Path(__file__).resolve().parents[2] / "examples" / "mpi_heat_lineage.py"
bindir = os.path.dirname(sys.executable)  # the environment's mpiexec first
mpiexec = shutil.which("mpiexec", path=os.pathsep.join([bindir, os.environ.get("PATH", "")]))
if mpiexec is None:
    sys.exit("no mpiexec found: pip install mpich (or put your MPI's launcher on PATH)")
env = dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")  # ranks share the cores


def launch(n: int, *args: str, where: str | None = None) -> None:
    where = where or path
    name = os.path.basename(where)
    shown = " ".join(os.path.basename(a) if os.path.isabs(a) else a for a in args)
    print(f"$ mpiexec -n {n} python mpi_heat_lineage.py {name} {shown}")
    command = [mpiexec, "-n", str(n), sys.executable, str(example), where, *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    print("".join(line + "\n" for line in proc.stdout.splitlines() if "pid" not in line), end="")
    if proc.returncode != 0:
        sys.exit(f"mpiexec failed (exit {proc.returncode}):\n{proc.stderr}")


spec = importlib.util.spec_from_file_location("mpi_heat_lineage", example)
heat = importlib.util.module_from_spec(spec)
spec.loader.exec_module(heat)

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "heat.vlcc")
    launch(4, "--steps", "40")
    launch(3, "--steps", "60")
    with History(path, mode="r") as h:
        at = next(v.id for v in h.log("main") if v.meta["step"] == 40)
    launch(3, "--branch", "alt", "--at", at, "--kappa", "0.05", "--steps", "60")

    with History(path, mode="r") as h:  # serial: no MPI needed to read
        print(h.draw())
        state = h.load("main")  # the global field, assembled from the 3 ranks' blocks
        print("u:", state["u"].shape, state["u"].dtype, "at step", state["step"])
        same = state["u"].tobytes() == heat.reference(32, 60).tobytes()
        print("bitwise equal to one serial run of 60 steps:", same)
        print("blocks of the newest version:", [leaf.path for leaf in h.leaves("main")][:4])
    print("$ python mpi_heat_lineage.py heat.vlcc --diff main alt")
    heat.diff(path, "main", "alt")

    # The node-local tier: staged in a node-local directory, flushed as packs.
    staged = os.path.join(tmp, "heat-local.vlcc")
    node_local = os.path.join(tmp, "node-local")  # /dev/shm on a cluster node
    launch(4, "--steps", "40", "--local", node_local, where=staged)
    launch(3, "--steps", "60", "--local", node_local, where=staged)
    with History(staged, mode="r") as h:
        packs = os.listdir(os.path.join(staged, "packs"))
        print(
            f"{len(h)} versions, {len(packs)} packs on the shared path (one per node and version)"
        )
        same = h.load("main")["u"].tobytes() == heat.reference(32, 60).tobytes()
        print("bitwise equal to one serial run of 60 steps:", same)
