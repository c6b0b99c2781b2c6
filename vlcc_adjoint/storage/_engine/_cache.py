"""The read-ahead cache: records read before the schedule needs them, kept
and evicted with perfect foresight.

Records on the *prefetch levels* (default: every level but 0) are read
ahead into a RAM cache of at most ``prefetch_bytes``, in the order the
schedule will load them, by worker threads that also verify their
checksums (:meth:`ReadCache.pump`, run on every store call).  The cache is
run by Belady's rule (L. A. Belady, "A study of replacement algorithms for
a virtual-storage computer", IBM Systems Journal 5(2), 1966; see
:mod:`.._belady`): room is made by evicting the record whose next load is
farthest away (or never), a record is read ahead only if that evicts
nothing needed sooner, a record past its last load (from the plan) leaves
the cache at once, and on its last load its arrays are handed to the
caller without a copy when the store owns them alone.  Captures for
prefetch levels whose next load is near are kept in the cache after their
``put`` under the same rule (write-through, :meth:`ReadCache.admit`), so a
record saved and soon loaded again is never read back.

A slot being read is *pinned* (never evicted); its bytes are reserved from
the moment the read is queued.  A load that finds its record still queued
for reading reads it itself (:meth:`~._jobs.Jobs.help`).
"""

from __future__ import annotations

import time

from .._belady import ForesightCache
from ._common import FAILED, QUEUED, STORED, WRITING, Slot
from ._write import lost

__all__ = ["ReadCache"]


