"""TieredStore: the facade over the engine's parts (see the package docstring)."""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import VlccTypeError, VlccValueError

if TYPE_CHECKING:  # storage reads an IOPlan's arrays; it does not import schedules
    from ...schedules import IOPlan

from .._stats import StoreStats
from .._tier import StorageError, Tier
from ._cache import ReadCache
from ._capture import Capture
from ._clock import PlanClock
from ._common import (
    DELETE,
    LOAD,
    MOVE,
    SAVE,
    STORED,
    Entry,
    NoLock,
    Shared,
    check_int,
    check_level,
    check_step,
    end_leases,
    snapshot,
    tier_name,
)
from ._device import DevicePath
from ._inline import InlinePath
from ._jobs import Jobs
from ._placement import Placement
from ._restore import Restore, StateLease
from ._write import Writer

__all__ = ["TieredStore"]

_MiB = 1 << 20

#: ``move``'s `state` when not given (``None`` is a state).
_UNSET: Any = object()


class TieredStore:
    """The asynchronous checkpoint store over a hierarchy of tiers.

    **Arguments:**

    - `tiers`: the storage levels, fastest first (``tiers[k]`` is schedule
      level ``k``): :class:`~vlcc_adjoint.storage.MemoryTier`,
      :class:`~vlcc_adjoint.storage.CompressedMemoryTier`,
      :class:`~vlcc_adjoint.storage.ZarrTier` or any :class:`Tier`; tier 0
      may be a :class:`~vlcc_adjoint.storage.DeviceTier`, the device slots
      of an accelerator integration (its records are the integration's
      payloads; see :mod:`vlcc_adjoint.storage._device` for the contract,
      and :meth:`move` for the data a ``Move`` to or from it carries).
    - `plan`: the schedule's :class:`~vlcc_adjoint.schedules.IOPlan`
      (``io_plan(schedule)``), *not* the
      :class:`~vlcc_adjoint.budget.BudgetPlan` that
      :func:`vlcc_adjoint.plan` returns (for that, ``budget_plan.make_store()``
      builds the store, tiers and IO plan included): enables plan checking, prefetching and
      foresight eviction.  ``None``: every call is accepted, nothing is
      prefetched.  A plan of fewer levels than tiers draws a ``UserWarning``
      naming the tiers it never reaches, unless ``policy="spill"``.
    - `prefetch_bytes`: the read cache's budget (never exceeded).
    - `staging_bytes`: the most bytes of captures waiting for their
      background write; ``save`` waits when it is full.  A single capture
      larger than this is accepted when nothing else is staged.
    - `workers`: background threads for the slower levels (memory levels
      always run in the caller; the threads start with the first
      background job); ``0`` runs every write and read in the caller (a
      synchronous store, for baselines and debugging).  Default: one core
      fewer than the machine has, between 1 and 4 (the solver keeps a core);
      at least 2 if a tier ``waits_on_io`` (see :class:`Tier`).
    - `policy`: ``"raise"`` or ``"spill"``, when a record does not fit its tier.
    - `dedup`: ``False``; ``True`` to store identical leaves once, hashed
      after the capture (saves memory, not capture time); ``"eager"`` to
      hash in ``save`` before copying (saves the copy of a leaf that did not
      change, costs a hash of every leaf in the caller).
    - `prefetch_levels`: levels read ahead and cached (default: all but 0).
    - `lookahead`: how many future reads the prefetcher considers.
    - `pool_bytes`: the most bytes of free capture buffers kept for reuse
      (default: ``staging_bytes``).
    - `close_tiers`: whether :meth:`close` closes the tiers too.
    - `threadsafe`: ``True`` (default): the store may be shared by several
      threads; its public methods are serialised by one lock, and the
      engine's parts, its pool and its worker threads share another.
      ``False``: a *single-threaded* store, for a caller that makes every
      call from one thread at a time (calls from different threads one
      after the other are fine, calls that overlap are not): it has no
      worker threads (`workers` must be 0 or ``None``), every write and
      read runs in the call, and no call takes a lock.  Every check stays
      (checksums, capacities, the plan).  ``run_adjoint``'s memory store is
      the intended user: a time loop calls its store from one thread.

    Use it as a context manager, or call :meth:`close`.

    **Ownership of buffers.**  The store owns the buffers it captures into
    and reads into (from its :class:`~vlcc_adjoint.storage.BufferPool`):
    a record's buffers go back to the pool when its last holder lets go
    (its tier on delete, a read-ahead slot on eviction, a move once the new
    copy is written), never on a guess from reference counts.  Buffers
    shown to a caller are held by a lease: ``load(copy=False)``'s until
    the record is deleted, :meth:`lend`'s until the caller releases it.
    """

    def __init__(
        self,
        tiers: Sequence[Tier],
        plan: IOPlan | None = None,
        prefetch_bytes: int = 256 * _MiB,
        *,
        staging_bytes: int = 512 * _MiB,
        workers: int | None = None,
        policy: str = "raise",
        dedup: bool | str = False,
        prefetch_levels: Sequence[int] | None = None,
        lookahead: int = 64,
        pool_bytes: int | None = None,
        close_tiers: bool = True,
        threadsafe: bool = True,
    ):
        tiers = list(tiers)
        if not tiers:
            raise VlccValueError("TieredStore needs at least one tier, e.g. [MemoryTier()]")
        for k, tier in enumerate(tiers):
            if not isinstance(tier, Tier):
                raise VlccTypeError(
                    f"tiers[{k}] is a {type(tier).__name__}, not a Tier; use "
                    "MemoryTier, CompressedMemoryTier, ZarrTier or a Tier subclass"
                )
        for k, tier in enumerate(tiers):
            if k > 0 and getattr(tier, "holds_payloads", False):
                raise VlccValueError(
                    f"tiers[{k}] is a {type(tier).__name__}, whose records stay on the device: it "
                    "can only be level 0 (the fastest); put it first, e.g. "
                    "TieredStore([DeviceTier(), MemoryTier(), ...])"
                )
        if policy not in ("raise", "spill"):
            raise VlccValueError(f"policy must be 'raise' or 'spill', got {policy!r}")
        if not threadsafe:
            if workers not in (None, 0):
                raise VlccValueError(
                    f"a single-threaded store (threadsafe=False) has no worker threads, got "
                    f"workers={workers!r}; pass workers=0, or threadsafe=True for background work"
                )
            workers = 0
        if workers is None:
            workers = max(1, min(4, (os.cpu_count() or 2) - 1))
            if any(t.waits_on_io for t in tiers):
                workers = max(2, workers)
        if dedup not in (False, True, "eager"):
            raise VlccValueError(f"dedup must be False, True or 'eager', got {dedup!r}")
        for name, value in (
            ("prefetch_bytes", prefetch_bytes),
            ("staging_bytes", staging_bytes),
            ("workers", workers),
            ("lookahead", lookahead),
        ):
            check_int(name, value)
        nlv = len(tiers)
        prefetching = frozenset(
            int(k) for k in (range(1, nlv) if prefetch_levels is None else prefetch_levels)
        )
        bad = [k for k in prefetching if not 0 <= k < nlv]
        if bad:
            raise VlccValueError(f"prefetch_levels {bad} are not levels of these {nlv} tiers")
        if any(getattr(tiers[k], "holds_payloads", False) for k in prefetching):
            raise VlccValueError(
                "prefetch_levels include level 0, a device level: its records stay on the "
                "device and cannot be read ahead; leave it out (the default: levels 1 ..)"
            )
        self.tiers = tiers
        self.policy = policy
        self.dedup = dedup
        self._close_tiers = close_tiers
        # The lock that serialises the public methods; `_mutex` is the same
        # lock, or None in a single-threaded store (the hot methods test it).
        self._api: threading.RLock | NoLock
        self._mutex: threading.RLock | None
        if threadsafe:
            self._api = self._mutex = threading.RLock()
        else:
            self._api, self._mutex = NoLock(), None
        sh = self._shared = Shared(
            tiers, policy, dedup, int(workers), prefetching, bool(threadsafe)
        )
        self._clock = PlanClock(plan, nlv, sh.lock)
        if plan is not None:
            self._warn_unused_tiers()
        staging = int(staging_bytes)
        # The most bytes of buffers the store may hold at once: its memory
        # levels' capacities, the staging and the read cache.  The pool keeps
        # a free buffer only within it (BudgetPlan.make_store sizes a memory
        # budget for those three).  None: unbounded.
        caps = [t.capacity_bytes for t, r in zip(tiers, sh.retains) if r]
        hold = None
        if all(c is not None for c in caps):
            hold = sum(c for c in caps if c is not None) + staging + int(prefetch_bytes)
        self._capture = Capture(sh, staging if pool_bytes is None else int(pool_bytes), hold)
        self._jobs = Jobs(sh, self._run_job)
        self._placement = Placement(sh, self._jobs, staging)
        self._writer = Writer(sh, self._jobs, self._placement, self._capture, self._clock)
        self._cache = ReadCache(
            sh,
            self._jobs,
            self._clock,
            self._writer,
            self._capture,
            int(prefetch_bytes),
            int(lookahead),
        )
        self._writer.cache = self._cache
        self._restore = Restore(sh, self._clock, self._capture, self._cache)
        self._inline = InlinePath(
            sh, self._clock, self._capture, self._placement, self._jobs, self._writer, self._cache
        )
        self._device = DevicePath(sh, self._clock, self._register, self._unregister)
        self._capture.held = self._held
        self._verify = self._restore.verify
        self._retaining = [t for t, r in zip(tiers, sh.retains) if r]

    def _warn_unused_tiers(self):
        """A plan of fewer levels than tiers never reaches the slower ones
        (unless records spill there)."""
        nlv, reach = self._shared.nlv, self._clock.levels
        if reach < nlv and self.policy != "spill":
            names = ", ".join(f"{k} ({tier_name(self.tiers[k])})" for k in range(reach, nlv))
            warnings.warn(
                f"the plan has {reach} storage level(s) but the store has {nlv} tiers: tier "
                f"level(s) {names} will never be used.  Use a schedule with one level per tier "
                "(e.g. Multistage(steps, levels=[Level(...), ...])), pass only the tiers the "
                "schedule uses, or policy='spill' to overflow into them",
                UserWarning,
                stacklevel=3,
            )

    @property
    def threadsafe(self) -> bool:
        """Whether the store may be shared by threads (see the class docstring)."""
        return self._shared.threadsafe

    @property
    def plan(self) -> IOPlan | None:
        """The :class:`~vlcc_adjoint.schedules.IOPlan` the store follows, or ``None``."""
        return self._clock.plan

    # -- the engine's parts, for tests and tools ----------------------------------------

    @property
    def _plan(self):  # the name earlier versions had; use `plan`
        return self._clock.plan

    @property
    def _threads(self) -> list:
        return self._jobs.threads

    @property
    def _outstanding(self) -> int:
        return self._jobs.outstanding

    @property
    def _closed(self) -> bool:
        return self._shared.closed

    @property
    def _pool(self):
        return self._capture.pool

    @property
    def _table(self):
        return self._capture.table

    # ------------------------------------------------------------------ API

    def save(self, step: int, state: Any, level: int = 0) -> None:
        """Store `state` as ``u_step`` on `level`; returns once the store owns it.

        **Arguments:**

        - `step`: the step of the state.
        - `state`: anything :func:`vlcc_adjoint.state.flatten` accepts.  The
          caller may modify it as soon as ``save`` returns.  On a device
          level (a :class:`~vlcc_adjoint.storage.DeviceTier`): the
          integration's payload, any object, kept as given.
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
        api = self._mutex
        if api is not None:
            api.acquire()
        try:
            sh = self._shared
            if sh.closed or self._jobs.failures:
                self._enter()
            if type(step) is not int or step < 0:
                step = check_step(step)
            if type(level) is not int or not 0 <= level < sh.nlv:
                level = self._check_level(level)
            if (step, level) in sh.index:
                raise StorageError(
                    f"step {step} is already stored on level {level}; delete it "
                    "first (schedules Save a step once per level)"
                )
            if self._inline.save(step, state, level):
                return
            if sh.payloads[level]:
                self._device.save(step, state, level)
                return
            self._capture_save(step, state, level)
        finally:
            if api is not None:
                api.release()

    def _capture_save(self, step: int, state: Any, level: int, src: int = -1) -> None:
        """API lock held, step and level validated and not stored there: the
        general path of ``save`` (`src` < 0), or of the ``Move`` of a device
        record from level `src` to `level`, which captures `state`, the
        record's data the caller brought from the device."""
        sh, clock, capture, placement = self._shared, self._clock, self._capture, self._placement
        leaves, spec, traits = capture.flatten(state)
        spec["step"] = step
        mark = clock.mark()
        if src < 0:
            record = clock.follow(SAVE, step, level)
        else:
            record = clock.follow(MOVE, step, src, level)
        how, nbytes, copy_bytes = capture.classify(leaves, traits)
        try:
            if not sh.inline[level]:  # memory levels stage nothing
                placement.wait_staging(copy_bytes)
            tier, reserved = placement.place(step, level, nbytes)
            if not sh.inline[tier] and sh.inline[level]:  # spilled to a slow level
                try:
                    placement.wait_staging(copy_bytes)
                except BaseException:
                    placement.unreserve(tier, reserved)
                    raise
        except BaseException:
            clock.rewind(mark)
            raise
        inline = sh.inline[tier]
        t0 = time.perf_counter()
        out, owned, digests, sums, copied, referenced = capture.capture(leaves, how, inline)
        leaves = None
        t1 = time.perf_counter()
        entry = Entry(step, level, tier, next(sh.seq), spec, nbytes, record)
        entry.leaves, entry.owned, entry.checksums, entry.digests = out, owned, sums, digests
        entry.reserved, entry.reserved_tier = reserved, tier
        layout = capture.layout
        if layout is not None and spec["tree"] is layout.tree:  # a state of that layout
            entry.shape = self._inline.shape_of(layout)
        out = None
        with sh.lock:
            sh.t["capture"] += t1 - t0
            sh.n["saves" if src < 0 else "moves"] += 1
            sh.n["captured"] += copied
            sh.n["referenced"] += referenced
            self._register(entry)
            if inline:
                self._jobs.tier_jobs[tier] += 1
            else:
                entry.staged_bytes = copied
                placement.stage(copied)
                self._jobs.submit("write", entry, clock.priority(entry))
            self._cache.pump()
        if inline:
            self._writer.write_inline(entry)
        self._jobs.after_inline()

    def load(self, step: int, level: int | None = None, out: Any = None, copy: bool = True) -> Any:
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
          the stored arrays, verified but not copied, for a caller that
          copies at once (the executor's ``on_load`` path).  The views are
          held by a lease that the record's deletion ends: the store does
          not reuse their memory while the record is stored (a ``move``
          keeps them valid: the record moves), and may reuse it for later
          captures and reads once the record is deleted, so a view kept past
          the record's ``Delete`` can show another record's bytes.  To keep
          views longer, use :meth:`lend`.  Cannot be combined with `out`.

        **Returns:** the state.  Without `out` and with ``copy=True`` its
        arrays are the caller's own (from 1 MiB on, page-aligned views of a
        block of their own): changing them never changes the stored record.
        On a device level: the payload ``save`` was given (the same object).

        A record on a memory level is verified while it is copied out (one
        pass over it); if it turns out corrupt, the arrays of `out` may
        already hold part of it.

        Raises :class:`StorageError` if the step is not stored there or its
        write failed, :class:`CorruptCheckpointError` if the record fails its
        integrity check, :class:`PlanMismatchError` off-plan.
        """
        api = self._mutex
        if api is not None:
            api.acquire()
        try:
            entry = self._find(step, level)
            shape = entry.shape
            if (
                shape is not None
                and shape.small
                and out is None
                and copy
                and entry.state == STORED
                and entry.slot is None
                and self._shared.direct[entry.tier]
                and entry.leaves is not None
                and entry.checksums is not None
                and entry.key in self._shared.tiers[entry.tier]
            ):
                # A memory record of a known structure: the short path.
                self._clock.follow(LOAD, entry.step, entry.level)
                return self._inline.load(entry, self._verify)
            if self._shared.payloads[entry.tier]:
                return self._device.load(entry, out)
            state, lease = self._restore_entry(entry, out, copy)
            if lease is not None:  # views lent: their lease ends with the record
                if entry.leases is None:
                    entry.leases = [lease]
                else:
                    entry.leases.append(lease)
            return state
        finally:
            if api is not None:
                api.release()

    def lend(self, step: int, level: int | None = None) -> StateLease:
        """The stored ``u_step`` as read-only views, held by a lease until the
        caller releases it::

            with store.lend(i, k) as state:
                solver.restore_from(state)  # no copy made by the store

        Like ``load(step, level, copy=False)`` (a ``Load`` of the plan; the
        record verified, not copied), but the views stay valid until
        :meth:`StateLease.release` (or the end of the ``with`` block), even
        if the record is deleted meanwhile: the store does not reuse their
        memory before then.  Release every lease: memory lent is memory the
        store cannot reuse.

        **Arguments:** `step` and `level` as in :meth:`load`.

        **Returns:** a :class:`StateLease`: ``lease.state`` is the state,
        ``with`` yields it.
        """
        with self._api:
            entry = self._find(step, level)
            if self._shared.payloads[entry.tier]:
                raise VlccValueError(
                    f"step {entry.step} on level {entry.level} is a device record: its payload "
                    "is the caller's own object, with no store memory to lend; use "
                    "load(step, level)"
                )
            state, lease = self._restore_entry(entry, None, False, lend=True)
            return StateLease(state, lease)

    def delete(self, step: int, level: int | None = None) -> None:
        """Forget the stored ``u_step`` on `level` (``None``: the plan's level,
        or without a plan every level holding it).

        The leases of views ``load(copy=False)`` returned of the record end
        here: its buffers may be reused by the next save or read (those of
        an open :meth:`lend` lease only once it is released)."""
        api = self._mutex
        if api is not None:
            api.acquire()
        try:
            sh = self._shared
            if sh.closed or self._jobs.failures:
                self._enter()
            entry = None
            if type(step) is int and type(level) is int:  # (a bool is not an int)
                # stored: its step and level were validated by its save
                entry = sh.index.get((step, level))
            if entry is None:
                entry = self._delete_entry(step, level)
                if entry is None:  # deleted from every level holding it
                    return
                step, level = entry.step, entry.level
            self._clock.follow(DELETE, step, level)
            if entry.state == STORED and sh.inline[entry.tier] and entry.slot is None:
                self._inline.delete(entry)  # now, in the caller: buffers back to the pool
                return
            if sh.payloads[entry.tier]:
                self._device.delete(entry)
                return
            self._delete_general(entry)
        finally:
            if api is not None:
                api.release()

    def _delete_entry(self, step, level) -> Entry | None:
        """API lock held: ``delete``'s validation of `step` and `level` and
        its lookup, for a call whose record the index did not find at once:
        the entry (raises if none), or ``None`` once ``level=None`` without
        a plan has deleted the step from every level holding it."""
        sh = self._shared
        if type(step) is not int or step < 0:
            step = check_step(step)
        if level is None:
            if self._clock.plan is not None:
                level = self._default_level(step, DELETE)
            else:
                levels = [k for k in range(sh.nlv) if (step, k) in sh.index]
                if not levels:
                    raise StorageError(f"step {step} is not stored on any level")
                for k in levels:
                    self.delete(step, k)
                return None
        if type(level) is not int or not 0 <= level < sh.nlv:
            level = self._check_level(level)
        return sh.index.get((step, level)) or self._lookup(step, level)

    def _delete_general(self, entry: Entry, counter: str = "deletes") -> None:
        """API lock held, the plan followed: the record `entry` leaves the
        store (``delete``'s general path; and the source of a ``Move`` to a
        device level, once read, counted as the move, `counter`)."""
        sh = self._shared
        with sh.lock:
            sh.n[counter] += 1
            self._unregister(entry)
            # A stored record on a memory level is deleted here and now:
            # its buffers go back to the pool for the next save.
            now = entry.state == STORED and sh.inline[entry.tier]
            if now:
                self._cache.drop_slot(entry)
            else:
                self._writer.retire(entry)
            self._cache.pump()
        end_leases(entry)
        if now:
            try:
                self._writer.run_delete(entry, notify=False)
            except Exception as exc:
                with sh.lock:
                    self._jobs.record("delete", entry, exc)
                self._jobs.raise_failures()
        self._jobs.after_inline()

    def move(
        self,
        step: int,
        src: int,
        dst: int,
        state: Any = _UNSET,
        *,
        fetch: Callable[[Any], Any] | None = None,
        place: Callable[[Any], Any] | None = None,
    ) -> Any:
        """Relocate the stored ``u_step`` from level `src` to level `dst`.

        Between host levels it returns at once; the copy runs in the
        background (a ``load`` from `dst` meanwhile is served from RAM or
        waits for it).

        A move to or from a device level (a
        :class:`~vlcc_adjoint.storage.DeviceTier`, level 0) carries the
        record's data across, which only one side can reach:

        - from the device (``move(i, 0, k, state=leaves)``): the caller
          supplies `state`, the record's data brought to the host (anything
          ``save`` accepts), or `fetch`, a function of the device record's
          payload that returns it (``fetch=lambda clones: [c.to_host() for
          c in clones]``, in the device library's words); the store captures it onto level `dst` as
          ``save`` would, and ends the device record.
        - to the device (``move(i, k, 0, place=fn)``): the store reads the
          record of level `src` (from its read-ahead cache when the plan
          prefetched it; the wait counts as a stall), deletes it there, and
          **returns** what it read, the caller's own arrays; the new device
          record holds ``fn(state)`` as its payload (``None`` without
          `place`).

        **Returns:** the state read for a move to a device level, else
        ``None``.  (The read of a move to a device level counts among the
        store's loads, as well as a move.)
        """
        with self._api:
            self._enter()
            sh, clock, placement = self._shared, self._clock, self._placement
            step, src, dst = check_step(step), self._check_level(src), self._check_level(dst)
            if src == dst:
                raise VlccValueError(f"move of step {step} from level {src} to itself")
            if (step, dst) in sh.index:
                raise StorageError(
                    f"step {step} is already stored on level {dst}; delete it there first"
                )
            old = self._lookup(step, src)
            if sh.payloads[src]:
                if (state is _UNSET) == (fetch is None):
                    raise VlccValueError(
                        f"move({step}, {src}, {dst}) from a device level needs the record's data "
                        "brought to the host, as state= or as fetch= (a function of the "
                        "payload), one of them: the store cannot read a device"
                    )
                if fetch is not None:
                    state = fetch(sh.tiers[src].payload(old.key))
                self._capture_save(step, state, dst, src=src)
                self._device.remove(old)
                return None
            if state is not _UNSET or fetch is not None:
                raise VlccValueError(
                    f"move({step}, {src}, {dst}): state= and fetch= give the data of a record "
                    "moved off a device level; the store reads a host level's records itself"
                )
            if sh.payloads[dst]:
                mark = clock.mark()
                state, _ = self._restore_entry(old, None, True, MOVE, dst)
                plan = clock.plan
                record = -1 if plan is None else int(plan.record_of_action[clock.now])
                try:
                    self._device.add(step, dst, None if place is None else place(state), record)
                except BaseException:
                    clock.rewind(mark)
                    raise
                self._delete_general(old, "moves")
                return state
            if place is not None:
                raise VlccValueError(
                    f"move({step}, {src}, {dst}): place= makes the payload of a record moved "
                    f"onto a device level; level {dst} is a host level"
                )
            mark = clock.mark()
            record = clock.follow(MOVE, step, src, dst)
            try:
                self._writer.settle(old)
                if old.slot is not None:  # may be written from the cache: needs staging room
                    placement.wait_staging(old.nbytes)
                tier, reserved = placement.place(step, dst, old.nbytes)
            except BaseException:
                clock.rewind(mark)
                raise
            new = Entry(step, dst, tier, next(sh.seq), old.spec, old.nbytes, record)
            new.reserved, new.reserved_tier = reserved, tier
            new.shape = old.shape
            with sh.lock:
                sh.n["moves"] += 1
                self._unregister(old)
                self._writer.hand_over(old, new)
                self._register(new)
                self._jobs.submit("write", new, clock.priority(new))
                self._cache.pump()
            self._jobs.after_inline()
            return None

    def restart(self) -> None:
        """Run the plan again from its start: delete every record the store
        holds, without following the plan, and put the plan's clock back to
        its first action.

        A schedule is run more than once on one store when an integration
        differentiates the same loop at every training step (a compiled
        gradient called again and again); a run may also be abandoned
        halfway (a forward pass whose backward pass never ran), leaving its
        records behind.  The integration calls ``restart`` where a new run
        begins.  Without a plan it only deletes the records.  Background
        deletes are queued like any other; records being written are
        cancelled.
        """
        with self._api:
            self._enter()
            sh = self._shared
            for entry in list(sh.index.values()):
                if sh.payloads[entry.tier]:
                    self._device.delete(entry)
                else:
                    self._delete_general(entry)
            with sh.lock:
                self._clock.restart()

    def sync(self, action_index: int, *, device: bool = False) -> None:
        """Tell a planned store that the executor is at schedule action
        `action_index` (optional: the store follows its calls anyway).

        **Arguments:**

        - `action_index`: the index in the schedule of the action the
          caller is about to run.
        - `device`: the planned actions of the store's device levels (a
          :class:`~vlcc_adjoint.storage.DeviceTier`) before `action_index`
          were performed by the device itself, which does not call the
          store for each (a compiled program): the store records them now,
          in table order, as the calls ``save(i, None, k)``, ``load(i, k)``
          and ``delete(i, k)`` would (records with no payload), at a
          fraction of their cost.

        Raises :class:`PlanMismatchError` if an I/O action before it (of a
        host level, with `device`) was skipped.
        """
        with self._api:
            self._enter()
            if device:
                self._device.catch_up(action_index)
            with self._shared.lock:
                # (After the device levels' actions alone the read-ahead has
                # nothing new to do: they move the clock past no host read.)
                if self._clock.sync(action_index) and not device:
                    self._cache.pump()

    def wait(self) -> None:
        """Block until every background job is done; raise any failure."""
        with self._api:
            self._check_open()
            sh = self._shared
            t0 = time.perf_counter()
            with sh.lock:
                while self._jobs.outstanding and not sh.stopping:
                    sh.changed.wait(0.05)
                sh.t["flush"] += time.perf_counter() - t0
            self._jobs.raise_failures()

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
            sh, jobs = self._shared, self._jobs
            if sh.closed:
                return
            t0 = time.perf_counter()
            deadline = None if timeout is None else t0 + timeout
            with sh.lock:
                sh.closing = True  # queued prefetches are skipped, none are started
                while jobs.outstanding:
                    left = None if deadline is None else deadline - time.perf_counter()
                    if left is not None and left <= 0:
                        jobs.failures.append(
                            (
                                "close",
                                None,
                                None,
                                None,
                                TimeoutError(
                                    f"{jobs.outstanding} background jobs still pending "
                                    f"after {timeout} s (steps, levels: "
                                    f"{jobs.pending_steps()[:10]})"
                                ),
                            )
                        )
                        break
                    sh.changed.wait(0.05 if left is None else min(left, 0.05))
                jobs.stop()
            stuck = jobs.join(deadline)
            with sh.lock:
                sh.t["flush"] += time.perf_counter() - t0
                self._cache.clear()
                entries = list(sh.index.values())
                sh.index.clear()
                sh.by_record.clear()
            for entry in entries:  # views load(copy=False) lent: the records are gone
                end_leases(entry)
            self._capture.pool.close()
            if self._close_tiers:
                for k, tier in enumerate(self.tiers):
                    try:
                        tier.close()
                    except Exception as exc:  # reported below, after the others close
                        jobs.failures.append(("close", None, k, tier, exc))
            sh.closed = True
            if stuck:
                raise StorageError(
                    f"worker threads {stuck} were still busy when close() timed "
                    "out; a tier operation is hanging (check the tier's path or "
                    "network); they are daemon threads and end with the process"
                )
            jobs.raise_failures()

    def __enter__(self) -> TieredStore:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as close_error:  # the body's exception is the one raised
            exc.add_note(f"closing the TieredStore afterwards also failed: {close_error!r}")

    def stats(self) -> StoreStats:
        """A snapshot of the store's counters (:class:`StoreStats`)."""
        return snapshot(self._shared, self._placement, self._cache.belady, self._capture.pool)

    def steps(self, level: int) -> list[int]:
        """The steps stored on `level` now, sorted."""
        with self._shared.lock:
            return sorted(s for s, k in self._shared.index if k == level)

    def reserve(self, state: Any, count: int = 1) -> None:
        """Allocate and touch capture buffers for `count` states shaped like
        `state` ahead of time, so the first saves do not pay page faults."""
        self._capture.reserve(state, count)

    def __repr__(self) -> str:
        names = ", ".join(type(t).__name__ for t in self.tiers)
        plan = "with plan" if self._clock.plan is not None else "no plan"
        return f"TieredStore([{names}], {plan}, workers={self._shared.workers})"

    # ------------------------------------------------------------- helpers

    def _run_job(self, kind, entry, slot):
        if kind == "write":
            self._writer.run_write(entry)
        elif kind == "read":
            self._cache.run_read(entry, slot)
        else:
            self._writer.run_delete(entry)

    def _held(self) -> int:
        """Bytes of buffers the store holds: staged, cached, pooled, and in
        the tiers that keep them."""
        held = self._placement.staging_used + self._cache.used_bytes + self._capture.pool.free_bytes
        for tier in self._retaining:
            held += tier.used_bytes
        return held

    def _check_open(self):
        if self._shared.closed:
            raise StorageError("this TieredStore is closed; create a new one")

    def _enter(self):
        if self._shared.closed:
            raise StorageError("this TieredStore is closed; create a new one")
        if self._jobs.failures:  # (read without the lock: one recorded meanwhile waits a call)
            self._jobs.raise_failures()

    def _check_level(self, level) -> int:
        return check_level(level, self._shared.nlv)

    def _default_level(self, step, kind) -> int:
        level = self._clock.expected_level(step, kind)
        if level is not None:
            return level
        for k in range(self._shared.nlv):
            if (step, k) in self._shared.index:
                return k
        raise StorageError(
            f"step {step} is not stored on any level; stored: {self._describe_stored()}"
        )

    def _describe_stored(self) -> str:
        by: dict[int, list[int]] = {}
        for s, k in self._shared.index:
            by.setdefault(k, []).append(s)
        if not by:
            return "nothing"
        return "; ".join(f"level {k}: {sorted(v)[:12]}" for k, v in sorted(by.items()))

    def _find(self, step, level) -> Entry:
        """API lock held: the entry of ``u_step`` on `level` (``None``: the
        plan's level, or the fastest holding it) for a load, validated."""
        sh = self._shared
        if sh.closed or self._jobs.failures:
            self._enter()
        if type(step) is int and type(level) is int:  # (a bool is not an int)
            entry = sh.index.get((step, level))
            if entry is not None:  # stored: its step and level were validated by its save
                return entry
        if type(step) is not int or step < 0:
            step = check_step(step)
        if level is None:
            level = self._default_level(step, LOAD)
        if type(level) is not int or not 0 <= level < sh.nlv:
            level = self._check_level(level)
        return sh.index.get((step, level)) or self._lookup(step, level)

    def _restore_entry(self, entry, out, copy, kind=LOAD, dst=-1, lend=False):
        """API lock held: the load of `entry` on every path but the short one
        (plan followed, a ``Load``, or the ``Move`` to `dst` for a `kind` of
        ``MOVE``; rewound if the load fails before it changes anything).
        ``(state, lease)``: the pool lease of views lent (``copy=False``; for
        `lend` always, for ``load`` where the record's buffers may go back
        to the pool before its deletion)."""
        sh, clock = self._shared, self._clock
        if not copy and out is not None:
            raise VlccValueError(
                "load(copy=False) returns read-only views of the stored record; "
                "it cannot restore into out= as well (pass one or the other)"
            )
        targets = None if out is None else self._restore.targets(out, entry.spec)
        mark = clock.mark()
        clock.follow(kind, entry.step, entry.level, dst)
        try:
            if (
                entry.state == STORED
                and entry.slot is None
                and sh.direct[entry.tier]
                and entry.leaves is not None
                and entry.checksums is not None
            ):
                return self._restore.direct(entry, out, targets, copy, lend)
            acquired = self._cache.acquire(entry)
        except BaseException:
            clock.rewind(mark)
            self._jobs.after_inline()
            raise
        try:
            return self._restore.finish(entry, acquired, out, targets, copy)
        finally:
            self._jobs.after_inline()

    def _lookup(self, step, level) -> Entry:
        entry = self._shared.index.get((step, level))
        if entry is None:
            raise StorageError(
                f"step {step} is not stored on level {level} (stored: "
                f"{self._describe_stored()}); save it first, or load from "
                "the level the schedule saved it on"
            )
        return entry

    def _register(self, entry):
        sh = self._shared
        sh.index[(entry.step, entry.level)] = entry
        if entry.record >= 0:
            sh.by_record[entry.record] = entry
            entry.read_q = self._clock.first_read(entry.record)

    def _unregister(self, entry):
        sh = self._shared
        sh.index.pop((entry.step, entry.level), None)
        if entry.record >= 0:
            sh.by_record.pop(entry.record, None)
