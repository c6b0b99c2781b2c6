"""Versions written by several processes: stage parts, then commit them once.

``History.commit`` takes a whole state in one process.  A distributed save
(several ranks, each holding a shard) needs the version split in two steps:

1. **Stage** (every process, :func:`stage`: ``History.stage``).  Each process cuts its
   arrays into chunks (:mod:`._format`), hashes them and writes the chunks
   the repository lacks into ``chunks/`` (deduplicated, and, in a delta
   repository, as deltas against the chunks of a base version's leaves).
   It returns one JSON *leaf entry* per array (layout, codec, chunk
   addresses): small enough to send to one process.  Nothing is visible.
2. **Commit** (one process, :func:`commit_staged`: ``History.commit_staged``).  The leaf entries
   of every process are assembled into one version group in ``scratch/``
   (hard links to the staged chunks) and published exactly as ``commit``
   publishes (:meth:`._commit.CommitPipeline.publish`): under ``locks/graph.lock``, with the
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
import shutil
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import VlccTypeError, VlccValueError
from ..state import byte_view
from ..storage import StorageError
from ..storage import format as SF
from . import _format as F
from ._commit import CommitPipeline, Job, LeafJob, ManifestLeaves, json_meta
from ._format import Layout
from ._packs import PackWriter

__all__ = ["commit_staged", "stage"]


def _parse_entry(entry: object) -> tuple[Layout, dict | None, list[str]]:
    """A leaf entry from :func:`stage`, validated (``ValueError`` saying what is wrong)."""
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


def stage(
    pipeline: CommitPipeline,
    arrays: Sequence[np.ndarray],
    base: str | None,
    base_leaves: Sequence[int | None] | None,
    pack: PackWriter | None = None,
) -> list[dict]:
    """``History.stage`` (see there) through the commit pipeline of the writer.

    With `pack`, the chunks the repository lacks are appended to that pack
    (:mod:`._packs`; full chunks, no deltas) instead of written as loose
    files: the node-local tier's flush (:mod:`._local`)."""
    repo, chunks, refs = pipeline.repo, pipeline.chunks, pipeline.refs
    arrays = list(arrays)
    parent: ManifestLeaves | None = None
    if base is not None and chunks.deltas:
        if base_leaves is None or len(base_leaves) != len(arrays):
            raise VlccValueError("base_leaves must give one leaf index (or None) per array")
        g = repo.refresh()
        parent = pipeline.reader.manifest(refs.resolve(g, base)).leaves
    out = []
    with repo.gc_lock.shared():
        for i, leaf in enumerate(arrays):
            if not isinstance(leaf, np.ndarray):
                raise VlccTypeError(f"array {i} is a {type(leaf).__name__}; stage numpy arrays")
            layout = F.plan_layout(leaf.dtype, leaf.shape, pipeline.chunk_bytes)
            cfg = F.codec_config(pipeline.codec, layout.dtype.itemsize)
            tag = F.codec_tag(cfg)
            bases = None
            k = base_leaves[i] if parent is not None and base_leaves is not None else None
            if parent is not None and k is not None and 0 <= k < len(parent):
                blayout, bcfg, baddrs = parent[k]
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
                data: Any
                for j, (off, valid, _key) in enumerate(layout.spans()):
                    if valid == n:
                        data = flat[off : off + n]
                    else:  # an edge chunk, padded with zeros as zarr stores it
                        data = np.zeros(n, np.uint8)
                        data[:valid] = flat[off : off + valid]
                    addr = F.address_of(data, tag)
                    addrs.append(addr)
                    if pack is not None:
                        if addr not in pack and not chunks.present(addr):
                            blob = F.encode_chunk(data, cfg)
                            pack.add(addr, blob)
                            written += len(blob)
                    elif not chunks.exists(addr):
                        written += chunks.store(
                            addr, data, cfg, bases[j] if bases else None, layout
                        )
            entry = F.leaf_entry(layout, cfg, addrs)
            entry["written"] = written
            out.append(entry)
    with repo.lock:
        pipeline.stats["new_bytes"] += sum(e["written"] for e in out)
    return out


def commit_staged(
    pipeline: CommitPipeline,
    wait: Callable[[], None],
    spec: dict,
    leaves: Sequence[dict],
    message: str,
    meta: dict | None,
    branch: str | None,
    at: str | None,
    packs: Sequence[str] | None = None,
    vid: str | None = None,
) -> str:
    """``History.commit_staged`` (see there); `wait` finishes the writer's own
    commits first (they may be the branch's tip).

    With `packs` (names in ``packs/``, maybe none), the version is a packed one: its
    group holds the manifest only, no zarr view, and publication fails if a
    pack was removed meanwhile (:mod:`._packs`).  `vid`: the id to give the
    version (chosen earlier and returned by a node-local commit); a taken
    one raises ``ValueError``."""
    if not isinstance(message, str):
        raise VlccTypeError(f"message must be a str, got {type(message).__name__}")
    meta = json_meta(meta)
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
        lj = LeafJob(layout, cfg)
        lj.addrs = list(addrs)
        jobs.append(lj)
        written = entry.get("written", 0)
        new_bytes += written if type(written) is int and written > 0 else 0
    wait()
    repo, refs = pipeline.repo, pipeline.refs
    g = repo.refresh()
    with repo.lock:
        target = refs.target_branch(branch, "; commit onto a branch (branch='name')")
        base = refs.head_id(g)
        if at is not None and target not in g.branches:
            base = refs.resolve(g, at)
        if vid is None:
            vid = pipeline.new_id(g)
        elif not F.VERSION_ID.fullmatch(vid) or vid in g:
            raise VlccValueError(
                f"the version id {vid!r} chosen for this version is invalid or taken "
                "(another process published one with this id meanwhile); commit again"
            )
    job = Job(
        vid,
        spec,
        jobs,
        sum(lj.layout.nbytes for lj in jobs),
        branch=target,
        base=base,
        message=message,
        meta=meta,
        created=time.time(),
        packs=None if packs is None else tuple(packs),
    )
    with repo.gc_lock.shared():
        work = repo.p(F.SCRATCH, f"v-{vid}-{F.token()}")
        os.mkdir(work)
        try:
            for lj in jobs if packs is not None else ():
                for addr in lj.addrs:  # no links to fail on a chunk gc removed: look
                    if not pipeline.chunks.present(addr, look=True):
                        raise StorageError(
                            f"chunk {addr} of this version is missing from {repo.path} "
                            "(removed by gc in another process before the version was published)"
                        )
            for i, lj in enumerate(jobs if packs is None else ()):
                leaf_dir = pipeline.leaf_dir(work, i, lj)
                for (_, _, key), addr in zip(lj.layout.spans(), lj.addrs):
                    pipeline.chunks.link(addr, f"{leaf_dir}/{key}")
                if repo.durable:
                    SF.fsync_dir(leaf_dir)
            pipeline.publish(job, work, new_bytes)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    with repo.lock:
        if branch is not None:
            refs.switch(branch)
        refs.tips.pop(target, None)
        pipeline.stats["commits"] += 1
    repo.refresh()
    return vid
