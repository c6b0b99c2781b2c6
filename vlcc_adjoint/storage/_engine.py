"""TieredStore: the asynchronous checkpoint engine over a hierarchy of tiers.

The executor maps every schedule action to one call: ``Save(i, k)`` ->
``save(i, state, k)``, ``Load(i, k)`` -> ``load(i, k)``, ``Delete(i, k)`` ->
``delete(i, k)``, ``Move(i, k, d)`` -> ``move(i, k, d)``.  Levels index the
``tiers`` list, 0 the fastest.  What happens behind those calls:

**Capture** (``save``).  The state is flattened
(:func:`vlcc_adjoint.state.flatten`) and every leaf the caller could still
change is copied into a buffer from a :class:`~._pool.BufferPool` (copying
into reused memory runs at memory bandwidth; fresh pages cost a page fault
each).  The copy computes the leaf's xxh3-64 checksum in the same pass
(:func:`~._checksum.copy_checksum`: one read of the caller's array, the GIL
released, streaming stores for large leaves, so the capture neither reads
the old contents of its buffer nor evicts the caller's working set from the
caches).  Leaves that cannot change are kept by reference: read-only arrays
whose whole base chain is read-only and ends in no buffer or in an
immutable one (``bytes``, a JAX array's host buffer).

**Memory levels run in the caller.**  A tier that keeps records by
reference (a :class:`~vlcc_adjoint.storage.MemoryTier`, or any tier with
``retains_references = True``) does no I/O: its ``put`` adopts the
capture's buffers.  So a ``save`` to it finishes the record in the caller
(capture with checksum, ``put``) and returns with the record complete; its
``delete`` gives the buffers back to the pool at once, for the next
``save``; and a ``load`` from a ``MemoryTier`` reads the arrays the tier
keeps, verifying each leaf's checksum in the same pass that copies it into
``out`` (or into a fresh array), so a restore reads the record once.
Handing these to a worker thread, as earlier versions did, bought nothing
and cost a thread hand-off per call plus the worker's hashing and
bookkeeping competing with the caller for the GIL: on the 300 x 300
seismic gradient (1.44 MB states, ~0.2 ms a forward step) that was more
time than the copies themselves.  Worker threads are started only for the
slower levels (compressed, zarr), with the first background job.
``load(copy=False)`` returns read-only views of the record, verified, for
a caller that copies anyway (the executor's ``on_load`` path).
``benchmarks/bench_store_calls.py`` measures each call against a bare
``np.copyto`` of the same bytes (cold data, shared 2-core VM, load ~3,
median of 5 interleaved rounds): for a 1.44 MB state ``save`` takes 0.85x
the copy with the record complete (before: 0.98x, plus 0.76x more on a
worker), ``load(out=)`` 0.84x (before: 1.44x); for 16 MiB 0.94x and
1.20x (before: 1.55x and 1.80x).  In the seismic run the store calls took
0.94 s (before: 1.99 s; the copies alone, in a store that does nothing
else, 0.57 s) and the whole run 3.1 s (before: 4.6 s).

**Staging.**  A capture for a slower level waits for its background write
*staged*: it counts against ``staging_bytes``, and a ``load`` of it is
served from the staged copy (which never changes, so a read can never see
half a write).  When staging is full, ``save`` waits for the workers (a
*stall*).  ``save`` returns as soon as the copies (and their checksums)
are made; optional deduplication, compression and the tier ``put`` run on
worker threads; leaves kept by reference are hashed there.  After the
``put`` its buffers go to the read cache (below) or back to the pool.

**Plan.**  With ``plan`` (:func:`vlcc_adjoint.schedules.io_plan`), the store
knows the schedule's whole future I/O.  It rebuilds the sequence of I/O
actions from the plan (``Save``/``Move`` at each record's start, ``Delete``
at its end, ``Load`` at each read) and checks every call against the next
one: a call that diverges raises :class:`PlanMismatchError` naming the
action the plan expected.  The position in that sequence is the clock of
the prefetcher.

**Prefetch and eviction.**  Records on the *prefetch levels* (default: every
level but 0) are read ahead into a RAM cache of at most ``prefetch_bytes``,
in the order the schedule will load them, by worker threads that also
verify their checksums.  The cache is run by Belady's rule (IBM Syst. J.
5(2), 1966; :mod:`._belady`): room is made by evicting the record whose next
load is farthest away (or never), a record is prefetched only if that evicts
nothing needed sooner, a record past its last load (from the plan) leaves
the cache at once, and on its last load its prefetched arrays are handed to
the caller without a copy.  Captures for prefetch levels whose next load is
near are kept in the cache after their ``put`` under the same rule (write
through), so a record saved and soon loaded again is never read back.

**Deduplication** (``dedup=``, off by default).  Leaves with equal content
digests (:func:`vlcc_adjoint.state.leaf_digest`) are stored once and
referenced from every record that holds them, through a reference-counted
:class:`~vlcc_adjoint.storage.LeafTable`; a tier that keeps records by
reference then holds the bytes once.  ``dedup=True`` hashes on the worker,
after the capture: it saves memory, and costs the caller nothing.
``dedup="eager"`` hashes in ``save`` before copying and skips the copy of a
leaf seen before: it also saves the capture of unchanged leaves (a
velocity model, frozen weights), at the price of hashing every leaf in the
caller (xxh3 runs at about twice the speed of a copy).  On a memory level
(written in the caller) ``dedup=True`` hashes in the caller too, after the
capture.  Leaves that are
immutable are never copied in the first place, whatever the setting.

**Capacity.**  Every tier enforces ``used_bytes <= capacity_bytes`` itself
(a ``put`` that does not fit raises :class:`TierFullError` and changes
nothing).  ``save`` and ``move`` check first, counting the bytes of writes
still queued for the tier (compressed tiers: raw size times the ratio seen
so far): if the record does not fit once pending work settles,
``policy="raise"`` raises :class:`StorageError` naming step, level and the
remedy, and ``policy="spill"`` stores it on the next slower tier that has
room (loads find it there).  A compressed record that turns out bigger than
estimated fails in its ``put``: it spills there, or surfaces as a write
failure.

**Failures.**  A worker never dies with an exception: a failed background
write is recorded, and the next call into the store (``wait`` and ``close``
included) raises :class:`StorageError` naming the step, the level and the
cause (chained).  A failed ``put`` on a memory level (written in the
caller) raises in that ``save``.  A corrupt record raises
:class:`CorruptCheckpointError` naming its step (a restore from a memory
level verifies while it copies: ``out`` may then hold part of the corrupt
record).  ``close`` flushes pending
writes, stops and joins the workers, and with a ``timeout`` never waits
longer.

**Memory safety of reused buffers.**  A pooled buffer is reused only when
CPython's reference count shows that nobody else (a tier, a reader, a view)
holds it; see :mod:`._pool`.

**Threads.**  The public methods are serialised by one lock, so a store may
be shared by several threads (plan-following then needs their calls in
schedule order).  Workers take jobs from one priority queue, earliest need
first: deletes, then reads and writes by the action index at which their
record is next needed.

Time accounting (stall, hidden I/O) is defined in :mod:`._stats`.
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import bisect_left
import os
import sys
import threading
import time
from collections.abc import Sequence

import numpy as np

from ..state import dtype_from_json as _spec_dtype
from ..state import Layout, flatten, leaf_digest, unflatten
from ._belady import NEVER, ForesightCache
from ._checksum import copy_checksum, corrupt, leaf_checksum
from ._dedup import LeafTable
from ._memory import MemoryTier
from ._pool import _SOLE, BufferPool
from ._stats import StoreStats, TierStats
from ._tier import CorruptCheckpointError, Record, StorageError, Tier, TierFullError

__all__ = ["PlanMismatchError", "TieredStore"]

# I/O action kinds, as in vlcc_adjoint.schedules.ActionKind (storage does not
# import the schedules package: it only reads an IOPlan's arrays).
_SAVE, _LOAD, _DELETE, _MOVE = 1, 2, 3, 4
_KIND_NAME = {_SAVE: "Save", _LOAD: "Load", _DELETE: "Delete", _MOVE: "Move"}

# Entry states.
_QUEUED, _WRITING, _STORED, _FAILED, _CANCELLED, _GONE = range(6)

_MiB = 1 << 20


class PlanMismatchError(StorageError):
    """A store call does not match the next I/O action of the store's plan."""


def _describe(kind, step, level, dst=-1) -> str:
    if kind == _MOVE:
        return f"Move(step={step}, src={level}, dst={dst})"
    return f"{_KIND_NAME[kind]}(step={step}, level={level})"


def _immutable(arr: np.ndarray) -> bool:
    """Whether nobody can change `arr`'s data: read-only along its whole base
    chain, ending in no buffer, ``bytes``, or a JAX array's host buffer."""
    if arr.flags.writeable:
        return False
    base = arr.base
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return False
        base = base.base
    if base is None or isinstance(base, bytes):
        return True
    if isinstance(base, memoryview) and base.readonly:
        owner = type(base.obj)
        return isinstance(base.obj, bytes) or owner.__module__.split(".")[0] in ("jax", "jaxlib")
    return False


def _readonly(arr: np.ndarray) -> np.ndarray:
    view = arr.view()
    view.flags.writeable = False
    return view


