"""MPI: one schedule on every rank, launched with mpiexec

Under MPI every rank runs the same schedule on its own block of the domain;
`run_adjoint(..., comm=comm)` checks that the ranks agree on the schedule,
runs, and reduces the statistics.  The solver exchanges halo cells with its
neighbours (`HaloExchange`), and the state is a `DistributedArray` (a rank's
block and its place in the global array), so a `DistributedStore` can
persist all ranks' snapshots to **one** zarr hierarchy (`SharedZarrTier`),
each rank writing its own chunks.  `write_checkpoint` / `read_checkpoint`
write a restart point on `P` ranks and read it on any number of ranks, here
on one.

The script `heat_adjoint.py` (shown first) is a 1-D reaction-diffusion
equation, `u_{i+1} = u_i + A L u_i - DT u_i^3`, with `J = |u_n|^2 / 2`; its adjoint
step uses the same halo exchange, since the stencil `L` is symmetric.  This
page's script launches it with `mpiexec -n 2` and shows what it printed;
rank 0 checks the gathered gradient against the same loop run serially on
the whole grid with every state kept.  Install with
`pip install "vlcc-adjoint[mpi]"` (mpi4py and an MPICH wheel, whose
`mpiexec` lands in the environment's `bin`).
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

script = Path(__file__).resolve().parent / "07_mpi" / "heat_adjoint.py"
bindir = os.path.dirname(sys.executable)  # the environment's mpiexec first
mpiexec = shutil.which("mpiexec", path=os.pathsep.join([bindir, os.environ.get("PATH", "")]))
if mpiexec is None:
    sys.exit("no mpiexec found: pip install mpich (or put your MPI's launcher on PATH)")
env = dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")  # ranks share the cores

with tempfile.TemporaryDirectory() as tmp:
    command = [mpiexec, "-n", "2", sys.executable, str(script), tmp]
    print("$ mpiexec -n 2 python heat_adjoint.py $TMPDIR")
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    print(proc.stdout, end="")
    if proc.returncode != 0:
        sys.exit(f"mpiexec failed (exit {proc.returncode}):\n{proc.stderr}")
