"""A repository's directory: opening and creating it, its root, its graph file, its locks.

:class:`Repository` is the part of :class:`~vlcc_adjoint.lineage.History`
that knows the repository's top level (``zarr.json``, ``chunks/``,
``versions/``, ``graph/``, ``locks/``, ``scratch/``), reads and replaces
the root and the graph file (sealed, see :mod:`._graph`), holds the two
inter-process locks (:mod:`._locks`) and sweeps what interrupted writers
left in ``scratch/``.  Every file is opened through
:mod:`vlcc_adjoint.storage.format`: regular files only, never through a
link, reads bounded.  The top-level directories are checked to be real
directories (not links) when the repository is opened, so nothing a
``History`` writes or deletes can lie outside its root.

Installed :class:`~._graph.Graph` objects are never mutated (readers in
other threads may be iterating them): a writer takes a private copy
(:meth:`Repository.fresh`) under the graph lock, changes it, and
:meth:`Repository.write_graph` writes and installs it.
"""

from __future__ import annotations

import os
import stat
import threading
import time

from ..storage import CorruptCheckpointError, StorageError
from ..storage import format as SF
from . import _format as F
from ._graph import Graph, graph_file, read_graph_file
from ._locks import FileLock, SharedExclusiveLock

__all__ = ["Repository"]

TOP = frozenset({"zarr.json", F.CHUNKS, F.VERSIONS, F.GRAPH, F.LOCKS, F.SCRATCH, F.PACKS})

#: What identifies one version of the graph file: inode, modification time, size.
Stamp = tuple[int, int, int]