def _leaf_nodes(tree, out=None) -> dict:
    """``{leaf index: spec node}`` of a state spec tree."""
    if out is None:
        out = {}
    if isinstance(tree, dict):
        if "leaf" in tree:
            out[tree["leaf"]] = tree
            return out
        for value in tree.values():
            if isinstance(value, (list, dict)):
                _leaf_nodes(value, out)
    elif isinstance(tree, list):
        for value in tree:
            _leaf_nodes(value, out)
    return out


class _Slot:
    """A record's arrays in the read cache (prefetched, or kept after a write)."""

    __slots__ = ("arrays", "owned", "digests", "ready", "error", "dropped", "prefetched", "used")

    def __init__(self, prefetched: bool):
        self.arrays = None
        self.owned = None
        self.digests = None
        self.ready = threading.Event()
        self.error = None
        self.dropped = False
        self.prefetched = prefetched
        self.used = False


class _Entry:
    """One stored record: a state on one level, from its save to its delete."""

    __slots__ = ("step", "level", "tier", "key", "seq", "spec", "nbytes", "leaves", "owned",
                 "digests", "checksums", "staged_bytes", "state", "cancel", "done", "error",
                 "slot", "record", "read_q", "move_src", "delete_after", "reserved",
                 "reserved_tier")

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
        self.state = _QUEUED
        self.cancel = False  # deleted while its put runs: the worker deletes it after
        self.done = None  # set when its background write ends (made by _submit)
        self.error = None
        self.slot = None
        self.record = record  # row of the plan's records, -1 without a plan
        self.read_q = -1  # position of its next read in its level's reads, -1 if none
        self.move_src = None  # a Move's source entry, read by the worker
        self.delete_after = None  # a Move's source entry, deleted after our put
        self.reserved = 0
        self.reserved_tier = -1


class _TierCounters:
    __slots__ = ("bytes_in", "bytes_out", "puts", "gets", "deletes", "records", "raw_bytes")

    def __init__(self):
        self.bytes_in = self.bytes_out = self.puts = self.gets = self.deletes = 0
        self.records = self.raw_bytes = 0


def _plan_ops(plan):
    """The plan's I/O actions in schedule order, rebuilt from its records and
    reads: ``(index, kind, step, level, dst, record)`` arrays."""
    records = plan.records
    m = len(plan.record_of_action)
    kind = np.zeros(m, np.int8)
    step = np.full(m, -1, np.int64)
    level = np.full(m, -1, np.int64)
    dst = np.full(m, -1, np.int64)
    rec = np.full(m, -1, np.int64)
    r = np.arange(len(records))
    start = records["start"]
    kind[start] = _SAVE
    step[start] = records["step"]
    level[start] = records["level"]
    rec[start] = r
    moves = np.zeros(m, bool)
    for lv in plan.levels:
        if len(lv) == 0:
            continue
        idx = lv.index
        src_rec = lv.record
        is_move = (kind[idx] == _SAVE) & (records["end"][src_rec] == idx)
        mi = idx[is_move]
        moves[mi] = True
        dst[mi] = level[mi]
        level[mi] = lv.level
        kind[mi] = _MOVE
        li = idx[~is_move]
        kind[li] = _LOAD
        step[li] = lv.step[~is_move]
        level[li] = lv.level
        rec[li] = src_rec[~is_move]
    end = records["end"]
    has_end = end < m
    dels = end[has_end]
    not_move = ~moves[dels]
    di = dels[not_move]
    kind[di] = _DELETE
    step[di] = records["step"][has_end][not_move]
    level[di] = records["level"][has_end][not_move]
    rec[di] = r[has_end][not_move]
    sel = np.flatnonzero(kind)
    return sel, kind[sel], step[sel], level[sel], dst[sel], rec[sel]


