"""Garbage collection: which versions a retention policy keeps, and the sweep.

``History.gc(keep=...)`` removes the versions no rule of a
:class:`KeepPolicy` keeps, then every chunk file that no kept version lists,
then the leftovers of interrupted commits.  The order makes it safe:

1. Under ``locks/gc.lock`` held *exclusive* (so no commit is in flight in any
   process: each holds it shared from capture to publication) and
   ``locks/graph.lock``: the kept set is computed from the current graph, and
   the set of chunk addresses the kept versions' manifests list.
2. The graph without the removed versions is written first (they vanish from
   every reader at once; kept versions whose parents were removed get their
   nearest kept ancestors as parents), then their groups are renamed away
   and deleted.
3. Chunk files whose address no kept manifest lists are deleted, so are
   packs (:mod:`._packs`) none of whose chunks a kept manifest lists (a pack
   is kept whole while any kept version uses one of its chunks), and every
   entry of ``scratch/`` and every group in ``versions/`` the graph does not
   list (a commit killed between its rename and the graph update).

A chunk is deleted only if no kept version lists it, so every kept version
checks out bit-identical afterwards (``tests/lineage/test_lineage.py`` checks this
over random histories and policies).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable

from ..errors import VlccTypeError, VlccValueError
from . import _format as F
from ._chunks import ChunkStore
from ._graph import Graph, human_bytes
from ._read import Reader
from ._refs import Refs

__all__ = ["GCReport", "KeepPolicy", "collect", "tree_bytes"]


@dataclasses.dataclass(frozen=True)
class KeepPolicy:
    """Which versions ``History.gc`` keeps; every other version is removed.

    A version is kept if any rule keeps it.  Branch tips are always kept.

    **Arguments:**

    - `last`: keep the last `last` versions of every branch (its tip and
      first-parent ancestors, the versions ``git log --first-parent`` lists
      first); ``None``: this rule keeps nothing.
    - `tagged`: keep every tagged version.
    - `best`: ``(meta key, "min" | "max")``: keep the `n_best` versions with the
      smallest (largest) numeric ``meta[key]``, e.g. ``("loss", "min")``.
    - `n_best`: how many versions `best` keeps.
    - `keep`: refs (ids, tags, branches, ``"main~3"``) kept explicitly.

    Example: ``KeepPolicy(last=3, tagged=True, best=("loss", "min"))``.
    """

    last: int | None = None
    tagged: bool = True
    best: tuple[str, str] | None = None
    n_best: int = 1
    keep: tuple[str, ...] = ()

    def __post_init__(self):
        if self.last is not None and (not isinstance(self.last, int) or self.last < 0):
            raise VlccValueError(f"KeepPolicy.last must be None or an int >= 0, got {self.last!r}")
        if self.best is not None:
            if not (
                isinstance(self.best, (tuple, list))
                and len(self.best) == 2
                and isinstance(self.best[0], str)
                and self.best[1] in ("min", "max")
            ):
                raise VlccValueError(
                    f"KeepPolicy.best must be (meta key, 'min' or 'max'), "
                    f"e.g. ('loss', 'min'); got {self.best!r}"
                )
            object.__setattr__(self, "best", tuple(self.best))
        if not isinstance(self.n_best, int) or self.n_best < 0:
            raise VlccValueError(f"KeepPolicy.n_best must be an int >= 0, got {self.n_best!r}")
        if isinstance(self.keep, str):
            object.__setattr__(self, "keep", (self.keep,))
        object.__setattr__(self, "keep", tuple(self.keep))

    def select(self, g: Graph, resolve: Callable[[str], str]) -> set[str]:
        """The ids this policy keeps in graph `g` (`resolve` turns a ref into an id)."""
        kept = set(g.branches.values())
        if self.last:
            for tip in g.branches.values():
                kept.update(g.first_parents(tip)[: self.last])
        if self.tagged:
            kept.update(g.tags.values())
        if self.best is not None and self.n_best:
            key, mode = self.best
            scored = []
            for vid, attrs in g.nodes.items():
                value = attrs["meta"].get(key)
                if (
                    isinstance(value, (int, float))
                    and not isinstance(value, bool)
                    and math.isfinite(value)
                ):
                    scored.append((value if mode == "min" else -value, -attrs["seq"], vid))
            kept.update(vid for _, _, vid in sorted(scored)[: self.n_best])
        for ref in self.keep:
            kept.add(resolve(ref))
        return kept


@dataclasses.dataclass(frozen=True)
class GCReport:
    """What ``History.gc`` removed (or would remove, with ``dry_run=True``).

    **Attributes:** `removed` (version ids), `kept` (number of versions
    kept), `chunks_removed`, `bytes_freed` (sizes of the files removed;
    a chunk counts once however many versions linked it), `debris_removed`
    (leftovers of interrupted commits: scratch entries and unpublished
    version groups), `dry_run`.
    """

    removed: tuple[str, ...]
    kept: int
    chunks_removed: int
    bytes_freed: int
    debris_removed: int
    dry_run: bool = False

    def __str__(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        return (
            f"gc {verb} {len(self.removed)} versions, {self.chunks_removed} chunks "
            f"({human_bytes(self.bytes_freed)}) and {self.debris_removed} leftovers of "
            f"interrupted commits; {self.kept} versions kept"
        )


def collect(
    reader: Reader, refs: Refs, chunks: ChunkStore, keep: KeepPolicy | int | None, dry_run: bool
) -> GCReport:
    """``History.gc`` on the repository of `reader` (see there and the module
    docstring); the caller has checked that it may write."""
    if isinstance(keep, int) and not isinstance(keep, bool):
        keep = KeepPolicy(last=keep)
    if keep is not None and not isinstance(keep, KeepPolicy):
        raise VlccTypeError(f"keep must be a KeepPolicy, an int or None, got {keep!r}")
    repo = reader.repo
    with repo.gc_lock.exclusive(), repo.graph_lock.held():
        g = repo.fresh()
        kept = set(g.nodes) if keep is None else keep.select(g, lambda r: refs.resolve(g, r))
        doomed = set(g.nodes) - kept
        referenced: set[str] = set()
        for vid in kept:
            referenced |= reader.manifest(vid).addresses()
        referenced = chunks.closure(referenced)  # with the bases of kept delta chunks
        removable, freed = [], 0
        chunk_root = repo.p(F.CHUNKS)
        for sub in os.scandir(chunk_root):
            if not sub.is_dir(follow_symlinks=False) or len(sub.name) != 2:
                continue
            for entry in os.scandir(sub.path):
                addr = sub.name + entry.name
                if F.is_address(addr) and addr not in referenced:
                    removable.append(entry.path)
                    freed += entry.stat(follow_symlinks=False).st_size
        # A pack goes when no kept version lists any of its chunks; a pack whose
        # index is damaged is kept (``verify`` reports it).
        dead_packs = {
            name
            for name, addrs in chunks.scan_packs().items()
            if addrs is not None and not addrs & referenced
        }
        for name in sorted(dead_packs):
            removable.append(repo.p(F.PACKS, name))
            freed += os.lstat(repo.p(F.PACKS, name)).st_size
        debris = [e.path for e in os.scandir(repo.p(F.SCRATCH)) if e.name != "zarr.json"]
        debris += [
            e.path
            for e in os.scandir(repo.p(F.VERSIONS))
            if e.is_dir(follow_symlinks=False) and e.name not in g
        ]
        for vid in doomed:
            freed += tree_bytes(repo.p(F.VERSIONS, vid), chunks_too=False)
        report = GCReport(
            tuple(sorted(doomed, key=lambda v: g.nodes[v]["seq"])),
            len(kept),
            len(removable),
            freed,
            len(debris),
            dry_run,
        )
        if dry_run:
            return report
        if doomed:
            g.remove(doomed)
            repo.write_graph(g)
            reader.forget(doomed)
            for vid in doomed:
                refs.forget_version(vid)
        for vid in doomed:
            away = repo.p(F.SCRATCH, f"rm-{vid}-{F.token()}")
            try:
                os.rename(repo.p(F.VERSIONS, vid), away)
            except FileNotFoundError:
                continue
            repo.remove(away)
        for path in debris + removable:
            repo.remove(path)
        chunks.forget_packs(dead_packs)
    return report


def tree_bytes(path: str, chunks_too: bool) -> int:
    """Bytes of the files under `path`, each inode once (hard links are free).

    With ``chunks_too=False``, files with several links (a version's chunk
    files, shared with ``chunks/``) are not counted: deleting the version does
    not free them.
    """
    seen = set()
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            if not chunks_too and st.st_nlink > 1:
                continue
            total += st.st_size
    return total
