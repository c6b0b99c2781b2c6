"""Restore: a stored record back into a state, in the caller's arrays or new ones.

Three ways out of the store, chosen by ``load``:

* ``out=``: the record is copied into the arrays of an existing state of the
  same structure (a solver's live buffers), which is returned.  Leaves a
  provider rebuilds (immutable arrays) are rebuilt instead, and so is a
  state whose tree differs from the record's in values that cannot change
  in place (scalars).
* ``copy=True`` (default): arrays the caller owns.  At a record's last use
  (from the plan) its arrays are handed over without a copy when the store
  owns them alone: its own capture buffers that no other record shares and
  of which no read-only view was lent, or arrays a tier's ``get`` returned
  new (``fresh_gets``).  Everything else is copied.
* ``copy=False``: read-only views of the stored arrays, verified.  The
  buffers behind them are held by a :class:`~vlcc_adjoint.storage.Lease`
  of the store's pool, so that no later capture or read reuses them while
  the views are valid: ``load(copy=False)`` hands the lease to the record
  (its deletion ends it), :meth:`TieredStore.lend` to the caller
  (:class:`StateLease`).  The lease covers the buffers the store owns: for
  a record of a tier that keeps them by reference (``retains_references``)
  its leaves, whatever ``get`` returned; otherwise the arrays read.  A
  record read straight from a memory tier keeps its buffers until its
  deletion anyway, so ``load(copy=False)`` opens no lease there (a Move
  that takes the buffers over opens one).

A record on a memory level whose tier serves the arrays it was given
(``serves_put_arrays``) is read straight from them (:meth:`Restore.direct`):
each leaf is verified against its checksum in the same pass that copies it
out, so a restore reads the record once.  If it turns out corrupt, ``out``
may already hold part of it.
"""

from __future__ import annotations

import numpy as np

from ...errors import VlccValueError
from ...state import dtype_from_json, flatten_traits, unflatten
from .._belady import NEVER
from .._checksum import copy_checksum, leaf_checksum
from .._pool import owns_memory
from .._tier import CorruptCheckpointError, StorageError
from ._common import readonly, tier_name

__all__ = ["Restore", "StateLease"]


