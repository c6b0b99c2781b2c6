"""History: a persistent, branching repository of checkpoint versions.

See :mod:`vlcc_adjoint.lineage` for the user-facing description and the
on-disk format.  :class:`History` is composed of parts with one job each,
which it builds and wires together:

* :class:`~._repo.Repository` (``_repo``): the directory, its root, the
  graph file and the inter-process locks;
* :class:`~._chunks.ChunkStore` (``_chunks``): the content-addressed chunk
  files, delta chains included;
* :class:`~._read.Reader` (``_reader``): manifests and chunks, read and
  verified;
* :class:`~._refs.Refs` (``_refs``): HEAD, branches, tags;
* :class:`~._commit.CommitPipeline` (``_commits``): capture, the writer
  thread, publication (staged parts too, :mod:`._parts`).

This module adds the life cycle (``wait``, ``close``, forks), the public
reads (``checkout``, ``load``, ``log``, ``draw``...) and the entry points of
diff/compare (:mod:`._compare`), gc (:mod:`._gc`), verification
(:mod:`._verify`) and export/import (:mod:`._transfer`).

A ``History`` object is safe to share between threads: the state of all its
parts is guarded by one lock (the repository's), and installed graphs are
immutable (writers change a clone).  Its own reads first wait for its own
pending commits, so a process always sees what it committed; other
processes see a version once it is published.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import json
import os
import sys
import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import networkx as nx
import numpy as np

from ..errors import VlccValueError
from ..state import leaf_paths
from ..storage import StorageError
from . import _format as F
from ._chunks import ChunkStore
from ._commit import CommitPipeline
from ._compare import Comparison, Diff, comparison, diff_states
from ._format import Manifest
from ._gc import GCReport, KeepPolicy, collect, tree_bytes
from ._graph import Graph, Version, render
from ._info import LeafInfo, Usage, short
from ._local import NodeLocal
from ._parts import commit_staged, stage
from ._ranks import RankGroup
from ._read import Reader
from ._refs import Ref, Refs
from ._repo import Repository
from ._transfer import check_import_target, discard_import, unpack_archive, write_archive
from ._verify import Verification, check_intact, verify

if TYPE_CHECKING:
    from ..storage.codecs import Codec

__all__ = [
    "History",
    "LeafInfo",
    "Usage",
    "Verification",
    "export_history",
    "import_history",
]

_OPEN: weakref.WeakSet[History] = weakref.WeakSet()


@atexit.register
def _finish_open_histories() -> None:
    """At interpreter exit, finish the commits of Histories nobody closed (the writer
    thread is a daemon: without this, they would be lost)."""
    for h in list(_OPEN):
        try:
            h.close()
        except Exception as err:  # pragma: no cover - reported, exit goes on
            print(f"vlcc_adjoint.lineage: {err}", file=sys.stderr)


# -- History -----------------------------------------------------------------------------


class History:
    """A persistent, branching repository of checkpoint versions (git-like).

    **Arguments:**

    - `path`: the repository directory (a zarr v3 hierarchy).  Created if
      missing or empty; an existing repository is opened as it is, by any
      number of processes at once.
    - `mode`: ``"a"`` (read and write, the default) or ``"r"`` (read only:
      ``commit``, ``branch``, ``tag``, ``gc`` refuse; works on read-only media).
    - `chunk_bytes`: target raw size of a chunk (default 1 MiB).  Smaller
      chunks deduplicate finer and cost more files.
    - `codec`: ``None`` (raw chunks, the default) or a
      :class:`~vlcc_adjoint.storage.codecs.Lossless` whose parameters
      compress new chunks (zarr's blosc codec; see the module docstring).
    - `capture`: ``"hash"`` (default: hash chunks in ``commit``, copy only
      new ones) or ``"copy"`` (copy every leaf, hash in the background).
    - `durable`: fsync before a version becomes visible.
    - `max_pending_bytes`: bytes of owned copies that commits in flight may
      hold; ``commit`` waits for the background writer beyond it.  Also the
      most memory kept for reuse by later captures (freed by ``close``).
    - `deltas`: ``True`` stores a changed chunk as the compressed XOR with
      the parent version's chunk at its place when that is at most 3/4 of a
      chunk (:mod:`._delta`); recorded in the repository's root, so every
      process then writes deltas.  Such versions are no longer readable by
      plain zarr, only by ``History``.  ``None`` (default): as the repository
      says (new repositories: full chunks, readable by plain zarr).
    - `comm`: an mpi4py communicator: every rank of it opens the History
      (collectively) and ``commit``, ``branch``, ``tag``, their deletion and
      ``gc`` become collective; a state's
      :class:`~vlcc_adjoint.mpi.DistributedArray` leaves are committed as
      every rank's blocks of one version, and ``load``/``checkout`` return
      each rank's blocks under any decomposition, on any number of ranks
      (:mod:`._ranks`).  ``None`` (default): this process alone.
    - `timeout`: with `comm`, the most seconds a collective step waits for
      the other ranks before :class:`~vlcc_adjoint.mpi.CollectiveTimeoutError`.
    - `local`: with `comm`, a node-local directory (a RAM disk such as
      ``/dev/shm``, or a local SSD): ``commit`` then copies each rank's
      blocks there and returns, and a background flush per node moves the
      version to `path` as one pack per node (:mod:`._local`); the version
      is published (visible) at the next collective call: ``wait``,
      ``commit``, ``close``, ``gc`` or a ref change.  ``None`` (default):
      commits write to `path` before they return.
    - `local_comm`: with `local`, the sub-communicator of `comm` whose ranks
      share one node-local directory and write one pack per version (its
      rank 0 flushes); each rank passes its own group's.  ``None`` (default):
      the ranks of one node (:func:`vlcc_adjoint.mpi.split_by_node`).

    Use it as a context manager, or call :meth:`close`, so pending commits
    are finished.  One ``History`` object is safe to share between threads;
    a forked child must open its own.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        mode: str = "a",
        chunk_bytes: int = F.DEFAULT_CHUNK_BYTES,
        codec: Codec | None = None,
        capture: str = "hash",
        durable: bool = False,
        max_pending_bytes: int = 1 << 30,
        deltas: bool | None = None,
        comm: Any = None,
        timeout: float | None = 600.0,
        local: str | os.PathLike | None = None,
        local_comm: Any = None,
    ) -> None:
        if mode not in ("a", "r"):
            raise VlccValueError(f"mode must be 'a' (read/write) or 'r' (read only), got {mode!r}")
        if capture not in ("hash", "copy"):
            raise VlccValueError(f"capture must be 'hash' or 'copy', got {capture!r}")
        if not isinstance(chunk_bytes, int) or not 1 <= chunk_bytes <= 1 << 30:
            raise VlccValueError(f"chunk_bytes must be an int in 1..2**30, got {chunk_bytes!r}")
        F.codec_config(codec, 8)  # validates
        self.path = os.path.abspath(os.fspath(path))
        self.mode = mode
        self.chunk_bytes = chunk_bytes
        self.codec = codec
        self.capture = capture
        self.durable = bool(durable)
        self.max_pending_bytes = int(max_pending_bytes)
        self._pid = os.getpid()
        self._closed = False
        self._ranks: RankGroup | None = None
        self._local: NodeLocal | None = None
        if local is not None and comm is None:
            raise VlccValueError(
                "local= stages the commits of ranks; give comm= too (MPI.COMM_SELF for one process)"
            )
        if local is not None and mode != "a":
            raise VlccValueError("local= stages commits; open with mode='a'")
        if comm is None:
            self._open(deltas)
        else:
            # Rank 0 opens (creates) the repository first, then the others.
            self._ranks = RankGroup(comm, timeout)
            self._ranks.in_turn(
                f"opening the history at {self.path}", lambda: self._open(deltas), self._shut
            )
            self._ranks.attach(self._commits)
            if local is not None:
                try:
                    self._local = NodeLocal(self._ranks, os.fspath(local), local_comm)
                except BaseException:  # agreed on every rank: undo the opening everywhere
                    self._shut()
                    self._ranks.close()
                    raise
        _OPEN.add(self)

    def _open(self, deltas: bool | None) -> None:
        """Build the parts on the repository (created if missing)."""
        self._repo = Repository(self.path, self.mode, self.durable, threading.RLock())
        try:
            self._chunks = ChunkStore(self._repo, deltas)
        except BaseException:
            self._repo.close()
            raise
        self._reader = Reader(self._repo, self._chunks)
        self._refs = Refs(self._repo)
        self._commits = CommitPipeline(
            self._repo,
            self._chunks,
            self._reader,
            self._refs,
            chunk_bytes=self.chunk_bytes,
            codec=self.codec,
            capture=self.capture,
            max_pending_bytes=self.max_pending_bytes,
        )

    def _shut(self) -> None:
        """Undo :meth:`_open` (another rank failed to open the repository)."""
        self._commits.close()
        self._repo.close()

    # -- housekeeping ------------------------------------------------------------------

    def _check(self, write: bool = False) -> None:
        if os.getpid() != self._pid:
            raise StorageError(
                "this History was opened in another process (before a fork); "
                "open a new History(path) in this process"
            )
        if self._closed:
            raise StorageError(f"the History at {self.path} is closed; open it again")
        if write and self.mode == "r":
            raise StorageError(
                f"the History at {self.path} is open read-only (mode='r'); "
                "open it with mode='a' to change it"
            )
        errors = self._commits.take_errors()
        if errors:
            vid, err = errors[0]
            more = f" ({len(errors) - 1} later commits failed too)" if len(errors) > 1 else ""
            raise StorageError(
                f"commit of version {vid} to the history at {self.path} failed in the "
                f"background: {err}{more}; that version was not stored and is not in the "
                "history (commit the state again once the cause is fixed)"
            ) from err

    def _sync(self) -> Graph:
        """Before a read: own commits finished, failures raised, graph current
        (local: a node-local commit not published yet is not waited for)."""
        self._drain()
        return self._repo.refresh()

    def _open_version(self, ref: Ref) -> tuple[str, Manifest, Reader]:
        """(id, manifest, reader) of the version `ref` names, for a diff."""
        vid = self._refs.resolve(self._sync(), ref)
        return vid, self._reader.manifest(vid), self._reader

    def wait(self) -> None:
        """Block until every commit of this object is visible (or raise its failure).

        With ``local=``: collective; waits for the node-local flush and
        publishes the version (see `local`); its failure is raised on every
        rank (the same :class:`~vlcc_adjoint.mpi.AgreedError`)."""
        self._drain()
        if self._local is not None:
            self._local.finish()

    def _drain(self) -> None:
        """This process's own commits finished (not collective), failures raised."""
        self._check()
        self._commits.drain()
        self._check()

    def close(self) -> None:
        """Finish pending commits, stop the writer thread, release the lock files.

        Idempotent; raises a background failure if one is pending.
        """
        if self._closed:
            return
        same_process = os.getpid() == self._pid
        try:
            if same_process:
                self._commits.drain()
                if self._local is not None:
                    self._local.close()
        finally:
            self._closed = True
            if same_process:
                self._commits.close()
                if self._ranks is not None:
                    self._ranks.close()
            self._repo.close()
        errors = self._commits.take_errors()
        if errors:
            vid, err = errors[0]
            raise StorageError(
                f"commit of version {vid} to the history at {self.path} failed "
                f"in the background: {err}; that version was not stored"
            ) from err

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- commits -----------------------------------------------------------------------

    def commit(
        self,
        state: Any,
        message: str = "",
        meta: dict | None = None,
        *,
        branch: str | None = None,
        merge: Iterable[Ref] | Ref = (),
    ) -> str:
        """Store `state` as a new version on the current branch; return its id.

        Returns once the state is owned (the caller may modify it at once);
        the version is written in the background and becomes visible (in
        ``log``, to ``checkout``, to other processes) when it is complete on
        disk.  Later calls of this object that read the history wait for it.

        **Arguments:**

        - `state`: anything :func:`vlcc_adjoint.state.flatten` accepts.
        - `message`: a one-line description.
        - `meta`: free-form JSON metadata (step, loss, hyper-parameters,
          code version); non-finite floats are stored as ``"nan"``/``"inf"``.
        - `branch`: commit to this branch instead (created at HEAD if new) and
          make it the current branch.  Needed after checking out a version or
          tag (detached HEAD).
        - `merge`: refs of versions merged into this one (extra parents).

        **Returns:** the new version's id (12 hexadecimal characters).

        The version's first parent is the branch's tip when the version is
        published, so several processes appending to one branch interleave.
        See :mod:`vlcc_adjoint._lineage._commit` for how.

        With ``comm=``: collective; every rank passes its own blocks and the
        same other values, and gets the same id once the version is visible
        (or the same :class:`~vlcc_adjoint.mpi.AgreedError`: then no version
        was added).  `merge` is not supported there.
        """
        self._check(write=True)
        if self._ranks is not None:
            if merge:
                raise VlccValueError("merge= is not supported with comm=; commit without it")
            self._drain()
            if self._local is not None:
                return self._local.commit(state, message, meta, branch)
            return self._ranks.commit(state, message, meta, branch)
        merges = [merge] if isinstance(merge, (str, Version)) else list(merge)
        if merges:
            self.wait()  # merged refs may name this object's own pending commits
        return self._commits.commit(state, message, meta, branch, merges)

    @property
    def deltas(self) -> bool:
        """Whether this repository stores changed chunks as deltas (see ``History``'s `deltas`)."""
        return self._chunks.deltas

    def stage(
        self,
        arrays: Sequence[np.ndarray],
        *,
        base: str | None = None,
        base_leaves: Sequence[int | None] | None = None,
    ) -> list[dict]:
        """Write the chunks of `arrays` into the repository, for a later :meth:`commit_staged`.

        Any process may stage; one process then commits every process's entries
        as one version.  Staged chunks alone are no version: if the commit never
        happens, ``gc`` removes them.

        **Arguments:**

        - `arrays`: numpy arrays (any shape, 0-d included; dtypes as in ``commit``).
        - `base`: a ref whose leaves are delta bases (a repository opened with
          ``deltas=True``): with it, `base_leaves` gives, per array, the index of
          the leaf of `base` at the same place, or ``None``.
        - `base_leaves`: see `base`.

        **Returns:** one JSON-serialisable leaf entry per array (its dtype, shape,
        chunk grid, codec and chunk addresses; ``"written"``: the chunk bytes this
        call wrote), to pass to :meth:`commit_staged`.
        """
        self._check(write=True)
        return stage(self._commits, arrays, base, base_leaves)

    def commit_staged(
        self,
        spec: dict,
        leaves: Sequence[dict],
        message: str = "",
        meta: dict | None = None,
        *,
        branch: str | None = None,
        at: str | None = None,
    ) -> str:
        """Publish one version made of staged leaves (from any processes); return its id.

        Unlike ``commit``, this returns once the version is visible (or raises:
        then no version was added).

        **Arguments:**

        - `spec`: the state spec of the version (``vlcc_adjoint.state.flatten``'s
          second result), with one leaf per entry of `leaves`, in their order.
        - `leaves`: leaf entries from :meth:`stage`.
        - `message`, `meta`, `branch`: as in ``commit``.
        - `at`: where `branch` starts when it does not exist yet (a ref; default:
          HEAD).  Ignored when the branch exists (the version goes on its tip).

        **Returns:** the new version's id.
        """
        self._check(write=True)
        return commit_staged(self._commits, self._drain, spec, leaves, message, meta, branch, at)

    # -- reads -------------------------------------------------------------------------

    def checkout(self, ref: Ref = "HEAD", *, decomposition: Any = None) -> Any:
        """Restore a version; a branch also becomes the current branch (HEAD).

        **Arguments:**

        - `ref`: a branch (its tip is restored, and later commits append to
          it), or a tag, version id, ``"HEAD~n"``..., which *detaches* HEAD
          (commit then needs ``branch=``).
        - `decomposition`: with ``comm=``, how this reader's ranks split each
          distributed leaf (see :meth:`load`).

        **Returns:** the state, rebuilt with the types it was committed with
        (every chunk verified: :class:`~vlcc_adjoint.storage.CorruptCheckpointError`
        names the version and leaf of a damaged one).
        """
        g = self._sync()
        vid = self._refs.resolve(g, ref)
        state = self._read(vid, decomposition)
        self._refs.check_out(g, ref, vid)
        return state

    def load(self, ref: Ref = "HEAD", *, decomposition: Any = None) -> Any:
        """The state of a version, without moving HEAD (see :meth:`checkout`).

        **Arguments:**

        - `ref`: a ref (branch, tag, id, ``"main~2"``...).
        - `decomposition`: with ``comm=``: a
          :class:`~vlcc_adjoint.mpi.Decomposition` over this communicator for
          the distributed leaves (a callable ``global_shape -> Decomposition``
          for fields of several shapes), or ``None``: as committed when the
          rank count is the same, else slabs along axis 0.  Each rank reads
          only the parts of the stored blocks that overlap its own.

        **Returns:** the state; a version committed with ``comm=`` holds each
        distributed leaf as this rank's
        :class:`~vlcc_adjoint.mpi.DistributedArray` with ``comm=``, and as the
        global numpy array without.
        """
        return self._read(self._refs.resolve(self._sync(), ref), decomposition)

    def _read(self, vid: str, decomposition: Any) -> Any:
        if self._ranks is not None:
            return self._ranks.load(vid, decomposition)
        if decomposition is not None:
            raise VlccValueError(
                "decomposition= needs a History opened with comm=; without it a "
                "version's distributed leaves load as global arrays"
            )
        return self._reader.load(vid)

    def read_leaf(self, ref: Ref, index: int, rows: tuple[int, int] | None = None) -> np.ndarray:
        """One leaf of a version (or a range of its rows), verified, without the others.

        **Arguments:**

        - `ref`: a ref (branch, tag, id, ``"main~2"``...).
        - `index`: the leaf's index in the version (its order in the state spec).
        - `rows`: ``(start, stop)``: only the rows ``start:stop`` along the first
          axis; only the chunks holding them are read (a leaf's chunks are
          contiguous runs of its C-order bytes).  ``None``: the whole leaf.

        **Returns:** a new numpy array.  Damage raises
        :class:`~vlcc_adjoint.storage.CorruptCheckpointError` naming the file;
        the allocation is checked against the leaf's declared size and the
        memory this process may use first.
        """
        vid = self._refs.resolve(self._sync(), ref)
        return self._reader.read_rows(self._reader.manifest(vid), index, rows)

    def leaf_count(self, ref: Ref) -> int:
        """The number of leaves of a version (its manifest is read and verified)."""
        vid = self._refs.resolve(self._sync(), ref)
        return len(self._reader.manifest(vid).leaves)

    def version(self, ref: Ref = "HEAD") -> Version:
        """The :class:`Version` a ref names."""
        g = self._sync()
        return g.version(self._refs.resolve(g, ref))

    def leaves(self, ref: Ref = "HEAD") -> list[LeafInfo]:
        """How a version's leaves are stored (path, dtype, shape, chunks, codec, zarr array)."""
        g = self._sync()
        vid = self._refs.resolve(g, ref)
        m = self._reader.manifest(vid)
        paths = leaf_paths(m.spec)
        return [
            LeafInfo(
                paths.get(i, f"#{i}"),
                layout.dtype.str,
                layout.shape,
                layout.nbytes,
                layout.chunk_shape,
                layout.nchunks,
                cfg,
                f"{F.VERSIONS}/{vid}/{i}",
            )
            for i, (layout, cfg, _) in enumerate(m.leaves)
        ]

    # -- refs --------------------------------------------------------------------------

    @property
    def head(self) -> str | None:
        """The branch this object commits to, or ``None`` when detached (after
        ``checkout`` of a version or tag)."""
        return self._refs.head_branch

    @property
    def head_version(self) -> str | None:
        """The id of the version HEAD points at (``None`` in an empty branch)."""
        return self._refs.head_id(self._sync())

    @property
    def branches(self) -> dict[str, str]:
        """``{branch name: tip version id}``."""
        return dict(self._sync().branches)

    @property
    def tags(self) -> dict[str, str]:
        """``{tag name: version id}``."""
        return dict(self._sync().tags)

    @property
    def graph(self) -> nx.DiGraph:
        """A copy of the version DAG (edges parent -> child; node attributes as in the file)."""
        return self._sync().g.copy()

    def __len__(self) -> int:
        return len(self._sync())

    def __contains__(self, ref: Ref) -> bool:
        try:
            self.resolve(ref)
        except KeyError:
            return False
        return True

    def resolve(self, ref: Ref = "HEAD") -> str:
        """The version id a ref names.

        **Arguments:**

        - `ref`: a branch (its tip), a tag, a version id or a unique prefix of
          one (4+ characters), ``"HEAD"``, or any of these followed by ``~n``
          (``n`` first-parent steps back: ``"main~2"``), or a :class:`Version`.

        **Returns:** the version id; ``KeyError`` naming the known refs if none matches.
        """
        return self._refs.resolve(self._sync(), ref)

    def branch(self, name: str, at: Ref = "HEAD", *, force: bool = False) -> str:
        """Create branch `name` at a version (``checkout(name)`` then switches to it).

        **Arguments:**

        - `name`: the new branch.
        - `at`: where it starts (a ref; default HEAD).
        - `force`: move an existing branch there (its later versions stay in
          the history until ``gc``).

        **Returns:** the id of the version the branch points at.
        """
        self._sync()
        self._check(write=True)
        return self._collective(
            f"creating branch {name!r}", self._refs.branch, name, at, force=force
        )

    def delete_branch(self, name: str) -> None:
        """Remove branch `name` (its versions stay until a ``gc`` no longer keeps them)."""
        self._sync()
        self._check(write=True)
        self._collective(f"deleting branch {name!r}", self._refs.delete_branch, name)

    def tag(self, name: str, version: Ref = "HEAD", *, force: bool = False) -> str:
        """Name a version (tags are kept by ``gc`` with ``KeepPolicy(tagged=True)``).

        **Returns:** the id of the tagged version.  An existing tag is moved
        only with ``force=True``.
        """
        self._sync()
        self._check(write=True)
        return self._collective(
            f"creating tag {name!r}", self._refs.tag, name, version, force=force
        )

    def delete_tag(self, name: str) -> None:
        """Remove tag `name` (the version stays)."""
        self._sync()
        self._check(write=True)
        self._collective(f"deleting tag {name!r}", self._refs.delete_tag, name)

    # -- history queries ---------------------------------------------------------------

    def log(
        self, branch: str | None = None, *, all: bool = False, limit: int | None = None
    ) -> list[Version]:
        """Versions, newest first (git log).

        **Arguments:**

        - `branch`: a branch, tag or version: it and its ancestors.  ``None``:
          HEAD's (empty before the first commit).
        - `all`: every version of the repository, all branches.
        - `limit`: at most this many.

        **Returns:** a list of :class:`Version` (newest published first, a
        topological order: children before parents).
        """
        g = self._sync()
        if all:
            ids = set(g.nodes)
        else:
            try:
                vid = self._refs.resolve(g, "HEAD" if branch is None else branch)
            except KeyError:
                if branch is None:
                    return []
                raise
            ids = g.ancestors(vid) | {vid}
        out = g.newest_first(ids)
        return out[:limit] if limit is not None else out

    def ancestors(self, ref: str = "HEAD") -> list[Version]:
        """Every version `ref` descends from (not itself), newest first."""
        g = self._sync()
        return g.newest_first(g.ancestors(self._refs.resolve(g, ref)))

    def descendants(self, ref: str = "HEAD") -> list[Version]:
        """Every version descending from `ref` (not itself), newest first."""
        g = self._sync()
        return g.newest_first(nx.descendants(g.g, self._refs.resolve(g, ref)))

    def draw(self, *, all: bool = True, limit: int | None = None) -> str:
        """An ASCII drawing of the history, like ``git log --graph --oneline --all``."""
        g = self._sync()
        versions = self.log(all=True) if all else self.log()
        if limit is not None:
            versions = versions[:limit]
        refs: dict[str, list[str]] = collections.defaultdict(list)
        head_branch, head_version = self._refs.head_branch, self._refs.head_version
        for name, vid in sorted(g.branches.items()):
            refs[vid].append(f"HEAD -> {name}" if name == head_branch else name)
        for name, vid in sorted(g.tags.items()):
            refs[vid].append(f"tag: {name}")
        if head_branch is None and head_version is not None and head_version in g:
            refs[head_version].insert(0, "HEAD")

        def describe(v: Version) -> str:
            deco = f" ({', '.join(refs[v.id])})" if refs.get(v.id) else ""
            meta = " ".join(f"{k}={short(v.meta[k])}" for k in list(v.meta)[:4])
            text = v.message or ""
            if meta:
                text = f"{text} [{meta}]" if text else f"[{meta}]"
            return f"{v.id}{deco} {text}".rstrip()

        return "\n".join(render(versions, describe))

    # -- diff and compare --------------------------------------------------------------

    def diff(self, a: str, b: str) -> Diff:
        """Per-leaf differences between two versions (or a version and a live state).

        **Arguments:**

        - `a`, `b`: refs (see :meth:`resolve`), or states (anything not a
          ``str``/:class:`Version` is flattened and compared as it is).

        **Returns:** a :class:`~vlcc_adjoint.lineage.Diff`: per leaf, whether it
        changed and by how much (max absolute and relative difference), and
        the non-array values that differ.  Only chunks whose addresses differ
        are read.
        """
        return diff_states(self._open_version, self._open_version, a, b, 0.0, 0.0)

    def compare(
        self, a: str, b: str, rtol: float = 0.0, atol: float = 0.0, *, other: History | None = None
    ) -> Comparison:
        """Whether two versions agree within tolerances (a reproducibility check).

        **Arguments:**

        - `a`, `b`: refs or states, as in :meth:`diff`.
        - `rtol`, `atol`: elementwise ``|a - b| <= atol + rtol * |b|``
          (NaN equals NaN).  The defaults demand numerical equality.
        - `other`: resolve `b` in this other ``History`` (compare two runs
          stored in two repositories).

        **Returns:** a :class:`~vlcc_adjoint.lineage.Comparison`, truthy when
        equal, with the first leaf that differs (``.first_leaf``) and
        ``.bitwise``.
        """
        if not (rtol >= 0 and atol >= 0):
            raise VlccValueError(f"rtol and atol must be >= 0, got {rtol}, {atol}")
        open_b = other._open_version if other is not None else self._open_version
        return comparison(
            diff_states(self._open_version, open_b, a, b, float(rtol), float(atol)),
            float(rtol),
            float(atol),
        )

    # -- gc ----------------------------------------------------------------------------

    def gc(self, keep: KeepPolicy | int | None = None, *, dry_run: bool = False) -> GCReport:
        """Remove versions a policy does not keep, and every chunk no kept version uses.

        **Arguments:**

        - `keep`: a :class:`KeepPolicy`, an int ``N`` (``KeepPolicy(last=N)``),
          or ``None``: keep every version and only sweep unreferenced chunks
          and the leftovers of interrupted commits.
        - `dry_run`: report what would be removed, change nothing.

        **Returns:** a :class:`GCReport`.

        Removed versions are spliced out of the graph: a kept version's
        parents become its nearest kept ancestors.  A chunk is deleted only
        if no kept version lists it, so every kept version checks out
        bit-identical afterwards.  gc waits for commits in flight in every
        process (they hold ``locks/gc.lock`` shared) and holds them off while
        it runs.
        """
        self.wait()  # with local=: the pending version is published first (collective)
        self._sync()
        self._check(write=True)
        if self._ranks is None:
            return collect(self._reader, self._refs, self._chunks, keep, dry_run)
        report = self._ranks.on_root(
            "collecting garbage",
            lambda: collect(self._reader, self._refs, self._chunks, keep, dry_run),
            encode=lambda r: json.dumps(dataclasses.asdict(r)),
            decode=json.loads,
        )
        report["removed"] = tuple(report["removed"])
        if not report["dry_run"]:  # rank 0's gc forgot them there; here too
            self._chunks.forget_packs(None)
            self._reader.forget(set(report["removed"]))
            for vid in report["removed"]:
                self._refs.forget_version(vid)
        return GCReport(**report)

    def _collective(self, what: str, change: Any, *args: Any, **kwargs: Any) -> Any:
        """`change(*args, **kwargs)` of the refs: here, or with ``comm=`` on rank 0
        with the outcome agreed and its result (text or ``None``) on every rank."""
        if self._ranks is None:
            return change(*args, **kwargs)
        self.wait()  # with local=: the pending version is published first
        return self._ranks.on_root(
            what,
            lambda: change(*args, **kwargs),
            encode=lambda r: json.dumps(r),
            decode=json.loads,
        )

    # -- usage, export -----------------------------------------------------------------

    def usage(self) -> Usage:
        """Storage used: versions, distinct chunks and their bytes, bytes on disk."""
        g = self._sync()
        chunks = chunk_bytes = 0
        for sub in os.scandir(self._repo.p(F.CHUNKS)):
            if sub.is_dir(follow_symlinks=False):
                for entry in os.scandir(sub.path):
                    chunks += 1
                    chunk_bytes += entry.stat(follow_symlinks=False).st_size
        for addrs in self._chunks.scan_packs().values():  # chunks held in packs
            for addr in addrs or ():
                if not os.path.lexists(self._repo.p(F.chunk_relpath(addr))):
                    chunks += 1
                    chunk_bytes += self._chunks.stored_size(addr)
        logical = sum(a["nbytes"] for a in g.nodes.values())
        return Usage(
            len(g),
            len(g.branches),
            len(g.tags),
            chunks,
            chunk_bytes,
            logical,
            tree_bytes(self.path, chunks_too=True),
        )

    @property
    def stats(self) -> dict:
        """Counters of this object: ``commits``, ``caller_seconds`` (time spent in
        ``commit``), ``writer_seconds`` (background), ``new_bytes`` (chunk bytes written)."""
        with self._repo.lock:
            return dict(self._commits.stats)

    def export(self, out: str | os.PathLike, *, force: bool = False) -> str:
        """Write the repository (every version, refs, deduplicated chunks) to a tar file.

        **Arguments:**

        - `out`: the archive path; ``.tar.gz``/``.tgz`` compress it.
        - `force`: replace an existing file `out` (else
          :class:`~vlcc_adjoint.storage.StorageError`).

        **Returns:** `out`.  ``import_history(out, path)`` recreates the
        repository elsewhere (another machine, after a suspension).  Hard
        links are kept as tar hard links, so the archive holds each chunk once.
        What is archived is verified first (:meth:`verify`): a damaged
        repository raises :class:`~vlcc_adjoint.storage.CorruptCheckpointError`
        naming every damaged file, and nothing is written.
        """
        out = os.fspath(out)
        write_archive(self._reader, self._sync(), out, force)
        return out

    def verify(self) -> Verification:
        """Read and check every byte a read of any version depends on (``git fsck``).

        The root and the graph file, every version's manifest, every chunk of
        every version (delta chunks with their bases) and the files plain
        zarr reads, all read from disk now through the checked read paths
        (:mod:`._verify`).  Nothing is changed.

        **Returns:** a :class:`~vlcc_adjoint.lineage.Verification`, truthy
        when nothing is damaged; else its ``damaged`` lists every damaged file
        with the versions it breaks (``str()``: one line each and a summary).
        """
        self._drain()
        return verify(self._reader)

    def __repr__(self) -> str:
        n = len(self._repo.graph)
        head = self._refs.head_branch
        if head is None:
            head = f"detached {self._refs.head_version}"
        return f"History({self.path!r}, versions={n}, head={head})"


