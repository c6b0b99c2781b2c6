"""History: a persistent, branching repository of checkpoint versions.

See :mod:`vlcc_adjoint.lineage` for the user-facing description and the
on-disk format.  This file is the repository object: opening and creating
a repository, the graph file (read, validated, replaced atomically under
``locks/graph.lock``), refs (branches, tags, HEAD, ``ref~n``), reading
versions (every chunk verified), log and ancestry, and the entry points of
diff/compare (:mod:`._compare`), gc (:mod:`._gc`) and export
(:mod:`._transfer`).  How ``commit`` turns a state into a durable, visible
version is in :mod:`._commit`.

A ``History`` object is safe to share between threads: its state is
guarded by one lock, and installed graphs are immutable (writers change a
clone).  Its own reads first wait for its own pending commits, so a process
always sees what it committed; other processes see a version once it is
published.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import json
import math
import os
import queue
import secrets
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

import networkx as nx
import numpy as np

from ..state import byte_view, flatten, unflatten
from ..storage._pool import BufferPool
from ..storage._tier import CorruptCheckpointError, StorageError
from . import _format as F
from ._compare import Comparison, Diff, comparison, diff_states, leaf_paths
from ._gc import GCReport, KeepPolicy, collect, tree_bytes
from ._graph import Graph, Version, check_name
from ._commit import CommitPipeline, _Job
from ._locks import FileLock, SharedExclusiveLock

__all__ = ["History", "LeafInfo", "Usage"]

_TOP = {"zarr.json", F.CHUNKS, F.VERSIONS, F.GRAPH, F.LOCKS, F.SCRATCH}  # what a repository holds


# -- public result types ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Usage:
    """Storage used by a repository (``History.usage``).

    **Attributes:** `versions`, `branches`, `tags`, `chunks` (distinct
    chunk files), `chunk_bytes` (their bytes on disk, after compression),
    `logical_bytes` (the sum over versions of their state's bytes: what
    storing every version whole would cost), `disk_bytes` (every file of
    the repository, each inode counted once: hard links are free).
    """

    versions: int
    branches: int
    tags: int
    chunks: int
    chunk_bytes: int
    logical_bytes: int
    disk_bytes: int

    @property
    def dedup_ratio(self) -> float:
        """`logical_bytes` / `disk_bytes`: how many times deduplication shrinks the versions."""
        return self.logical_bytes / self.disk_bytes if self.disk_bytes else 1.0


@dataclasses.dataclass(frozen=True)
class LeafInfo:
    """One leaf of a version (``History.leaves``): where it sits and how it is stored."""

    path: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    chunk_shape: tuple[int, ...]
    chunks: int
    codec: dict | None
    array: str  # the leaf's zarr array, relative to the repository root


def _json_meta(meta) -> dict:
    """`meta` as strict JSON (non-finite floats become the strings "nan", "inf", "-inf")."""
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise TypeError(f"meta must be a dict of JSON values, got {type(meta).__name__}")

    def clean(x, path):
        if isinstance(x, float) and not math.isfinite(x):
            return repr(x)
        if isinstance(x, dict):
            bad = [k for k in x if not isinstance(k, str)]
            if bad:
                raise TypeError(f"meta{path} has a non-string key {bad[0]!r}; JSON objects "
                                "have string keys")
            return {k: clean(v, f"{path}[{k!r}]") for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v, f"{path}[{i}]") for i, v in enumerate(x)]
        if isinstance(x, np.generic):
            return clean(x.item(), path)
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise TypeError(f"meta{path} is a {type(x).__name__}, which is not JSON; use dicts, "
                        "lists, strings, numbers, bools and None (convert arrays with .tolist())")

    return clean(meta, "")


_OPEN: "weakref.WeakSet[History]" = weakref.WeakSet()


@atexit.register
def _finish_open_histories() -> None:
    """At interpreter exit, finish the commits of Histories nobody closed (the writer
    thread is a daemon: without this, they would be lost)."""
    for h in list(_OPEN):
        try:
            h.close()
        except Exception as err:  # pragma: no cover - reported, exit goes on
            print(f"vlcc_adjoint.lineage: {err}", file=sys.stderr)


_now_token = F.token


# -- History -----------------------------------------------------------------------------


class History(CommitPipeline):
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

    Use it as a context manager, or call :meth:`close`, so pending commits
    are finished.  One ``History`` object is safe to share between threads;
    a forked child must open its own.
    """

    def __init__(self, path, *, mode: str = "a", chunk_bytes: int = F.DEFAULT_CHUNK_BYTES,
                 codec=None, capture: str = "hash", durable: bool = False,
                 max_pending_bytes: int = 1 << 30):
        if mode not in ("a", "r"):
            raise ValueError(f"mode must be 'a' (read/write) or 'r' (read only), got {mode!r}")
        if capture not in ("hash", "copy"):
            raise ValueError(f"capture must be 'hash' or 'copy', got {capture!r}")
        if not isinstance(chunk_bytes, int) or not 1 <= chunk_bytes <= 1 << 30:
            raise ValueError(f"chunk_bytes must be an int in 1..2**30, got {chunk_bytes!r}")
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
        self._graph_lock = FileLock(self._p(F.LOCKS, "graph.lock"), readonly=mode == "r")
        self._gc_lock = SharedExclusiveLock(self._p(F.LOCKS, "gc.lock"), readonly=mode == "r")
        self._refresh()
        self._head_branch: str | None = self._graph.head
        self._head_version: str | None = None  # when detached
        self._tip: dict[str, str] = {}  # branch -> this object's last pending commit on it
        _OPEN.add(self)

    # -- opening ----------------------------------------------------------------------

    def _p(self, *parts: str) -> str:
        return os.path.join(self.path, *parts)

    def _open(self) -> None:
        root = self._p("zarr.json")
        try:
            attrs = F.read_group_attrs(self.path, F.ROOT_KEY)
        except FileNotFoundError:
            attrs = None
        except (ValueError, KeyError) as err:
            kind = ""
            try:
                F.read_group_attrs(self.path, "vlcc_adjoint")
                kind = (" It is a ZarrTier checkpoint store (open it with "
                        "vlcc_adjoint.storage.ZarrTier; `vlcc inspect` summarises it).")
            except Exception:
                pass
            raise StorageError(f"{self.path} is not a lineage history ({err}).{kind} Give "
                               "History a new or empty directory, or the directory of one"
                               ) from None
        if attrs is not None:
            if not isinstance(attrs, dict) or attrs.get("format") != F.FORMAT:
                raise StorageError(
                    f"the history at {self.path} has format {attrs!r:.60}; this version of "
                    f"vlcc_adjoint reads format {F.FORMAT}; upgrade vlcc_adjoint")
            for d in (F.CHUNKS, F.VERSIONS, F.GRAPH):
                if not os.path.isdir(self._p(d)):
                    raise StorageError(f"the history at {self.path} lacks its {d}/ directory "
                                       "(an incomplete copy?); copy the whole directory")
            if self.mode == "a":
                for d in (F.LOCKS, F.SCRATCH):  # absent after an export of a read-only copy
                    self._ensure_group(d, {F.ROOT_KEY: d})
            return
        if self.mode == "r":
            raise StorageError(f"no lineage history at {self.path} (mode='r' does not create one); "
                               "check the path, or open with mode='a' to create it")
        existing = set(os.listdir(self.path)) if os.path.isdir(self.path) else set()
        if existing - _TOP:
            raise StorageError(
                f"{self.path} is not empty and not a lineage history (it holds "
                f"{sorted(existing - _TOP)[:5]}); give History a new or empty directory")
        # Create (or finish creating) the layout; the root zarr.json comes last and
        # is what makes the directory a repository.  Every file is created
        # exclusively, so processes creating it at once agree.
        try:
            os.makedirs(self.path, exist_ok=True)
            self._ensure_group(F.SCRATCH, {F.ROOT_KEY: "in-flight commits; never versions"})
            self._ensure_group(F.LOCKS, {F.ROOT_KEY: "flock(2) lock files"})
            self._ensure_group(F.CHUNKS, {F.ROOT_KEY: "content-addressed chunk files "
                                          "(chunks/<2 hex>/<30 hex>: xxh3-128); not zarr arrays"})
            self._ensure_group(F.VERSIONS, {F.ROOT_KEY: "one zarr group per version"})
            graph_path = self._p(F.GRAPH)
            os.makedirs(graph_path, exist_ok=True)
            self._create_file(os.path.join(graph_path, "zarr.json"), graph_file_text(Graph()))
            self._create_file(root, F.group_json({F.ROOT_KEY: {
                "format": F.FORMAT, "kind": "history",
                "layout": "chunks/: content-addressed chunk files; versions/<id>/: a zarr group "
                          "per version, an array per leaf (chunk files hard-linked); graph/: "
                          "the version DAG (networkx node-link JSON) in its attributes",
                "created": time.time()}}, indent=2))
        except OSError as err:
            raise StorageError(f"cannot create a history at {self.path}: {err}") from err

    def _ensure_group(self, name: str, attrs: dict) -> None:
        d = self._p(name)
        os.makedirs(d, exist_ok=True)
        self._create_file(os.path.join(d, "zarr.json"), F.group_json(attrs))

    def _create_file(self, path: str, data: bytes) -> None:
        """Create `path` with `data` unless it exists (atomic: via link of a temporary)."""
        if os.path.exists(path):
            return
        tmp = f"{path}.{_now_token()}.tmp"
        F.write_file(tmp, data, self.durable)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError:
            if not os.path.exists(path):
                os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    # -- the graph file --------------------------------------------------------------

    def _graph_file(self) -> str:
        return self._p(F.GRAPH, "zarr.json")

    # Installed Graph objects are never mutated (readers in other threads may be
    # iterating them): writers parse a private copy (_fresh), change it, write
    # it, and install it.

    @staticmethod
    def _stamp_of(st: os.stat_result) -> tuple:
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _parse_graph(self) -> tuple[Graph, tuple]:
        path = self._graph_file()
        try:
            with open(path, "rb") as f:
                stamp = self._stamp_of(os.fstat(f.fileno()))
                raw = f.read()
        except FileNotFoundError:
            raise StorageError(f"the graph file {path} of the history is missing; the directory "
                               "was damaged or partially copied") from None
        try:
            doc = json.loads(raw)
            if not (isinstance(doc, dict) and doc.get("zarr_format") == 3):
                raise ValueError("not a zarr v3 group")
            return Graph.from_json(doc["attributes"][F.GRAPH_KEY], self._frags), stamp
        except (ValueError, KeyError, TypeError) as err:
            raise StorageError(f"the graph file {path} of the history is damaged ({err}); "
                               "restore it from a copy of the repository") from None

    def _refresh(self) -> Graph:
        """The current graph, re-read if another process (or object) replaced it."""
        try:
            stamp = self._stamp_of(os.stat(self._graph_file()))
        except FileNotFoundError:
            stamp = None
        if stamp is None or stamp != self._stamp:
            graph, stamp = self._parse_graph()
            with self._lock:
                self._graph, self._stamp = graph, stamp
        return self._graph

    def _fresh(self) -> Graph:
        """A private, current copy of the graph to change (caller holds the graph lock)."""
        try:
            stamp = self._stamp_of(os.stat(self._graph_file()))
        except FileNotFoundError:
            stamp = None
        if stamp is not None and stamp == self._stamp:  # nobody wrote since we read it
            return self._graph.clone()
        graph, stamp = self._parse_graph()
        with self._lock:
            self._graph, self._stamp = graph, stamp
        return graph.clone()

    def _write_graph(self, g: Graph) -> None:
        """Replace the graph file with `g` and install `g` (caller holds the graph lock)."""
        tmp = self._p(F.SCRATCH, f"graph-{_now_token()}.json")
        F.write_file(tmp, graph_file_text(g), self.durable)
        stamp = self._stamp_of(os.stat(tmp))  # rename keeps inode, mtime and size
        os.replace(tmp, self._graph_file())
        if self.durable:
            F.fsync_dir(self._p(F.GRAPH))
        with self._lock:
            self._graph, self._stamp = g, stamp

    # -- housekeeping ------------------------------------------------------------------

    def _check(self, write: bool = False) -> None:
        if os.getpid() != self._pid:
            raise StorageError("this History was opened in another process (before a fork); "
                               "open a new History(path) in this process")
        if self._closed:
            raise StorageError(f"the History at {self.path} is closed; open it again")
        if write and self.mode == "r":
            raise StorageError(f"the History at {self.path} is open read-only (mode='r'); "
                               "open it with mode='a' to change it")
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            vid, err = errors[0]
            more = f" ({len(errors) - 1} later commits failed too)" if len(errors) > 1 else ""
            raise StorageError(
                f"commit of version {vid} to the history at {self.path} failed in the "
                f"background: {err}{more}; that version was not stored and is not in the "
                "history (commit the state again once the cause is fixed)") from err

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
            raise StorageError(f"commit of version {vid} to the history at {self.path} failed "
                               f"in the background: {err}; that version was not stored") from err

    def __enter__(self) -> "History":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- refs --------------------------------------------------------------------------

    @property
    def head(self) -> str | None:
        """The branch this object commits to, or ``None`` when detached (after
        ``checkout`` of a version or tag)."""
        return self._head_branch

    @property
    def head_version(self) -> str | None:
        """The id of the version HEAD points at (``None`` in an empty branch)."""
        self._sync()
        return self._head_id(self._graph)

    def _head_id(self, g: Graph) -> str | None:
        if self._head_branch is None:
            return self._head_version
        return g.branches.get(self._head_branch)

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

    def __contains__(self, ref) -> bool:
        try:
            self.resolve(ref)
        except KeyError:
            return False
        return True

    def resolve(self, ref="HEAD") -> str:
        """The version id a ref names.

        **Arguments:**

        - `ref`: a branch (its tip), a tag, a version id or a unique prefix of
          one (4+ characters), ``"HEAD"``, or any of these followed by ``~n``
          (``n`` first-parent steps back: ``"main~2"``), or a :class:`Version`.

        **Returns:** the version id; ``KeyError`` naming the known refs if none matches.
        """
        return self._resolve(self._sync(), ref)

    def _resolve(self, g: Graph, ref) -> str:
        if isinstance(ref, Version):
            ref = ref.id
        if not isinstance(ref, str):
            raise TypeError(f"refs are strings (branch, tag, version id) or Version objects, "
                            f"got {type(ref).__name__}")
        base, _, back = ref.partition("~")
        steps = 0
        if _:
            if not back.isdigit() and back != "":
                raise KeyError(f"bad ref {ref!r}: '~' must be followed by a number of steps")
            steps = int(back or 1)
        if base == "HEAD":
            vid = self._head_id(g)
            if vid is None:
                raise KeyError(f"HEAD (branch {self._head_branch!r}) has no versions yet; "
                               "commit a state first")
        elif base in g.branches:
            vid = g.branches[base]
        elif base in g.tags:
            vid = g.tags[base]
        elif base in g:
            vid = base
        else:
            matches = [v for v in g.nodes if len(base) >= 4 and v.startswith(base)]
            if len(matches) != 1:
                what = "is ambiguous" if matches else "names no branch, tag or version"
                raise KeyError(f"ref {base!r} {what}; branches: {sorted(g.branches)}, tags: "
                               f"{sorted(g.tags)} (ids: `vlcc log {self.path}`)")
            vid = matches[0]
        for _i in range(steps):
            parents = g.nodes[vid]["parents"]
            if not parents:
                raise KeyError(f"ref {ref!r} goes back past the first version")
            vid = parents[0]
        return vid

    # -- commit ------------------------------------------------------------------------

    def commit(self, state, message: str = "", meta: dict | None = None, *,
               branch: str | None = None, merge: Iterable = ()) -> str:
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
        """
        self._check(write=True)
        if not isinstance(message, str):
            raise TypeError(f"message must be a str, got {type(message).__name__}")
        meta = _json_meta(meta)
        created = time.time()
        merge = [merge] if isinstance(merge, (str, Version)) else list(merge)
        if merge:  # they may name this object's own pending commits
            self.wait()
        g = self._refresh()
        with self._lock:
            if branch is not None:
                check_name(branch, "branch")
            elif self._head_branch is None:
                raise ValueError(
                    f"HEAD is detached at version {self._head_version} (a version or tag was "
                    "checked out); commit onto a branch: commit(state, branch='name') creates it "
                    "there, or checkout a branch first")
            target = branch or self._head_branch
            base = self._tip.get(self._head_branch) or self._head_id(g) \
                if self._head_branch is not None else self._head_version
            merges = []
            for ref in merge:
                merges.append(self._resolve(g, ref))
            vid = secrets.token_hex(6)
            while vid in g or vid in self._pending:
                vid = secrets.token_hex(6)
        leaves, spec = flatten(state)
        t0 = time.perf_counter()
        self._gc_lock.acquire_shared()  # released when the version is published (or fails)
        try:
            job = self._capture(vid, leaves, spec)
        except BaseException:
            self._gc_lock.release_shared()
            raise
        job.branch, job.base, job.merge = target, base, merges
        job.message, job.meta, job.created = message, meta, created
        with self._cond:
            # Back-pressure: wait while the writer holds too many owned bytes.
            while self._pending and self._pending_bytes + job.owned_bytes > self.max_pending_bytes:
                self._cond.wait()
            self._pending[vid] = job
            self._pending_bytes += job.owned_bytes
            self._tip[target] = vid
            if branch is not None:
                self._head_branch, self._head_version = branch, None
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="vlcc-lineage-writer",
                                                daemon=True)
                self._worker.start()
            self._stats["commits"] += 1
            self._stats["caller_seconds"] += time.perf_counter() - t0
        self._queue.put(job)
        return vid

    # -- reading -----------------------------------------------------------------------

    def _manifest(self, vid: str) -> F.Manifest:
        with self._lock:
            m = self._manifests.get(vid)
            if m is not None:
                self._manifests.move_to_end(vid)
                return m
        try:
            attrs = F.read_group_attrs(self._p(F.VERSIONS, vid), F.ROOT_KEY)
            m = F.parse_manifest(vid, attrs)
        except FileNotFoundError:
            raise KeyError(f"version {vid} is not in the history at {self.path} (removed by gc?)"
                           ) from None
        except (ValueError, KeyError, TypeError) as err:
            raise CorruptCheckpointError(
                f"version {vid} of the history at {self.path} is corrupt: its manifest "
                f"versions/{vid}/zarr.json is unreadable ({err}); check out another version",
                key=vid, tier=f"lineage:{self.path}") from None
        with self._lock:
            self._manifests[vid] = m
            if len(self._manifests) > 1024:
                self._manifests.popitem(last=False)
        return m

    def _corrupt(self, m: F.Manifest, what: str) -> CorruptCheckpointError:
        step = m.meta.get("step")
        return CorruptCheckpointError(
            f"version {m.id} of the history at {self.path} is corrupt: {what}. The stored data "
            "was damaged or modified after it was committed; check out another version "
            "(`vlcc log` lists them) or restore the repository from a copy",
            key=m.id, tier=f"lineage:{self.path}", step=step if type(step) is int else None)

    def _read_chunk(self, m: F.Manifest, where: str, j: int, addr: str, layout, cfg,
                    out: memoryview | None) -> Any:
        """One chunk's raw bytes, verified (into `out` when it is a full chunk's slice)."""
        path = self._p(F.CHUNKS, addr[:2], addr[2:])
        n = layout.chunk_nbytes
        try:
            if cfg is None:
                if out is not None:
                    F.read_into(path, out)
                    data = out
                else:
                    data = F.read_file(path, n)
                    if len(data) != n:
                        raise ValueError(f"{len(data)} bytes, expected {n}")
            else:
                blob = F.read_file(path, n + n // 8 + 4096)
                data = F.decode_chunk(blob, cfg, n, out)
        except FileNotFoundError:
            raise self._corrupt(m, f"{where}, chunk {j} ({F.chunk_relpath(addr)}) is missing"
                                ) from None
        except ValueError as err:
            raise self._corrupt(m, f"{where}, chunk {j} ({F.chunk_relpath(addr)}) is damaged: "
                                f"{err}") from None
        got = F.address_of(data, F.codec_tag(cfg))
        if got != addr:
            raise self._corrupt(m, f"{where}, chunk {j} ({F.chunk_relpath(addr)}) has checksum "
                                f"{got}, its address says {addr}")
        return data

    def _read_leaf(self, m: F.Manifest, i: int, path: str) -> np.ndarray:
        layout, cfg, addrs = m.leaves[i]
        out = np.empty(layout.shape, layout.dtype)
        if layout.nchunks == 0:
            return out
        flat = byte_view(out)
        n = layout.chunk_nbytes
        where = f"leaf {path} (leaf {i}, {layout.dtype.str}{list(layout.shape)})"
        for j, ((off, valid, _), addr) in enumerate(zip(layout.spans(), addrs)):
            if valid == n:
                self._read_chunk(m, where, j, addr, layout, cfg, flat[off:off + n])
            else:
                data = self._read_chunk(m, where, j, addr, layout, cfg, None)
                flat[off:off + valid] = memoryview(data)[:valid]
        return out

    def _load(self, vid: str):
        m = self._manifest(vid)
        paths = leaf_paths(m.spec)
        with self._gc_lock.shared():
            if not os.path.isdir(self._p(F.VERSIONS, vid)):
                raise KeyError(f"version {vid} was removed from {self.path} by gc")
            leaves = [self._read_leaf(m, i, paths.get(i, f"#{i}")) for i in range(len(m.leaves))]
        return unflatten(m.spec, leaves)

    def checkout(self, ref="HEAD"):
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

    def load(self, ref="HEAD"):
        """The state of a version, without moving HEAD (see :meth:`checkout`)."""
        return self._load(self._resolve(self._sync(), ref))

    def version(self, ref="HEAD") -> Version:
        """The :class:`Version` a ref names."""
        g = self._sync()
        return g.version(self._resolve(g, ref))

    def leaves(self, ref="HEAD") -> list[LeafInfo]:
        """How a version's leaves are stored (path, dtype, shape, chunks, codec, zarr array)."""
        g = self._sync()
        vid = self._resolve(g, ref)
        m = self._manifest(vid)
        paths = leaf_paths(m.spec)
        return [LeafInfo(paths.get(i, f"#{i}"), layout.dtype.str, layout.shape, layout.nbytes,
                         layout.chunk_shape, layout.nchunks, cfg, f"{F.VERSIONS}/{vid}/{i}")
                for i, (layout, cfg, _) in enumerate(m.leaves)]

    # -- history queries ---------------------------------------------------------------

    def log(self, branch=None, *, all: bool = False, limit: int | None = None) -> list[Version]:
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

    def ancestors(self, ref="HEAD") -> list[Version]:
        """Every version `ref` descends from (not itself), newest first."""
        g = self._sync()
        return g.newest_first(g.ancestors(self._resolve(g, ref)))

    def descendants(self, ref="HEAD") -> list[Version]:
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
            meta = " ".join(f"{k}={_short(v.meta[k])}" for k in list(v.meta)[:4])
            text = v.message or ""
            if meta:
                text = f"{text} [{meta}]" if text else f"[{meta}]"
            return f"{v.id}{deco} {text}".rstrip()

        return "\n".join(render(versions, describe))

    # -- refs: branch and tag ----------------------------------------------------------

    def branch(self, name: str, at="HEAD", *, force: bool = False) -> str:
        """Create branch `name` at a version (``checkout(name)`` then switches to it).

        **Arguments:**

        - `name`: the new branch.
        - `at`: where it starts (a ref; default HEAD).
        - `force`: move an existing branch there (its later versions stay in
          the history until ``gc``).

        **Returns:** the id of the version the branch points at.
        """
        check_name(name, "branch")
        self._sync()
        self._check(write=True)
        with self._graph_lock.held():
            g = self._fresh()
            vid = self._resolve(g, at)
            if name in g.branches and not force and g.branches[name] != vid:
                raise ValueError(f"branch {name!r} exists (at {g.branches[name]}); pick another "
                                 "name, or pass force=True to move it")
            g.branches[name] = vid
            self._write_graph(g)
        return vid

    def delete_branch(self, name: str) -> None:
        """Remove branch `name` (its versions stay until a ``gc`` no longer keeps them)."""
        self._sync()
        self._check(write=True)
        with self._graph_lock.held():
            g = self._fresh()
            if name not in g.branches:
                raise KeyError(f"no branch {name!r}; branches: {sorted(g.branches)}")
            tip = g.branches.pop(name)
            self._write_graph(g)
        with self._lock:
            if self._head_branch == name:  # detach where the branch was
                self._head_branch, self._head_version = None, tip

    def tag(self, name: str, version="HEAD", *, force: bool = False) -> str:
        """Name a version (tags are kept by ``gc`` with ``KeepPolicy(tagged=True)``).

        **Returns:** the id of the tagged version.  An existing tag is moved
        only with ``force=True``.
        """
        check_name(name, "tag")
        self._sync()
        self._check(write=True)
        with self._graph_lock.held():
            g = self._fresh()
            vid = self._resolve(g, version)
            if name in g.tags and not force and g.tags[name] != vid:
                raise ValueError(f"tag {name!r} exists (on {g.tags[name]}); pick another name, "
                                 "or pass force=True to move it")
            g.tags[name] = vid
            self._write_graph(g)
        return vid

    def delete_tag(self, name: str) -> None:
        """Remove tag `name` (the version stays)."""
        self._sync()
        self._check(write=True)
        with self._graph_lock.held():
            g = self._fresh()
            if name not in g.tags:
                raise KeyError(f"no tag {name!r}; tags: {sorted(g.tags)}")
            del g.tags[name]
            self._write_graph(g)

    # -- diff and compare --------------------------------------------------------------

    def diff(self, a, b) -> Diff:
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

    def compare(self, a, b, rtol: float = 0.0, atol: float = 0.0, *, other: "History | None" = None
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
            raise ValueError(f"rtol and atol must be >= 0, got {rtol}, {atol}")
        return comparison(diff_states(self, a, b, float(rtol), float(atol), other),
                          float(rtol), float(atol))

    # -- gc ----------------------------------------------------------------------------

    def gc(self, keep: "KeepPolicy | int | None" = None, *, dry_run: bool = False) -> GCReport:
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
        return Usage(len(g), len(g.branches), len(g.tags), chunks, chunk_bytes,
                     logical, tree_bytes(self.path, chunks_too=True))

    @property
    def stats(self) -> dict:
        """Counters of this object: ``commits``, ``caller_seconds`` (time spent in
        ``commit``), ``writer_seconds`` (background), ``new_bytes`` (chunk bytes written)."""
        with self._lock:
            return dict(self._stats)

    def export(self, out) -> str:
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


def graph_file_text(g: Graph) -> bytes:
    """``graph/zarr.json``: a zarr group whose attributes hold the graph."""
    return ('{"zarr_format":3,"node_type":"group","attributes":{"%s":%s}}'
            % (F.GRAPH_KEY, g.dumps())).encode()


def _short(x) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    text = json.dumps(x)
    return text if len(text) <= 24 else text[:21] + "..."
