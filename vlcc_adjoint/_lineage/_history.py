"""History: a persistent, branching repository of checkpoint versions.

See :mod:`vlcc_adjoint.lineage` for the user-facing description and the
on-disk format.  This file is the repository object's facade: its
construction, its life cycle (``wait``, ``close``, threads, forks), the
public reads (``checkout``, ``load``, ``log``, ``draw``...) and the entry
points of diff/compare (:mod:`._compare`), gc (:mod:`._gc`) and export
(:mod:`._transfer`).  The rest is in mixins, one job each: the directory
and the graph file (:mod:`._repo`), reading and verifying versions
(:mod:`._read`), refs (:mod:`._refs`), and ``commit`` (:mod:`._commit`).

A ``History`` object is safe to share between threads: its state is
guarded by one lock, and installed graphs are immutable (writers change a
clone).  Its own reads first wait for its own pending commits, so a process
always sees what it committed; other processes see a version once it is
published.
"""

from __future__ import annotations

import atexit
import collections
import os
import queue
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any

import networkx as nx

from ..errors import VlccValueError
from ..storage import BufferPool, StorageError
from . import _delta
from . import _format as F
from ._commit import CommitPipeline, _Job
from ._compare import Comparison, Diff, comparison, diff_states, leaf_paths
from ._gc import GCReport, KeepPolicy, collect, tree_bytes
from ._graph import Graph, Version
from ._info import LeafInfo, Usage, short
from ._locks import FileLock, SharedExclusiveLock
from ._parts import Parts
from ._read import Reader
from ._refs import Refs
from ._repo import Repository

if TYPE_CHECKING:
    from ..storage.codecs import Codec

__all__ = ["History", "LeafInfo", "Usage"]

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


