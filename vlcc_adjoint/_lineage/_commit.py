"""How ``History.commit`` turns a state into a durable, visible version.

1. **Capture** (``commit``, in the caller's thread).  The state is
   flattened (:func:`vlcc_adjoint.state.flatten`) and each leaf cut into
   chunks (:mod:`._format`).  With ``capture="hash"`` (the default) each
   chunk is hashed where it lies (xxh3-128, 6-10 GB/s on one core) and only
   the chunks the repository does not hold yet are copied: a state whose big
   leaves did not change costs a hash, not a copy.  With ``capture="copy"``
   every leaf is copied (into reused buffers) and hashing happens in the
   background: less time in the caller when everything changes at every
   commit, more when little does.  Either way ``commit`` returns once the
   state is *owned*: the caller may change its arrays at once.
2. **Write** (one background thread per ``History``, commits in order).
   New chunks are (optionally compressed and) written to a scratch file and
   hard-linked into ``chunks/`` under their address (``link`` fails if the
   chunk appeared meanwhile, so concurrent writers never duplicate an inode).
   The version's zarr group is assembled in ``scratch/``: one array per
   leaf, whose chunk files are hard links to the content-addressed files.
3. **Publish** (background, under ``locks/graph.lock``).  The current graph
   is re-read, the version's parents fixed (the branch's tip *now*: commits
   to one branch are appended in publication order, so two processes
   committing to one branch interleave and neither is lost), the manifest
   written into the group, the group renamed into ``versions/`` and the
   graph file replaced atomically.  Only then is the version visible.  A
   process killed before that leaves scratch debris that nothing lists and
   that the next ``gc`` removes.

Errors in steps 2-3 are kept and raised by the next call (``wait`` and
``close`` included) as :class:`~vlcc_adjoint.storage.StorageError` naming the
version; the failed version is simply absent.

Durability: by default nothing is fsynced (like
:class:`~vlcc_adjoint.storage.ZarrTier`): versions survive the process
(``kill -9`` included), not a power cut.  ``durable=True`` fsyncs chunk
files, the version group and the directories before publication, and the
graph file after it.

Memory: owned copies live in buffers of a
:class:`~vlcc_adjoint.storage.BufferPool` (pages touched before: on
the target VMs a copy into fresh memory is 2-5x slower than into reused
memory), returned to the pool once their chunks are written; commits wait
while more than ``max_pending_bytes`` of copies are in flight.
"""

from __future__ import annotations

import errno
import math
import os
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..errors import VlccTypeError, VlccValueError
from ..state import byte_view, flatten
from ..storage import CorruptCheckpointError, StorageError
from ..storage import format as SF
from . import _delta
from . import _format as F
from ._graph import Version, check_name

_LINK_UNSUPPORTED = {
    errno.EPERM,
    errno.ENOTSUP,
    errno.EOPNOTSUPP,
    errno.EMLINK,
    errno.EXDEV,
    errno.EACCES,
}


def _json_meta(meta) -> dict:
    """`meta` as strict JSON (non-finite floats become the strings "nan", "inf", "-inf")."""
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise VlccTypeError(f"meta must be a dict of JSON values, got {type(meta).__name__}")

    def clean(x, path):
        if isinstance(x, float) and not math.isfinite(x):
            return repr(x)
        if isinstance(x, dict):
            bad = [k for k in x if not isinstance(k, str)]
            if bad:
                raise VlccTypeError(
                    f"meta{path} has a non-string key {bad[0]!r}; JSON objects have string keys"
                )
            return {k: clean(v, f"{path}[{k!r}]") for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v, f"{path}[{i}]") for i, v in enumerate(x)]
        if isinstance(x, np.generic):
            return clean(x.item(), path)
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise VlccTypeError(
            f"meta{path} is a {type(x).__name__}, which is not JSON; use dicts, "
            "lists, strings, numbers, bools and None (convert arrays with .tolist())"
        )

    return clean(meta, "")


def _delta_bases(parent, i: int, lj) -> list[str] | None:
    """The addresses of the parent's chunks at leaf `i`'s places, when its layout and
    codec are the same as the new leaf's (else ``None``: no delta bases)."""
    if parent is None or i >= len(parent):
        return None
    layout, cfg, addrs = parent[i]
    new = lj.layout
    if (
        layout.dtype != new.dtype
        or layout.shape != new.shape
        or cfg != lj.cfg
        or layout.chunk_nbytes != new.chunk_nbytes
        or len(addrs) != new.nchunks
    ):
        return None
    return list(addrs)


