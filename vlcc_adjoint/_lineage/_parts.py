"""Versions written by several processes: stage parts, then commit them once.

``History.commit`` takes a whole state in one process.  A distributed save
(several ranks, each holding a shard) needs the version split in two steps:

1. **Stage** (every process, :meth:`Parts.stage`).  Each process cuts its
   arrays into chunks (:mod:`._format`), hashes them and writes the chunks
   the repository lacks into ``chunks/`` (deduplicated, and, in a delta
   repository, as deltas against the chunks of a base version's leaves).
   It returns one JSON *leaf entry* per array (layout, codec, chunk
   addresses): small enough to send to one process.  Nothing is visible.
2. **Commit** (one process, :meth:`Parts.commit_staged`).  The leaf entries
   of every process are assembled into one version group in ``scratch/``
   (hard links to the staged chunks) and published exactly as ``commit``
   publishes (:mod:`._commit`, step 3): under ``locks/graph.lock``, with the
   branch's tip at that moment as parent.  The version becomes visible at
   once and for every process, or not at all.

A failure anywhere before step 2 leaves only unreferenced chunk files,
which ``gc`` sweeps: never a partial version.  Chunks are protected from a
concurrent ``gc`` while they are staged and while the version is assembled
(``locks/gc.lock`` held shared); between the two steps, a ``gc`` that
removes a staged chunk makes step 2 fail (the chunk is missing) rather than
publish a version without it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Sequence

import numpy as np

from ..errors import VlccIndexError, VlccKeyError, VlccTypeError, VlccValueError
from ..state import byte_view
from ..storage import format as SF
from . import _format as F
from ._commit import _Job, _json_meta, _LeafJob

__all__ = ["Parts"]


def _parse_entry(entry) -> tuple:
    """A leaf entry from :meth:`Parts.stage`, validated (``ValueError`` saying what is wrong)."""
    if not isinstance(entry, dict):
        raise VlccValueError(
            f"a leaf entry is a dict from History.stage, got {type(entry).__name__}"
        )
    layout = F.layout_from_json(entry)
    cfg = F.check_codec_config(entry.get("codec"))
    addrs = entry.get("chunks")
    if not (
        isinstance(addrs, list)
        and len(addrs) == layout.nchunks
        and all(F.is_address(a) for a in addrs)
    ):
        raise VlccValueError("a leaf entry's chunk list does not match its chunk grid")
    return layout, cfg, addrs


class Parts:
    """Staged, multi-process commits of :class:`~vlcc_adjoint.lineage.History` (a mixin;
    see the module docstring)."""

    @property
    def deltas(self) -> bool:
        """Whether this repository stores changed chunks as deltas (see ``History``'s `deltas`)."""
        return bool(self._deltas)

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
        arrays = list(arrays)
        parent = None
        if base is not None and self._deltas:
            if base_leaves is None or len(base_leaves) != len(arrays):
                raise VlccValueError("base_leaves must give one leaf index (or None) per array")
            g = self._refresh()
            parent = self._manifest(self._resolve(g, base)).leaves
        out = []
        with self._gc_lock.shared():
            for i, leaf in enumerate(arrays):
                if not isinstance(leaf, np.ndarray):
                    raise VlccTypeError(f"array {i} is a {type(leaf).__name__}; stage numpy arrays")
                layout = F.plan_layout(leaf.dtype, leaf.shape, self.chunk_bytes)
                cfg = F.codec_config(self.codec, layout.dtype.itemsize)
                tag = F.codec_tag(cfg)
                bases = None
                if (
                    parent is not None
                    and base_leaves[i] is not None
                    and 0 <= base_leaves[i] < len(parent)
                ):
                    blayout, bcfg, baddrs = parent[base_leaves[i]]
                    if (
                        blayout.dtype == layout.dtype
                        and blayout.shape == layout.shape
                        and bcfg == cfg
                        and len(baddrs) == layout.nchunks
                    ):
                        bases = baddrs
                addrs: list[str] = []
                written = 0
                if layout.nchunks:
                    flat = byte_view(np.ascontiguousarray(leaf).reshape(leaf.shape))
                    n = layout.chunk_nbytes
                    for j, (off, valid, _key) in enumerate(layout.spans()):
                        if valid == n:
                            data = flat[off : off + n]
                        else:  # an edge chunk, padded with zeros as zarr stores it
                            data = np.zeros(n, np.uint8)
                            data[:valid] = flat[off : off + valid]
                        addr = F.address_of(data, tag)
                        addrs.append(addr)
                        if not os.path.lexists(self._p(F.chunk_relpath(addr))):
                            written += self._store_chunk(
                                addr, data, cfg, bases[j] if bases else None, layout
                            )
                entry = F.leaf_entry(layout, cfg, addrs)
                entry["written"] = written
                out.append(entry)
        with self._lock:
            self._stats["new_bytes"] += sum(e["written"] for e in out)
        return out

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
        if not isinstance(message, str):
            raise VlccTypeError(f"message must be a str, got {type(message).__name__}")
        meta = _json_meta(meta)
        if not (
            isinstance(spec, dict)
            and isinstance(spec.get("leaves"), list)
            and len(spec["leaves"]) == len(leaves)
        ):
            raise VlccValueError("spec must be a state spec with one leaf per staged entry")
        jobs = []
        new_bytes = 0
        for entry in leaves:
            layout, cfg, addrs = _parse_entry(entry)
            lj = _LeafJob(layout, cfg, F.codec_tag(cfg))
            lj.addrs = list(addrs)
            jobs.append(lj)
            written = entry.get("written", 0)
            new_bytes += written if type(written) is int and written > 0 else 0
        self.wait()  # this object's own commits first: they may be this branch's tip
        g = self._refresh()
        with self._lock:
            target = self._target_branch(branch, "; commit onto a branch (branch='name')")
            base = self._head_id(g) if self._head_branch is not None else self._head_version
            if at is not None and target not in g.branches:
                base = self._resolve(g, at)
            vid = secrets.token_hex(6)
            while vid in g:
                vid = secrets.token_hex(6)
        job = _Job(
            id=vid,
            spec=spec,
            leaves=jobs,
            nbytes=sum(lj.layout.nbytes for lj in jobs),
            owned_bytes=0,
            inflight=[],
            branch=target,
            base=base,
            merge=[],
            message=message,
            meta=meta,
            created=time.time(),
            spent=[],
        )
        with self._gc_lock.shared():
            work = self._p(F.SCRATCH, f"v-{vid}-{F.token()}")
            os.mkdir(work)
            try:
                for i, lj in enumerate(jobs):
                    leaf_dir = f"{work}/{i}"
                    os.mkdir(leaf_dir)
                    SF.write_file(
                        f"{leaf_dir}/zarr.json",
                        F.array_meta(lj.layout, lj.cfg),
                        self.durable,
                        exclusive=True,
                    )
                    for (_, _, key), addr in zip(lj.layout.spans(), lj.addrs):
                        self._link(addr, f"{leaf_dir}/{key}")
                    if self.durable:
                        SF.fsync_dir(leaf_dir)
                self._publish(job, work, new_bytes)
            except BaseException:
                shutil.rmtree(work, ignore_errors=True)
                raise
        with self._lock:
            if branch is not None:
                self._head_branch, self._head_version = branch, None
            self._tip.pop(target, None)
            self._stats["commits"] += 1
        self._refresh()
        return vid

    def read_leaf(self, ref: str, index: int, rows: tuple[int, int] | None = None) -> np.ndarray:
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
        g = self._sync()
        vid = self._resolve(g, ref)
        m = self._manifest(vid)
        if not (type(index) is int and 0 <= index < len(m.leaves)):
            raise VlccIndexError(f"version {vid} has {len(m.leaves)} leaves, not a leaf {index!r}")
        layout, cfg, addrs = m.leaves[index]
        if rows is not None:
            start, stop = rows
            if not (
                layout.shape
                and type(start) is int
                and type(stop) is int
                and 0 <= start <= stop <= layout.shape[0]
            ):
                raise VlccIndexError(
                    f"rows {rows!r} are not a range of leaf {index} of version {vid} "
                    f"(shape {list(layout.shape)})"
                )
        with self._gc_lock.shared():
            if not os.path.lexists(self._p(F.VERSIONS, vid)):
                raise VlccKeyError(f"version {vid} was removed from {self.path} by gc")
            if rows is None:
                return self._read_leaf(m, index, f"#{index}")
            where = f"leaf #{index} ({layout.dtype.str}{list(layout.shape)}), rows {start}:{stop}"
            out_shape = (stop - start,) + tuple(layout.shape[1:])
            row_bytes = layout.nbytes // layout.shape[0] if layout.shape[0] else 0
            self._check_alloc(m, row_bytes * (stop - start), where)
            out = np.empty(out_shape, layout.dtype)
            lo, hi = start * row_bytes, stop * row_bytes
            if hi == lo:
                return out
            flat = byte_view(out)
            for j, ((off, valid, _), addr) in enumerate(zip(layout.spans(), addrs)):
                if off + valid <= lo or off >= hi:
                    continue
                data = self._read_chunk(m, where, j, addr, layout, cfg, None)
                a, b = max(lo, off), min(hi, off + valid)
                flat[a - lo : b - lo] = memoryview(data).cast("B")[a - off : b - off]
            return out

    def leaf_count(self, ref: str) -> int:
        """The number of leaves of a version (its manifest is read and verified)."""
        g = self._sync()
        return len(self._manifest(self._resolve(g, ref)).leaves)
