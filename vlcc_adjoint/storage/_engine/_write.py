"""The write path: records into their tiers, and out of them again.

**Memory levels run in the caller.**  A tier that keeps records by
reference (``retains_references``) does no I/O: its ``put`` adopts the
capture's buffers.  So a ``save`` to it finishes the record in the caller
(capture with checksum, ``put``: :meth:`Writer.write_inline`) and returns
with the record complete; its ``delete`` gives the buffers back to the pool
at once, for the next ``save``.  A thread hand-off per call would cost more
than the ``put`` itself, and the worker's bookkeeping would compete with
the caller for the GIL.

**Slower levels run on the workers** (:meth:`Writer.run_write`): optional
deduplication, the hashing of leaves kept by reference, and the tier
``put`` (which compresses or writes files).  After the ``put`` the staged
buffers go to the read cache, if the record is read again soon and Belady's
rule admits it (write-through, :mod:`._cache`), or back to the pool: if the
tier declares ``copies_on_put``; a tier that does not may keep them, so
they are shared with it from then on and never reused.

A ``put`` that finds its tier full spills to the next slower tier with
``policy="spill"``.  A record deleted while its write is queued is
cancelled; one deleted while its ``put`` runs is deleted by the worker
right after.  A ``Move`` writes the new copy first and deletes the old one
after (:meth:`Writer.delete_after`), so a failure never loses both.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from .._belady import NEVER
from .._checksum import leaf_checksum, verify_leaves
from .._tier import CorruptCheckpointError, Record, StorageError, TierFullError
from ._common import CANCELLED, FAILED, QUEUED, STORED, WRITING, tier_name

__all__ = ["Writer"]


class Writer:
    """Puts, gets and deletes of records on their tiers.

    **Arguments:** the engine's :class:`~._common.Shared`, :class:`~._jobs.Jobs`,
    :class:`~._placement.Placement`, :class:`~._capture.Capture` and
    :class:`~._clock.PlanClock`; the read cache is attached as ``cache``.
    """

    def __init__(self, shared, jobs, placement, capture, clock):
        self.shared = shared
        self.jobs = jobs
        self.placement = placement
        self.capture = capture
        self.clock = clock
        self.cache = None

    # -- writes ---------------------------------------------------------------------

    def write_inline(self, entry) -> None:
        """Put a fresh capture into a memory level, in the caller.  The
        checksums were computed by the capture copy.  Failures are raised
        here, naming the step."""
        sh, jobs = self.shared, self.jobs
        try:
            if sh.dedup is True:
                give, _ = self.capture.dedup(entry, entry.leaves)
                self.capture.pool.recycle(give)
            self.put(
                entry, Record(entry.spec, tuple(entry.leaves), tuple(entry.checksums)), adopt=True
            )
        except BaseException as exc:
            self.inline_failed(entry, exc)
        with sh.lock:
            entry.state = STORED
            sh.count_put(entry)
            jobs.tier_jobs[entry.tier] -= 1  # entry.tier: where it ended up (a spill moves it)
            release = self.finish_write(entry, stored=True, notify=False)
        self.capture.release(*release)

    def inline_failed(self, entry, exc) -> None:
        """The put of an inline write failed: the record is lost; raise
        naming the step."""
        sh, jobs = self.shared, self.jobs
        with sh.lock:
            entry.state = FAILED
            entry.error = exc
            jobs.tier_jobs[entry.tier] -= 1
            release = self.finish_write(entry)
            jobs.record("save", entry, exc)
        self.capture.release(*release)
        jobs.raise_failures()
        raise exc  # pragma: no cover - raise_failures raised

    def run_write(self, entry) -> None:
        """Worker: the background write of a staged capture or of a Move."""
        sh = self.shared
        with sh.lock:
            if entry.state == CANCELLED:
                release = self.finish_write(entry)
                after = entry.delete_after
                entry.delete_after = None
            else:
                after = release = None
                entry.state = WRITING
                # Taken in the same critical section as the state change: a
                # Move may hand the staged copy on the moment we are WRITING.
                leaves = None if entry.leaves is None else list(entry.leaves)
                sums = entry.checksums
                src = entry.move_src
        if release is not None:
            self.delete_after(after)  # the source first, as below
            self.capture.release(*release)
            if entry.done is not None:
                entry.done.set()
            return
        try:
            checksums: Sequence[str] | None = None
            if leaves is None:  # a Move whose source is only in its tier
                rec = self.tier_get(src)
                leaves, checksums = list(rec.leaves), rec.checksums
                del rec
                fresh = sh.fresh[src.tier]
                with sh.lock:
                    entry.leaves, entry.owned = leaves, [fresh] * len(leaves)
                    entry.move_src = None
            elif src is not None:  # a Move of a memory record's own buffers
                self.verify_moved(src, leaves, sums)
                with sh.lock:
                    entry.move_src = None
            elif sh.dedup is True and entry.digests is None:
                give, leaves = self.capture.dedup(entry, leaves)
                self.capture.pool.recycle(give)
            if checksums is None:
                # Most were computed by the capture copy (a shared dedup leaf
                # has the same bytes, hence the same checksum); the leaves
                # kept by reference are hashed here, with the GIL released.
                if sums is None:
                    sums = [None] * len(leaves)
                checksums = [
                    c if c is not None else leaf_checksum(leaf) for leaf, c in zip(leaves, sums)
                ]
            # A Move's leaves read from its source keep the checksums verified there.
            record = Record(entry.spec, tuple(leaves), tuple(checksums))
            del leaves
            self.put(entry, record)
            checksums = record.checksums
            del record
        except BaseException as exc:
            with sh.lock:
                entry.state = FAILED
                entry.error = exc
                release = self.finish_write(entry)
                after = entry.delete_after
                entry.delete_after = None
                self.jobs.record("write", entry, exc)
            self.delete_after(after)  # the source first, as below
            self.capture.release(*release)
            if entry.done is not None:
                entry.done.set()
            return
        with sh.lock:
            entry.state = STORED
            entry.checksums = checksums  # for loads straight from a memory tier
            sh.count_put(entry)
            cancel = entry.cancel
            release = self.finish_write(entry, stored=True)
            after = entry.delete_after
            entry.delete_after = None
        # A Move's source first: a tier that kept the buffers by reference
        # lets go of them before they go back to the pool.
        self.delete_after(after)
        self.capture.release(*release)
        if cancel:
            self.run_delete(entry)
        if entry.done is not None:
            entry.done.set()

    def finish_write(self, entry, stored=False, notify=True):
        """Lock held: end of a write job.  Returns what to release.  (An
        inline write need not `notify`: nobody can be waiting for it, the
        caller holds the API lock.)"""
        sh, pl = self.shared, self.placement
        pl.staging_used -= entry.staged_bytes
        entry.staged_bytes = 0
        k = entry.tier
        if not (sh.retains[k] or sh.copies[k]) and entry.owned is not None:
            # The tier may keep what its put was given (it declares
            # neither): shared with it from now on, never reused.
            entry.owned = [False] * len(entry.owned)
            if entry.digests:
                self.capture.disown(entry.digests)
        if entry.reserved_tier >= 0:
            pl.reserved[entry.reserved_tier] -= entry.reserved
            entry.reserved, entry.reserved_tier = 0, -1
        if notify:
            sh.changed.notify_all()
        if stored and not entry.cancel and entry.leaves is not None:
            if sh.retains[entry.tier]:
                return (None, None, None)  # the tier holds them: kept until the delete
            nxt = self.clock.next_use(entry) if entry.record >= 0 else NEVER
            if nxt != NEVER and entry.tier in sh.prefetch_levels and not sh.closing:
                leaves, owned, digests = entry.leaves, entry.owned, entry.digests
                if self.cache.admit(entry, leaves, owned, digests, nxt, prefetched=False):
                    entry.leaves = entry.owned = entry.digests = None
                    return (None, None, None)
        if stored and entry.cancel:
            return (None, None, None)  # released by the delete that follows
        leaves, owned, digests = entry.leaves, entry.owned, entry.digests
        entry.leaves = entry.owned = entry.digests = None
        return (leaves, owned, digests)

    def put(self, entry, record, adopt=False) -> None:
        """Put `record` into `entry`'s tier (spilling on with policy="spill").
        `adopt`: the record is a fresh capture of ours (:meth:`Tier.adopt`)."""
        sh = self.shared
        while True:
            tier = sh.tiers[entry.tier]
            try:
                if adopt:
                    tier.adopt(entry.key, record)
                else:
                    tier.put(entry.key, record)
                return
            except TierFullError as exc:
                nxt = entry.tier + 1
                if sh.policy != "spill" or nxt >= sh.nlv:
                    raise StorageError(
                        f"step {entry.step} does not fit on level {entry.tier}: {exc}"
                    ) from exc
                with sh.lock:
                    self.jobs.tier_jobs[entry.tier] -= 1
                    self.jobs.tier_jobs[nxt] += 1
                    sh.n["spills"] += 1
                    entry.tier = nxt

    # -- reads and deletes ------------------------------------------------------------

    def tier_get(self, entry) -> Record:
        """The record of `entry` from its tier, errors naming the step."""
        sh = self.shared
        tier = sh.tiers[entry.tier]
        try:
            if sh.reads_into[entry.tier]:  # into pooled buffers: touched before, page-aligned
                rec = tier.get(entry.key, take=self.capture.pool.take)
            else:
                rec = tier.get(entry.key)
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(
                f"step {entry.step} on level {entry.level}: {exc}",
                key=entry.key,
                tier=getattr(tier, "name", None),
                step=entry.step,
            ) from exc
        except KeyError as exc:
            raise StorageError(
                f"the record of step {entry.step} is missing from level {entry.tier} "
                f"({tier_name(tier)}, key {entry.key!r}): it was "
                "removed behind the store's back; recompute the state"
            ) from exc
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(
                f"reading step {entry.step} from level {entry.tier} "
                f"({tier_name(tier)}) failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        with sh.lock:
            c = sh.tc[entry.tier]
            c.gets += 1
            c.bytes_out += entry.nbytes
        return rec

    def verify_moved(self, src, leaves, checksums) -> None:
        """Worker: the leaves a Move took over from the memory record `src`
        match their checksums (as its tier's ``get`` would check), else
        :class:`CorruptCheckpointError` naming the step."""
        tier = tier_name(self.shared.tiers[src.tier])
        try:
            verify_leaves(leaves, checksums, src.key, tier, src.step)
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(
                f"step {src.step} on level {src.level}: {exc}",
                key=src.key,
                tier=tier,
                step=src.step,
            ) from exc

    def delete_after(self, old) -> None:
        """After a Move's write: delete the source's tier copy."""
        if old is None:
            return
        sh = self.shared
        try:
            self.run_delete(old)
        finally:
            with sh.lock:
                self.jobs.tier_jobs[old.tier] -= 1
                sh.changed.notify_all()

    def run_delete(self, entry, notify=True) -> None:
        """Delete `entry` from its tier and give its buffers back."""
        sh = self.shared
        tier = sh.tiers[entry.tier]
        try:
            tier.delete(entry.key)
        except KeyError:
            pass  # already gone (a cancelled write that never reached the tier)
        with sh.lock:
            leaves, owned, digests = sh.count_delete(entry)
            if notify:
                sh.changed.notify_all()
        self.capture.release(leaves, owned, digests)

    def retire(self, entry) -> None:
        """Lock held: `entry` left the schedule's view (Delete, or Move away of
        a staged capture); cancel or delete its storage."""
        self.cache.drop_slot(entry)
        if entry.state == QUEUED:
            entry.state = CANCELLED  # the worker skips it
        elif entry.state == WRITING:
            entry.cancel = True  # the worker deletes it after its put
        elif entry.state == STORED:
            self.jobs.submit("delete", entry, -1)

    def hand_over(self, old, new) -> None:
        """Lock held: a Move's new record `new` takes over what `old` has.

        Still staged: the staged copy (the old write is cancelled).  On a
        tier that keeps its arrays by reference: those arrays, the record's
        buffers, which `new` now owns (the old tier's record is deleted
        once the new one is written, and gives nothing back).  Cached: the
        cached arrays, written from RAM.  Otherwise the worker reads the old
        record from its tier.  The old tier copy is deleted once the new one
        is written.  Leases of views lent of `old` pass to `new`: the record
        moves, its bytes stay."""
        new.leases, old.leases = old.leases, None
        new.lent = old.lent
        if old.state in (QUEUED, WRITING):
            new.leaves, new.owned, new.digests = old.leaves, old.owned, old.digests
            new.checksums = old.checksums
            new.staged_bytes, old.staged_bytes = old.staged_bytes, 0
            old.leaves = old.owned = old.digests = None
            self.retire(old)
            return
        sh = self.shared
        if old.state == STORED and sh.retains[old.tier] and old.leaves is not None:
            # get would return views of these very buffers: hand over the
            # buffers themselves (the worker verifies their checksums).
            # Views load(copy=False) lent of them (which hold no lease:
            # the record kept its buffers) are leased now, until the new
            # record's deletion: its write may give the buffers back.
            self.cache.drop_slot(old)
            if old.lent:
                lease = self.capture.pool.lend(old.leaves)
                new.leases = [lease] if new.leases is None else [*new.leases, lease]
            new.leaves, new.owned, new.digests = old.leaves, old.owned, old.digests
            new.checksums = old.checksums
            old.leaves = old.owned = old.digests = None
            new.move_src = old  # the worker verifies them, as the tier's get would
            new.delete_after = old
            self.jobs.tier_jobs[old.tier] += 1
            return
        slot = old.slot
        if slot is not None and slot.ready.is_set() and slot.error is None:
            self.cache.drop_slot(old, release=False)
            new.leaves, new.owned, new.digests = slot.arrays, slot.owned, slot.digests
            slot.arrays = None
            new.staged_bytes = new.nbytes
            self.placement.stage(new.nbytes)
        else:
            self.cache.drop_slot(old)
            new.move_src = old  # the worker reads it from its tier
        new.delete_after = old
        self.jobs.tier_jobs[old.tier] += 1

    def settle(self, entry) -> None:
        """Wait for a pending write without a staged copy (a Move in flight),
        then raise if it failed."""
        sh = self.shared
        with sh.lock:
            pending = entry.state in (QUEUED, WRITING) and entry.leaves is None
        if pending:
            t0 = time.perf_counter()
            entry.done.wait()
            with sh.lock:
                sh.t["stall"] += time.perf_counter() - t0
        if entry.state == FAILED:
            raise lost(entry) from entry.error


def lost(entry) -> StorageError:
    """The error for a record whose background write failed."""
    return StorageError(
        f"step {entry.step} on level {entry.level} is lost: its background write failed "
        f"({type(entry.error).__name__}: {entry.error}); recompute it or restart from "
        "an earlier checkpoint"
    )