def _stamp_of(st: os.stat_result) -> Stamp:
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class Repository:
    """The directory of a lineage repository (see the module docstring).

    **Arguments:**

    - `path`: the repository directory (created with its layout when missing
      or empty and `mode` is ``"a"``).
    - `mode`: ``"a"`` (read and write) or ``"r"`` (read only).
    - `durable`: fsync what is written before it becomes visible.
    - `lock`: the instance lock of the ``History`` that owns this object,
      which guards the graph installed here (and the state of its other parts).

    **Attributes:** `path`, `mode`, `durable`, `lock`; `graph_lock` (the
    exclusive lock of graph rewrites) and `gc_lock` (the readers-writer lock
    of gc against commits and reads), both :mod:`._locks`.
    """

    def __init__(self, path: str, mode: str, durable: bool, lock: threading.RLock) -> None:
        self.path = path
        self.mode = mode
        self.durable = durable
        self.lock = lock
        self._graph = Graph()
        self._stamp: Stamp | None = None
        self._open()
        self.graph_lock = FileLock(self.p(F.LOCKS, "graph.lock"), readonly=mode == "r")
        try:
            self.gc_lock = SharedExclusiveLock(self.p(F.LOCKS, "gc.lock"), readonly=mode == "r")
        except BaseException:
            self.graph_lock.close()
            raise
        try:
            self.refresh()
            if mode == "a":
                self.sweep_scratch()
        except BaseException:
            self.close()
            raise

    def p(self, *parts: str) -> str:
        """A path inside the repository."""
        return os.path.join(self.path, *parts)

    def close(self) -> None:
        """Release the lock files (idempotent)."""
        self.graph_lock.close()
        self.gc_lock.close()

    # -- opening ----------------------------------------------------------------------

    def _open(self) -> None:
        try:
            st = os.stat(self.path)  # the root itself is the caller's path: links allowed
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise StorageError(
                f"{self.path} is not a directory; a History is a directory: give "
                "History a new path (it is created there) or the directory of a "
                "history"
            )
        attrs = self.root_attrs() if st is not None else None
        if attrs is not None:
            for d in (F.CHUNKS, F.VERSIONS, F.GRAPH):
                try:
                    SF.check_dir(self.p(d))
                except FileNotFoundError:
                    raise StorageError(
                        f"the history at {self.path} lacks its {d}/ directory "
                        "(an incomplete copy?); copy the whole directory"
                    ) from None
            if self.mode == "a":
                for d in (F.LOCKS, F.SCRATCH):  # absent after an export of a read-only copy
                    self._ensure_group(d, {F.ROOT_KEY: d})
                if attrs.get("format") != F.FORMAT:
                    self.write_root({**attrs, "format": F.FORMAT})  # seal a format 1 root
            elif os.path.lexists(self.p(F.LOCKS)):
                SF.check_dir(self.p(F.LOCKS))
            return
        if self.mode == "r":
            raise StorageError(
                f"no lineage history at {self.path} (mode='r' does not create one); "
                "check the path, or open with mode='a' to create it"
            )
        existing = set(os.listdir(self.path)) if st is not None else set()
        # The scratch files of a process creating the layout right now (or of one
        # that died while creating it) are part of a repository being made.
        foreign = {e for e in existing - TOP if SF.scratch_target(e) not in TOP}
        if foreign:
            raise StorageError(
                f"{self.path} is not empty and not a lineage history (it holds "
                f"{sorted(foreign)[:5]}); give History a new or empty directory"
            )
        # Create (or finish creating) the layout; the root zarr.json comes last and
        # is what makes the directory a repository.  Every file is created
        # exclusively, so processes creating it at once agree.
        try:
            os.makedirs(self.path, exist_ok=True)
            self._ensure_group(F.SCRATCH, {F.ROOT_KEY: "in-flight commits; never versions"})
            self._ensure_group(F.LOCKS, {F.ROOT_KEY: "flock(2) lock files"})
            self._ensure_group(
                F.CHUNKS,
                {
                    F.ROOT_KEY: "content-addressed chunk files "
                    "(chunks/<2 hex>/<30 hex>: xxh3-128); not zarr arrays"
                },
            )
            self._ensure_group(F.VERSIONS, {F.ROOT_KEY: "one zarr group per version"})
            graph_dir = self.p(F.GRAPH)
            SF.make_dir(graph_dir)
            SF.create_file(os.path.join(graph_dir, "zarr.json"), graph_file(Graph()), self.durable)
            SF.create_file(
                self.p("zarr.json"),
                F.root_document(
                    {
                        "format": F.FORMAT,
                        "kind": "history",
                        "layout": "chunks/: content-addressed chunk files; versions/<id>/: a zarr group "
                        "per version, an array per leaf (chunk files hard-linked); graph/: "
                        "the version DAG (networkx node-link JSON) in its attributes",
                        "created": time.time(),
                    }
                ),
                self.durable,
            )
        except OSError as err:
            raise StorageError(f"cannot create a history at {self.path}: {err}") from err
        self.root_attrs()  # what another process may have created meanwhile is one too

    def root_attrs(self) -> dict | None:
        """The root's attributes, verified (without their digest); ``None`` when
        there is no root ``zarr.json``."""
        root = self.p("zarr.json")
        try:
            attrs = SF.open_group(root, F.ROOT_KEY)
        except FileNotFoundError:
            return None
        except CorruptCheckpointError as err:
            raise CorruptCheckpointError(
                f"{self.path} is not a lineage history, or its root metadata is damaged ({err}); "
                "give History a new or empty directory, or the directory of a history "
                "(restore a damaged one from a copy)",
                path=root,
            ) from None
        if attrs is None:
            if SF.open_group(root, "vlcc_adjoint") is not None:
                raise StorageError(
                    f"{self.path} is not a lineage history: it is a ZarrTier checkpoint store "
                    "(open it with vlcc_adjoint.storage.ZarrTier; `vlcc inspect` summarises it)"
                )
            raise CorruptCheckpointError(
                f"{self.path} is not a lineage history, or its root metadata is damaged "
                f"({root} has no {F.ROOT_KEY!r} attributes); give History a new or empty "
                "directory, or the directory of a history (restore a damaged one from a copy)",
                path=root,
            )
        fmt = attrs.get("format") if isinstance(attrs, dict) else None
        if fmt == 2:
            attrs = SF.unseal(attrs, root, "the root metadata")
        elif fmt == 1 and "digest" not in attrs:
            pass  # written before seals
        else:
            raise CorruptCheckpointError(
                f"the history at {self.path} has format {fmt!r:.60} ({root}); this version of "
                f"vlcc_adjoint reads formats {', '.join(map(str, F.FORMATS))}: upgrade "
                "vlcc_adjoint, or restore the file from a copy if it was damaged",
                path=root,
            )
        if attrs.get("kind") != "history":
            raise CorruptCheckpointError(
                f"{root}: the root is not a history's (kind {attrs.get('kind')!r:.40})", path=root
            )
        return attrs

    def write_root(self, attrs: dict) -> None:
        """Replace the root ``zarr.json`` with `attrs`, sealed (atomically: other
        processes read the old root or the new one).  A writer that opens a
        format 1 root seals it as format 2 this way: it adds sealed versions and
        a sealed graph, which an older reader refuses, and the root's format
        number tells that reader why."""
        SF.write_atomic(self.p("zarr.json"), F.root_document(attrs), self.durable)

    def _ensure_group(self, name: str, attrs: dict) -> None:
        d = self.p(name)
        SF.make_dir(d)
        SF.create_file(os.path.join(d, "zarr.json"), SF.group_json(attrs), self.durable)

    def sweep_scratch(self) -> None:
        """Remove what interrupted writers left in ``scratch/`` (a writer's open).

        Only when no commit or read is in flight in any process (``gc.lock``
        free, taken exclusive without waiting) and no graph is being replaced
        (``graph.lock``): then every scratch entry is a dead writer's.
        """
        with self.gc_lock.exclusive_nowait() as got:
            if not got:
                return
            with self.graph_lock.held():
                for entry in os.scandir(self.p(F.SCRATCH)):
                    # scratch/zarr.json, and its scratch files: another process
                    # opening the history may be creating it right now (create_file
                    # removes its own; no lock covers the opening).
                    if "zarr.json" not in (entry.name, SF.scratch_target(entry.name)):
                        self.remove(entry.path)

    def remove(self, path: str) -> None:
        """Remove the entry `path` inside the repository (a directory with its
        contents; a file or link by unlinking it, never what a link points to);
        failures leave it for a later sweep."""
        try:
            SF.remove_tree(path, self.path)
        except OSError:
            pass

    # -- the graph file --------------------------------------------------------------

    @property
    def graph(self) -> Graph:
        """The graph installed last (as read by :meth:`refresh`; never mutated)."""
        return self._graph

    def _graph_file(self) -> str:
        return self.p(F.GRAPH, "zarr.json")

    def _graph_stamp(self) -> Stamp | None:
        try:
            return _stamp_of(os.lstat(self._graph_file()))
        except FileNotFoundError:
            return None

    def _parse_graph(self) -> tuple[Graph, Stamp | None]:
        path = self._graph_file()
        # The stamp is taken before the read: a replacement in between makes the
        # next refresh read again (a stamp taken after could hide it).
        stamp = self._graph_stamp()
        try:
            raw = SF.read_limited(path, SF.MAX_METADATA_BYTES)
            return read_graph_file(raw, path), stamp
        except FileNotFoundError:
            raise CorruptCheckpointError(
                f"the graph file {path} of the history is missing; the directory was damaged "
                "or partially copied",
                path=path,
            ) from None
        except CorruptCheckpointError as err:
            raise CorruptCheckpointError(
                f"the graph file of the history is damaged: {err}; restore it from a copy of "
                "the repository",
                path=path,
            ) from None
        except (ValueError, KeyError, TypeError) as err:
            raise CorruptCheckpointError(
                f"the graph file {path} of the history is damaged ({err}); restore it from a "
                "copy of the repository",
                path=path,
            ) from None

    def read_graph(self) -> Graph:
        """The graph file read and verified now, whatever is installed (``vlcc
        verify`` reads every byte from disk); not installed.  Damage raises
        :class:`~vlcc_adjoint.storage.CorruptCheckpointError` naming the file."""
        return self._parse_graph()[0]

    def graph_path(self) -> str:
        """The graph file's path."""
        return self._graph_file()

    def refresh(self) -> Graph:
        """The current graph, re-read if another process (or object) replaced it."""
        stamp = self._graph_stamp()
        if stamp is None or stamp != self._stamp:
            graph, stamp = self._parse_graph()
            with self.lock:
                self._graph, self._stamp = graph, stamp
        return self._graph

    def fresh(self) -> Graph:
        """A private, current copy of the graph to change (caller holds the graph lock)."""
        stamp = self._graph_stamp()
        if stamp is not None and stamp == self._stamp:  # nobody wrote since we read it
            return self._graph.clone()
        graph, stamp = self._parse_graph()
        with self.lock:
            self._graph, self._stamp = graph, stamp
        return graph.clone()

    def write_graph(self, g: Graph) -> None:
        """Replace the graph file with `g` and install `g` (caller holds the graph lock)."""
        st = SF.write_atomic(
            self._graph_file(), graph_file(g), self.durable, scratch=self.p(F.SCRATCH)
        )
        with self.lock:
            self._graph, self._stamp = g, _stamp_of(st)  # rename keeps inode, mtime and size
