"""What the engine's parts share: the record entries, the cache slots, the
counters, the tiers' declared capabilities and the one lock.

Every part of the engine (:mod:`._clock`, :mod:`._capture`, :mod:`._jobs`,
:mod:`._placement`, :mod:`._write`, :mod:`._cache`, :mod:`._restore`) holds
the same :class:`Shared` and takes ``shared.lock`` for every change to the
book-keeping, so the parts need not agree on a lock order: there is one
(the buffer pool's own lock, taken inside it, comes after it).

A single-threaded store (``TieredStore(threadsafe=False)``) has no worker
threads and is called from one thread at a time, so nothing in it runs
concurrently: its ``shared.lock`` is a :class:`NoLock` and ``shared.mutex``
is ``None`` (the hot paths test it and skip the lock altogether).
"""

from __future__ import annotations

import itertools
import threading

import numpy as np

from ...errors import VlccRuntimeError, VlccValueError
from .._stats import StoreStats, TierStats
from .._tier import StorageError

# I/O action kinds, as in vlcc_adjoint.schedules.ActionKind (storage does not
# import the schedules package: it only reads an IOPlan's arrays).
SAVE, LOAD, DELETE, MOVE = 1, 2, 3, 4
KIND_NAME = {SAVE: "Save", LOAD: "Load", DELETE: "Delete", MOVE: "Move"}

# Entry states.
QUEUED, WRITING, STORED, FAILED, CANCELLED, GONE = range(6)


class PlanMismatchError(StorageError):
    """A store call does not match the next I/O action of the store's plan."""


def describe(kind, step, level, dst=-1) -> str:
    """An I/O action as the schedule writes it."""
    if kind == MOVE:
        return f"Move(step={step}, src={level}, dst={dst})"
    return f"{KIND_NAME[kind]}(step={step}, level={level})"


def tier_name(tier) -> str:
    return getattr(tier, "name", type(tier).__name__)