class ReadCache:
    """The prefetch cache of one store.

    **Arguments:**

    - `shared`, `jobs`, `clock`, `writer`, `capture`: the engine's parts.
    - `capacity_bytes`: the cache's budget (never exceeded).
    - `lookahead`: how many future reads :meth:`pump` considers.
    """

    def __init__(self, shared, jobs, clock, writer, capture, capacity_bytes: int, lookahead: int):
        self.shared = shared
        self.jobs = jobs
        self.clock = clock
        self.writer = writer
        self.capture = capture
        self.lookahead = lookahead
        self.belady = ForesightCache(int(capacity_bytes))
        self.slots: dict = {}  # entry.seq -> entry with a cache slot
        self.inflight = 0
        self.max_inflight = max(2, 2 * shared.workers)

    @property
    def used_bytes(self) -> int:
        return self.belady.used_bytes

    # -- admission and eviction --------------------------------------------------------

    def admit(self, entry, arrays, owned, digests, next_use, prefetched) -> bool:
        """Lock held: keep `arrays` of `entry` in the cache if Belady allows."""
        if entry.slot is not None or entry.tier not in self.shared.prefetch_levels:
            return False
        victims = self.belady.victims_for(entry.nbytes, next_use)
        if victims is None:
            return False
        for v in victims:
            self.evict(v)
        self.belady.insert(entry.seq, entry.nbytes, next_use)
        slot = Slot(prefetched)
        slot.arrays, slot.owned, slot.digests = list(arrays), list(owned), digests
        slot.ready.set()
        entry.slot = slot
        self.slots[entry.seq] = entry
        return True

    def evict(self, seq) -> None:
        """Lock held: drop a ready, unpinned slot from the cache."""
        entry = self.slots[seq]
        if entry.slot is not None and entry.slot.prefetched and not entry.slot.used:
            self.shared.n["wasted"] += 1
        self.drop_slot(entry)

    def drop_slot(self, entry, release=True) -> None:
        """Lock held: remove `entry`'s slot (an in-flight one is only marked,
        its bytes stay reserved until its read ends)."""
        slot = entry.slot
        if slot is None:
            return
        entry.slot = None
        if not slot.ready.is_set():
            slot.dropped = True  # the read job frees the reservation
            return
        self.slots.pop(entry.seq, None)
        if entry.seq in self.belady:
            self.belady.remove(entry.seq)
        if release and slot.arrays is not None:
            arrays, owned, digests = slot.arrays, slot.owned, slot.digests
            slot.arrays = None
            self.capture.release(arrays, owned, digests)

    def clear(self) -> None:
        """Lock held: evict every slot not being read (at close)."""
        for seq in list(self.slots):
            if not self.belady.pinned(seq):
                self.evict(seq)

    # -- read-ahead -----------------------------------------------------------------------

    def _upcoming(self):
        """Lock held: ``(entry, action index)`` of the next reads of records
        on prefetch levels, soonest first, each record once.  Only the
        prefetch levels' reads are looked at, plus the levels records may
        have spilled from onto a prefetch level."""
        sh = self.shared
        prefetch = sh.prefetch_levels
        spilled = sh.n["spills"]
        levels = [
            k
            for k in range(len(self.clock.reads))
            if k in prefetch or (spilled and any(j > k for j in prefetch))
        ]
        seen = set()
        by_record = sh.by_record
        for t, r in self.clock.upcoming_reads(levels, self.lookahead):
            if r in seen:
                continue
            seen.add(r)
            entry = by_record.get(r)
            if entry is not None and entry.tier in prefetch:
                yield entry, t

    def pump(self) -> None:
        """Lock held: start the prefetches Belady admits, soonest first."""
        sh = self.shared
        if (
            self.clock.plan is None
            or sh.workers == 0
            or sh.closing
            or not sh.prefetch_levels
            or self.belady.capacity_bytes == 0
        ):
            return
        for entry, t in self._upcoming():
            if self.inflight >= self.max_inflight:
                return
            if entry.slot is not None:
                if entry.slot.ready.is_set():
                    self.belady.update(entry.seq, t)
                continue
            if entry.state != STORED:
                continue  # still staged (served from RAM), or failed
            victims = self.belady.victims_for(entry.nbytes, t)
            if victims is None:
                return
            for v in victims:
                self.evict(v)
            self.belady.insert(entry.seq, entry.nbytes, t)
            self.belady.pin(entry.seq)  # in flight: never evicted
            slot = Slot(prefetched=True)
            entry.slot = slot
            self.slots[entry.seq] = entry
            self.inflight += 1
            sh.n["issued"] += 1
            self.jobs.submit("read", entry, t, slot)

    def run_read(self, entry, slot) -> None:
        """Worker: read `entry` from its tier into `slot` (verified by the tier)."""
        sh = self.shared
        with sh.lock:
            skip = slot.dropped or sh.closing
        arrays = error = None
        if not skip:
            try:
                rec = self.writer.tier_get(entry)
                arrays = list(rec.leaves)
                del rec
            except BaseException as exc:
                error = exc
        fresh = sh.fresh[entry.tier]
        with sh.lock:
            self.inflight -= 1
            slot.arrays, slot.error = arrays, error
            slot.owned = None if arrays is None else [fresh] * len(arrays)
            self.belady.unpin(entry.seq)
            release = None
            if slot.dropped or skip:  # nobody wants it any more: free its reservation
                if entry.slot is slot:
                    entry.slot = None
                if entry.slot is None:
                    seq = entry.seq
                    if self.slots.get(seq) is entry:
                        del self.slots[seq]
                    if seq in self.belady:
                        self.belady.remove(seq)
                release = (slot.arrays, slot.owned, None)
                slot.arrays = None
            slot.ready.set()
            self.pump()
        if release is not None and release[0] is not None:
            self.capture.release(*release)
        del arrays

    # -- loads --------------------------------------------------------------------------------

    def acquire(self, entry):
        """The arrays of `entry` for a load: ``(arrays, source, slot, hold)``,
        the source ``"staged"`` (the capture waiting for its write; `hold` a
        lease on its buffers, which the writer gives back when the write
        ends, so that they are not reused while the load reads them),
        ``"cache"`` (the slot returned pinned) or ``"tier"``."""
        sh, jobs = self.shared, self.jobs
        waited = 0.0
        late = False
        try:
            while True:
                with sh.lock:
                    if entry.state == FAILED:
                        raise lost(entry) from entry.error
                    if entry.state in (QUEUED, WRITING) and entry.leaves is not None:
                        sh.n["staged_hits"] += 1
                        staged = list(entry.leaves)
                        return staged, "staged", None, self.capture.pool.lend(staged)
                    slot = entry.slot
                    if slot is not None and slot.ready.is_set():
                        if slot.error is not None:
                            err = slot.error
                            self.drop_slot(entry)
                            raise err
                        self.belady.pin(entry.seq)
                        slot.used = True
                        sh.n["hits"] += 1
                        sh.n["late"] += late
                        return list(slot.arrays), "cache", slot, None
                    t0 = time.perf_counter()
                    if slot is not None:
                        event = slot.ready
                        late = True
                        if jobs.help(("read",), entry):  # still queued: read it ourselves
                            waited += time.perf_counter() - t0
                            continue
                    elif entry.state in (QUEUED, WRITING):
                        event = entry.done  # a Move still reading its source
                        if jobs.help(("write",), entry):
                            waited += time.perf_counter() - t0
                            continue
                    else:
                        if entry.tier in sh.prefetch_levels:
                            sh.n["misses"] += 1
                        break
                t0 = time.perf_counter()
                event.wait()
                waited += time.perf_counter() - t0
            t0 = time.perf_counter()
            rec = self.writer.tier_get(entry)
            arrays = list(rec.leaves)
            del rec
            waited += time.perf_counter() - t0
            return arrays, "tier", None, None
        finally:
            if waited:
                with sh.lock:
                    sh.t["stall"] += waited