class TieredStore:
    """The asynchronous checkpoint store over a hierarchy of tiers.

    **Arguments:**

    - `tiers`: the storage levels, fastest first (``tiers[k]`` is schedule
      level ``k``): :class:`~vlcc_adjoint.storage.MemoryTier`,
      :class:`~vlcc_adjoint.storage.CompressedMemoryTier`,
      :class:`~vlcc_adjoint.storage.ZarrTier` or any :class:`Tier`.
    - `plan`: the schedule's :class:`~vlcc_adjoint.schedules.IOPlan`
      (``io_plan(schedule)``): enables plan checking, prefetching and
      foresight eviction.  ``None``: every call is accepted, nothing is
      prefetched.
    - `prefetch_bytes`: the read cache's budget (never exceeded).
    - `staging_bytes`: the most bytes of captures waiting for their
      background write; ``save`` waits when it is full.  A single capture
      larger than this is accepted when nothing else is staged.
    - `workers`: background threads for the slower levels (memory levels
      always run in the caller; the threads start with the first
      background job); ``0`` runs every write and read in the caller (a
      synchronous store, for baselines and debugging).  Default:
      one core fewer than the machine has, between 1 and 4 (the solver
      keeps a core: on 2 cores one worker hides more I/O than two, see
      ``benchmarks/bench_overlap.py``).
    - `policy`: ``"raise"`` or ``"spill"``, when a record does not fit its tier.
    - `dedup`: ``False``; ``True`` to store identical leaves once, hashed on a
      worker after the capture (saves memory, not capture time);
      ``"eager"`` to hash in ``save`` before copying (saves the copy of a
      leaf that did not change, costs a hash of every leaf in the caller).
    - `prefetch_levels`: levels read ahead and cached (default: all but 0).
    - `lookahead`: how many future reads the prefetcher considers.
    - `pool_bytes`: the most bytes of free capture buffers kept for reuse
      (default: ``staging_bytes``).
    - `close_tiers`: whether :meth:`close` closes the tiers too.

    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(self, tiers: Sequence[Tier], plan=None, prefetch_bytes: int = 256 * _MiB, *,
                 staging_bytes: int = 512 * _MiB, workers: int | None = None,
                 policy: str = "raise",
                 dedup: bool | str = False, prefetch_levels: Sequence[int] | None = None,
                 lookahead: int = 64, pool_bytes: int | None = None, close_tiers: bool = True):
        tiers = list(tiers)
        if not tiers:
            raise ValueError("TieredStore needs at least one tier, e.g. [MemoryTier()]")
        for k, tier in enumerate(tiers):
            if not isinstance(tier, Tier):
                raise TypeError(f"tiers[{k}] is a {type(tier).__name__}, not a Tier; use "
                                "MemoryTier, CompressedMemoryTier, ZarrTier or a Tier subclass")
        if policy not in ("raise", "spill"):
            raise ValueError(f"policy must be 'raise' or 'spill', got {policy!r}")
        if workers is None:
            workers = max(1, min(4, (os.cpu_count() or 2) - 1))
        if dedup not in (False, True, "eager"):
            raise ValueError(f"dedup must be False, True or 'eager', got {dedup!r}")
        for name, value in (("prefetch_bytes", prefetch_bytes), ("staging_bytes", staging_bytes),
                            ("workers", workers), ("lookahead", lookahead)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        self.tiers = tiers
        self.policy = policy
        self.dedup = dedup
        self._nlv = len(tiers)
        self._workers_n = int(workers)
        self._staging_limit = int(staging_bytes)
        self._lookahead = int(lookahead)
        self._close_tiers = close_tiers
        self._retains = [isinstance(t, MemoryTier) or bool(getattr(t, "retains_references", False))
                         for t in tiers]
        # Levels written in the caller (see "Memory levels" above): tiers that
        # keep records by reference, whose put is bookkeeping, not I/O.
        self._inline = list(self._retains)
        # ... and read in the caller straight from the arrays the tier keeps
        # (a MemoryTier whose get is the stock one: it returns those arrays).
        self._direct = [isinstance(t, MemoryTier) and type(t).get is MemoryTier.get
                        for t in tiers]
        if prefetch_levels is None:
            prefetch_levels = range(1, self._nlv)
        self._prefetch_levels = frozenset(int(k) for k in prefetch_levels)
        bad = [k for k in self._prefetch_levels if not 0 <= k < self._nlv]
        if bad:
            raise ValueError(f"prefetch_levels {bad} are not levels of these {self._nlv} tiers")

        # Plan.
        self._plan = plan
        self._ops = None
        self._cursor = 0
        self._now = -1
        if plan is not None:
            if not all(hasattr(plan, a) for a in ("levels", "records", "record_of_action")):
                raise TypeError(f"plan must be an IOPlan, got {type(plan).__name__}; pass "
                                "vlcc_adjoint.schedules.io_plan(schedule)")
            if len(plan.levels) > self._nlv:
                raise ValueError(f"the plan uses {len(plan.levels)} levels but the store has "
                                 f"{self._nlv} tiers; pass one tier per schedule level")
            self._ops = tuple(a.tolist() for a in _plan_ops(plan))
            # Per record: the position of its first read among its level's
            # reads (-1: never read), looked up once per save, not searched.
            first = plan.records["first_read"]
            q = np.full(len(first), -1, np.int64)
            for lv in plan.levels:
                mine = (plan.records["level"] == lv.level) & (first >= 0)
                q[mine] = np.searchsorted(lv.index, first[mine], side="left")
            self._first_q = q.tolist()
            # Each level's reads as Python lists (indexed once per load).
            self._reads = [(lv.index.tolist(), lv.next_read_of_record.tolist())
                           for lv in plan.levels]
            # ... and the record each read reads (the prefetcher's lookahead).
            self._read_records = [lv.record.tolist() for lv in plan.levels]

        # Book-keeping, all under self._lock.
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # callers wait for workers
        self._work = threading.Condition(self._lock)  # workers wait for jobs
        self._api = threading.RLock()  # serialises the public methods
        self._index: dict[tuple[int, int], _Entry] = {}
        self._by_record: dict[int, _Entry] = {}
        self._slots: dict[int, _Entry] = {}  # entry.seq -> entry with a cache slot
        self._cache = ForesightCache(int(prefetch_bytes))
        self._pool = BufferPool(self._staging_limit if pool_bytes is None else int(pool_bytes))
        # The most bytes of buffers the store may hold at once: its memory
        # levels' capacities, the staging and the read cache.  The pool keeps
        # a free buffer only within it, so reusing buffers (a capture into
        # memory that is already mapped costs half what one into fresh pages
        # does) never makes the store hold more than a memory budget sized
        # for those three allows (BudgetPlan.make_store).  None: unbounded.
        caps = [t.capacity_bytes for t, r in zip(tiers, self._retains) if r]
        self._hold_limit = None if any(c is None for c in caps) else \
            sum(caps) + self._staging_limit + int(prefetch_bytes)
        self._table = LeafTable() if dedup else None
        self._dedup_owned: dict[str, bool] = {}
        self._seq = itertools.count()
        self._heap: list = []
        self._outstanding = 0
        self._inflight_reads = 0
        self._max_inflight = max(2, 2 * self._workers_n)
        self._tier_jobs = [0] * self._nlv
        self._reserved = [0] * self._nlv
        self._failures: list = []
        self._staging_used = 0
        self._peak_staging = 0
        self._closing = False
        self._stopping = False
        self._closed = False
        self._tc = [_TierCounters() for _ in tiers]
        self._n = dict(saves=0, loads=0, moves=0, deletes=0, spills=0, captured=0,
                       referenced=0, issued=0, hits=0, late=0, misses=0, wasted=0,
                       staged_hits=0, dedup_hits=0, dedup_saved=0)
        self._t = dict(capture=0.0, stall=0.0, flush=0.0, io=0.0)
        self._threads = []  # started with the first background job (_submit)
        # The structure of the states saved last (see state.Layout): a save or
        # a load into `out` of a state of that structure skips flatten.
        self._layout: Layout | None = None
        self._no_layout: type | None = None  # a state type that has none

    # ------------------------------------------------------------------ API

    def save(self, step: int, state, level: int = 0) -> None:
        """Store `state` as ``u_step`` on `level`; returns once the store owns it.

        **Arguments:**

        - `step`: the step of the state.
        - `state`: anything :func:`vlcc_adjoint.state.flatten` accepts.  The
          caller may modify it as soon as ``save`` returns.
        - `level`: the storage level (an index into ``tiers``).

        On a memory level the record is complete when ``save`` returns
        (captured, checksummed and put, in the caller); on a slower level
        the write continues in the background.

        Raises :class:`StorageError` if the record does not fit (with
        ``policy="raise"``), if the step is already stored on the level, if
        a memory level's ``put`` fails, or to report an earlier background
        failure; :class:`PlanMismatchError` if the plan expected another
        action.
        """
        with self._api:
            self._enter()
            step, level = self._check_step(step), self._check_level(level)
            if (step, level) in self._index:
                raise StorageError(f"step {step} is already stored on level {level}; delete it "
                                   "first (schedules Save a step once per level)")
            leaves, spec = self._flatten(state)
            spec["step"] = step
            mark = (self._cursor, self._now)
            record = self._follow(_SAVE, step, level)
            # Which leaves to copy: not the immutable ones, nor temporaries
            # flatten made (a C-ordered copy of a non-contiguous array, which
            # nobody else references).
            plan_copy = []
            nbytes = copy_bytes = 0
            for i in range(len(leaves)):
                n = leaves[i].nbytes
                nbytes += n
                if sys.getrefcount(leaves[i]) <= _SOLE and leaves[i].base is None \
                        and leaves[i].flags.writeable:
                    plan_copy.append(0)  # take
                    copy_bytes += n
                elif not leaves[i].flags.writeable and _immutable(leaves[i]):
                    plan_copy.append(1)  # reference
                else:
                    plan_copy.append(2)  # copy
                    copy_bytes += n
            try:
                if not self._inline[level]:  # memory levels stage nothing
                    self._wait_staging(copy_bytes)
                tier, reserved = self._place(step, level, nbytes)
                if not self._inline[tier] and self._inline[level]:  # spilled to a slow level
                    try:
                        self._wait_staging(copy_bytes)
                    except BaseException:
                        with self._lock:
                            self._reserved[tier] -= reserved
                        raise
            except BaseException:
                self._rewind(mark)
                raise
            inline = self._inline[tier]
            t0 = time.perf_counter()
            owned, digests, out, sums = [], [], [], []
            copied = referenced = 0
            for leaf, how in zip(leaves, plan_copy):
                digest = None
                if self.dedup == "eager":
                    digest = leaf_digest(leaf)
                    shared = self._table.acquire(digest)
                    if shared is not None:
                        with self._lock:
                            self._n["dedup_hits"] += 1
                            self._n["dedup_saved"] += leaf.nbytes
                        out.append(shared)
                        owned.append(self._dedup_owned.get(digest, False))
                        digests.append(digest)
                        sums.append(leaf_checksum(shared) if inline else None)
                        continue
                if how == 2:
                    # The capture copy computes the record's checksum in the
                    # same pass (one read of the caller's array); a large
                    # leaf is written with streaming stores (nobody reads a
                    # checkpoint soon: it need not displace the caller's
                    # data from the caches).
                    buf = self._pool.take(leaf.dtype, leaf.shape)
                    checksum = copy_checksum(leaf, buf, stream=True)
                    leaf, buf = buf, None  # no stray reference: it would block reuse
                    copied += leaf.nbytes
                else:
                    # Kept as they are: hashed now for a memory level, by the
                    # worker otherwise.
                    checksum = leaf_checksum(leaf) if inline else None
                    if how == 1:
                        referenced += leaf.nbytes
                    else:
                        copied += leaf.nbytes
                if digest is not None:
                    leaf = self._table.put(digest, leaf)
                    self._dedup_owned[digest] = how != 1
                out.append(leaf)
                owned.append(how != 1)
                digests.append(digest)
                sums.append(checksum)
            leaf = shared = leaves = None
            t1 = time.perf_counter()
            entry = _Entry(step, level, tier, next(self._seq), spec, nbytes, record)
            entry.leaves, entry.owned, entry.checksums = out, owned, sums
            entry.digests = digests if self.dedup == "eager" else None
            entry.reserved, entry.reserved_tier = reserved, tier
            with self._lock:
                self._t["capture"] += t1 - t0
                self._n["saves"] += 1
                self._n["captured"] += copied
                self._n["referenced"] += referenced
                self._register(entry)
                if inline:
                    self._tier_jobs[tier] += 1
                else:
                    entry.staged_bytes = copied
                    self._staging_used += copied
                    self._peak_staging = max(self._peak_staging, self._staging_used)
                    self._submit("write", entry, self._priority(entry))
                self._pump()
            if inline:
                self._write_inline(entry)
            self._after_inline()

    def load(self, step: int, level: int | None = None, out=None, copy: bool = True):
        """The stored ``u_step``.

        **Arguments:**

        - `step`: the step.
        - `level`: the level to read; ``None``: the level the plan expects,
          or without a plan the fastest level holding the step.
        - `out`: optional, a state of the same structure: its arrays are
          overwritten in place (restoring into a solver's live buffers) and
          it is returned (a rebuilt state holding its arrays if it has
          values that cannot change in place, e.g. numpy scalars).
        - `copy`: ``False`` returns the state around *read-only views* of
          the stored arrays, verified but not copied: for a caller that
          copies what it needs at once (the executor's ``on_load`` path,
          which copies into the solver's own buffers).  The views are valid
          until the record is deleted (in practice the store never reuses a
          buffer that a view still references, but holding views keeps
          that memory from being reused: copy, then drop them).  Cannot be
          combined with `out`.

        **Returns:** the state.  Without `out` and with ``copy=True`` its
        arrays are the caller's own: modifying them never changes the
        stored record.

        A record on a memory level is verified while it is copied out (one
        pass over it); if it turns out corrupt, the arrays of `out` may
        already hold part of it.

        Raises :class:`StorageError` if the step is not stored there or its
        write failed, :class:`CorruptCheckpointError` if the record fails its
        integrity check, :class:`PlanMismatchError` off-plan.
        """
        with self._api:
            self._enter()
            step = self._check_step(step)
            if level is None:
                level = self._default_level(step, _LOAD)
            level = self._check_level(level)
            entry = self._lookup(step, level)
            if not copy and out is not None:
                raise ValueError("load(copy=False) returns read-only views of the stored record; "
                                 "it cannot restore into out= as well (pass one or the other)")
            targets = None if out is None else self._targets(out, entry.spec)
            mark = (self._cursor, self._now)
            self._follow(_LOAD, step, level)
            if entry.state == _STORED and entry.slot is None and self._direct[entry.tier] \
                    and entry.leaves is not None and entry.checksums is not None:
                try:
                    return self._load_direct(entry, out, targets, copy)
                except BaseException:
                    self._rewind(mark)
                    raise
            arrays = None
            try:
                arrays, source, slot = self._acquire(entry)
            except BaseException:
                self._rewind(mark)
                raise
            pinned = slot is not None  # the slot stays pinned while we copy from it
            try:
                with self._lock:
                    self._n["loads"] += 1
                    nxt = self._advance_read(entry)
                    free = False  # nobody else needs `arrays` after this load
                    if slot is not None:
                        if nxt == NEVER and entry.slot is slot:
                            self._drop_slot(entry, release=False)  # unpins it
                            slot.arrays = None
                            free = True
                            pinned = False
                        elif entry.slot is slot:
                            self._cache.update(entry.seq, nxt)
                    elif source == "tier":
                        free = nxt == NEVER or not self._admit(
                            entry, arrays, [True] * len(arrays), None, nxt, prefetched=False)
                    self._pump()
                if targets is not None or not copy:
                    if targets is not None:
                        state = self._into(out, entry.spec, arrays, *targets)
                    else:
                        state = unflatten(entry.spec, [_readonly(a) for a in arrays])
                    if free:  # the read buffers go to the pool (if nobody holds them)
                        owned = slot.owned if slot is not None else [True] * len(arrays)
                        self._release(arrays, owned, slot.digests if slot is not None else None)
                    return state
                if free:
                    if slot is not None and slot.digests:
                        self._unshare(slot.digests)  # before _own's reference check
                    return unflatten(entry.spec, self._own(arrays))
                return unflatten(entry.spec, [np.array(a, copy=True) for a in arrays])
            finally:
                arrays = None
                if pinned:
                    with self._lock:
                        if entry.slot is slot:
                            self._cache.unpin(entry.seq)
                self._after_inline()

    def delete(self, step: int, level: int | None = None) -> None:
        """Forget the stored ``u_step`` on `level` (``None``: the plan's level,
        or without a plan every level holding it)."""
        with self._api:
            self._enter()
            step = self._check_step(step)
            if level is None:
                if self._plan is not None:
                    level = self._default_level(step, _DELETE)
                else:
                    levels = [k for k in range(self._nlv) if (step, k) in self._index]
                    if not levels:
                        raise StorageError(f"step {step} is not stored on any level")
                    for k in levels:
                        self.delete(step, k)
                    return
            level = self._check_level(level)
            entry = self._lookup(step, level)
            self._follow(_DELETE, step, level)
            with self._lock:
                self._n["deletes"] += 1
                self._unregister(entry)
                # A stored record on a memory level is deleted here and now:
                # its buffers go back to the pool for the next save.
                now = entry.state == _STORED and self._inline[entry.tier]
                if now:
                    self._drop_slot(entry)
                else:
                    self._retire(entry)
                self._pump()
            if now:
                try:
                    self._run_delete(entry, notify=False)
                except Exception as exc:
                    with self._lock:
                        self._failures.append(("delete", entry.step, entry.level,
                                               self.tiers[entry.tier], exc))
                    self._raise_failures()
            self._after_inline()

    def move(self, step: int, src: int, dst: int) -> None:
        """Relocate the stored ``u_step`` from level `src` to level `dst`.

        Returns at once; the copy runs in the background (a ``load`` from
        `dst` meanwhile is served from RAM or waits for it).
        """
        with self._api:
            self._enter()
            step, src, dst = self._check_step(step), self._check_level(src), self._check_level(dst)
            if src == dst:
                raise ValueError(f"move of step {step} from level {src} to itself")
            if (step, dst) in self._index:
                raise StorageError(f"step {step} is already stored on level {dst}; delete it "
                                   "there first")
            old = self._lookup(step, src)
            mark = (self._cursor, self._now)
            record = self._follow(_MOVE, step, src, dst)
            try:
                self._settle(old)
                if old.slot is not None:  # may be written from the cache: needs staging room
                    self._wait_staging(old.nbytes)
                tier, reserved = self._place(step, dst, old.nbytes)
            except BaseException:
                self._rewind(mark)
                raise
            new = _Entry(step, dst, tier, next(self._seq), old.spec, old.nbytes, record)
            new.reserved, new.reserved_tier = reserved, tier
            with self._lock:
                self._n["moves"] += 1
                self._unregister(old)
                if old.state in (_QUEUED, _WRITING):
                    # Still staged: the new record takes over the staged copy,
                    # the old write is cancelled.
                    new.leaves, new.owned, new.digests = old.leaves, old.owned, old.digests
                    new.checksums = old.checksums
                    new.staged_bytes, old.staged_bytes = old.staged_bytes, 0
                    old.leaves = old.owned = old.digests = None
                    self._retire(old)
                else:
                    slot = old.slot
                    if slot is not None and slot.ready.is_set() and slot.error is None:
                        # Cached: the new record is written from the cache.
                        self._drop_slot(old, release=False)
                        new.leaves, new.owned, new.digests = slot.arrays, slot.owned, slot.digests
                        slot.arrays = None
                        new.staged_bytes = new.nbytes
                        self._staging_used += new.nbytes
                        self._peak_staging = max(self._peak_staging, self._staging_used)
                    else:
                        self._drop_slot(old)
                        new.move_src = old  # the worker reads it from its tier
                    # The old tier copy goes once the new one is written.
                    new.delete_after = old
                    self._tier_jobs[old.tier] += 1
                self._register(new)
                self._submit("write", new, self._priority(new))
                self._pump()
            self._after_inline()

    def sync(self, action_index: int) -> None:
        """Tell a planned store that the executor is at schedule action
        `action_index` (optional: the store follows its calls anyway).

        Raises :class:`PlanMismatchError` if an I/O action before it was skipped.
        """
        with self._api:
            self._enter()
            if self._ops is None:
                return
            index, kind, step, level, dst, _ = self._ops
            c = self._cursor
            if c < len(index) and index[c] < action_index:
                raise PlanMismatchError(
                    f"sync({action_index}): the plan's action {index[c]}, "
                    f"{_describe(kind[c], step[c], level[c], dst[c])}, was not performed; "
                    "call the store for every Save/Load/Delete/Move of the schedule, in order"
                )
            with self._lock:
                self._now = max(self._now, action_index - 1)
                self._pump()

    def wait(self) -> None:
        """Block until every background job is done; raise any failure."""
        with self._api:
            self._check_open()
            t0 = time.perf_counter()
            with self._lock:
                while self._outstanding and not self._stopping:
                    self._changed.wait(0.05)
                self._t["flush"] += time.perf_counter() - t0
            self._raise_failures()

    def close(self, timeout: float | None = 600.0) -> None:
        """Flush pending writes, stop the workers, close the tiers (if
        `close_tiers`).  Idempotent.

        **Arguments:**

        - `timeout`: the most seconds to wait for pending work and for the
          workers (``None``: as long as it takes).  Work still pending then
          is abandoned and reported, so a hanging tier (a dead network
          file system) cannot hang ``close``.

        Raises :class:`StorageError` for any failure not yet reported.
        """
        with self._api:
            if self._closed:
                return
            t0 = time.perf_counter()
            deadline = None if timeout is None else t0 + timeout
            with self._lock:
                self._closing = True  # queued prefetches are skipped, none are started
                while self._outstanding:
                    left = None if deadline is None else deadline - time.perf_counter()
                    if left is not None and left <= 0:
                        pending = sorted({(j[4].step, j[4].level) for j in self._heap})
                        self._failures.append((
                            "close", None, None, None,
                            TimeoutError(f"{self._outstanding} background jobs still pending "
                                         f"after {timeout} s (steps, levels: {pending[:10]})")))
                        break
                    self._changed.wait(0.05 if left is None else min(left, 0.05))
                self._stopping = True
                self._heap.clear()
                self._work.notify_all()
            for th in self._threads:
                left = None if deadline is None else max(0.0, deadline - time.perf_counter())
                th.join(left)
            stuck = [th.name for th in self._threads if th.is_alive()]
            with self._lock:
                self._t["flush"] += time.perf_counter() - t0
                for seq in list(self._slots):
                    if not self._cache.pinned(seq):
                        self._evict(seq)
                self._index.clear()
                self._by_record.clear()
            self._pool.clear()
            if self._close_tiers:
                for k, tier in enumerate(self.tiers):
                    try:
                        tier.close()
                    except Exception as exc:  # reported below, after the others close
                        self._failures.append(("close", None, k, tier, exc))
            self._closed = True
            if stuck:
                raise StorageError(f"worker threads {stuck} were still busy when close() timed "
                                   "out; a tier operation is hanging (check the tier's path or "
                                   "network); they are daemon threads and end with the process")
            self._raise_failures()

    def __enter__(self) -> TieredStore:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            self.close()
            return False
        try:
            self.close()
        except Exception as close_error:  # the body's exception is the one raised
            exc.add_note(f"closing the TieredStore afterwards also failed: {close_error!r}")
        return False

    def stats(self) -> StoreStats:
        """A snapshot of the store's counters (:class:`StoreStats`)."""
        with self._lock:
            tiers = []
            for k, (tier, c) in enumerate(zip(self.tiers, self._tc)):
                used = tier.used_bytes
                tiers.append(TierStats(
                    level=k, name=getattr(tier, "name", type(tier).__name__),
                    bytes_in=c.bytes_in, bytes_out=c.bytes_out, puts=c.puts, gets=c.gets,
                    deletes=c.deletes, records=c.records, raw_bytes=c.raw_bytes,
                    used_bytes=used, capacity_bytes=tier.capacity_bytes,
                    compression_ratio=(c.raw_bytes / used) if used > 0 and c.raw_bytes else None,
                ))
            n, t = self._n, self._t
            return StoreStats(
                tiers=tuple(tiers), saves=n["saves"], loads=n["loads"], moves=n["moves"],
                deletes=n["deletes"], spills=n["spills"], captured_bytes=n["captured"],
                referenced_bytes=n["referenced"], capture_seconds=t["capture"],
                stall_seconds=t["stall"], flush_seconds=t["flush"], io_seconds=t["io"],
                prefetch_issued=n["issued"], prefetch_hits=n["hits"], prefetch_late=n["late"],
                prefetch_misses=n["misses"], prefetch_wasted=n["wasted"],
                staged_hits=n["staged_hits"], dedup_hits=n["dedup_hits"],
                dedup_bytes_saved=n["dedup_saved"], staging_bytes=self._staging_used,
                cache_bytes=self._cache.used_bytes, peak_staging_bytes=self._peak_staging,
                peak_cache_bytes=self._cache.peak_bytes, staging_limit=self._staging_limit,
                cache_limit=self._cache.capacity_bytes, pool_reused=self._pool.reused,
                pool_allocated=self._pool.allocated,
            )

    def steps(self, level: int) -> list[int]:
        """The steps stored on `level` now, sorted."""
        with self._lock:
            return sorted(s for s, k in self._index if k == level)

    def reserve(self, state, count: int = 1) -> None:
        """Allocate and touch capture buffers for `count` states shaped like
        `state` ahead of time, so the first saves do not pay page faults."""
        leaves, _ = flatten(state)
        for leaf in leaves:
            if not _immutable(leaf):
                self._pool.reserve(leaf.dtype, leaf.shape, count)

    def __repr__(self) -> str:
        names = ", ".join(type(t).__name__ for t in self.tiers)
        plan = "with plan" if self._plan is not None else "no plan"
        return f"TieredStore([{names}], {plan}, workers={self._workers_n})"

    # ------------------------------------------------------------- helpers

    def _flatten(self, state):
        """``flatten(state)``, without re-deriving the spec of a state whose
        structure, dtypes and shapes are those of the last one saved (a time
        loop saves one structure over and over).  The spec's ``tree`` and
        ``leaves`` are then shared with the earlier records: read-only."""
        layout = self._layout
        if layout is not None:
            leaves = layout.leaves(state)
            if leaves is not None:
                return leaves, layout.spec()
        leaves, spec = flatten(state)
        if type(state) is not self._no_layout:
            layout = Layout.of(state, leaves, spec)
            if layout is None:
                self._no_layout = type(state)
            else:
                self._layout = layout
        return leaves, spec

    def _check_open(self):
        if self._closed:
            raise StorageError("this TieredStore is closed; create a new one")

    def _enter(self):
        if self._closed:
            raise StorageError("this TieredStore is closed; create a new one")
        if self._failures:  # (read without the lock: a failure recorded meanwhile waits a call)
            self._raise_failures()

    @staticmethod
    def _check_step(step) -> int:
        if type(step) is int and step >= 0:
            return step
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        return int(step)

    def _check_level(self, level) -> int:
        if type(level) is int and 0 <= level < self._nlv:
            return level
        if isinstance(level, bool) or not isinstance(level, (int, np.integer)) \
                or not 0 <= level < self._nlv:
            raise ValueError(f"level must be an int in 0..{self._nlv - 1} (an index into the "
                             f"store's {self._nlv} tiers), got {level!r}")
        return int(level)

    def _default_level(self, step, kind) -> int:
        if self._ops is not None:
            c = self._cursor
            if c < len(self._ops[0]) and self._ops[1][c] == kind and self._ops[2][c] == step:
                return self._ops[3][c]
        for k in range(self._nlv):
            if (step, k) in self._index:
                return k
        raise StorageError(f"step {step} is not stored on any level; stored: "
                           f"{self._describe_stored()}")

    def _describe_stored(self) -> str:
        by = {}
        for s, k in self._index:
            by.setdefault(k, []).append(s)
        if not by:
            return "nothing"
        return "; ".join(f"level {k}: {sorted(v)[:12]}" for k, v in sorted(by.items()))

    def _lookup(self, step, level) -> _Entry:
        entry = self._index.get((step, level))
        if entry is None:
            raise StorageError(f"step {step} is not stored on level {level} (stored: "
                               f"{self._describe_stored()}); save it first, or load from "
                               "the level the schedule saved it on")
        return entry

    def _follow(self, kind, step, level, dst=-1) -> int:
        """Match a call against the plan's next I/O action; returns the record."""
        if self._ops is None:
            return -1
        index, kinds, steps, levels, dsts, recs = self._ops
        c = self._cursor
        if c >= len(index):
            call = _describe(kind, step, level, dst)
            raise PlanMismatchError(
                f"{call} is past the end of the plan (all {len(index)} of its I/O actions are "
                "done); construct the store with the io_plan of the schedule being run, or "
                "with plan=None"
            )
        if kinds[c] != kind or steps[c] != step or levels[c] != level or \
                (kind == _MOVE and dsts[c] != dst):
            call = _describe(kind, step, level, dst)
            raise PlanMismatchError(
                f"{call} does not follow the plan: it expected action {index[c]}, "
                f"{_describe(kinds[c], steps[c], levels[c], dsts[c])}. Call the store in "
                "schedule order with the schedule's levels (one call per Save/Load/Delete/Move), "
                "or construct it without plan="
            )
        self._cursor = c + 1
        with self._lock:
            self._now = index[c]
        return recs[c]

    def _priority(self, entry) -> int:
        """Action index at which `entry`'s data is next needed (FIFO without a plan)."""
        if self._plan is None:
            return NEVER
        return self._next_use(entry)

    def _next_use(self, entry) -> int:
        if entry.read_q < 0:
            return NEVER
        return self._reads[entry.level][0][entry.read_q]

    def _register(self, entry):
        self._index[(entry.step, entry.level)] = entry
        if entry.record >= 0:
            self._by_record[entry.record] = entry
            entry.read_q = self._first_q[entry.record]

    def _unregister(self, entry):
        self._index.pop((entry.step, entry.level), None)
        if entry.record >= 0:
            self._by_record.pop(entry.record, None)

    def _advance_read(self, entry) -> int:
        """After a read of `entry` at the current action: its next use."""
        if entry.record < 0 or entry.read_q < 0:
            return NEVER
        index, next_read = self._reads[entry.level]
        q = entry.read_q
        if index[q] != self._now:  # resynchronise (defensive)
            q = self._plan.levels[entry.level].position(self._now)
        entry.read_q = next_read[q] if q < len(index) else -1
        return NEVER if entry.read_q < 0 else index[entry.read_q]

    def _raise_failures(self):
        with self._lock:
            if not self._failures:
                return
            failures, self._failures = self._failures, []
        what, step, level, tier, exc = failures[0]
        more = f" ({len(failures) - 1} more failures after it)" if len(failures) > 1 else ""
        tname = getattr(tier, "name", type(tier).__name__) if tier is not None else None
        if what == "close":
            if tier is not None:
                msg = f"closing tier {tname!r} (level {level}) failed: {exc!r}"
            else:
                msg = f"close() gave up: {exc}"
        elif what == "save":
            msg = (f"saving step {step} to level {level} (tier {tname!r}) failed: "
                   f"{type(exc).__name__}: {exc}. The record of step {step} on level {level} "
                   "is lost; recompute the state or restart from an earlier checkpoint")
        elif what == "delete":
            msg = (f"deleting step {step} from level {level} (tier {tname!r}) "
                   f"failed: {type(exc).__name__}: {exc}. The tier may still hold the record "
                   "and its bytes; check the tier's path and permissions")
        else:
            msg = (f"the background {what} of step {step} to level {level} (tier {tname!r}) "
                   f"failed: {type(exc).__name__}: {exc}. The record of step {step} on level "
                   f"{level} is lost; check the tier's path, permissions and free space, then "
                   "recompute the state or restart from an earlier checkpoint")
        if isinstance(exc, CorruptCheckpointError):
            raise CorruptCheckpointError(msg + more, key=exc.key, tier=exc.tier,
                                         step=step) from exc
        raise StorageError(msg + more) from exc

    def _after_inline(self):
        """With workers=0 the jobs ran in the call: report their failures now."""
        if self._workers_n == 0:
            self._raise_failures()

    def _rewind(self, mark):
        """Undo a plan step whose call failed before changing anything."""
        with self._lock:
            self._cursor, self._now = mark

    def _settle(self, entry):
        """Wait for a pending write without a staged copy (a Move in flight),
        then raise if it failed."""
        with self._lock:
            pending = entry.state in (_QUEUED, _WRITING) and entry.leaves is None
        if pending:
            t0 = time.perf_counter()
            entry.done.wait()
            with self._lock:
                self._t["stall"] += time.perf_counter() - t0
        if entry.state == _FAILED:
            raise StorageError(
                f"step {entry.step} on level {entry.level} is lost: its background write failed "
                f"({type(entry.error).__name__}: {entry.error}); recompute it or restart from "
                "an earlier checkpoint") from entry.error

    def _retire(self, entry):
        """Lock held: `entry` left the schedule's view (Delete, or Move away of
        a staged capture); cancel or delete its storage."""
        self._drop_slot(entry)
        if entry.state == _QUEUED:
            entry.state = _CANCELLED  # the worker skips it
        elif entry.state == _WRITING:
            entry.cancel = True  # the worker deletes it after its put
        elif entry.state == _STORED:
            self._submit("delete", entry, -1)

    # -- staging and capacity ---------------------------------------------

    def _wait_staging(self, nbytes):
        with self._lock:
            if not (self._staging_used > 0 and self._staging_used + nbytes > self._staging_limit):
                return
            t0 = time.perf_counter()
            while self._staging_used > 0 and self._staging_used + nbytes > self._staging_limit \
                    and not self._failures:
                if not self._help(("write",)):
                    self._changed.wait(0.05)
            self._t["stall"] += time.perf_counter() - t0
        self._raise_failures()

    def _help(self, kinds, entry=None) -> bool:
        """Lock held: instead of waiting for a worker, run the most urgent
        queued job of `kinds` (for `entry`, if given) in the calling thread
        (work stealing: when the machine has no core to spare for the
        workers, a blocked caller does their work rather than sleep).
        Returns whether a job ran."""
        best = None
        for i, job in enumerate(self._heap):
            if job[2] in kinds and (entry is None or job[4] is entry) \
                    and (best is None or job[:2] < self._heap[best][:2]):
                best = i
        if best is None:
            return False
        _, _, kind, slot, job_entry = self._heap.pop(best)
        heapq.heapify(self._heap)
        self._lock.release()
        try:
            t0 = time.perf_counter()
            self._run(kind, job_entry, slot)
            dt = time.perf_counter() - t0
        finally:
            self._lock.acquire()
        self._t["io"] += dt
        self._job_done(kind, job_entry)
        return True

    def _estimate(self, k, nbytes) -> int:
        c = self._tc[k]
        used = self.tiers[k].used_bytes
        if c.raw_bytes <= 0 or used <= 0 or used >= c.raw_bytes:
            return nbytes
        return min(nbytes, int(math.ceil(nbytes * used / c.raw_bytes * 1.1)) + 4096)

    def _place(self, step, level, nbytes) -> tuple[int, int]:
        """The tier to store `nbytes` on (the level, or a slower one when
        spilling) and the bytes reserved there."""
        candidates = [level]
        if self.policy == "spill":
            candidates += list(range(level + 1, self._nlv))
        t0 = None
        notes = []
        try:
            for k in candidates:
                tier = self.tiers[k]
                cap = tier.capacity_bytes
                with self._lock:
                    while True:
                        if cap is None:
                            self._n["spills"] += k != level
                            return k, 0
                        est = self._estimate(k, nbytes)
                        used = tier.used_bytes
                        if used + self._reserved[k] + est <= cap:
                            self._reserved[k] += est
                            self._n["spills"] += k != level
                            return k, est
                        if self._tier_jobs[k] == 0 or self._failures:
                            break
                        if t0 is None:
                            t0 = time.perf_counter()
                        # Pending writes and deletes may free room: help them along.
                        if not self._help(("write", "delete")):
                            self._changed.wait(0.05)
                    notes.append(f"level {k} ({getattr(tier, 'name', type(tier).__name__)}): "
                                 f"{used} of {cap} B used, {self._reserved[k]} B pending")
        finally:
            if t0 is not None:
                with self._lock:
                    self._t["stall"] += time.perf_counter() - t0
        self._raise_failures()
        remedy = ("give the tier a larger capacity_bytes, use a schedule with fewer slots on "
                  "that level")
        remedy += "" if self.policy == "spill" else ", or construct the store with policy='spill'"
        raise StorageError(f"step {step} ({nbytes} B) does not fit on level {level}: "
                           f"{'; '.join(notes)}. {remedy[0].upper() + remedy[1:]}")

    # -- jobs ---------------------------------------------------------------

    def _submit(self, kind, entry, priority, slot=None):
        """Queue a job (lock held); with workers=0 run it now."""
        self._outstanding += 1
        if kind != "read":
            self._tier_jobs[entry.tier] += 1
        if kind == "write" and entry.done is None:
            entry.done = threading.Event()
        if kind == "delete":
            priority = -1
        if self._workers_n == 0:
            self._lock.release()
            try:
                t0 = time.perf_counter()
                self._run(kind, entry, slot)
                dt = time.perf_counter() - t0
            finally:
                self._lock.acquire()
            self._t["io"] += dt
            self._t["stall"] += dt
            self._job_done(kind, entry)
            return
        heapq.heappush(self._heap, (priority, next(self._seq), kind, slot, entry))
        if not self._threads:
            # Workers start with the first background job: a store whose
            # levels are all in memory never starts a thread.
            for k in range(self._workers_n):
                th = threading.Thread(target=self._worker, name=f"vlcc-store-{k}", daemon=True)
                th.start()
                self._threads.append(th)
        self._work.notify()

    def _job_done(self, kind, entry):
        self._outstanding -= 1
        if kind != "read":
            self._tier_jobs[entry.tier] -= 1
        self._changed.notify_all()

    def _worker(self):
        while True:
            with self._lock:
                while not self._heap and not self._stopping:
                    self._work.wait()
                if self._stopping:
                    return
                _, _, kind, slot, entry = heapq.heappop(self._heap)
            t0 = time.perf_counter()
            try:
                self._run(kind, entry, slot)
            except BaseException as exc:  # pragma: no cover - _run catches its own
                with self._lock:
                    self._failures.append((kind, entry.step, entry.level,
                                           self.tiers[entry.tier], exc))
            finally:
                dt = time.perf_counter() - t0
                with self._lock:
                    self._t["io"] += dt
                    self._job_done(kind, entry)

    def _run(self, kind, entry, slot):
        try:
            if kind == "write":
                self._run_write(entry)
            elif kind == "read":
                self._run_read(entry, slot)
            else:
                self._run_delete(entry)
        except BaseException as exc:
            with self._lock:
                self._failures.append((kind, entry.step, entry.level, self.tiers[entry.tier], exc))

    def _write_inline(self, entry):
        """Put a fresh capture into a memory level, in the caller.

        A tier that keeps records by reference does no I/O in ``put`` (the
        capture's buffers become the record), so handing it to a worker
        would only add a thread switch and GIL traffic to every ``save``.
        The checksums were computed by the capture copy.  Failures are
        raised here, naming the step."""
        try:
            if self.dedup is True:
                self._pool.recycle(self._dedup(entry, entry.leaves))
            self._put(entry, Record(entry.spec, tuple(entry.leaves), tuple(entry.checksums)),
                      adopt=True)
        except BaseException as exc:
            with self._lock:
                entry.state = _FAILED
                entry.error = exc
                self._tier_jobs[entry.tier] -= 1
                release = self._finish_write(entry)
                self._failures.append(("save", entry.step, entry.level,
                                       self.tiers[entry.tier], exc))
            self._release(*release)
            self._raise_failures()
            raise  # pragma: no cover - _raise_failures raised
        with self._lock:
            entry.state = _STORED
            c = self._tc[entry.tier]
            c.puts += 1
            c.bytes_in += entry.nbytes
            c.records += 1
            c.raw_bytes += entry.nbytes
            self._tier_jobs[entry.tier] -= 1  # entry.tier: where it ended up (a spill moves it)
            release = self._finish_write(entry, stored=True, notify=False)
        self._release(*release)

    def _run_write(self, entry, what="write"):
        with self._lock:
            if entry.state == _CANCELLED:
                release = self._finish_write(entry)
                after = entry.delete_after
                entry.delete_after = None
            else:
                after = release = None
                entry.state = _WRITING
                # Taken in the same critical section as the state change: a
                # Move may hand the staged copy on the moment we are WRITING.
                leaves = None if entry.leaves is None else list(entry.leaves)
                sums = entry.checksums
                src = entry.move_src
        if release is not None:
            self._release(*release)
            self._delete_after(after)
            if entry.done is not None:
                entry.done.set()
            return
        try:
            checksums = None
            if leaves is None:  # a Move whose source is only in its tier
                rec = self._tier_get(src)
                leaves, checksums = list(rec.leaves), rec.checksums
                del rec
                with self._lock:
                    entry.leaves, entry.owned = leaves, [True] * len(leaves)
                    entry.move_src = None
            elif self.dedup is True and entry.digests is None:
                give = self._dedup(entry, leaves)
                with self._lock:
                    if entry.leaves is not None:  # else handed on by a Move: ours still hold
                        leaves = list(entry.leaves)
                self._pool.recycle(give)  # unless a reader or a Move still holds them
            if checksums is None:
                # Most were computed by the capture copy (a shared dedup leaf
                # has the same bytes, hence the same checksum); the leaves
                # kept by reference are hashed here, with the GIL released.
                if sums is None:
                    sums = [None] * len(leaves)
                checksums = [c if c is not None else leaf_checksum(leaf)
                             for leaf, c in zip(leaves, sums)]
            # A Move's leaves read from its source keep the checksums verified there.
            record = Record(entry.spec, tuple(leaves), tuple(checksums))
            del leaves
            self._put(entry, record)
            checksums = record.checksums
            del record
        except BaseException as exc:
            with self._lock:
                entry.state = _FAILED
                entry.error = exc
                release = self._finish_write(entry)
                after = entry.delete_after
                entry.delete_after = None
                self._failures.append((what, entry.step, entry.level,
                                       self.tiers[entry.tier], exc))
            self._release(*release)
            self._delete_after(after)
            if entry.done is not None:
                entry.done.set()
            return
        with self._lock:
            entry.state = _STORED
            entry.checksums = checksums  # for loads straight from a memory tier
            c = self._tc[entry.tier]
            c.puts += 1
            c.bytes_in += entry.nbytes
            c.records += 1
            c.raw_bytes += entry.nbytes
            cancel = entry.cancel
            release = self._finish_write(entry, stored=True)
            after = entry.delete_after
            entry.delete_after = None
        self._release(*release)
        self._delete_after(after)
        if cancel:
            self._run_delete(entry)
        if entry.done is not None:
            entry.done.set()

    def _delete_after(self, old):
        """After a Move's write: delete the source's tier copy."""
        if old is None:
            return
        try:
            self._run_delete(old)
        finally:
            with self._lock:
                self._tier_jobs[old.tier] -= 1
                self._changed.notify_all()

    def _finish_write(self, entry, stored=False, notify=True):
        """Lock held: end of a write job.  Returns what to release.  (An
        inline write need not `notify`: nobody can be waiting for it, the
        caller holds the API lock.)"""
        self._staging_used -= entry.staged_bytes
        entry.staged_bytes = 0
        if entry.reserved_tier >= 0:
            self._reserved[entry.reserved_tier] -= entry.reserved
            entry.reserved, entry.reserved_tier = 0, -1
        if notify:
            self._changed.notify_all()
        if stored and not entry.cancel and entry.leaves is not None:
            if self._retains[entry.tier]:
                return (None, None, None)  # the tier holds them: kept until the delete
            nxt = self._next_use(entry) if entry.record >= 0 else NEVER
            if nxt != NEVER and entry.tier in self._prefetch_levels and not self._closing:
                leaves, owned, digests = entry.leaves, entry.owned, entry.digests
                if self._admit(entry, leaves, owned, digests, nxt, prefetched=False):
                    entry.leaves = entry.owned = entry.digests = None
                    return (None, None, None)
        if stored and entry.cancel:
            return (None, None, None)  # released by the delete that follows
        leaves, owned, digests = entry.leaves, entry.owned, entry.digests
        entry.leaves = entry.owned = entry.digests = None
        return (leaves, owned, digests)

    def _put(self, entry, record, adopt=False):
        """Put `record` into `entry`'s tier (spilling on with policy="spill").
        `adopt`: the record is a fresh capture of ours, which a MemoryTier
        may take without re-checking it (MemoryTier._adopt)."""
        while True:
            tier = self.tiers[entry.tier]
            try:
                if adopt and self._direct[entry.tier]:
                    tier._adopt(entry.key, record)
                else:
                    tier.put(entry.key, record)
                return
            except TierFullError as exc:
                nxt = entry.tier + 1
                if self.policy != "spill" or nxt >= self._nlv:
                    raise StorageError(
                        f"step {entry.step} does not fit on level {entry.tier}: {exc}"
                    ) from exc
                with self._lock:
                    self._tier_jobs[entry.tier] -= 1
                    self._tier_jobs[nxt] += 1
                    self._n["spills"] += 1
                    entry.tier = nxt

    def _tier_get(self, entry):
        tier = self.tiers[entry.tier]
        try:
            rec = tier.get(entry.key)
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(
                f"step {entry.step} on level {entry.level}: {exc}", key=entry.key,
                tier=getattr(tier, "name", None), step=entry.step) from exc
        except KeyError as exc:
            raise StorageError(
                f"the record of step {entry.step} is missing from level {entry.tier} "
                f"({getattr(tier, 'name', type(tier).__name__)}, key {entry.key!r}): it was "
                "removed behind the store's back; recompute the state") from exc
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(
                f"reading step {entry.step} from level {entry.tier} "
                f"({getattr(tier, 'name', type(tier).__name__)}) failed: "
                f"{type(exc).__name__}: {exc}") from exc
        with self._lock:
            c = self._tc[entry.tier]
            c.gets += 1
            c.bytes_out += entry.nbytes
        return rec

    def _run_read(self, entry, slot):
        with self._lock:
            skip = slot.dropped or self._closing
        arrays = error = None
        if not skip:
            try:
                rec = self._tier_get(entry)
                arrays = list(rec.leaves)
                del rec
            except BaseException as exc:
                error = exc
        with self._lock:
            self._inflight_reads -= 1
            slot.arrays, slot.error = arrays, error
            slot.owned = None if arrays is None else [True] * len(arrays)
            self._cache.unpin(entry.seq)
            release = None
            if slot.dropped or skip:  # nobody wants it any more: free its reservation
                if entry.slot is slot:
                    entry.slot = None
                if entry.slot is None:
                    if self._slots.get(entry.seq) is entry:
                        del self._slots[entry.seq]
                    if entry.seq in self._cache:
                        self._cache.remove(entry.seq)
                release = (slot.arrays, slot.owned, None)
                slot.arrays = None
            slot.ready.set()
            self._pump()
        if release is not None and release[0] is not None:
            self._release(*release)
        del arrays

    def _run_delete(self, entry, notify=True):
        tier = self.tiers[entry.tier]
        try:
            tier.delete(entry.key)
        except KeyError:
            pass  # already gone (a cancelled write that never reached the tier)
        with self._lock:
            c = self._tc[entry.tier]
            c.deletes += 1
            c.records -= 1
            c.raw_bytes -= entry.nbytes
            entry.state = _GONE
            leaves, owned, digests = entry.leaves, entry.owned, entry.digests
            entry.leaves = entry.owned = entry.digests = None
            if notify:
                self._changed.notify_all()
        self._release(leaves, owned, digests)

    def _dedup(self, entry, leaves) -> list:
        """Worker: hash the staged leaves and share the ones seen before.
        Returns the replaced capture buffers, for the pool."""
        digests = [leaf_digest(leaf) for leaf in leaves]
        give = []
        with self._lock:
            if entry.leaves is None:
                return give
            for i, d in enumerate(digests):
                mine = entry.leaves[i]
                shared = self._table.put(d, mine)
                if shared is not mine:
                    self._n["dedup_hits"] += 1
                    self._n["dedup_saved"] += mine.nbytes
                    if entry.owned[i]:
                        give.append(mine)
                    entry.leaves[i] = shared
                    entry.owned[i] = self._dedup_owned.get(d, False)
                else:
                    self._dedup_owned[d] = entry.owned[i]
                mine = shared = None
            entry.digests = digests
        return give

    def _unshare(self, digests):
        """Drop a record's dedup references (its arrays are handed on)."""
        for d in digests:
            if d is not None and self._table.release(d):
                self._dedup_owned.pop(d, None)

    def _release(self, leaves, owned, digests):
        """Give a record's arrays back: dedup references, then pool buffers."""
        if leaves is None:
            return
        give = []
        n = len(leaves)
        for i in range(n - 1, -1, -1):
            arr = leaves.pop()
            d = digests[i] if digests else None
            if d is not None:
                if not self._table.release(d):
                    continue  # still shared
                mine = self._dedup_owned.pop(d, False)
            else:
                mine = owned[i] if owned else False
            if mine:
                give.append(arr)
        arr = None
        if give and self._hold_limit is not None:
            held = self._staging_used + self._cache.used_bytes + self._pool.free_bytes + sum(
                t.used_bytes for t, r in zip(self.tiers, self._retains) if r)
            while give and held + sum(a.nbytes for a in give) > self._hold_limit:
                give.pop()  # freed, not pooled
        self._pool.recycle(give)

    # -- cache ------------------------------------------------------------------

    def _admit(self, entry, arrays, owned, digests, next_use, prefetched) -> bool:
        """Lock held: keep `arrays` of `entry` in the read cache if Belady allows."""
        if entry.slot is not None or entry.tier not in self._prefetch_levels:
            return False
        victims = self._cache.victims_for(entry.nbytes, next_use)
        if victims is None:
            return False
        for v in victims:
            self._evict(v)
        self._cache.insert(entry.seq, entry.nbytes, next_use)
        slot = _Slot(prefetched)
        slot.arrays, slot.owned, slot.digests = list(arrays), list(owned), digests
        slot.ready.set()
        entry.slot = slot
        self._slots[entry.seq] = entry
        return True

    def _evict(self, seq):
        """Lock held: drop a ready, unpinned slot from the cache."""
        entry = self._slots[seq]
        if entry.slot is not None and entry.slot.prefetched and not entry.slot.used:
            self._n["wasted"] += 1
        self._drop_slot(entry)

    def _drop_slot(self, entry, release=True):
        """Lock held: remove `entry`'s slot (an in-flight one is only marked,
        its bytes stay reserved until its read ends)."""
        slot = entry.slot
        if slot is None:
            return
        entry.slot = None
        if not slot.ready.is_set():
            slot.dropped = True  # the read job frees the reservation
            return
        self._slots.pop(entry.seq, None)
        if entry.seq in self._cache:
            self._cache.remove(entry.seq)
        if release and slot.arrays is not None:
            arrays, owned, digests = slot.arrays, slot.owned, slot.digests
            slot.arrays = None
            self._release(arrays, owned, digests)

    def _upcoming(self):
        """Lock held: ``(entry, action index)`` of the next reads of records
        on prefetch levels, soonest first, each record once.

        Lazy, and it reads the plan's lists only from the clock on: ``_pump``
        runs on every store call and usually stops at the first or second
        read (the cache is full, or the reads in flight are enough).  Only
        the prefetch levels' reads are looked at, plus the levels records
        may have spilled from onto a prefetch level."""
        now = self._now + 1
        look = self._lookahead
        streams = []
        for k in range(len(self._reads)):
            if k not in self._prefetch_levels and not (
                    self._n["spills"] and any(j > k for j in self._prefetch_levels)):
                continue
            index = self._reads[k][0]
            p = bisect_left(index, now)
            if p < len(index):
                streams.append(zip(index[p:p + look], self._read_records[k][p:p + look]))
        if not streams:
            return
        reads = streams[0] if len(streams) == 1 else heapq.merge(*streams)
        seen = set()
        by_record, prefetch = self._by_record, self._prefetch_levels
        for t, r in itertools.islice(reads, look):
            if r in seen:
                continue
            seen.add(r)
            entry = by_record.get(r)
            if entry is not None and entry.tier in prefetch:
                yield entry, t

    def _pump(self):
        """Lock held: start the prefetches Belady admits, soonest first."""
        if self._plan is None or self._workers_n == 0 or self._closing \
                or not self._prefetch_levels or self._cache.capacity_bytes == 0:
            return
        for entry, t in self._upcoming():
            if self._inflight_reads >= self._max_inflight:
                return
            if entry.slot is not None:
                if entry.slot.ready.is_set():
                    self._cache.update(entry.seq, t)
                continue
            if entry.state != _STORED:
                continue  # still staged (served from RAM), or failed
            victims = self._cache.victims_for(entry.nbytes, t)
            if victims is None:
                return
            for v in victims:
                self._evict(v)
            self._cache.insert(entry.seq, entry.nbytes, t)
            self._cache.pin(entry.seq)  # in flight: never evicted
            slot = _Slot(prefetched=True)
            entry.slot = slot
            self._slots[entry.seq] = entry
            self._inflight_reads += 1
            self._n["issued"] += 1
            self._submit("read", entry, t, slot)

    # -- reads --------------------------------------------------------------------

    def _acquire(self, entry):
        """The arrays of `entry` for a load: ``(arrays, source, slot)``; a
        cache slot is returned pinned."""
        waited = 0.0
        late = False
        try:
            while True:
                with self._lock:
                    if entry.state == _FAILED:
                        raise StorageError(
                            f"step {entry.step} on level {entry.level} is lost: its background "
                            f"write failed ({type(entry.error).__name__}: {entry.error}); "
                            "recompute it or restart from an earlier checkpoint"
                        ) from entry.error
                    if entry.state in (_QUEUED, _WRITING) and entry.leaves is not None:
                        self._n["staged_hits"] += 1
                        return list(entry.leaves), "staged", None
                    slot = entry.slot
                    if slot is not None and slot.ready.is_set():
                        if slot.error is not None:
                            err = slot.error
                            self._drop_slot(entry)
                            raise err
                        self._cache.pin(entry.seq)
                        slot.used = True
                        self._n["hits"] += 1
                        self._n["late"] += late
                        return list(slot.arrays), "cache", slot
                    t0 = time.perf_counter()
                    if slot is not None:
                        event = slot.ready
                        late = True
                        if self._help(("read",), entry):  # still queued: read it ourselves
                            waited += time.perf_counter() - t0
                            continue
                    elif entry.state in (_QUEUED, _WRITING):
                        event = entry.done  # a Move still reading its source
                        if self._help(("write",), entry):
                            waited += time.perf_counter() - t0
                            continue
                    else:
                        if entry.tier in self._prefetch_levels:
                            self._n["misses"] += 1
                        break
                t0 = time.perf_counter()
                event.wait()
                waited += time.perf_counter() - t0
            t0 = time.perf_counter()
            rec = self._tier_get(entry)
            arrays = list(rec.leaves)
            del rec
            waited += time.perf_counter() - t0
            return arrays, "tier", None
        finally:
            if waited:
                with self._lock:
                    self._t["stall"] += waited

    def _load_direct(self, entry, out, targets, copy):
        """A load from a memory level, in the caller, from the arrays the
        tier keeps (they are the ones the engine handed to its ``put``):
        each leaf is verified against its checksum in the same pass that
        copies it out, so a restore reads the record once."""
        tier = self.tiers[entry.tier]
        if entry.key not in tier:
            raise StorageError(
                f"the record of step {entry.step} is missing from level {entry.tier} "
                f"({getattr(tier, 'name', type(tier).__name__)}, key {entry.key!r}): it was "
                "removed behind the store's back; recompute the state")
        with self._lock:
            leaves, sums = list(entry.leaves), entry.checksums
        spec = entry.spec
        if targets is not None:
            dsts, out_spec, jax = targets
            for i, src in enumerate(leaves):
                if jax[i]:  # JAX arrays are immutable: rebuilt from a copy
                    dsts[i] = np.empty(src.shape, src.dtype)
                self._verify(entry, i, src, copy_checksum(src, dsts[i]), sums[i])
            if any(jax) or (out_spec["tree"] is not spec["tree"]
                            and out_spec["tree"] != spec["tree"]):
                out = unflatten(spec, dsts)
            state = out
        elif copy:
            arrays = []
            for i, src in enumerate(leaves):
                dst = np.empty(src.shape, src.dtype)
                self._verify(entry, i, src, copy_checksum(src, dst), sums[i])
                arrays.append(dst)
            state = unflatten(spec, arrays)
        else:
            for i, src in enumerate(leaves):
                self._verify(entry, i, src, leaf_checksum(src), sums[i])
            state = unflatten(spec, [_readonly(a) for a in leaves])
        with self._lock:
            self._n["loads"] += 1
            if entry.tier in self._prefetch_levels:  # a memory level asked to be prefetched
                self._n["misses"] += 1
            self._advance_read(entry)
            c = self._tc[entry.tier]
            c.gets += 1
            c.bytes_out += entry.nbytes
            self._pump()
        return state

    def _verify(self, entry, i, leaf, got, want):
        if got != want:
            tier = self.tiers[entry.tier]
            name = getattr(tier, "name", None)
            exc = corrupt(f"leaf {i} ({leaf.dtype.str}{list(leaf.shape)}) has checksum {got}, "
                          f"the record says {want}", entry.key, name, entry.step)
            raise CorruptCheckpointError(f"step {entry.step} on level {entry.level}: {exc}",
                                         key=entry.key, tier=name, step=entry.step)

    @staticmethod
    def _own(arrays: list) -> list:
        """Arrays the caller may own: those nobody else references are
        handed over, the others copied."""
        out = []
        arrays.reverse()
        while arrays:
            arr = arrays.pop()
            if sys.getrefcount(arr) <= _SOLE and arr.base is None and arr.flags.writeable:
                out.append(arr)
            else:
                out.append(np.array(arr, copy=True))
        return out

    def _targets(self, out, spec):
        """Check that `out` can take the stored state of `spec` in place:
        ``(its arrays, its spec, which leaves are JAX arrays)``."""
        layout = self._layout
        if layout is not None and (spec["tree"] is layout.tree or spec["tree"] == layout.tree) \
                and (spec["leaves"] is layout.leaf_specs or spec["leaves"] == layout.leaf_specs):
            # The record has the structure of the states saved last; so has
            # `out` if the layout takes it: its leaves are then its own
            # C-contiguous numpy arrays, of the record's dtypes and shapes.
            targets = layout.leaves(out)
            if targets is not None:
                for i, dst in enumerate(targets):
                    if not dst.flags.writeable:
                        raise ValueError(f"out= array {i} is read-only; pass writeable arrays, "
                                         "or load without out=")
                return targets, layout.spec(), [False] * len(targets)
        targets, out_spec = flatten(out)
        want = spec["leaves"]
        if len(targets) != len(want):
            raise ValueError(f"out= has {len(targets)} arrays, the stored state of step "
                             f"{spec.get('step')} has {len(want)}; pass a state of the same "
                             "structure, or load without out=")
        same = out_spec["leaves"] == want  # same dtypes (byte order included) and shapes
        # JAX leaves (only possible once JAX is imported) are rebuilt, not written.
        nodes = _leaf_nodes(out_spec["tree"]) if "jax" in sys.modules else {}
        jax = []
        for i in range(len(targets)):
            dst = targets[i]
            if not same:
                w = want[i]
                dtype = _spec_dtype(w["dtype"])
                if list(dst.shape) != w["shape"] or dst.dtype != dtype \
                        or dst.dtype.str != dtype.str:
                    raise ValueError(
                        f"out= array {i} is {dst.dtype.str}{list(dst.shape)}, the stored one "
                        f"is {w['dtype']}{w['shape']}; pass a state of the same shapes and "
                        "dtypes, or load without out="
                    )
            is_jax = bool(nodes.get(i, {}).get("jax"))
            jax.append(is_jax)
            if is_jax:
                continue  # JAX arrays are immutable: rebuilt
            # A leaf only `targets` references is a C-ordered copy flatten
            # made of a non-contiguous array: writing it would restore nothing.
            if sys.getrefcount(targets[i]) <= _SOLE + 1:
                raise ValueError(f"out= array {i} is not C-contiguous, so it cannot be restored "
                                 "in place; pass C-contiguous arrays, or load without out=")
            if not dst.flags.writeable:
                raise ValueError(f"out= array {i} is read-only; pass writeable arrays, or load "
                                 "without out=")
        return targets, out_spec, jax

    @staticmethod
    def _into(out, spec, arrays, targets, out_spec, jax):
        """Copy `arrays` into the arrays of the state `out` (checked by _targets)."""
        for i, (dst, src) in enumerate(zip(targets, arrays)):
            if jax[i]:
                targets[i] = np.array(src, copy=True)
            else:
                np.copyto(dst, src, casting="no")
        if not any(jax) and (out_spec["tree"] is spec["tree"] or out_spec["tree"] == spec["tree"]):
            return out
        return unflatten(spec, targets)
