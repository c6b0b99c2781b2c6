"""Capture: a state becomes leaves the store owns, each with its checksum.

``save`` flattens the state (:func:`vlcc_adjoint.state.flatten_traits`, or
the :class:`~vlcc_adjoint.state.Layout` of the last state saved when the
structure repeats, which skips re-deriving the spec) and decides per leaf:

* **take** a leaf ``flatten`` copied itself (a non-contiguous array brought
  to C order): nobody else holds it;
* **reference** a leaf nobody can ever change: one a leaf provider vouches
  for (an immutable array library's host buffer), or a numpy array
  read-only down to an immutable ``bytes`` buffer
  (:func:`vlcc_adjoint.state.immutable_array`).  A read-only array that owns
  its data is *not* immutable: its owner may make it writeable again, so it
  is copied like any other;
* **copy** everything else, into a buffer from the :class:`BufferPool`
  (copying into reused memory runs at memory bandwidth; fresh pages cost a
  page fault each).  The copy computes the leaf's xxh3-64 checksum in the
  same pass (:func:`~.._checksum.copy_checksum`: one read of the caller's
  array, the GIL released, streaming stores for large leaves, so the
  capture neither reads the old contents of its buffer nor evicts the
  caller's working set from the caches).

**Deduplication** (``dedup=``).  Leaves with equal content digests
(:func:`vlcc_adjoint.state.leaf_digest`) are stored once and referenced
from every record holding them, through a reference-counted
the store's leaf table (``storage/_dedup.py``).  ``dedup=True`` hashes after the
capture (on the worker for slower levels); ``dedup="eager"`` hashes in
``save`` before copying and skips the copy of a leaf seen before.

**Giving buffers back** (:meth:`Capture.release`).  A record's buffers go
back to the pool when its last holder lets go of them: its tier when it is
deleted (a tier that keeps arrays by reference), its write when the tier
has its own copy, its read-ahead slot when it is evicted or read for the
last time, after its dedup references are dropped; and only within the
most bytes the store may hold (its memory levels' capacities, the staging
and the read cache), so reusing buffers never makes the store hold more
than a memory budget sized for those allows.  Buffers behind views lent to
a caller are held by a pool lease and reach the free lists when it ends
(see :mod:`.._pool`: ownership is explicit, never judged from reference
counts).
"""

from __future__ import annotations

from collections.abc import Callable

from ...state import Layout, flatten_traits, immutable_array, leaf_digest
from .._checksum import copy_checksum, leaf_checksum
from .._dedup import LeafTable
from .._pool import SMALL_BYTES, BufferPool

__all__ = ["Capture", "COPY", "REFERENCE", "TAKE"]

TAKE, REFERENCE, COPY = 0, 1, 2


def _nothing_held() -> int:
    return 0


