"""Versioned lineage: a branching, persistent history of checkpoint versions.

Checkpoints serve more than adjoints.  A long run restarts after a failure,
is suspended and resumed, migrates to another machine, is replayed to debug
a window of steps, is compared with a repeated run; a training run
backtracks to an earlier checkpoint and branches to try something else.
:class:`History` keeps all of that in one repository with git's vocabulary::

    from vlcc_adjoint.lineage import History, KeepPolicy

    with History("run.vlcc") as h:
        for step in range(n):
            state = advance(state)
            if step % 100 == 0:
                h.commit(state, message=f"step {step}", meta={"step": step, "loss": loss})
        good = h.log()[3].id                    # newest first
        h.branch("lr-small", at=good)
        state = h.checkout("lr-small")          # HEAD now on lr-small
        ...
        print(h.draw())                         # like git log --graph --oneline --all
        h.compare("main", "lr-small", rtol=1e-6).first_leaf
        h.gc(keep=KeepPolicy(last=3, tagged=True, best=("loss", "min")))

Git semantics where git has them: ``commit`` appends to the current branch
(``main`` at first, then the branch last checked out); ``checkout`` of a
branch moves HEAD there, of a version or tag detaches it (``commit`` then
needs ``branch=``); refs are branches, tags, ids, unique id prefixes and
``ref~n``; ``log`` is newest first.  Where a checkpoint history needs other
rules: commits are asynchronous (``commit`` returns once the state is owned;
a version becomes visible once it is complete on disk), several processes
may commit at once (to one branch, their versions are appended in the order
they become visible), and ``gc`` deletes versions by a retention policy,
splicing them out of the graph.

On disk (one zarr v3 hierarchy; JSON and raw chunk bytes, never pickle)
-----------------------------------------------------------------------

::

    path/zarr.json                  root group    {"vlcc_lineage": {"format": 2, "kind": "history"}}
    path/graph/zarr.json            group; its attributes hold the version DAG (networkx
                                    node-link JSON), branches, tags, HEAD
    path/versions/<id>/zarr.json    group per version: the manifest (parents, branch, message,
                                    meta, created, the state spec, per leaf: dtype, shape,
                                    chunk shape, codec, chunk addresses)
    path/versions/<id>/<i>/zarr.json  leaf i as a zarr v3 array (regular chunk grid)
    path/versions/<id>/<i>/c.3.0    its chunk files: *hard links* to ...
    path/chunks/ab/cdef...          ... the content-addressed chunk files (xxh3-128 address)
    path/packs/<32 hex>.pack        packs: many chunks in one file, with a checksummed index
                                    (written by the node-local tier; absent otherwise)
    path/locks/, path/scratch/      lock files; commits in flight (never versions)

**Deduplication and zarr readability together.**  Each leaf is cut into
chunks of about ``chunk_bytes`` (1 MiB) along its leading axes (row bands;
see :mod:`vlcc_adjoint._lineage._format`), and each chunk is stored once, under
its content address, in ``chunks/``.  A version is also an ordinary zarr
group whose arrays hold *hard links* to those files at the chunk keys zarr
expects: the same inode, no extra bytes, and ``zarr.open_group(path,
mode="r")["versions/<id>/0"][...]`` reads a leaf with plain zarr.  Ten
versions of a model whose embedding table never changed store it once
(plus one directory entry per chunk per version).  Where the file system
refuses hard links, the version's chunk files are copies (readable, not
deduplicated there; ``chunks/`` stays deduplicated).  Sharding (zarr's
``sharding_indexed``) was the alternative: it puts a leaf's chunks in one
file per shard, so a shared chunk cannot be shared across versions.

**Packs (the node-local tier).**  ``History(path, comm=comm, local=dir)``
stages commits on node-local storage and flushes each version as one pack
per node (:mod:`vlcc_adjoint._lineage._local`, :mod:`vlcc_adjoint._lineage._packs`).
Such a *packed version* has no zarr view (its group holds the manifest only);
``History`` reads it like any other, deduplication works across loose chunks
and packs, and ``export`` writes it as a plain zarr version again.  Every other
commit keeps loose chunk files and the zarr view described above.

**Delta chunks (opt-in).**  ``History(path, deltas=True)`` (recorded in the
root as ``"deltas": true``, so every process then writes them) stores a
changed chunk as the byte-shuffled, LZ4-compressed XOR with the parent
version's chunk at the same place, when that is at most 3/4 of a chunk:
a version that rewrites 5 % of a state in regions smaller than a chunk
costs about those 5 %, not every touched chunk again.  Chains are bounded
(32 deltas, two chunks' bytes; then a full chunk), a read resolves and
verifies them, and ``gc`` and ``export`` keep every base a kept delta needs
(:mod:`vlcc_adjoint._lineage._delta`).  The trade: a version holding a delta
chunk is readable through ``History`` only, not by plain zarr; without
``deltas`` (the default) every chunk is full and plain zarr reads it.

Leaves of zarr's core dtypes are arrays of their own dtype (byte order in
the ``bytes`` codec); others (datetime, strings, structured, bfloat16) are
``uint8`` arrays with a trailing axis of the item size, their real dtype in
the array's attributes, as in :class:`~vlcc_adjoint.storage.ZarrTier`.

**Integrity.**  A chunk's address is xxh3-128 of its raw bytes (and the
codec, when compressed); every read re-hashes what it read and raises
:class:`~vlcc_adjoint.storage.CorruptCheckpointError` naming the version,
the leaf's path in the state and the file.  Every metadata document a read
depends on is sealed (format 2; :func:`vlcc_adjoint.storage.format.seal`): a
version's manifest carries the digest of its whole description (spec,
names, scalars, the leaf-to-name mapping, dtypes, shapes, chunk addresses,
codec configuration, parents, branch, message, meta), the graph records
that digest again and is itself sealed, and so is the root.  Any damaged
byte raises ``CorruptCheckpointError`` naming the file (``.path``), or
leaves the data returned bit-identical; a damaged version is reported as
damaged, never silently dropped.  Manifests are then validated before use
(dtypes from an allow-list, shapes and chunk grids consistent, parents
known, the graph acyclic); a type named in a state spec is rebuilt only if
the reading process registered it.  Reading never executes or imports
anything.  Repositories written in format 1 (before seals) are still read,
and new versions added to them are sealed.

**Crafted repositories.**  Files are opened only through
:mod:`vlcc_adjoint.storage.format`: regular files, never through a symbolic
link (the top-level directories and the chunk directories are checked to be
real directories), never blocking on a FIFO; metadata reads are bounded,
chunk files must have their declared size, decompression never produces
more than the declared bytes, and a load checks the total it would allocate
against the memory the process may use before allocating anything.  Nothing
outside the repository's root is ever read, written or deleted.

**Crash safety and concurrency.**  A version's chunks and group are written
in ``scratch/``; the group is renamed into ``versions/`` and the graph file
replaced (``os.replace``) under an ``flock`` on ``locks/graph.lock``, in
that order, so a version is visible exactly when it is complete, and
concurrent commits from several processes never lose each other's updates.
``gc`` and commits in flight exclude each other through a readers-writer
lock (``locks/gc.lock``), so gc never deletes a chunk a commit is about to
use.  A process killed mid-commit leaves only scratch debris; the
repository opens as it was, and the next writer that opens it (or ``gc``)
sweeps it.  Moving or copying the directory (``cp -r``, ``rsync -H``,
``vlcc export``/``vlcc import``) moves the repository: nothing in it names an
absolute path.

**Verification.**  Damage is otherwise found when a version is read.
``History.verify()`` (``vlcc verify PATH``, like ``git fsck``) reads and
checks every byte a read depends on, now: the root, the graph, every
manifest, every chunk of every version (delta chunks with their bases) and
the files plain zarr reads, and names every damaged file with the versions
it breaks (:class:`Verification`).  ``export`` verifies what it archives
and ``import`` what it unpacks: a damaged file is refused by name, and
nothing half-imported stays.

**Versions written by several processes.**  ``History.stage(arrays)`` writes
the chunks of one process's arrays (nothing visible yet) and returns small
JSON leaf entries; one process then publishes every process's entries as
one version with ``History.commit_staged(spec, entries, ...)``, atomically,
or not at all (staged chunks that no version uses are swept by ``gc``).
``History.read_leaf(ref, i, rows=...)`` reads one leaf, or a range of its
rows, without the rest of the version.  The ``torch.distributed.checkpoint``
backend (:mod:`vlcc_adjoint.torch.dcp`) is built on these
(:mod:`vlcc_adjoint._lineage._parts`).

**Versions of MPI codes.**  ``History(path, comm=comm)`` (every rank
opens it) commits a state holding
:class:`~vlcc_adjoint.mpi.DistributedArray` leaves collectively::

    with History("run.vlcc", comm=MPI.COMM_WORLD) as h:
        state = {"u": DistributedArray(u_block, decomposition, rank), "step": 0}
        vid = h.commit(state, message="step 0")        # the same id on every rank
        ...
    # later, on any number of ranks, any block layout:
    state = h.checkout("main", decomposition=Decomposition.split(shape, (size, 1)))
    # or serially: History("run.vlcc").load("main")["u"] is the global array

Each rank stages its blocks through the chunk store (deduplicated, deltas
per block), rank 0 publishes one version whose spec names every rank's
block and the decomposition (``commit_staged``, all or nothing); a failing
rank fails the commit on every rank with the same
:class:`~vlcc_adjoint.mpi.AgreedError`, and nothing is added.  ``branch``,
``tag`` and ``gc`` are collective; reads are local.  See
:mod:`vlcc_adjoint._lineage._ranks` and ``examples/mpi_heat_lineage.py``
(restart on another rank count, suspend on a signal, branch and diff).

Costs: a commit blocks the caller for a hash of the state plus a copy of its
new chunks; space grows with the chunks that change, not with the versions;
the graph file is rewritten whole at every publication (a few hundred bytes
per version: prune very long histories with ``gc``).  Measurements against
``np.save`` and ``torch.save`` are in ``benchmarks/bench_lineage.py`` and
``benchmarks/results/bench_lineage.json``.
"""

from ._lineage._compare import Comparison as Comparison
from ._lineage._compare import Diff as Diff
from ._lineage._compare import LeafDiff as LeafDiff
from ._lineage._gc import GCReport as GCReport
from ._lineage._gc import KeepPolicy as KeepPolicy
from ._lineage._graph import Version as Version
from ._lineage._history import History as History
from ._lineage._history import LeafInfo as LeafInfo
from ._lineage._history import Usage as Usage
from ._lineage._history import export_history as export_history
from ._lineage._history import import_history as import_history
from ._lineage._verify import Damage as Damage
from ._lineage._verify import Verification as Verification
from .storage import CorruptCheckpointError as CorruptCheckpointError
from .storage import StorageError as StorageError

__all__ = [
    "Comparison",
    "CorruptCheckpointError",
    "Damage",
    "Diff",
    "GCReport",
    "History",
    "KeepPolicy",
    "LeafDiff",
    "LeafInfo",
    "StorageError",
    "Usage",
    "Verification",
    "Version",
    "export_history",
    "import_history",
]