# -- jobs: a commit in flight ------------------------------------------------------------


class _LeafJob:
    __slots__ = ("layout", "cfg", "tag", "addrs", "owned", "whole")

    def __init__(self, layout, cfg, tag):
        self.layout = layout
        self.cfg = cfg
        self.tag = tag
        self.addrs: list[str | None] = []
        self.owned: dict[int, Any] = {}  # chunk index -> owned raw bytes (capture="hash")
        self.whole = None  # an owned copy of the leaf (capture="copy")


class _Job:
    __slots__ = (
        "id",
        "branch",
        "base",
        "merge",
        "message",
        "meta",
        "created",
        "spec",
        "leaves",
        "nbytes",
        "owned_bytes",
        "inflight",
        "spent",
    )

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


class CommitPipeline:
    """The commit half of :class:`~vlcc_adjoint.lineage.History` (a mixin: it uses the
    repository's paths, locks, graph and pool; see the module docstring)."""

    # -- commit (the caller's half) --------------------------------------------------

    def commit(
        self,
        state: Any,
        message: str = "",
        meta: dict | None = None,
        *,
        branch: str | None = None,
        merge: Iterable = (),
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
        """
        self._check(write=True)
        if not isinstance(message, str):
            raise VlccTypeError(f"message must be a str, got {type(message).__name__}")
        meta = _json_meta(meta)
        created = time.time()
        merge = [merge] if isinstance(merge, (str, Version)) else list(merge)
        if merge:  # they may name this object's own pending commits
            self.wait()
        g = self._refresh()
        with self._lock:
            target = self._target_branch(
                branch,
                " (a version or tag was checked out); commit onto a branch: "
                "commit(state, branch='name') creates it there, or checkout a branch first",
            )
            base = (
                self._tip.get(self._head_branch) or self._head_id(g)
                if self._head_branch is not None
                else self._head_version
            )
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
                self._worker = threading.Thread(
                    target=self._work, name="vlcc-lineage-writer", daemon=True
                )
                self._worker.start()
            self._stats["commits"] += 1
            self._stats["caller_seconds"] += time.perf_counter() - t0
        self._queue.put(job)
        return vid

    def _target_branch(self, branch: str | None, remedy: str) -> str:
        """Lock held: the branch a new version goes onto, `branch` (a valid name)
        or HEAD's; a detached HEAD raises ``ValueError`` ending with `remedy`."""
        if branch is not None:
            check_name(branch, "branch")
            return branch
        if self._head_branch is None:
            raise VlccValueError(f"HEAD is detached at version {self._head_version}{remedy}")
        return self._head_branch

    def _capture(self, vid: str, leaves: list, spec: dict) -> _Job:
        """Take ownership of the state's bytes (see the module docstring, step 1)."""
        jobs = []
        owned = 0
        inflight = []
        seen: set[str] = set()
        chunks_dir = self._p(F.CHUNKS)
        for leaf in leaves:
            layout = F.plan_layout(leaf.dtype, leaf.shape, self.chunk_bytes)
            cfg = F.codec_config(self.codec, layout.dtype.itemsize)
            lj = _LeafJob(layout, cfg, F.codec_tag(cfg))
            jobs.append(lj)
            if layout.nchunks == 0:
                continue
            if self.capture == "copy":
                whole = self._pool.take(leaf.dtype, leaf.shape)
                np.copyto(whole, leaf)
                lj.whole = whole
                owned += leaf.nbytes
                continue
            flat = byte_view(leaf)
            n = layout.chunk_nbytes
            for j, (off, valid, _key) in enumerate(layout.spans()):
                if valid == n:
                    data = flat[off : off + n]  # hashed in place, copied only if new
                else:  # an edge chunk, padded with zeros as zarr stores it
                    data = self._pool.take(np.uint8, (n,))
                    data[:valid] = flat[off : off + valid]
                    data[valid:] = 0
                addr = F.address_of(data, lj.tag)
                lj.addrs.append(addr)
                if addr[:2] not in self._chunk_dirs:
                    try:  # a real directory (never a link), or none yet
                        self._chunk_dir(addr[:2])
                    except FileNotFoundError:
                        pass
                if (
                    addr in seen
                    or self._inflight[addr]
                    or os.path.lexists(f"{chunks_dir}/{addr[:2]}/{addr[2:]}")
                ):
                    continue
                seen.add(addr)
                if isinstance(data, memoryview):
                    # A reused buffer: fresh memory is slow to touch on VMs (see
                    # vlcc_adjoint.storage._pool), 2-5x a copy into reused pages.
                    buf = self._pool.take(np.uint8, (n,))
                    buf[:] = data
                    data = buf
                lj.owned[j] = data
                owned += n
                inflight.append(addr)
        with self._lock:
            for addr in inflight:
                self._inflight[addr] += 1
        nbytes = sum(leaf.nbytes for leaf in leaves)
        return _Job(
            id=vid,
            spec=spec,
            leaves=jobs,
            nbytes=nbytes,
            owned_bytes=owned,
            inflight=inflight,
            branch=None,
            base=None,
            merge=None,
            message="",
            meta=None,
            created=0.0,
            spent=[],
        )

    # -- the writer thread -------------------------------------------------------------

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            t0 = time.perf_counter()
            try:
                self._write(job)
            except BaseException as err:  # kept and raised by the next call
                with self._lock:
                    self._errors.append((job.id, err))
                    for name in [b for b, v in self._tip.items() if v == job.id]:
                        del self._tip[name]
            finally:
                self._gc_lock.release_shared()
                spent = job.spent
                for lj in job.leaves:
                    spent.extend(lj.owned.values())
                    lj.owned = {}
                    if lj.whole is not None:
                        spent.append(lj.whole)
                        lj.whole = None
                job.spent = []
                self._pool.recycle(spent)  # back to the pool if nobody else holds them
                with self._cond:
                    for addr in job.inflight:
                        self._inflight[addr] -= 1
                        if not self._inflight[addr]:
                            del self._inflight[addr]
                    del self._pending[job.id]
                    self._pending_bytes -= job.owned_bytes
                    self._stats["writer_seconds"] += time.perf_counter() - t0
                    self._cond.notify_all()

    def _write(self, job: _Job) -> None:
        work = self._p(F.SCRATCH, f"v-{job.id}-{F.token()}")
        os.mkdir(work)
        try:
            new_bytes = 0
            seen: set[str] = set()
            parent = self._delta_parent(job) if self._deltas else None
            for i, lj in enumerate(job.leaves):
                bases = _delta_bases(parent, i, lj)
                layout = lj.layout
                leaf_dir = f"{work}/{i}"
                os.mkdir(leaf_dir)
                SF.write_file(
                    f"{leaf_dir}/zarr.json",
                    F.array_meta(layout, lj.cfg),
                    self.durable,
                    exclusive=True,
                )
                if lj.whole is not None:
                    flat = byte_view(lj.whole)
                n = layout.chunk_nbytes
                for j, (off, valid, key) in enumerate(layout.spans()):
                    if lj.whole is not None:  # capture="copy": hash and dedup here
                        if valid == n:
                            data = flat[off : off + n]
                        else:
                            data = bytearray(n)
                            data[:valid] = flat[off : off + valid]
                        addr = F.address_of(data, lj.tag)
                        lj.addrs.append(addr)
                        if addr not in seen:
                            seen.add(addr)
                            new_bytes += self._store_chunk(
                                addr, data, lj.cfg, bases and bases[j], layout
                            )
                    else:
                        addr = lj.addrs[j]
                        data = lj.owned.pop(j, None)
                        if data is not None:
                            new_bytes += self._store_chunk(
                                addr, data, lj.cfg, bases and bases[j], layout
                            )
                            job.spent.append(data)
                            data = None
                    self._link(addr, f"{leaf_dir}/{key}")
                if self.durable:
                    SF.fsync_dir(leaf_dir)
            self._stats["new_bytes"] += new_bytes
            self._publish(job, work, new_bytes)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise

    def _delta_parent(self, job: _Job):
        """The leaves of the version `job` is based on (delta bases), or ``None``."""
        if job.base is None:
            return None
        try:
            return self._manifest(job.base).leaves
        except (KeyError, CorruptCheckpointError, StorageError):
            return None  # no base to delta against: full chunks

    def _store_chunk(self, addr: str, data, cfg, base: str | None = None, layout=None) -> int:
        """Write a chunk under its address unless it is there; return bytes written.

        With `base` (a delta repository), the chunk is stored as a delta
        object against the chunk `base` when that pays (:mod:`._delta`).
        """
        sub = addr[:2]
        final = self._p(F.CHUNKS, sub, addr[2:])
        if os.path.lexists(final):
            return 0
        blob = None
        if base and base != addr:
            blob = self._delta_blob(addr, data, cfg, base, layout)
        if blob is None:
            blob = F.encode_chunk(data, cfg)
            if self._deltas:
                self._resolver.remember(addr, data, 0, 0)
        if sub not in self._chunk_dirs:
            SF.make_dir(self._p(F.CHUNKS, sub))  # a real directory, never a link
            self._chunk_dirs.add(sub)
        tmp = self._p(F.SCRATCH, f"c-{F.token()}")
        SF.write_file(tmp, blob, self.durable, exclusive=True)
        try:
            try:
                os.link(tmp, final)
            except FileExistsError:
                return 0  # another process stored it meanwhile
            except OSError as err:
                if err.errno not in _LINK_UNSUPPORTED:
                    raise
                os.replace(tmp, final)
            if self.durable:
                SF.fsync_dir(self._p(F.CHUNKS, sub))
            return len(blob)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _delta_blob(self, addr: str, data, cfg, base: str, layout) -> bytes | None:
        """The delta object for chunk `addr` against `base`, or ``None`` when a full
        chunk is better (the delta is above :data:`._delta.MAX_FRACTION` of a chunk, or its
        chain too long)."""
        n = layout.chunk_nbytes
        if not os.path.lexists(self._p(F.chunk_relpath(base))):
            return None  # removed by gc (the resolver may still cache it): store in full
        try:
            braw, depth, chain = self._resolver.get(base, n, cfg, _delta.MAX_DEPTH)
        except (FileNotFoundError, CorruptCheckpointError):
            return None  # the base is gone or damaged: store this chunk in full
        if depth + 1 > _delta.MAX_DEPTH:
            return None
        blob = _delta.encode(data, braw, base, depth, chain, layout.dtype.itemsize)
        if len(blob) > _delta.MAX_FRACTION * n or chain + len(blob) > 2 * n:
            return None
        self._resolver.remember(addr, data, depth + 1, chain + len(blob))
        return blob

    def _link(self, addr: str, dst: str) -> None:
        """Put the chunk file at `dst` in a version group: a hard link (no space), else a copy."""
        src = self._p(F.CHUNKS, addr[:2], addr[2:])
        if self._links:
            try:
                os.link(src, dst)
                return
            except FileNotFoundError:
                raise StorageError(
                    f"chunk {addr} is missing from {self.path}/chunks (it was to "
                    "be written by an earlier commit of this process that failed)"
                ) from None
            except OSError as err:
                if err.errno not in _LINK_UNSUPPORTED:
                    raise
                if err.errno != errno.EMLINK:  # too many links to this one file: copy just it
                    self._links = False
        shutil.copyfile(src, dst, follow_symlinks=False)

    def _publish(self, job: _Job, work: str, new_bytes: int) -> None:
        with self._graph_lock.held():
            g = self._fresh()
            tip = g.branches.get(job.branch)
            if tip is not None:
                parents = [tip]
            elif job.base is not None and job.base in g:
                parents = [job.base]
            elif job.base is not None:
                raise StorageError(
                    f"the version {job.base} this commit was based on was removed "
                    "(by gc in another process)"
                )
            else:
                parents = []
            for m in job.merge:
                if m not in g:
                    raise StorageError(f"merge parent {m} is not in the history (removed by gc?)")
                if m not in parents:
                    parents.append(m)
            manifest, digest = SF.sealed_group(
                F.ROOT_KEY,
                {
                    "format": F.FORMAT,
                    "kind": "version",
                    "id": job.id,
                    "parents": parents,
                    "branch": job.branch,
                    "message": job.message,
                    "meta": job.meta,
                    "created": job.created,
                    "origin": {"host": socket.gethostname(), "pid": os.getpid()},
                    "spec": job.spec,
                    "leaves": [F.leaf_entry(lj.layout, lj.cfg, lj.addrs) for lj in job.leaves],
                },
            )
            SF.write_file(f"{work}/zarr.json", manifest, self.durable, exclusive=True)
            if self.durable:
                SF.fsync_dir(work)
            SF.publish(work, self._p(F.VERSIONS, job.id), self.durable)
            g.add(
                job.id,
                parents,
                job.branch,
                job.message,
                job.meta,
                job.created,
                job.nbytes,
                new_bytes,
                digest,
            )
            g.branches[job.branch] = job.id
            self._write_graph(g)
