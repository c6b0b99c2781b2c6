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

    path/zarr.json                  root group    {"vlcc_lineage": {"format": 1, "kind": "history"}}
    path/graph/zarr.json            group; its attributes hold the version DAG (networkx
                                    node-link JSON), branches, tags, HEAD
    path/versions/<id>/zarr.json    group per version: the manifest (parents, branch, message,
                                    meta, created, the state spec, per leaf: dtype, shape,
                                    chunk shape, codec, chunk addresses)
    path/versions/<id>/<i>/zarr.json  leaf i as a zarr v3 array (regular chunk grid)
    path/versions/<id>/<i>/c.3.0    its chunk files: *hard links* to ...
    path/chunks/ab/cdef...          ... the content-addressed chunk files (xxh3-128 address)
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

Leaves of zarr's core dtypes are arrays of their own dtype (byte order in
the ``bytes`` codec); others (datetime, strings, structured, bfloat16) are
``uint8`` arrays with a trailing axis of the item size, their real dtype in
the array's attributes, as in :class:`~vlcc_adjoint.storage.ZarrTier`.

**Integrity.**  A chunk's address is xxh3-128 of its raw bytes (and the
codec, when compressed); every read re-hashes what it read and raises
:class:`~vlcc_adjoint.storage.CorruptCheckpointError` naming the version and
the leaf's path in the state.  Manifests and the graph are validated
before use (dtypes from an allow-list, shapes and chunk grids consistent,
parents known, the graph acyclic); a type named in a state spec is rebuilt
only if the reading process registered it.  Reading never executes anything.

**Crash safety and concurrency.**  A version's chunks and group are written
in ``scratch/``; the group is renamed into ``versions/`` and the graph file
replaced (``os.replace``) under an ``flock`` on ``locks/graph.lock``, in
that order, so a version is visible exactly when it is complete, and
concurrent commits from several processes never lose each other's updates.
``gc`` and commits in flight exclude each other through a readers-writer
lock (``locks/gc.lock``), so gc never deletes a chunk a commit is about to
use.  A process killed mid-commit leaves only scratch debris; the
repository opens as it was, and the next ``gc`` sweeps it.  Moving or copying
the directory (``cp -r``, ``rsync -H``, ``vlcc export``/``vlcc import``) moves
the repository: nothing in it names an absolute path.

Measured (``benchmarks/bench_lineage.py``, shared 2-core VM): 20 versions of
a 100 MB state in which 5 % of the chunks change per version take 1.98x the
space of one version (``np.save``: 20x); a commit blocks the caller for a
hash of the state plus a copy of its new chunks (~50 ms, 0.1-0.3x the time
of ``np.save`` writing it), 1.5-2 GB/s of state committed.  When every chunk
changes, the machine's write bandwidth bounds it like any writer.  A history
of 3000 versions publishes a commit in ~10-25 ms (the graph file is
rewritten whole: ~250 bytes per version, so prune very long histories with
``gc``).
"""

from ._lineage._compare import Comparison as Comparison
from ._lineage._compare import Diff as Diff
from ._lineage._compare import LeafDiff as LeafDiff
from ._lineage._graph import Version as Version
from ._lineage._gc import GCReport as GCReport
from ._lineage._gc import KeepPolicy as KeepPolicy
from ._lineage._history import History as History
from ._lineage._history import LeafInfo as LeafInfo
from ._lineage._history import Usage as Usage
from ._lineage._transfer import export_history as export_history
from ._lineage._transfer import import_history as import_history
from .storage import CorruptCheckpointError as CorruptCheckpointError
from .storage import StorageError as StorageError

__all__ = [
    "Comparison",
    "CorruptCheckpointError",
    "Diff",
    "GCReport",
    "History",
    "KeepPolicy",
    "LeafDiff",
    "LeafInfo",
    "StorageError",
    "Usage",
    "Version",
    "export_history",
    "import_history",
]
