"""Reading versions: manifests (sealed, validated) and chunks (bounded, verified).

:class:`Reader` is the read half of :class:`~vlcc_adjoint.lineage.History`.  A version is read
in this order, and nothing is interpreted before it is checked:

1. Its manifest ``versions/<id>/zarr.json`` (a real directory, a regular
   file, at most :data:`~vlcc_adjoint.storage.format.MAX_METADATA_BYTES`),
   whose seal must match, and match the digest the (sealed) graph records
   for the version (:func:`vlcc_adjoint.storage.format.unseal`).  Then its structure is validated
   (:func:`._format.parse_manifest`: dtypes from an allow-list, shapes and
   chunk grids consistent).
2. The bytes a load will allocate, the sum of its leaves plus a chunk, are
   checked *before* anything is allocated against the memory this process
   may use (:func:`memory_limit`): a crafted manifest that points thousands
   of times at one small compressed chunk of zeros cannot make a load
   allocate more than the machine has.
3. Every chunk: its file must be a regular file in a real
   ``chunks/<2 hex>/`` directory, of exactly the size a raw chunk has
   (compressed: at most its bound, and the Blosc header's sizes must agree
   before it is decoded, so decompression never produces more than the
   declared bytes), and the xxh3-128 of what it decodes to must be its
   address.

Every failure is a :class:`~vlcc_adjoint.storage.CorruptCheckpointError`
naming the version and the damaged file (``path``), or a
:class:`~vlcc_adjoint.storage.StorageError` for an I/O failure or a load
larger than this process may allocate.  Loading imports and executes
nothing: types named in a spec are rebuilt only when the reading process
registered them (:func:`vlcc_adjoint.state.unflatten`).
"""

from __future__ import annotations

import collections
import os
import resource
import time
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from ..errors import VlccIndexError, VlccKeyError, VlccValueError
from ..state import UnknownStateTypeError, byte_view, leaf_paths, unflatten
from ..storage import CorruptCheckpointError, StorageError
from ..storage import format as SF
from . import _format as F
from ._chunks import ChunkStore
from ._format import Layout, Manifest
from ._repo import Repository

__all__ = ["Reader", "compressed_bound", "memory_limit"]


def compressed_bound(n: int) -> int:
    """The most bytes a compressed chunk of `n` raw bytes may have on disk
    (Blosc1: `n` + 16 + its header; with room to spare)."""
    return n + n // 8 + 4096


_LIMIT_CACHE: list[float] = [0.0, 0.0]  # [time, bytes]