def export_history(
    history: History | str | os.PathLike, out: str | os.PathLike, *, force: bool = False
) -> str:
    """Archive a repository (a :class:`History` or its path) into a tar file.

    A consistent snapshot: the graph is read once, and only the versions it
    lists and the chunks they use are archived (commits published meanwhile
    are not), verified first; an existing `out` is replaced only with
    `force`.  See :meth:`History.export`.
    """
    if isinstance(history, History):
        return history.export(out, force=force)
    with History(history, mode="r") as h:
        return h.export(out, force=force)


def import_history(archive: str | os.PathLike, path: str | os.PathLike) -> str:
    """Unpack an archive made by :func:`export_history` into a new repository at `path`.

    The archive is checked first: only the repository's own top-level names,
    regular files, directories and hard links inside it (tarfile's ``data``
    filter: no absolute paths, ``..``, devices or links leaving the
    directory).  What it unpacks is then verified (:meth:`History.verify`):
    an archive with a damaged file is refused with
    :class:`~vlcc_adjoint.storage.CorruptCheckpointError` naming it (as a
    member of the archive), and whatever failed to import is removed:
    nothing half-imported stays.  **Returns:** `path`, a repository
    ``History(path)`` opens.
    """
    path = os.path.abspath(os.fspath(path))
    existed = check_import_target(path)
    try:
        unpack_archive(archive, path)
        # Opening validates the root and the graph, and adds locks/ and scratch/.
        with History(path, mode="a") as h:
            check_intact(h.verify(), f"importing {os.fspath(archive)}", os.fspath(archive))
    except BaseException:
        discard_import(path, existed)
        raise
    return path