class Capture:
    """Flatten, classify and copy states into pooled, checksummed buffers.

    **Arguments:**

    - `shared`: the engine's :class:`~._common.Shared`.
    - `pool_bytes`: the most bytes of free buffers kept for reuse.
    - `hold_limit`: the most bytes of buffers the store may hold at once
      (``None``: unbounded).
    """

    def __init__(self, shared, pool_bytes: int, hold_limit: int | None):
        self.shared = shared
        self.pool = BufferPool(pool_bytes, min_bytes=SMALL_BYTES, threadsafe=shared.threadsafe)
        self.table = LeafTable()  # (empty unless shared.dedup)
        self.dedup_owned: dict[str, bool] = {}  # digest -> its array is a buffer of ours
        self.hold_limit = hold_limit
        # Set by the store: () -> bytes of buffers it holds now.
        self.held: Callable[[], int] = _nothing_held
        # The structure of the states saved last (see state.Layout): a save or
        # a load into `out` of a state of that structure skips flatten.
        self.layout: Layout | None = None
        self._no_layout: type | None = None  # a state type that has none

    def flatten(self, state):
        """``(leaves, spec, traits)`` of `state`; `traits` is ``None`` for a
        state of the last layout (its leaves are the caller's own arrays).

        The spec of a state whose structure, dtypes and shapes are those of
        the last one saved is not re-derived: its ``tree`` and ``leaves``
        are then shared with the earlier records (read-only)."""
        layout = self.layout
        if layout is not None:
            leaves = layout.leaves(state)
            if leaves is not None:
                return leaves, layout.spec(), None
        leaves, spec, traits = flatten_traits(state)
        if type(state) is not self._no_layout:
            layout = Layout.of(state, leaves, spec)
            if layout is None:
                self._no_layout = type(state)
            else:
                self.layout = layout
        return leaves, spec, traits

    @staticmethod
    def classify(leaves, traits):
        """Per leaf TAKE, REFERENCE or COPY (see the module docstring);
        ``(how, total bytes, bytes to copy)``."""
        how = []
        nbytes = copy_bytes = 0
        for i, leaf in enumerate(leaves):
            n = leaf.nbytes
            nbytes += n
            if traits is not None and i in traits.fresh:
                how.append(TAKE)
                copy_bytes += n
            elif not leaf.flags.writeable and (
                (traits is not None and i in traits.immutable) or immutable_array(leaf)
            ):
                how.append(REFERENCE)
            else:
                how.append(COPY)
                copy_bytes += n
        return how, nbytes, copy_bytes

    def capture(self, leaves, how, inline: bool):
        """Copy the leaves to copy (checksummed in the same pass); hash the
        others now for a memory level (`inline`), later otherwise.

        **Returns:** ``(arrays, owned, digests, checksums, copied bytes,
        referenced bytes)``; the caller drops its `leaves` afterwards."""
        sh = self.shared
        eager = sh.dedup == "eager"
        table = self.table
        owned: list[bool] = []
        digests: list[str | None] = []
        out: list = []
        sums: list[str | None] = []
        copied = referenced = 0
        for leaf, h in zip(leaves, how):
            digest: str | None = None
            checksum: str | None
            if eager:
                digest = leaf_digest(leaf)
                shared = table.acquire(digest)
                if shared is not None:
                    with sh.lock:
                        sh.n["dedup_hits"] += 1
                        sh.n["dedup_saved"] += leaf.nbytes
                    out.append(shared)
                    owned.append(self.dedup_owned.get(digest, False))
                    digests.append(digest)
                    sums.append(leaf_checksum(shared) if inline else None)
                    continue
            if h == COPY:
                # A large leaf is written with streaming stores (nobody reads
                # a checkpoint soon: it need not displace the caller's data
                # from the caches).
                buf = self.pool.take(leaf.dtype, leaf.shape)
                checksum = copy_checksum(leaf, buf, stream=True)
                leaf = buf
                copied += leaf.nbytes
            else:
                checksum = leaf_checksum(leaf) if inline else None
                if h == REFERENCE:
                    referenced += leaf.nbytes
                else:
                    copied += leaf.nbytes
            if digest is not None:
                leaf = table.put(digest, leaf)
                self.dedup_owned[digest] = h != REFERENCE
            out.append(leaf)
            owned.append(h != REFERENCE)
            digests.append(digest)
            sums.append(checksum)
        return out, owned, (digests if eager else None), sums, copied, referenced

    def dedup(self, entry, leaves) -> tuple[list, list]:
        """Hash the staged leaves and share the ones seen before (lazy dedup).

        **Returns:** ``(give, leaves)``: the replaced capture buffers, for the
        pool (nothing else holds them: a load reading the staged record
        holds them by a lease), and the record's leaves to write (`leaves`
        itself if a Move took the record over meanwhile: then nothing was
        replaced)."""
        sh = self.shared
        digests = [leaf_digest(leaf) for leaf in leaves]
        give: list = []
        with sh.lock:
            if entry.leaves is None:
                return give, leaves
            for i, d in enumerate(digests):
                mine = entry.leaves[i]
                shared = self.table.put(d, mine)
                if shared is not mine:
                    sh.n["dedup_hits"] += 1
                    sh.n["dedup_saved"] += mine.nbytes
                    if entry.owned[i]:
                        give.append(mine)
                    entry.leaves[i] = shared
                    entry.owned[i] = self.dedup_owned.get(d, False)
                else:
                    self.dedup_owned[d] = entry.owned[i]
            entry.digests = digests
            return give, list(entry.leaves)

    def disown(self, digests) -> None:
        """The shared leaves of `digests` were given to a tier that may keep
        them: they are never reused (dropped when their last record goes)."""
        for d in digests:
            if d is not None and d in self.dedup_owned:
                self.dedup_owned[d] = False

    def unshare(self, digests) -> list[bool]:
        """Drop a record's dedup references (its arrays are handed on).
        Per leaf: whether no other record holds it any more."""
        alone = []
        for d in digests:
            if d is None:
                alone.append(True)
            elif self.table.release(d):
                alone.append(bool(self.dedup_owned.pop(d, False)))
            else:
                alone.append(False)
        return alone

    def release(self, leaves, owned, digests) -> None:
        """Give a record's arrays back: dedup references, then pool buffers."""
        if leaves is None:
            return
        give = []
        for i, arr in enumerate(leaves):
            d = digests[i] if digests else None
            if d is not None:
                if not self.table.release(d):
                    continue  # still shared
                mine = self.dedup_owned.pop(d, False)
            else:
                mine = owned[i] if owned else False
            if mine:
                give.append(arr)
        if give and self.hold_limit is not None:
            held = self.held()
            while give and held + sum(a.nbytes for a in give) > self.hold_limit:
                give.pop()  # freed, not pooled
        self.pool.recycle(give)

    def reserve(self, state, count: int) -> None:
        """Allocate and touch capture buffers for `count` states shaped like
        `state`, so the first saves do not pay page faults."""
        leaves, _, traits = flatten_traits(state)
        how, _, _ = self.classify(leaves, traits)
        for leaf, h in zip(leaves, how):
            if h == COPY:
                self.pool.reserve(leaf.dtype, leaf.shape, count)
