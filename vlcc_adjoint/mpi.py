"""SPMD adjoints on MPI: every rank runs the same schedule on its partition.

Seismic and CFD adjoints run domain-decomposed over many nodes.  Under
MPI, vlcc-adjoint keeps its serial design (a schedule is a table; one
interpreter; an asynchronous store per process) and adds what only the
ranks together can do:

- **Distributed state**: :class:`Decomposition` (a block partition of a
  global array over a process grid; blocks may differ in size, as in
  Devito's) and :class:`DistributedArray` (a rank's block and its place in
  the global array), a state provider that composes with all the others.
- **Halo exchange and its adjoint**: :class:`HaloExchange` (non-blocking
  ``Isend``/``Irecv``); ``accumulate`` is the transpose of the halo copy,
  the piece a hand-written distributed adjoint gets wrong most often.
- **Storage**: :class:`DistributedStore` runs a
  :class:`~vlcc_adjoint.storage.TieredStore` per rank (its own memory
  tiers, caches, prefetch and eviction) and persists to **one** zarr v3
  hierarchy shared by all ranks through :class:`SharedZarrTier`: each rank
  writes only its own chunks, the chunk grid is aligned to the
  decomposition, rank 0 alone writes metadata, and a checkpoint counts as
  persisted only after a collective commit.  :func:`read_checkpoint`
  restores a record written by ``P`` ranks on any ``Q`` ranks or serially;
  plain ``zarr.open_group`` reads every distributed leaf as one global array.
- **Execution**: :func:`run_adjoint` (also reached as
  ``vlcc_adjoint.run_adjoint(..., comm=comm)``: importing this module
  registers it with the executor, :func:`vlcc_adjoint.execute.register_spmd`) checks that every rank holds
  the same schedule (an xxh3 hash, all-gathered), runs, commits, and
  reduces the statistics (:class:`ReducedStats`: the slowest rank's stall,
  total bytes).
- **No hangs**: every wait has a deadline and watches an error channel
  (:class:`Guard`); a rank that raises makes every rank raise
  (:class:`RankFailedError` naming it, or the same :class:`AgreedError`),
  with ``MPI_Abort`` as the last resort.

Install and launch
------------------

``pip install "vlcc-adjoint[mpi]"`` installs ``mpi4py`` and the ``mpich``
wheel (an MPI library from PyPI, with its launcher in the environment's
``bin``)::

    . .venv/bin/activate
    mpiexec -n 4 python examples/mpi_seismic.py

MPICH oversubscribes by default (more ranks than cores runs, slowly);
set ``NUMBA_NUM_THREADS=1`` and ``OMP_NUM_THREADS=1`` when ranks share
cores.  On a cluster, use the site's MPI instead of the wheel, so that
ranks talk over its interconnect: ``pip uninstall mpich`` and build
``mpi4py`` against the system library (``module load cray-mpich``, then
``MPICC=mpicc pip install --no-binary=mpi4py mpi4py``), or, for an
MPICH-ABI system MPI (Cray MPICH, Intel MPI, MVAPICH), keep the wheel's
mpi4py and point it at the site library at run time; then launch with
the site launcher (``srun``, ``mpiexec``).  ``mpi4py.MPI.Get_library_version()``
shows which library a run uses.

Nothing here imports mpi4py until it is needed: decompositions,
distributed arrays and :func:`read_checkpoint` work in a serial process.

References: Griewank & Walther (2000), "Algorithm 799: Revolve", ACM TOMS
26(1) (the schedules, unchanged under SPMD); Thakur, Gropp & Lusk (1999),
"Data sieving and collective I/O in ROMIO" (aligning writers to file
layout); Bland et al. (2013), ULFM, IJHPCA 27(3) (failure propagation).
"""

from ._mpi._comm import AgreedError as AgreedError
from ._mpi._comm import CollectiveTimeoutError as CollectiveTimeoutError
from ._mpi._comm import Guard as Guard
from ._mpi._comm import RankFailedError as RankFailedError
from ._mpi._comm import active_guard as active_guard
from ._mpi._comm import box_intersection as box_intersection
from ._mpi._comm import ensure_initialized as ensure_initialized
from ._mpi._comm import split_by_node as split_by_node
from ._mpi._decomp import Decomposition as Decomposition
from ._mpi._decomp import DistributedArray as DistributedArray
from ._mpi._decomp import reader_decomposition as reader_decomposition
from ._mpi._decomp import storage_layout as storage_layout
from ._mpi._halo import HaloExchange as HaloExchange
from ._mpi._run import DistributedAdjointResult as DistributedAdjointResult
from ._mpi._run import ReducedStats as ReducedStats
from ._mpi._run import ScheduleMismatchError as ScheduleMismatchError
from ._mpi._run import run_adjoint as run_adjoint
from ._mpi._run import schedule_fingerprint as schedule_fingerprint
from ._mpi._store import DistributedStore as DistributedStore
from ._mpi._store import write_checkpoint as write_checkpoint
from ._mpi._zarr import SharedZarrTier as SharedZarrTier
from ._mpi._zarr import list_checkpoints as list_checkpoints
from ._mpi._zarr import read_checkpoint as read_checkpoint

__all__ = [
    "AgreedError",
    "CollectiveTimeoutError",
    "Decomposition",
    "DistributedAdjointResult",
    "DistributedArray",
    "DistributedStore",
    "Guard",
    "HaloExchange",
    "RankFailedError",
    "ReducedStats",
    "ScheduleMismatchError",
    "SharedZarrTier",
    "active_guard",
    "box_intersection",
    "ensure_initialized",
    "list_checkpoints",
    "read_checkpoint",
    "reader_decomposition",
    "run_adjoint",
    "schedule_fingerprint",
    "split_by_node",
    "storage_layout",
    "write_checkpoint",
]