def check_int(name, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise VlccValueError(f"{name} must be an int >= 0, got {value!r}")


def check_step(step) -> int:
    if type(step) is int and step >= 0:
        return step
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise VlccValueError(f"step must be an int >= 0, got {step!r}")
    return int(step)


def check_level(level, nlv: int) -> int:
    if type(level) is int and 0 <= level < nlv:
        return level
    if isinstance(level, bool) or not isinstance(level, (int, np.integer)) or not 0 <= level < nlv:
        raise VlccValueError(
            f"level must be an int in 0..{nlv - 1} (an index into the "
            f"store's {nlv} tiers), got {level!r}"
        )
    return int(level)


def readonly(arr: np.ndarray) -> np.ndarray:
    view = arr.view()
    view.flags.writeable = False
    return view


class NoLock:
    """The lock of a single-threaded store: taking it does nothing."""

    __slots__ = ()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return True

    def release(self) -> None:
        pass

    def __enter__(self) -> bool:
        return True

    def __exit__(self, exc_type, exc, tb) -> None:
        return None


class NoCondition:
    """The conditions of a single-threaded store: there is no other thread
    to notify or to wait for."""

    __slots__ = ()

    def notify(self, n: int = 1) -> None:
        pass

    def notify_all(self) -> None:
        pass

    def wait(self, timeout: float | None = None) -> bool:
        # Every job of a store without workers runs in the call that makes
        # it, so nothing is ever waited for; a wait would never end.
        raise VlccRuntimeError(
            "internal error: a single-threaded TieredStore (threadsafe=False) waited for "
            "background work; please report it, and use threadsafe=True meanwhile"
        )


class Slot:
    """A record's arrays in the read cache (prefetched, or kept after a write)."""

    __slots__ = ("arrays", "owned", "digests", "ready", "error", "dropped", "prefetched", "used")

    def __init__(self, prefetched: bool):
        self.arrays: list | None = None
        self.owned: list[bool] | None = None  # per array: the store's own (may be pooled)
        self.digests: list | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.dropped = False
        self.prefetched = prefetched
        self.used = False


class Entry:
    """One stored record: a state on one level, from its save to its delete."""

    __slots__ = (
        "step",
        "level",
        "tier",
        "key",
        "seq",
        "spec",
        "nbytes",
        "leaves",
        "owned",
        "digests",
        "checksums",
        "staged_bytes",
        "state",
        "cancel",
        "done",
        "error",
        "slot",
        "record",
        "read_q",
        "move_src",
        "delete_after",
        "reserved",
        "reserved_tier",
        "lent",
        "leases",
        "shape",
    )

    def __init__(self, step, level, tier, seq, spec, nbytes, record):
        self.step = step
        self.level = level  # the schedule's level
        self.tier = tier  # the level it is stored on (differs after a spill)
        self.seq = seq
        self.key = f"u{step}-L{level}-{seq}"
        self.spec = spec
        self.nbytes = nbytes
        self.leaves = None  # staged copy (before the put), or arrays a tier keeps by reference
        self.owned = None  # per leaf: a buffer of ours (may be reused once free)
        self.digests = None  # per leaf: dedup digest held in the LeafTable, or None
        self.checksums = None  # per leaf: xxh3-64 of `leaves` (None: not computed yet)
        self.staged_bytes = 0
        self.state = QUEUED
        self.cancel = False  # deleted while its put runs: the worker deletes it after
        self.done = None  # set when its background write ends (made by Jobs.submit)
        self.error = None
        self.slot = None
        self.record = record  # row of the plan's records, -1 without a plan
        self.read_q = -1  # position of its next read in its level's reads, -1 if none
        self.move_src = None  # a Move's source entry, read by the worker
        self.delete_after = None  # a Move's source entry, deleted after our put
        self.reserved = 0
        self.reserved_tier = -1
        self.lent = False  # read-only views of its arrays were handed out (load(copy=False))
        self.leases = None  # the pool leases of those views, ended with the record
        self.shape = None  # the planned structure of its state (_inline.Shape), if known


def end_leases(entry) -> None:
    """API lock held: `entry`'s record was deleted, so the leases of the
    views ``load(copy=False)`` lent of it end: a buffer they held and its
    owner gave back meanwhile goes to the pool now."""
    leases, entry.leases = entry.leases, None
    if leases:
        for lease in leases:
            lease.release()


class TierCounters:
    __slots__ = ("bytes_in", "bytes_out", "puts", "gets", "deletes", "records", "raw_bytes")

    def __init__(self):
        self.bytes_in = self.bytes_out = self.puts = self.gets = self.deletes = 0
        self.records = self.raw_bytes = 0


class Shared:
    """The state every part of the engine reads: tiers and their capabilities,
    the lock and its conditions, the index of records, the counters.

    Capabilities, per level, read once from the tiers' declared class
    attributes (:class:`~vlcc_adjoint.storage.Tier`):

    - `retains`: the tier keeps the leaf arrays ``put`` hands it
      (``retains_references``): it is written in the caller (``inline``),
      and its buffers stay with it until the record's delete.
    - `copies`: its ``put`` keeps no reference to the arrays it is given
      (``copies_on_put``): the store owns them again once the put returns.
      A tier with neither `retains` nor `copies` may keep them: they are
      shared with it from its put on, never reused.
    - `direct`: its records may be read straight from the arrays the engine
      put (``serves_put_arrays``), verified by the engine in its copy.
    - `fresh`: ``get`` returns new arrays the caller may own
      (``fresh_gets``): they may be handed over or pooled without a copy.
    - `reads_into`: ``get`` reads into arrays from the engine's pool
      (``fresh_gets`` and ``reads_into``; a subclass that defines its own
      ``get`` without declaring them again has neither, see
      :class:`~vlcc_adjoint.storage.Tier`).
    - `payloads`: its records are the caller's opaque payloads
      (``holds_payloads``, a :class:`~vlcc_adjoint.storage.DeviceTier`):
      kept as given, never flattened, copied, checksummed or read as
      bytes (:mod:`._device`).

    With `threadsafe` ``False`` (no workers), `lock` is a :class:`NoLock`,
    `changed` and `work` are :class:`NoCondition` and `mutex` is ``None``;
    otherwise `mutex` is `lock`.
    """

    def __init__(self, tiers, policy, dedup, workers, prefetch_levels, threadsafe=True):
        self.tiers = tiers
        self.nlv = len(tiers)
        self.policy = policy
        self.dedup = dedup
        self.workers = workers
        self.retains = [bool(t.retains_references) for t in tiers]
        self.inline = list(self.retains)
        self.copies = [bool(t.copies_on_put) for t in tiers]
        self.direct = [bool(t.retains_references and t.serves_put_arrays) for t in tiers]
        self.fresh = [bool(t.fresh_gets) for t in tiers]
        self.reads_into = [bool(t.fresh_gets and t.reads_into) for t in tiers]
        self.payloads = [bool(getattr(t, "holds_payloads", False)) for t in tiers]
        self.prefetch_levels = prefetch_levels
        self.threadsafe = threadsafe
        self.lock: threading.Lock | NoLock
        self.changed: threading.Condition | NoCondition
        self.work: threading.Condition | NoCondition
        if threadsafe:
            self.lock = self.mutex = threading.Lock()
            self.changed = threading.Condition(self.lock)  # callers wait for workers
            self.work = threading.Condition(self.lock)  # workers wait for jobs
        else:
            self.lock, self.mutex = NoLock(), None
            self.changed = self.work = NoCondition()
        self.index: dict[tuple[int, int], Entry] = {}
        self.by_record: dict[int, Entry] = {}
        self.seq = itertools.count()
        self.tc = [TierCounters() for _ in tiers]
        self.n = dict(
            saves=0,
            loads=0,
            moves=0,
            deletes=0,
            spills=0,
            captured=0,
            referenced=0,
            issued=0,
            hits=0,
            late=0,
            misses=0,
            wasted=0,
            staged_hits=0,
            dedup_hits=0,
            dedup_saved=0,
        )
        self.t = dict(capture=0.0, stall=0.0, flush=0.0, io=0.0)
        self.closing = False  # queued prefetches are skipped, none are started
        self.stopping = False  # workers exit
        self.closed = False

    def count_put(self, entry) -> None:
        """Lock held: a record was put on its tier."""
        c = self.tc[entry.tier]
        c.puts += 1
        c.bytes_in += entry.nbytes
        c.records += 1
        c.raw_bytes += entry.nbytes

    def count_delete(self, entry) -> tuple:
        """Lock held: `entry` left its tier.  Marks it gone and hands back its
        ``(leaves, owned, digests)``, which it no longer holds."""
        c = self.tc[entry.tier]
        c.deletes += 1
        c.records -= 1
        c.raw_bytes -= entry.nbytes
        entry.state = GONE
        taken = entry.leaves, entry.owned, entry.digests
        entry.leaves = entry.owned = entry.digests = None
        return taken


def snapshot(shared, placement, cache, pool) -> StoreStats:
    """The store's counters as a :class:`StoreStats` (takes the lock)."""
    sh, pl = shared, placement
    with sh.lock:
        tiers = []
        for k, (tier, c) in enumerate(zip(sh.tiers, sh.tc)):
            used = tier.used_bytes
            tiers.append(
                TierStats(
                    level=k,
                    name=tier_name(tier),
                    bytes_in=c.bytes_in,
                    bytes_out=c.bytes_out,
                    puts=c.puts,
                    gets=c.gets,
                    deletes=c.deletes,
                    records=c.records,
                    raw_bytes=c.raw_bytes,
                    used_bytes=used,
                    capacity_bytes=tier.capacity_bytes,
                    compression_ratio=(c.raw_bytes / used) if used > 0 and c.raw_bytes else None,
                )
            )
        n, t = sh.n, sh.t
        return StoreStats(
            tiers=tuple(tiers),
            saves=n["saves"],
            loads=n["loads"],
            moves=n["moves"],
            deletes=n["deletes"],
            spills=n["spills"],
            captured_bytes=n["captured"],
            referenced_bytes=n["referenced"],
            capture_seconds=t["capture"],
            stall_seconds=t["stall"],
            flush_seconds=t["flush"],
            io_seconds=t["io"],
            prefetch_issued=n["issued"],
            prefetch_hits=n["hits"],
            prefetch_late=n["late"],
            prefetch_misses=n["misses"],
            prefetch_wasted=n["wasted"],
            staged_hits=n["staged_hits"],
            dedup_hits=n["dedup_hits"],
            dedup_bytes_saved=n["dedup_saved"],
            staging_bytes=pl.staging_used,
            cache_bytes=cache.used_bytes,
            peak_staging_bytes=pl.peak_staging,
            peak_cache_bytes=cache.peak_bytes,
            staging_limit=pl.staging_limit,
            cache_limit=cache.capacity_bytes,
            pool_reused=pool.reused,
            pool_allocated=pool.allocated,
        )