class History(Repository, Reader, Refs, CommitPipeline, Parts):
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
    ):
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
        self._lock = threading.RLock()  # instance state
        self._cond = threading.Condition(self._lock)
        self._frags: dict = {}  # JSON text of versions, reused by every graph write
        self._graph = Graph(self._frags)
        self._stamp = None
        self._manifests: collections.OrderedDict[str, F.Manifest] = collections.OrderedDict()
        self._pending: dict[str, _Job] = {}
        self._pending_bytes = 0
        self._inflight: collections.Counter[str] = collections.Counter()
        self._errors: list[tuple[str, BaseException]] = []
        self._queue: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None
        self._pool = BufferPool(self.max_pending_bytes)
        self._chunk_dirs: set[str] = set()
        self._links = True
        self._stats = collections.Counter()
        self._open()
        self._deltas = _delta.enable(self, deltas)
        self._resolver = _delta.Resolver(self)
        self._graph_lock = FileLock(self._p(F.LOCKS, "graph.lock"), readonly=mode == "r")
        try:
            self._gc_lock = SharedExclusiveLock(self._p(F.LOCKS, "gc.lock"), readonly=mode == "r")
        except BaseException:
            self._graph_lock.close()
            raise
        try:
            self._refresh()
            if mode == "a":
                self._sweep_scratch()
        except BaseException:
            self._graph_lock.close()
            self._gc_lock.close()
            raise
        self._head_branch: str | None = self._graph.head
        self._head_version: str | None = None  # when detached
        self._tip: dict[str, str] = {}  # branch -> this object's last pending commit on it
        _OPEN.add(self)

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
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            vid, err = errors[0]
            more = f" ({len(errors) - 1} later commits failed too)" if len(errors) > 1 else ""
            raise StorageError(
                f"commit of version {vid} to the history at {self.path} failed in the "
                f"background: {err}{more}; that version was not stored and is not in the "
                "history (commit the state again once the cause is fixed)"
            ) from err

    def _sync(self) -> Graph:
        """Before a read: own commits finished, failures raised, graph current."""
        self._check()
        self._drain()
        self._check()
        return self._refresh()

    def _drain(self) -> None:
        with self._cond:
            while self._pending:
                self._cond.wait()

    def wait(self) -> None:
        """Block until every commit of this object is visible (or raise its failure)."""
        self._check()
        self._drain()
        self._check()

    def close(self) -> None:
        """Finish pending commits, stop the writer thread, release the lock files.

        Idempotent; raises a background failure if one is pending.
        """
        if self._closed:
            return
        try:
            if os.getpid() == self._pid:
                self._drain()
        finally:
            self._closed = True
            if self._worker is not None and os.getpid() == self._pid:
                self._queue.put(None)
                self._worker.join()
            self._graph_lock.close()
            self._gc_lock.close()
            self._pool.clear()
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            vid, err = errors[0]
            raise StorageError(
                f"commit of version {vid} to the history at {self.path} failed "
                f"in the background: {err}; that version was not stored"
            ) from err

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def checkout(self, ref: str = "HEAD") -> Any:
        """Restore a version; a branch also becomes the current branch (HEAD).

        **Arguments:**

        - `ref`: a branch (its tip is restored, and later commits append to
          it), or a tag, version id, ``"HEAD~n"``..., which *detaches* HEAD
          (commit then needs ``branch=``).

        **Returns:** the state, rebuilt with the types it was committed with
        (every chunk verified: :class:`~vlcc_adjoint.storage.CorruptCheckpointError`
        names the version and leaf of a damaged one).
        """
        g = self._sync()
        vid = self._resolve(g, ref)
        state = self._load(vid)
        name = ref.id if isinstance(ref, Version) else ref
        if name == "HEAD" and self._head_branch is not None:
            name = self._head_branch  # stay on the current branch
        with self._lock:
            if name in g.branches:
                self._head_branch, self._head_version = name, None
            else:
                self._head_branch, self._head_version = None, vid
            self._tip.clear()
        if name in g.branches and self.mode == "a" and g.head != name:
            with self._graph_lock.held():
                g = self._fresh()
                if g.head != name:
                    g.head = name
                    self._write_graph(g)
        return state

    def load(self, ref: str = "HEAD") -> Any:
        """The state of a version, without moving HEAD (see :meth:`checkout`)."""
        return self._load(self._resolve(self._sync(), ref))

    def version(self, ref: str = "HEAD") -> Version:
        """The :class:`Version` a ref names."""
        g = self._sync()
        return g.version(self._resolve(g, ref))

    def leaves(self, ref: str = "HEAD") -> list[LeafInfo]:
        """How a version's leaves are stored (path, dtype, shape, chunks, codec, zarr array)."""
        g = self._sync()
        vid = self._resolve(g, ref)
        m = self._manifest(vid)
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
                vid = self._resolve(g, "HEAD" if branch is None else branch)
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
        return g.newest_first(g.ancestors(self._resolve(g, ref)))

    def descendants(self, ref: str = "HEAD") -> list[Version]:
        """Every version descending from `ref` (not itself), newest first."""
        g = self._sync()
        return g.newest_first(nx.descendants(g.g, self._resolve(g, ref)))

    def draw(self, *, all: bool = True, limit: int | None = None) -> str:
        """An ASCII drawing of the history, like ``git log --graph --oneline --all``."""
        from ._graph import render

        g = self._sync()
        versions = self.log(all=True) if all else self.log()
        if limit is not None:
            versions = versions[:limit]
        refs: dict[str, list[str]] = collections.defaultdict(list)
        for name, vid in sorted(g.branches.items()):
            refs[vid].append(f"HEAD -> {name}" if name == self._head_branch else name)
        for name, vid in sorted(g.tags.items()):
            refs[vid].append(f"tag: {name}")
        if self._head_branch is None and self._head_version in g:
            refs[self._head_version].insert(0, "HEAD")

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
        return diff_states(self, a, b, 0.0, 0.0, None)

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
        return comparison(
            diff_states(self, a, b, float(rtol), float(atol), other), float(rtol), float(atol)
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
        return collect(self, keep, dry_run)

    # -- usage, export -----------------------------------------------------------------

    def usage(self) -> Usage:
        """Storage used: versions, distinct chunks and their bytes, bytes on disk."""
        g = self._sync()
        chunks = chunk_bytes = 0
        for sub in os.scandir(self._p(F.CHUNKS)):
            if sub.is_dir(follow_symlinks=False):
                for entry in os.scandir(sub.path):
                    chunks += 1
                    chunk_bytes += entry.stat(follow_symlinks=False).st_size
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
        with self._lock:
            return dict(self._stats)

    def export(self, out: str | os.PathLike) -> str:
        """Write the repository (every version, refs, deduplicated chunks) to a tar file.

        **Arguments:**

        - `out`: the archive path; ``.tar.gz``/``.tgz`` compress it.

        **Returns:** `out`.  ``import_history(out, path)`` recreates the
        repository elsewhere (another machine, after a suspension).  Hard
        links are kept as tar hard links, so the archive holds each chunk once.
        """
        from ._transfer import export_history

        return export_history(self, out)

    def __repr__(self) -> str:
        try:
            n = len(self._graph)
        except Exception:  # pragma: no cover
            n = "?"
        head = self._head_branch
        if head is None:
            head = f"detached {self._head_version}"
        return f"History({self.path!r}, versions={n}, head={head})"