class StateLease:
    """A stored state lent as read-only views (:meth:`TieredStore.lend`).

    The store does not reuse the memory behind the views until the lease is
    released, even if the record is deleted meanwhile.  Use it as a context
    manager (``with store.lend(i) as state:``), or read :attr:`state` and
    call :meth:`release`; after the release the views may show other
    records' bytes, so drop them.

    **Attributes:** `state` (the state around the views).
    """

    __slots__ = ("state", "_lease")

    def __init__(self, state, lease):
        self.state = state
        self._lease = lease

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called."""
        return not self._lease.open

    def release(self) -> None:
        """End the lease (idempotent): the store may reuse the memory."""
        self._lease.release()

    def __enter__(self):
        return self.state

    def __exit__(self, exc_type, exc, tb) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<StateLease {'released' if self.released else 'open'}>"


class Restore:
    """Loads of records into states.

    **Arguments:** the engine's :class:`~._common.Shared`,
    :class:`~._clock.PlanClock`, :class:`~._capture.Capture` and
    :class:`~._cache.ReadCache`.
    """

    def __init__(self, shared, clock, capture, cache):
        self.shared = shared
        self.clock = clock
        self.capture = capture
        self.cache = cache

    def finish(self, entry, acquired, out, targets, copy):
        """`entry` as a state, from the arrays :meth:`ReadCache.acquire`
        returned (``(arrays, source, slot, hold)``; a slot comes pinned, a
        staged record's buffers with a lease `hold`).

        **Returns:** ``(state, lease)``: with ``copy=False`` the pool lease
        of the buffers behind the views, else ``None``."""
        sh, cache = self.shared, self.cache
        arrays, source, slot, hold = acquired
        pinned = slot is not None  # the slot stays pinned while we copy from it
        lease = None
        try:
            with sh.lock:
                sh.n["loads"] += 1
                nxt = self.clock.advance_read(entry)
                free = False  # nobody else needs `arrays` after this load
                owned = None
                if slot is not None:
                    if nxt == NEVER and entry.slot is slot:
                        cache.drop_slot(entry, release=False)  # unpins it
                        slot.arrays = None
                        free = True
                        pinned = False
                        owned = slot.owned
                    elif entry.slot is slot:
                        cache.belady.update(entry.seq, nxt)
                elif source == "tier":
                    owned = [sh.fresh[entry.tier]] * len(arrays)
                    free = nxt == NEVER or not cache.admit(
                        entry, arrays, owned, None, nxt, prefetched=False
                    )
                if not copy:
                    # Views are lent: lease the buffers behind them before
                    # anyone may give them back (below, or an eviction).
                    entry.lent = True
                    if hold is None:
                        hold = self.capture.pool.lend(self.buffers(entry, arrays))
                    lease, hold = hold, None
                lent = entry.lent
                cache.pump()
            if targets is not None or not copy:
                if targets is not None:
                    state = self.into(out, entry.spec, arrays, *targets)
                else:
                    state = self.rebuild(entry, [readonly(a) for a in arrays])
                if free:  # the read buffers go to the pool (after the lease, if lent)
                    self.capture.release(arrays, owned, slot.digests if slot is not None else None)
                return state, lease
            if free:
                if slot is not None and slot.digests:
                    alone = self.capture.unshare(slot.digests)
                    owned = [o and a for o, a in zip(owned, alone)]
                return self.rebuild(entry, self.own(arrays, None if lent else owned)), None
            return self.rebuild(entry, [np.array(a, copy=True) for a in arrays]), None
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        finally:
            if hold is not None:  # a staged record copied: its writer may give them back
                hold.release()
            if pinned:
                with sh.lock:
                    if entry.slot is slot:
                        cache.belady.unpin(entry.seq)

    def direct(self, entry, out, targets, copy, lend=False):
        """A load from a memory level, in the caller, from the arrays the
        tier keeps (they are the ones the engine handed to its ``put``).
        ``(state, lease)``: with `lend` (``copy=False``, for
        :meth:`TieredStore.lend`) the pool lease of the record's buffers,
        else ``None``.  Views lent by ``load(copy=False)`` need none: the
        record keeps its buffers until its deletion (a Move that takes them
        over leases them then, see :meth:`~._write.Writer.hand_over`)."""
        sh = self.shared
        tier = sh.tiers[entry.tier]
        if entry.key not in tier:
            raise StorageError(
                f"the record of step {entry.step} is missing from level {entry.tier} "
                f"({tier_name(tier)}, key {entry.key!r}): it was "
                "removed behind the store's back; recompute the state"
            )
        lease = None
        with sh.lock:
            leaves, sums = list(entry.leaves), entry.checksums
            if not copy:
                entry.lent = True
                if lend:
                    lease = self.capture.pool.lend(leaves)
        try:
            state = self._direct(entry, leaves, sums, out, targets, copy)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        with sh.lock:
            sh.n["loads"] += 1
            if entry.tier in sh.prefetch_levels:  # a memory level asked to be prefetched
                sh.n["misses"] += 1
            self.clock.advance_read(entry)
            c = sh.tc[entry.tier]
            c.gets += 1
            c.bytes_out += entry.nbytes
            self.cache.pump()
        return state, lease

    def _direct(self, entry, leaves, sums, out, targets, copy):
        """:meth:`direct`'s copy (or views) of the verified `leaves`."""
        spec = entry.spec
        if targets is not None:
            dsts, out_spec, rebuilt = targets
            for i, src in enumerate(leaves):
                if rebuilt[i]:  # immutable arrays: rebuilt from a copy
                    dsts[i] = np.empty(src.shape, src.dtype)
                self.verify(entry, i, src, copy_checksum(src, dsts[i]), sums[i])
            if any(rebuilt) or (
                out_spec["tree"] is not spec["tree"] and out_spec["tree"] != spec["tree"]
            ):
                out = unflatten(spec, dsts)
            state = out
        elif copy:
            arrays = []
            shape = entry.shape
            if shape is not None and shape.small:
                # Small leaves: a copy and one C call each (direct_hash).
                for i, (src, digest) in enumerate(zip(leaves, shape.hashes)):
                    dst = src.copy()
                    if digest(dst) != sums[i]:
                        self.verify(entry, i, src, digest(dst), sums[i])
                    arrays.append(dst)
                state = shape.build(arrays)
            else:
                for i, src in enumerate(leaves):
                    dst = np.empty(src.shape, src.dtype)
                    self.verify(entry, i, src, copy_checksum(src, dst), sums[i])
                    arrays.append(dst)
                state = self.rebuild(entry, arrays)
        else:
            for i, src in enumerate(leaves):
                self.verify(entry, i, src, leaf_checksum(src), sums[i])
            state = self.rebuild(entry, [readonly(a) for a in leaves])
        return state

    def buffers(self, entry, arrays) -> list:
        """Lock held: the buffers of the store behind `arrays` of `entry`,
        which a lease must hold: the record's own leaves on a tier that keeps
        them by reference (``get`` may return views of them), else `arrays`."""
        if self.shared.retains[entry.tier] and entry.leaves is not None:
            return list(entry.leaves)
        return arrays

    def own(self, arrays: list, owned) -> list:
        """Arrays the caller may own: those the store owns alone (`owned`,
        their memory their own, writeable, C-contiguous, and no lease on
        them) are handed over, the others copied."""
        pool = self.capture.pool
        out = []
        for i, arr in enumerate(arrays):
            if (
                owned is not None
                and owned[i]
                and arr.flags.writeable
                and arr.flags.c_contiguous
                and owns_memory(arr)
                and not pool.leased(arr)
            ):
                out.append(arr)
            else:
                out.append(np.array(arr, copy=True))
        arrays.clear()
        return out

    @staticmethod
    def rebuild(entry, arrays):
        """The state of `entry` around `arrays`: by its planned structure
        when the store knows it (:meth:`~vlcc_adjoint.state.Layout.build`,
        which checks each leaf's dtype and shape against the spec), else
        by :func:`~vlcc_adjoint.state.unflatten` of its spec."""
        shape = entry.shape
        if shape is not None:
            return shape.build(arrays)
        return unflatten(entry.spec, arrays)

    def verify(self, entry, i, leaf, got, want) -> None:
        if got != want:
            name = tier_name(self.shared.tiers[entry.tier])
            exc = CorruptCheckpointError.in_record(
                f"leaf {i} ({leaf.dtype.str}{list(leaf.shape)}) has checksum {got}, "
                f"the record says {want}",
                entry.key,
                name,
                entry.step,
            )
            raise CorruptCheckpointError(
                f"step {entry.step} on level {entry.level}: {exc}",
                key=entry.key,
                tier=name,
                step=entry.step,
            )

    def targets(self, out, spec):
        """Check that `out` can take the stored state of `spec` in place:
        ``(its arrays, its spec, which leaves are rebuilt)``."""
        layout = self.capture.layout
        if (
            layout is not None
            and (spec["tree"] is layout.tree or spec["tree"] == layout.tree)
            and (spec["leaves"] is layout.leaf_specs or spec["leaves"] == layout.leaf_specs)
        ):
            # The record has the structure of the states saved last; so has
            # `out` if the layout takes it: its leaves are then its own
            # C-contiguous numpy arrays, of the record's dtypes and shapes.
            targets = layout.leaves(out)
            if targets is not None:
                for i, dst in enumerate(targets):
                    if not dst.flags.writeable:
                        raise VlccValueError(
                            f"out= array {i} is read-only; pass writeable arrays, "
                            "or load without out="
                        )
                return targets, layout.spec(), [False] * len(targets)
        targets, out_spec, traits = flatten_traits(out)
        want = spec["leaves"]
        if len(targets) != len(want):
            raise VlccValueError(
                f"out= has {len(targets)} arrays, the stored state of step "
                f"{spec.get('step')} has {len(want)}; pass a state of the same "
                "structure, or load without out="
            )
        same = out_spec["leaves"] == want  # same dtypes (byte order included) and shapes
        rebuilt = []
        for i, dst in enumerate(targets):
            if not same:
                w = want[i]
                dtype = dtype_from_json(w["dtype"])
                if (
                    list(dst.shape) != w["shape"]
                    or dst.dtype != dtype
                    or dst.dtype.str != dtype.str
                ):
                    raise VlccValueError(
                        f"out= array {i} is {dst.dtype.str}{list(dst.shape)}, the stored one "
                        f"is {w['dtype']}{w['shape']}; pass a state of the same shapes and "
                        "dtypes, or load without out="
                    )
            rebuilt.append(i in traits.rebuilt)
            if rebuilt[i]:
                continue
            # A copy flatten made of a non-contiguous array: writing it
            # would restore nothing.
            if i in traits.fresh:
                raise VlccValueError(
                    f"out= array {i} is not C-contiguous, so it cannot be restored "
                    "in place; pass C-contiguous arrays, or load without out="
                )
            if not dst.flags.writeable:
                raise VlccValueError(
                    f"out= array {i} is read-only; pass writeable arrays, or load without out="
                )
        return targets, out_spec, rebuilt

    @staticmethod
    def into(out, spec, arrays, targets, out_spec, rebuilt):
        """Copy `arrays` into the arrays of the state `out` (checked by targets)."""
        for i, (dst, src) in enumerate(zip(targets, arrays)):
            if rebuilt[i]:
                targets[i] = np.array(src, copy=True)
            else:
                np.copyto(dst, src, casting="no")
        if not any(rebuilt) and (
            out_spec["tree"] is spec["tree"] or out_spec["tree"] == spec["tree"]
        ):
            return out
        return unflatten(spec, targets)
