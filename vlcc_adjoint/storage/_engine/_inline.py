"""The memory levels' short path: a save, load or delete of a state whose
structure the store has seen, done in the caller with the work planned once
per structure.

A time loop saves states of one structure thousands of times.  On a small
state every step of the general path (flatten, classify each leaf, reserve
room, capture, build the record, put it, settle the reservation; on the
way back parse the spec's dtypes and walk its tree) costs more than copying
the data, so for a memory level (a tier that keeps the arrays it is given
and serves them back, :attr:`Shared.direct`) the store plans these steps
once per state structure (a :class:`Shape`, made from the
:class:`~vlcc_adjoint.state.Layout` that :class:`~._capture.Capture`
keeps) and each call only follows the plan.  Nothing is skipped:

* **save**: the layout walk checks structure, dtypes, shapes and
  contiguity of the new state; every leaf is copied into a pooled buffer
  keyed by its precomputed ``(dtype, shape)`` (a leaf below the pool's
  ``min_bytes``, which the pool would neither keep nor count, into a new
  array: ``leaf.copy()``) and checksummed (xxh3-64,
  small leaves with one C call, :func:`~.._checksum.direct_hash`); the
  plan is followed (:meth:`~._clock.PlanClock.follow`); the tier's
  capacity is checked before anything changes and enforced again by its
  ``put``.  A state the general path would treat differently (a read-only
  leaf that may be immutable, a level that needs room first, deduplication)
  is handed to the general path instead, before any change.
* **load** (:meth:`~._restore.Restore.direct`): the copy out verifies each
  leaf's checksum; the state is rebuilt by the layout
  (:meth:`~vlcc_adjoint.state.Layout.build`), which checks each leaf's
  dtype and shape against the record's spec.

The effects on the store are those of the general path: the same counters,
the same index and plan positions, the same record in the tier (same key,
spec, leaves and checksums), the same buffers back in the pool on delete.
"""

from __future__ import annotations

import math
from functools import partial
from time import perf_counter
from typing import Any

from numpy import ndarray

from .._checksum import copy_checksum, direct_hash
from .._tier import Record, Tier, TierFullError
from ._common import SAVE, STORED, Entry, end_leases

__all__ = ["InlinePath", "Shape"]


class Shape:
    """What the store plans once per state structure.

    **Attributes:** `layout` (the :class:`~vlcc_adjoint.state.Layout`),
    `keys` (per leaf its buffer pool key), `hashes` (per leaf the one-call
    checksum function, or ``None`` for a leaf the kernel copies and hashes),
    `nbytes`, `n` (the number of leaves), `root` (``(dtype, shape)`` of
    a state that is one small array, else ``None``), `pooled` (per leaf:
    whether its buffer comes from the pool, i.e. it has at least
    `min_bytes`), `recycles` (whether any leaf's does: a delete gives the
    buffers back to the pool).
    """

    __slots__ = (
        "layout",
        "keys",
        "hashes",
        "small",
        "nbytes",
        "n",
        "owned",
        "format",
        "root",
        "pooled",
        "recycles",
    )

    def __init__(self, layout, min_bytes: int = 0):
        self.layout = layout
        self.format = layout.spec()["format"]
        self.keys = tuple((dtype, shape) for dtype, shape in layout.infos)
        # Per leaf a function, or None for a leaf the kernel hashes (Any: the
        # paths that call one know from `small` and `pooled` that it is set).
        self.hashes: tuple[Any, ...] = tuple(
            direct_hash(dtype, shape) for dtype, shape in layout.infos
        )
        self.small = all(h is not None for h in self.hashes)
        self.nbytes = layout.nbytes
        self.n = len(self.keys)
        self.owned = (True,) * self.n
        # (dtype, shape) when the state is one small array (the layout's
        # tree is its leaf): its walk and build done in place.
        self.root = layout.infos[0] if "leaf" in layout.tree and self.small else None
        self.pooled = tuple(
            dtype.itemsize * math.prod(shape) >= min_bytes for dtype, shape in layout.infos
        )
        self.recycles = any(self.pooled)

    def build(self, leaves):
        """The state around `leaves` (see :meth:`Layout.build`)."""
        return self.layout.build(leaves)


