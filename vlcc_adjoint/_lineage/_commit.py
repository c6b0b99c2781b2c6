"""How ``History.commit`` turns a state into a durable, visible version.

:class:`CommitPipeline` is this part of :class:`~vlcc_adjoint.lineage.History`:
the capture in the caller's thread, the writer thread, the publication
(also of versions assembled from staged parts, :mod:`._parts`).

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

import collections
import dataclasses
import math
import os
import queue
import secrets
import shutil
import socket
import threading
import time
from typing import Any

import numpy as np

from ..errors import VlccTypeError
from ..state import byte_view, flatten
from ..storage import BufferPool, CorruptCheckpointError, StorageError
from ..storage import format as SF
from . import _format as F
from ._chunks import ChunkStore
from ._format import Layout
from ._read import Reader
from ._refs import Ref, Refs
from ._repo import Repository

__all__ = ["CommitPipeline", "Job", "LeafJob", "json_meta"]

#: A version's leaves as its manifest lists them: (layout, codec, chunk addresses).
ManifestLeaves = tuple[tuple[Layout, dict | None, tuple[str, ...]], ...]


def json_meta(meta: dict | None) -> dict:
    """`meta` as strict JSON (non-finite floats become the strings "nan", "inf", "-inf")."""
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise VlccTypeError(f"meta must be a dict of JSON values, got {type(meta).__name__}")

    def clean(x: Any, path: str) -> Any:
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


def _delta_bases(parent: ManifestLeaves | None, i: int, lj: LeafJob) -> list[str] | None:
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


class LeafJob:
    """One leaf of a commit in flight: its layout, codec, chunk addresses (as
    they are known) and the bytes the commit owns until they are written."""

    __slots__ = ("layout", "cfg", "tag", "addrs", "owned", "whole")

    def __init__(self, layout: Layout, cfg: dict | None) -> None:
        self.layout = layout
        self.cfg = cfg
        self.tag = F.codec_tag(cfg)
        self.addrs: list[str] = []
        self.owned: dict[int, Any] = {}  # chunk index -> owned raw bytes (capture="hash")
        self.whole: np.ndarray | None = None  # an owned copy of the leaf (capture="copy")


@dataclasses.dataclass(eq=False)
class Job:
    """A version on its way to publication."""

    id: str
    spec: dict
    leaves: list[LeafJob]
    nbytes: int  # the state's bytes
    owned_bytes: int = 0  # bytes of copies the job holds (back-pressure)
    inflight: list[str] = dataclasses.field(default_factory=list)  # new chunk addresses
    branch: str = ""
    base: str | None = None  # the version it was based on (HEAD when committed)
    merge: list[str] = dataclasses.field(default_factory=list)
    message: str = ""
    meta: dict = dataclasses.field(default_factory=dict)
    created: float = 0.0
    spent: list = dataclasses.field(default_factory=list)  # buffers to give back to the pool
    packs: tuple[str, ...] | None = None  # a packed version's packs (its group has no zarr view)


class CommitPipeline:
    """Commits of one ``History``: capture, background writes, publication.

    **Arguments:** the repository's parts (`repo`, `chunks`, `reader`,
    `refs`); `chunk_bytes`, `codec`, `capture`, `max_pending_bytes`: the
    ``History`` arguments of those names.

    **Attributes:** `stats` (``commits``, ``caller_seconds``,
    ``writer_seconds``, ``new_bytes``), `pending_bytes` (bytes of copies held
    by commits in flight); both guarded by the repository's instance lock.
    """

    def __init__(
        self,
        repo: Repository,
        chunks: ChunkStore,
        reader: Reader,
        refs: Refs,
        *,
        chunk_bytes: int,
        codec: Any,
        capture: str,
        max_pending_bytes: int,
    ) -> None:
        self.repo = repo
        self.chunks = chunks
        self.reader = reader
        self.refs = refs
        self.chunk_bytes = chunk_bytes
        self.codec = codec
        self.capture = capture
        self.max_pending_bytes = max_pending_bytes
        self.cond = threading.Condition(repo.lock)
        self.stats: collections.defaultdict[str, float] = collections.defaultdict(int)
        self.pending_bytes = 0
        self._pending: dict[str, Job] = {}
        self._inflight: collections.Counter[str] = collections.Counter()
        self._errors: list[tuple[str, BaseException]] = []
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._pool = BufferPool(max_pending_bytes)

    # -- the state of the pipeline ---------------------------------------------------

    def drain(self) -> None:
        """Block until every commit in flight is published or failed."""
        with self.cond:
            while self._pending:
                self.cond.wait()

    def take_errors(self) -> list[tuple[str, BaseException]]:
        """The failures of background commits since the last call: (version, error)."""
        with self.repo.lock:
            errors, self._errors = self._errors, []
        return errors

    def new_id(self, g: Any) -> str:
        """A version id not in graph `g` nor in flight (lock held)."""
        vid = secrets.token_hex(6)
        while vid in g or vid in self._pending:
            vid = secrets.token_hex(6)
        return vid

    def close(self) -> None:
        """Stop the writer thread (after :meth:`drain`) and free the pooled buffers."""
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join()
            self._worker = None
        self._pool.clear()

    # -- commit (the caller's half) --------------------------------------------------

    def commit(
        self,
        state: Any,
        message: str,
        meta: dict | None,
        branch: str | None,
        merges: list[Ref],
    ) -> str:
        """``History.commit`` once the caller may write (see there): capture the
        state, queue it for the writer thread, return the new version's id."""
        if not isinstance(message, str):
            raise VlccTypeError(f"message must be a str, got {type(message).__name__}")
        meta = json_meta(meta)
        created = time.time()
        repo, refs = self.repo, self.refs
        g = repo.refresh()
        with repo.lock:
            target = refs.target_branch(
                branch,
                " (a version or tag was checked out); commit onto a branch: "
                "commit(state, branch='name') creates it there, or checkout a branch first",
            )
            base = refs.base(g)
            merged = [refs.resolve(g, ref) for ref in merges]
            vid = self.new_id(g)
        leaves, spec = flatten(state)
        t0 = time.perf_counter()
        repo.gc_lock.acquire_shared()  # released when the version is published (or fails)
        try:
            job = self._capture(vid, leaves, spec)
        except BaseException:
            repo.gc_lock.release_shared()
            raise
        job.branch, job.base, job.merge = target, base, merged
        job.message, job.meta, job.created = message, meta, created
        with self.cond:
            # Back-pressure: wait while the writer holds too many owned bytes.
            while self._pending and self.pending_bytes + job.owned_bytes > self.max_pending_bytes:
                self.cond.wait()
            self._pending[vid] = job
            self.pending_bytes += job.owned_bytes
            refs.tips[target] = vid
            if branch is not None:
                refs.switch(branch)
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._work, name="vlcc-lineage-writer", daemon=True
                )
                self._worker.start()
            self.stats["commits"] += 1
            self.stats["caller_seconds"] += time.perf_counter() - t0
        self._queue.put(job)
        return vid

    def _capture(self, vid: str, leaves: list[np.ndarray], spec: dict) -> Job:
        """Take ownership of the state's bytes (see the module docstring, step 1)."""
        jobs = []
        owned = 0
        inflight = []
        seen: set[str] = set()
        chunks = self.chunks
        for leaf in leaves:
            layout = F.plan_layout(leaf.dtype, leaf.shape, self.chunk_bytes)
            lj = LeafJob(layout, F.codec_config(self.codec, layout.dtype.itemsize))
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
            data: Any
            for j, (off, valid, _key) in enumerate(layout.spans()):
                if valid == n:
                    data = flat[off : off + n]  # hashed in place, copied only if new
                else:  # an edge chunk, padded with zeros as zarr stores it
                    data = self._pool.take(np.uint8, (n,))
                    data[:valid] = flat[off : off + valid]
                    data[valid:] = 0
                addr = F.address_of(data, lj.tag)
                lj.addrs.append(addr)
                try:  # in a real directory (never a link), or none yet
                    stored = os.path.lexists(chunks.chunk_path(addr))
                except FileNotFoundError:
                    stored = False
                if addr in seen or self._inflight[addr] or stored:
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
        with self.repo.lock:
            for addr in inflight:
                self._inflight[addr] += 1
        nbytes = sum(leaf.nbytes for leaf in leaves)
        return Job(vid, spec, jobs, nbytes, owned_bytes=owned, inflight=inflight)

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
                with self.repo.lock:
                    self._errors.append((job.id, err))
                    tips = self.refs.tips
                    for name in [b for b, v in tips.items() if v == job.id]:
                        del tips[name]
            finally:
                self.repo.gc_lock.release_shared()
                spent = job.spent
                for lj in job.leaves:
                    spent.extend(lj.owned.values())
                    lj.owned = {}
                    if lj.whole is not None:
                        spent.append(lj.whole)
                        lj.whole = None
                job.spent = []
                self._pool.recycle(spent)  # back to the pool if nobody else holds them
                with self.cond:
                    for addr in job.inflight:
                        self._inflight[addr] -= 1
                        if not self._inflight[addr]:
                            del self._inflight[addr]
                    del self._pending[job.id]
                    self.pending_bytes -= job.owned_bytes
                    self.stats["writer_seconds"] += time.perf_counter() - t0
                    self.cond.notify_all()

    def _write(self, job: Job) -> None:
        """Write the new chunks of `job` and assemble its version group in the
        scratch (see the module docstring, step 2), then publish it."""
        work = self.repo.p(F.SCRATCH, f"v-{job.id}-{F.token()}")
        os.mkdir(work)
        try:
            new_bytes = 0
            seen: set[str] = set()
            parent = self._delta_parent(job) if self.chunks.deltas else None
            for i, lj in enumerate(job.leaves):
                bases = _delta_bases(parent, i, lj)
                layout = lj.layout
                leaf_dir = self.leaf_dir(work, i, lj)
                if lj.whole is not None:
                    flat = byte_view(lj.whole)
                n = layout.chunk_nbytes
                data: Any
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
                            new_bytes += self.chunks.store(
                                addr, data, lj.cfg, bases[j] if bases else None, layout
                            )
                    else:
                        addr = lj.addrs[j]
                        data = lj.owned.pop(j, None)
                        if data is not None:
                            new_bytes += self.chunks.store(
                                addr, data, lj.cfg, bases[j] if bases else None, layout
                            )
                            job.spent.append(data)
                            data = None
                    self.chunks.link(addr, f"{leaf_dir}/{key}")
                if self.repo.durable:
                    SF.fsync_dir(leaf_dir)
            with self.repo.lock:
                self.stats["new_bytes"] += new_bytes
            self.publish(job, work, new_bytes)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise

    def _delta_parent(self, job: Job) -> ManifestLeaves | None:
        """The leaves of the version `job` is based on (delta bases), or ``None``."""
        if job.base is None:
            return None
        try:
            return self.reader.manifest(job.base).leaves
        except (KeyError, CorruptCheckpointError, StorageError):
            return None  # no base to delta against: full chunks

    def leaf_dir(self, work: str, i: int, lj: LeafJob) -> str:
        """Make the directory of leaf `i` of the version group `work`, with its
        array ``zarr.json``; return it."""
        leaf_dir = f"{work}/{i}"
        os.mkdir(leaf_dir)
        SF.write_file(
            f"{leaf_dir}/zarr.json",
            F.array_meta(lj.layout, lj.cfg),
            self.repo.durable,
            exclusive=True,
        )
        return leaf_dir

    def publish(self, job: Job, work: str, new_bytes: int) -> None:
        """Publish the version group `work` of `job` (see the module docstring,
        step 3): parents fixed, manifest sealed and written, group renamed into
        ``versions/``, graph replaced, all under the graph lock."""
        repo = self.repo
        with repo.graph_lock.held():
            g = repo.fresh()
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
            for name in (
                job.packs or ()
            ):  # removed by a gc since they were written: fail, not publish
                if not os.path.lexists(repo.p(F.PACKS, name)):
                    raise StorageError(
                        f"the pack {name} of this version was removed (by gc in another "
                        "process) before the version was published"
                    )
            view = {"zarr_view": False} if job.packs is not None else {}
            manifest, digest = SF.sealed_group(
                F.ROOT_KEY,
                {
                    **view,
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
            SF.write_file(f"{work}/zarr.json", manifest, repo.durable, exclusive=True)
            if repo.durable:
                SF.fsync_dir(work)
            SF.publish(work, repo.p(F.VERSIONS, job.id), repo.durable)
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
            repo.write_graph(g)