def memory_limit() -> int:
    """The most bytes one load may allocate in this process.

    The least of: the machine's physical memory
    (:func:`~vlcc_adjoint.storage.format.allocation_limit`), the memory
    available now (Linux ``MemAvailable``), and what the process's address
    space and data limits (``RLIMIT_AS``, ``RLIMIT_DATA``) leave beyond what
    it maps already.  Recomputed at most every half second.
    """
    now = time.monotonic()
    if now - _LIMIT_CACHE[0] < 0.5:
        return int(_LIMIT_CACHE[1])
    limit = SF.allocation_limit()
    try:
        with open("/proc/meminfo", "rb") as f:  # not a store file: the kernel's
            for line in f.read(1 << 16).splitlines():
                if line.startswith(b"MemAvailable:"):
                    limit = min(limit, int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    mapped = 0
    try:
        with open("/proc/self/statm", "rb") as f:
            mapped = int(f.read(256).split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    for which in (resource.RLIMIT_AS, getattr(resource, "RLIMIT_DATA", None)):
        if which is None:
            continue
        soft, _hard = resource.getrlimit(which)
        if soft != resource.RLIM_INFINITY:
            limit = min(limit, max(0, soft - mapped))
    _LIMIT_CACHE[:] = [now, float(limit)]
    return limit


class Reader:
    """Reads and verifies the versions of a repository (see the module docstring).

    **Arguments:** `repo`, the :class:`~._repo.Repository`; `chunks`, its
    :class:`~._chunks.ChunkStore`.  Manifests are cached (the last 1024 read),
    guarded by the repository's instance lock.
    """

    def __init__(self, repo: Repository, chunks: ChunkStore) -> None:
        self.repo = repo
        self.chunks = chunks
        self._manifests: collections.OrderedDict[str, Manifest] = collections.OrderedDict()

    def reading(self) -> AbstractContextManager[object]:
        """Hold the versions against removal while reading them (``gc.lock``
        shared: gc waits for this reader, in any process)."""
        return self.repo.gc_lock.shared()

    def forget(self, vids: set[str]) -> None:
        """Drop the cached manifests of versions `vids` (removed by gc)."""
        with self.repo.lock:
            for vid in vids:
                self._manifests.pop(vid, None)

    def manifest(self, vid: str) -> Manifest:
        """The manifest of version `vid`: sealed, matching the digest the graph
        records for it, validated (:func:`._format.parse_manifest`)."""
        repo = self.repo
        with repo.lock:
            m = self._manifests.get(vid)
            if m is not None:
                self._manifests.move_to_end(vid)
                return m
            node = repo.graph.nodes.get(vid)
        vdir = repo.p(F.VERSIONS, vid)
        path = os.path.join(vdir, "zarr.json")
        try:
            SF.check_dir(vdir)
            attrs = SF.open_group(path, F.ROOT_KEY)
            if attrs is None:
                raise SF.corrupt_file(path, f"has no {F.ROOT_KEY!r} attributes")
            expected = node.get("digest") if node is not None else None
            if (
                expected is not None
                or not isinstance(attrs, dict)
                or attrs.get("format") != 1
                or "digest" in attrs
            ):
                attrs = SF.unseal(attrs, path, f"the manifest of version {vid}", expected)
            m = F.parse_manifest(vid, attrs)
        except FileNotFoundError:
            if vid in repo.refresh():
                raise CorruptCheckpointError(
                    f"version {vid} of the history at {repo.path} is corrupt: its manifest "
                    f"{path} is missing; check out another version or restore the repository "
                    "from a copy",
                    key=vid,
                    tier=f"lineage:{repo.path}",
                    path=path,
                ) from None
            raise VlccKeyError(
                f"version {vid} is not in the history at {repo.path} (removed by gc?)"
            ) from None
        except CorruptCheckpointError as err:
            raise CorruptCheckpointError(
                f"version {vid} of the history at {repo.path} is corrupt: {err}; check out "
                "another version",
                key=vid,
                tier=f"lineage:{repo.path}",
                path=err.path or path,
            ) from None
        except (ValueError, KeyError, TypeError, RecursionError) as err:
            raise CorruptCheckpointError(
                f"version {vid} of the history at {repo.path} is corrupt: its manifest "
                f"{path} is invalid ({err}); check out another version",
                key=vid,
                tier=f"lineage:{repo.path}",
                path=path,
            ) from None
        except OSError as err:
            raise StorageError(
                f"reading the manifest {path} of version {vid} failed: {err}"
            ) from err
        with repo.lock:
            self._manifests[vid] = m
            if len(self._manifests) > 1024:
                self._manifests.popitem(last=False)
        return m

    def corrupt(self, m: Manifest, what: str, path: str | None = None) -> CorruptCheckpointError:
        """The error of damaged data `what` of version `m` (in the file `path`)."""
        step = m.meta.get("step")
        where = f" (file {path})" if path is not None and path not in what else ""
        return CorruptCheckpointError(
            f"version {m.id} of the history at {self.repo.path} is corrupt: {what}{where}. The "
            "stored data was damaged or modified after it was committed; check out another version "
            "(`vlcc log` lists them) or restore the repository from a copy",
            key=m.id,
            tier=f"lineage:{self.repo.path}",
            step=step if type(step) is int else None,
            path=path,
        )

    def check_alloc(self, m: Manifest, nbytes: int, what: str) -> None:
        """Refuse to allocate `nbytes` for `what` of version `m` beyond :func:`memory_limit`."""
        limit = memory_limit()
        if nbytes <= limit:
            return
        manifest = self.repo.p(F.VERSIONS, m.id, "zarr.json")
        try:  # more than the machine has: no real checkpoint of this machine declares that
            SF.check_allocation(nbytes, manifest, what)
        except CorruptCheckpointError as err:
            raise self.corrupt(m, str(err), manifest) from None
        raise StorageError(
            f"version {m.id} of the history at {self.repo.path}: {what} needs {nbytes} bytes, "
            f"more than the {limit} bytes this process may allocate now (free memory and "
            "the process's resource limits); load it where more memory is available"
        )

    def read_chunk(
        self,
        m: Manifest,
        where: str,
        j: int,
        addr: str,
        layout: Layout,
        cfg: dict | None,
        out: memoryview | None,
    ) -> Any:
        """Chunk `j` (address `addr`) of a leaf of version `m`: its raw bytes,
        verified (into `out` when it is a full chunk's slice).  `where` names
        the leaf in messages."""
        if not self.chunks.deltas:
            try:
                return self._read_full_chunk(m, where, j, addr, layout, cfg, out)
            except CorruptCheckpointError:
                # Another process may have turned deltas on since this one opened.
                if not self.chunks.recheck_deltas():
                    raise
        return self._read_resolved(m, where, j, addr, layout, cfg, out)

    def _read_full_chunk(
        self,
        m: Manifest,
        where: str,
        j: int,
        addr: str,
        layout: Layout,
        cfg: dict | None,
        out: memoryview | None,
    ) -> Any:
        """:meth:`read_chunk` in a repository without delta chunks."""
        rel = F.chunk_relpath(addr)
        path = self.repo.p(rel)
        n = layout.chunk_nbytes
        bound = compressed_bound(n)
        if cfg is not None:
            self.check_alloc(m, bound + (n if out is None else 0), f"{where}, chunk {j}")
        elif out is None:
            self.check_alloc(m, n, f"{where}, chunk {j}")
        data: Any
        try:
            # The loose file (in a real directory, never through a link), else a pack's entry.
            if cfg is None:
                if out is not None:
                    path = self.chunks.read_into(addr, out)
                    data = out
                else:
                    data, path = self.chunks.read_blob(addr, n)
                    if len(data) != n:
                        raise VlccValueError(f"{len(data)} bytes, its metadata says {n}")
            else:
                blob, path = self.chunks.read_blob(addr, bound)
                data = F.decode_chunk(blob, cfg, n, out)
        except FileNotFoundError:
            raise self.corrupt(m, f"{where}, chunk {j} ({rel}) is missing", path) from None
        except CorruptCheckpointError as err:
            raise self.corrupt(
                m, f"{where}, chunk {j} ({rel}) is damaged: {err}", err.path or path
            ) from None
        except ValueError as err:
            raise self.corrupt(m, f"{where}, chunk {j} ({rel}) is damaged: {err}", path) from None
        except OSError as err:
            raise StorageError(
                f"reading {where}, chunk {j} of version {m.id} from {path} failed: {err}"
            ) from err
        got = F.address_of(data, F.codec_tag(cfg))
        if got != addr:
            raise self.corrupt(
                m, f"{where}, chunk {j} ({rel}) has checksum {got}, its address says {addr}", path
            )
        return data

    def _read_resolved(
        self,
        m: Manifest,
        where: str,
        j: int,
        addr: str,
        layout: Layout,
        cfg: dict | None,
        out: memoryview | None,
    ) -> Any:
        """:meth:`read_chunk` in a repository with delta chunks: the chain of delta
        objects is resolved and verified (:class:`._delta.Resolver`)."""
        rel = F.chunk_relpath(addr)
        path = self.repo.p(rel)
        n = layout.chunk_nbytes
        self.check_alloc(m, 2 * n + compressed_bound(n), f"{where}, chunk {j}")
        try:
            raw, _, _ = self.chunks.resolver.get(addr, n, cfg)
        except FileNotFoundError as err:
            raise self.corrupt(
                m, f"{where}, chunk {j} ({rel}) or a base it needs is missing", err.filename or path
            ) from None
        except CorruptCheckpointError as err:
            raise self.corrupt(
                m, f"{where}, chunk {j} ({rel}) is damaged: {err}", err.path or path
            ) from None
        except OSError as err:
            raise StorageError(
                f"reading {where}, chunk {j} of version {m.id} from {path} failed: {err}"
            ) from err
        if out is None:
            return raw
        out[:] = memoryview(raw).cast("B") if isinstance(raw, bytes) else raw.data.cast("B")
        return out

    def read_leaf(self, m: Manifest, i: int, path: str) -> np.ndarray:
        """Leaf `i` of version `m` (named `path` in messages), every chunk verified."""
        layout, cfg, addrs = m.leaves[i]
        where = f"leaf {path} (leaf {i}, {layout.dtype.str}{list(layout.shape)})"
        self.check_alloc(m, layout.nbytes, where)  # diff reads single leaves
        out = np.empty(layout.shape, layout.dtype)
        if layout.nchunks == 0:
            return out
        flat = byte_view(out)
        n = layout.chunk_nbytes
        for j, ((off, valid, _), addr) in enumerate(zip(layout.spans(), addrs)):
            if valid == n:
                self.read_chunk(m, where, j, addr, layout, cfg, flat[off : off + n])
            else:
                data = self.read_chunk(m, where, j, addr, layout, cfg, None)
                flat[off : off + valid] = memoryview(data)[:valid]
        return out

    def read_rows(self, m: Manifest, index: int, rows: tuple[int, int] | None) -> np.ndarray:
        """Leaf `index` of version `m`, or its rows ``start:stop`` along the first
        axis (only the chunks holding them are read), verified (``History.read_leaf``)."""
        if not (type(index) is int and 0 <= index < len(m.leaves)):
            raise VlccIndexError(f"version {m.id} has {len(m.leaves)} leaves, not a leaf {index!r}")
        layout, cfg, addrs = m.leaves[index]
        if rows is None:
            with self.reading():
                self._check_present(m.id)
                return self.read_leaf(m, index, f"#{index}")
        start, stop = rows
        if not (
            layout.shape
            and type(start) is int
            and type(stop) is int
            and 0 <= start <= stop <= layout.shape[0]
        ):
            raise VlccIndexError(
                f"rows {rows!r} are not a range of leaf {index} of version {m.id} "
                f"(shape {list(layout.shape)})"
            )
        where = f"leaf #{index} ({layout.dtype.str}{list(layout.shape)}), rows {start}:{stop}"
        out_shape = (stop - start,) + tuple(layout.shape[1:])
        row_bytes = layout.nbytes // layout.shape[0] if layout.shape[0] else 0
        self.check_alloc(m, row_bytes * (stop - start), where)
        out = np.empty(out_shape, layout.dtype)
        lo, hi = start * row_bytes, stop * row_bytes
        if hi == lo:
            return out
        flat = byte_view(out)
        with self.reading():
            self._check_present(m.id)
            for j, ((off, valid, _), addr) in enumerate(zip(layout.spans(), addrs)):
                if off + valid <= lo or off >= hi:
                    continue
                data = self.read_chunk(m, where, j, addr, layout, cfg, None)
                a, b = max(lo, off), min(hi, off + valid)
                flat[a - lo : b - lo] = memoryview(data).cast("B")[a - off : b - off]
        return out

    def _check_present(self, vid: str) -> None:
        """Raise ``KeyError`` if version `vid` was removed (by gc) since its
        manifest was read (caller holds the gc lock shared)."""
        if not os.path.lexists(self.repo.p(F.VERSIONS, vid)):
            raise VlccKeyError(f"version {vid} was removed from {self.repo.path} by gc")

    def load(self, vid: str) -> Any:
        """The state of version `vid`, rebuilt with the types it was committed with."""
        m = self.manifest(vid)
        paths = leaf_paths(m.spec)
        # Everything the load allocates, checked before the first allocation.
        biggest = max((layout.chunk_nbytes for layout, _, _ in m.leaves), default=0)
        self.check_alloc(
            m, m.nbytes + 2 * biggest, f"its {len(m.leaves)} arrays ({m.nbytes} bytes declared)"
        )
        with self.reading():
            self._check_present(vid)
            leaves = [self.read_leaf(m, i, paths.get(i, f"#{i}")) for i in range(len(m.leaves))]
        try:
            return unflatten(m.spec, leaves)
        except UnknownStateTypeError:
            raise
        except (ValueError, KeyError, IndexError, TypeError, RecursionError) as err:
            raise self.corrupt(
                m,
                f"its state spec does not rebuild ({err})",
                self.repo.p(F.VERSIONS, vid, "zarr.json"),
            ) from None