class InlinePath:
    """The short path of ``save`` for memory levels.

    **Arguments:** the engine's :class:`~._common.Shared`,
    :class:`~._clock.PlanClock`, :class:`~._capture.Capture`,
    :class:`~._placement.Placement`, :class:`~._jobs.Jobs`,
    :class:`~._write.Writer` and :class:`~._cache.ReadCache`.
    """

    def __init__(self, shared, clock, capture, placement, jobs, writer, cache):
        self.shared = shared
        self.clock = clock
        self.capture = capture
        self.placement = placement
        self.jobs = jobs
        self.writer = writer
        self.cache = cache
        # Per level: whether its saves may take the short path.
        self.levels = [d and not shared.dedup for d in shared.direct]
        # Whether the read-ahead cache has anything to look ahead for
        # (ReadCache.pump returns at once otherwise).
        self.pumps = (
            clock.plan is not None
            and shared.workers > 0
            and bool(shared.prefetch_levels)
            and cache.belady.capacity_bytes > 0
        )
        # Per level: the tier's adopt of a record given in parts: its own
        # where it declares adopts_leaves, else Tier's (which builds the
        # record and calls its adopt).
        self.adopters = [
            t.adopt_leaves if t.adopts_leaves else partial(Tier.adopt_leaves, t)
            for t in shared.tiers
        ]
        self._layout = None
        self._shape = None

    def shape_of(self, layout) -> Shape:
        """The :class:`Shape` of `layout` (made once per layout)."""
        if layout is not self._layout:
            self._shape, self._layout = Shape(layout, self.capture.pool.min_bytes), layout
        return self._shape

    def save(self, step: int, state, level: int) -> bool:
        """Save `state` as ``u_step`` on the memory level `level` if the
        short path applies; returns whether it did (``False``: nothing
        changed, the general path takes the call).  Step and level are
        validated, and the step is not yet stored there."""
        sh = self.shared
        if not self.levels[level]:
            return False
        layout = self.capture.layout
        if layout is None:
            return False
        shape = self._shape if layout is self._layout else self.shape_of(layout)
        root = shape.root
        if root is not None:  # Layout.leaves of a one-array layout, in place
            if type(state) is not ndarray or state.dtype is not root[0] or state.shape != root[1]:
                return False
            flags = state.flags
            if not flags.c_contiguous:
                return False
            if not flags.writeable:  # perhaps immutable: kept by reference
                return False
            leaves = (state,)
        else:
            leaves = layout.leaves(state)
            if leaves is None:
                return False
            for leaf in leaves:
                if not leaf.flags.writeable:  # perhaps immutable: kept by reference
                    return False
        tier = sh.tiers[level]
        nbytes = shape.nbytes
        cap = tier.capacity_bytes
        if cap is not None:
            # As Placement.place: room now (reservations of writes still
            # running counted), with the raw size as the estimate (a tier
            # that stores less than it was given goes the general way).
            used = tier.used_bytes
            if (
                0 < used < sh.tc[level].raw_bytes
                or used + self.placement.reserved[level] + nbytes > cap
            ):
                return False
        record = self.clock.follow(SAVE, step, level)  # raises before any change
        t0 = perf_counter()
        out: tuple
        sums: tuple
        if shape.n == 1 and shape.small:  # one small leaf: the usual small state
            if shape.recycles:
                buf = self.capture.pool.take_key(shape.keys[0])
                buf[...] = leaves[0]
            else:  # below the pool's min_bytes: a new array (the pool's take would be)
                buf = leaves[0].copy()
            out, sums = (buf,), (shape.hashes[0](buf),)
        else:
            take = self.capture.pool.take_key
            bufs, hashes = [], []
            for leaf, key, digest, pooled in zip(leaves, shape.keys, shape.hashes, shape.pooled):
                if not pooled and digest is not None:
                    buf = leaf.copy()
                    hashes.append(digest(buf))
                    bufs.append(buf)
                    continue
                buf = take(key)
                if digest is None:  # large: copied and hashed in one pass, streamed
                    hashes.append(copy_checksum(leaf, buf, stream=True))
                else:
                    buf[...] = leaf
                    hashes.append(digest(buf))
                bufs.append(buf)
            out, sums = tuple(bufs), tuple(hashes)
        t1 = perf_counter()
        spec = {
            "format": shape.format,
            "tree": layout.tree,
            "leaves": layout.leaf_specs,
            "step": step,
        }
        entry = Entry(step, level, level, next(sh.seq), spec, nbytes, record)
        # (Tuples: a short-path record's leaves and flags are never changed
        # in place; a spill hands them on whole.)
        entry.leaves, entry.owned, entry.checksums = out, shape.owned, sums
        entry.shape = shape
        # The put first, then the book-keeping in one critical section: no
        # other thread looks at a memory level's record before it is stored.
        try:
            self.adopters[level](entry.key, spec, out, sums)
        except BaseException as exc:
            self._put_failed(entry, Record(spec, out, sums), exc)
        release = None
        lock = sh.mutex  # None in a single-threaded store: no lock to take
        if lock is not None:
            lock.acquire()
        try:
            sh.t["capture"] += t1 - t0
            n = sh.n
            n["saves"] += 1
            n["captured"] += nbytes
            sh.index[(step, level)] = entry
            if record >= 0:
                sh.by_record[record] = entry
                entry.read_q = self.clock.first_q[record]
            if self.pumps:
                self.cache.pump()
            entry.state = STORED
            if entry.tier == level:
                c = sh.tc[level]
                c.puts += 1
                c.bytes_in += nbytes
                c.records += 1
                c.raw_bytes += nbytes
            else:  # spilled to a slower tier (policy="spill"): as the general path
                sh.count_put(entry)
                release = self.writer.finish_write(entry, stored=True, notify=False)
        finally:
            if lock is not None:
                lock.release()
        if release is not None:
            self.capture.release(*release)
        return True

    def _put_failed(self, entry, put, exc) -> None:
        """The first ``put`` raised: spill on (``TierFullError``, with
        ``policy="spill"``) as the general path does, or record the failure
        and raise it."""
        sh, jobs = self.shared, self.jobs
        with sh.lock:
            jobs.tier_jobs[entry.tier] += 1
        if isinstance(exc, TierFullError):
            try:
                self.writer.put(entry, put, adopt=True)  # retries, then spills
            except BaseException as again:
                exc = again
            else:
                with sh.lock:
                    jobs.tier_jobs[entry.tier] -= 1
                return
        with sh.lock:
            sh.n["saves"] += 1
            sh.n["captured"] += entry.nbytes
            sh.index[(entry.step, entry.level)] = entry
            if entry.record >= 0:
                sh.by_record[entry.record] = entry
                entry.read_q = self.clock.first_q[entry.record]
        self.writer.inline_failed(entry, exc)  # raises

    def load(self, entry, verify):
        """A new state of the stored record `entry` of a memory level whose
        structure the store knows and whose leaves are all small (looked up,
        found in its tier, the plan followed): each leaf copied out and
        verified against its checksum, the state rebuilt by its layout.
        `verify` reports a mismatch (:meth:`~._restore.Restore.verify`)."""
        sh = self.shared
        shape = entry.shape
        sums = entry.checksums
        if shape.n == 1:
            src = entry.leaves[0]
            dst = src.copy()
            got = shape.hashes[0](dst)
            if got != sums[0]:
                verify(entry, 0, src, got, sums[0])
            root = shape.root
            if root is not None and dst.dtype is root[0] and dst.shape == root[1]:
                state = dst  # Layout.build of a one-array layout
            else:
                state = shape.layout.build([dst])
        else:
            arrays = []
            for i, (src, digest) in enumerate(zip(entry.leaves, shape.hashes)):
                dst = src.copy()
                if digest(dst) != sums[i]:
                    verify(entry, i, src, digest(dst), sums[i])
                arrays.append(dst)
            state = shape.layout.build(arrays)
        clock = self.clock
        lock = sh.mutex
        if lock is not None:
            lock.acquire()
        try:
            sh.n["loads"] += 1
            if entry.tier in sh.prefetch_levels:  # a memory level asked to be prefetched
                sh.n["misses"] += 1
            q = entry.read_q
            if entry.record >= 0 and q >= 0:
                index, next_read = clock.reads[entry.level]
                if index[q] == clock.now:
                    entry.read_q = next_read[q]
                else:
                    clock.advance_read(entry)  # resynchronises
            c = sh.tc[entry.tier]
            c.gets += 1
            c.bytes_out += entry.nbytes
            if self.pumps:
                self.cache.pump()
        finally:
            if lock is not None:
                lock.release()
        return state

    def delete(self, entry) -> None:
        """Delete the stored record `entry` of a memory level (looked up,
        the plan followed) and give its buffers back to the pool.

        A record's own buffers (captured for it, shared with no other
        record) pass from the tier to the pool: what the store holds does
        not grow, so they need no room check against its memory budget
        (:meth:`~._capture.Capture.release` makes it for the others)."""
        sh = self.shared
        tier = sh.tiers[entry.tier]
        try:
            tier.delete(entry.key)
        except KeyError:
            pass  # already gone (removed behind the store's back)
        except Exception as exc:
            with sh.lock:
                sh.n["deletes"] += 1
                self._unregister(entry)
                self.jobs.record("delete", entry, exc)
            self.jobs.raise_failures()
        lock = sh.mutex
        if lock is not None:
            lock.acquire()
        try:
            sh.n["deletes"] += 1
            del sh.index[(entry.step, entry.level)]  # as _unregister
            if entry.record >= 0:
                sh.by_record.pop(entry.record, None)
            if self.pumps:
                self.cache.pump()
            leaves, owned, digests = sh.count_delete(entry)
        finally:
            if lock is not None:
                lock.release()
        if entry.leases:  # views load(copy=False) lent: the record is gone
            end_leases(entry)
        if digests is None and leaves is not None and False not in owned:
            shape = entry.shape  # (None for a record the general path saved)
            if shape is None:
                self.capture.pool.recycle(leaves)
            elif shape.recycles:  # (else none is pooled: the pool would drop them all)
                self.capture.pool.recycle(leaves, shape.keys[0] if shape.n == 1 else None)
        else:
            self.capture.release(leaves, owned, digests)

    def _unregister(self, entry) -> None:
        """Lock held: `entry` leaves the index (and the cache looks ahead)."""
        sh = self.shared
        end_leases(entry)
        del sh.index[(entry.step, entry.level)]
        if entry.record >= 0:
            sh.by_record.pop(entry.record, None)
        if self.pumps:
            self.cache.pump()
