"""What the engine's parts share: the record entries, the cache slots, the
counters, the tiers' declared capabilities and the one lock.

Every part of the engine (:mod:`._clock`, :mod:`._capture`, :mod:`._jobs`,
:mod:`._placement`, :mod:`._write`, :mod:`._cache`, :mod:`._restore`) holds
the same :class:`Shared` and takes ``shared.lock`` for every change to the
book-keeping, so the parts need not agree on a lock order: there is one.
"""

from __future__ import annotations

import inspect
import itertools
import threading

import numpy as np

from ...errors import VlccValueError
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


class Slot:
    """A record's arrays in the read cache (prefetched, or kept after a write)."""

    __slots__ = ("arrays", "owned", "digests", "ready", "error", "dropped", "prefetched", "used")

    def __init__(self, prefetched: bool):
        self.arrays = None
        self.owned = None  # per array: the store's own (may be pooled or handed over)
        self.digests = None
        self.ready = threading.Event()
        self.error = None
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
        self.shape = None  # the planned structure of its state (_inline.Shape), if known


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
    - `direct`: its records may be read straight from the arrays the engine
      put (``serves_put_arrays``), verified by the engine in its copy.
    - `fresh`: ``get`` returns new arrays the caller may own
      (``fresh_gets``): they may be handed over or pooled without a copy.
    - `reads_into`: ``get`` reads into arrays from the engine's pool
      (``fresh_gets`` and ``reads_into``, and its ``get`` takes ``take``: a
      subclass that overrides ``get(key)`` alone is read as before).
    """

    def __init__(self, tiers, policy, dedup, workers, prefetch_levels):
        self.tiers = tiers
        self.nlv = len(tiers)
        self.policy = policy
        self.dedup = dedup
        self.workers = workers
        self.retains = [bool(t.retains_references) for t in tiers]
        self.inline = list(self.retains)
        self.direct = [bool(t.retains_references and t.serves_put_arrays) for t in tiers]
        self.fresh = [bool(t.fresh_gets) for t in tiers]
        self.reads_into = [bool(t.fresh_gets and t.reads_into) and _takes(t.get) for t in tiers]
        self.prefetch_levels = prefetch_levels
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # callers wait for workers
        self.work = threading.Condition(self.lock)  # workers wait for jobs
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


def _takes(get) -> bool:
    """Whether the bound method `get` accepts the keyword argument ``take``."""
    try:
        params = inspect.signature(get).parameters
    except (TypeError, ValueError):
        return False
    return "take" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
