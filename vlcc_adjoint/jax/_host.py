"""Host storage levels for the JAX interpreter: ``io_callback`` into a ``TieredStore``.

A schedule may keep checkpoints on levels >= 1 (host memory, compressed
memory, disk).  The store owns every level: ``checkpointed_scan(...,
store=store)`` takes a :class:`~vlcc_adjoint.storage.TieredStore` whose
tier 0 is a :class:`~vlcc_adjoint.storage.DeviceTier` (the device buffer's
slots) and whose plan is ``io_plan(schedule)`` of the whole schedule::

    store = TieredStore([DeviceTier(), MemoryTier(), ZarrTier(path)], plan=io_plan(schedule))

levels numbered as in the schedule (``store.tiers[k]`` holds level
``k``).  The compiled program (:mod:`._program`) marks the actions that
move device data to or from the host as *host instructions*; each runs one
ordered ``jax.experimental.io_callback``:

    H_SAVE       the state in hand -> store.save(i, leaves, k)       Save(i, k)
    H_LOAD       store.load(i, k) -> the state in hand              Load(i, k)
    H_FROM_SLOT  device slot -> store.move(i, 0, k, state=leaves)    Move(i, 0, k)
    H_TO_SLOT    store.move(i, k, 0) -> device slot                 Move(i, k, 0)

so the host is called only at captures and restores, never per step.

The session is a client of the one action machine
(:class:`~vlcc_adjoint.schedules.Machine`), in pull mode over the whole
table: at a callback for table row ``r`` it runs the rows since the last
callback up to ``r``.  The device's own rows (``Advance``, ``Reverse``,
and the ``Save``/``Load``/``Delete`` of a device slot) are skipped (the
compiled loops ran them), the host rows performed through the store in
table order; before each host row the store records the device's level-0
rows before it as records of its device tier, with no data, in one call
(``store.sync(row, device=True)``), so the store's plan check and its
clock see every action of the schedule, in order, a little late (at the
next callback).  Row ``r`` itself is the one data-carrying row among them:
its leaves are the callback's arguments, or its result.

Restores are read ahead by the store: the plan tells it, at every call,
which records the next restores read, and its workers read them into its
read-ahead cache (Belady's rule) while the device computes; the callback
that needs a record then collects it from RAM.  A restore's *stall* is the
time its callback waited; :func:`host_io_stats` reports it, and how many
restores the read-ahead served.

One :class:`HostSession` serves every run of one traced
``checkpointed_scan``: a callback for a row not after the last one starts a
new run, and the session restarts the store's plan
(:meth:`~vlcc_adjoint.storage.TieredStore.restart`), deleting what an
abandoned run (a forward pass whose backward pass never ran) left behind.
So one store serves one loop at a time: give two loops that are live
together two stores.

Under ``jax.vmap`` the callbacks would sit under a batched ``lax.cond``,
which JAX refuses for IO effects ("IO effect not supported in
vmap-of-cond"); ``checkpointed_scan`` raises a clear error instead.

The earlier form, a store of host tiers only and no plan (tier ``k - 1``
holding level ``k``), still works and warns (:func:`check_store`): the
session then translates levels, keeps level 0 to itself, and no restore is
read ahead (the store has no plan).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback

from ..errors import VlccTypeError, VlccValueError
from ..schedules import ADVANCE, REVERSE, Machine
from ._interpret import index_rows, update_rows
from ._program import H_FROM_SLOT, H_LOAD, H_SAVE, H_TO_SLOT, Program
from ._state import host_aval, is_key

if TYPE_CHECKING:
    from ..schedules import Schedule
    from ..storage import StoreStats, TieredStore

__all__ = ["HostIOStats", "HostSession", "check_store", "host_io_stats"]


@dataclasses.dataclass
class HostIOStats:
    """What the host levels of ``checkpointed_scan`` runs on one store did.

    **Attributes:**

    - `saves`: captures sent to a host level (``Save``, ``Move`` off the device).
    - `save_s`: seconds the compiled program spent in those callbacks.
    - `loads`: restores from a host level to the device (``Load``,
      ``Move`` onto the device).
    - `prefetched`: how many of them the store's read-ahead served (its
      ``prefetch_hits``: the record was in its read-ahead cache, read while
      the device computed).
    - `read_s`: seconds of storage I/O behind these runs: the store's
      ``io_seconds`` (its workers' reads and writes, checksums and
      compression included).
    - `stall_s`: seconds the compiled program waited in restore callbacks
      (a record read ahead stalls only for the part still running, and for
      the copy to the device).
    """

    saves: int = 0
    save_s: float = 0.0
    loads: int = 0
    prefetched: int = 0
    read_s: float = 0.0
    stall_s: float = 0.0


class _Counters:
    """The counts of the runs on one store, and the store's statistics when
    counting began (``prefetched`` and ``read_s`` are differences of them)."""

    __slots__ = ("saves", "save_s", "loads", "stall_s", "base")

    def __init__(self, base: StoreStats):
        self.saves = self.loads = 0
        self.save_s = self.stall_s = 0.0
        self.base = base


_COUNTERS: weakref.WeakKeyDictionary[object, _Counters] = weakref.WeakKeyDictionary()


def _counters(store: TieredStore) -> _Counters:
    counters = _COUNTERS.get(store)
    if counters is None:
        counters = _COUNTERS[store] = _Counters(store.stats())
    return counters


def host_io_stats(store: TieredStore, reset: bool = False) -> HostIOStats:
    """The host-level I/O of the ``checkpointed_scan`` runs on `store` so far.

    **Arguments:** `store`, the ``TieredStore`` passed to
    ``checkpointed_scan(..., store=store)``; `reset`: start counting afresh
    after this call.

    **Returns:** a :class:`HostIOStats` snapshot (zeros if no run used the
    store yet).
    """
    counters = _counters(store)
    now = store.stats()
    base = counters.base
    snap = HostIOStats(
        saves=counters.saves,
        save_s=counters.save_s,
        loads=counters.loads,
        prefetched=now.prefetch_hits - base.prefetch_hits,
        read_s=now.io_seconds - base.io_seconds,
        stall_s=counters.stall_s,
    )
    if reset:
        _COUNTERS[store] = _Counters(now)
    return snap


def check_store(store: Any, program: Program) -> bool:
    """Check that `store` can hold the levels of `program`'s schedule;
    returns whether it is the earlier form (host tiers only, no plan: tier
    ``k - 1`` holds level ``k``), which draws a ``DeprecationWarning``.

    Raises a clear error for anything else: not a ``TieredStore``, too few
    tiers, a plan of another schedule, a device tier without a plan, a plan
    without a device tier.
    """
    tiers = getattr(store, "tiers", None)
    if tiers is None or not all(
        hasattr(store, m) for m in ("save", "load", "delete", "move", "restart", "plan")
    ):
        raise VlccTypeError(
            f"checkpointed_scan: `store` must be a vlcc_adjoint.storage.TieredStore, got "
            f"{type(store).__name__}"
        )
    levels = program.levels
    schedule = _schedule_of(program)
    new_form = "TieredStore([DeviceTier(), MemoryTier(), ...], plan=io_plan(schedule))"
    if getattr(tiers[0], "holds_payloads", False):
        if len(tiers) < levels:
            raise VlccValueError(
                f"checkpointed_scan: the schedule uses levels 0..{levels - 1}, but the store has "
                f"{len(tiers)} tier(s); store.tiers[k] holds level k, so give it {levels} tiers "
                "(a DeviceTier and one host tier per level below the device)"
            )
        plan = store.plan
        if plan is None:
            raise VlccValueError(
                "checkpointed_scan: a store with a DeviceTier runs the schedule's plan: build it "
                f"as {new_form}, with the schedule given to checkpointed_scan"
            )
        planned = getattr(plan, "schedule", None)
        if planned is not None and planned is not schedule and not _same_table(planned, schedule):
            raise VlccValueError(
                f"checkpointed_scan: the store's plan is for {planned!r}, not for the schedule "
                f"being run, {schedule!r}; build the store with plan=io_plan(schedule) of the "
                "schedule passed to checkpointed_scan (with segment=B: the schedule over the "
                "segments)"
            )
        return False
    if store.plan is not None:
        raise VlccValueError(
            "checkpointed_scan: this store has a plan but no DeviceTier for level 0; the store "
            f"owns every level of the schedule: build it as {new_form}"
        )
    warnings.warn(
        "checkpointed_scan(store=TieredStore(host tiers)) without a plan, store.tiers[k - 1] "
        f"holding level k, is deprecated: give the store every level and the plan, {new_form}, "
        "levels numbered as in the schedule; the store then reads restores ahead, evicts with "
        "foresight and checks the plan on every level",
        DeprecationWarning,
        stacklevel=4,
    )
    if len(tiers) < levels - 1:
        raise VlccValueError(
            f"checkpointed_scan: the schedule uses levels 1..{levels - 1} below the device, but "
            f"the store has {len(tiers)} tier(s); in this (deprecated) form store.tiers[k - 1] "
            f"holds level k; better, give the store every level: {new_form}"
        )
    return True


def _schedule_of(program: Program) -> Schedule:
    plan = program.plan
    schedule = None if plan is None else plan.schedule
    if schedule is None:
        raise VlccValueError(
            "this Program was built without its schedule's plan; compile it with compile_program"
        )
    return schedule


def _same_table(a: Schedule, b: Schedule) -> bool:
    return a.n_steps == b.n_steps and len(a) == len(b) and np.array_equal(a.table, b.table)


class HostSession:
    """The host side of one traced ``checkpointed_scan`` with host levels:
    a client of the action machine (module docstring).

    **Arguments:** `program` (its schedule's table and plan, and which rows
    are host instructions), `store` (a ``TieredStore``, checked by
    :func:`check_store`), `leaf_avals` (shapes and dtypes of the carry's
    leaves).

    **Attributes:** `reads`, `writes`: per level, the host reads and writes
    of the runs so far (``Load``/``Save`` of host levels, both sides of
    ``Move``), for :func:`~vlcc_adjoint.jax.jax_trace`.
    """

    def __init__(self, program: Program, store: Any, leaf_avals: list):
        self.legacy = check_store(store, program)
        self.store: TieredStore = store
        self.schedule = _schedule_of(program)
        self.rows = program.host_index  # table row of each host action
        self.shapes = [host_aval(a) for a in leaf_avals]  # PRNG keys: their key_data
        self.position = 0  # the rows before it are done (in this run)
        self.hid = 0  # the next host row's host action id (in this run)
        self.started = False
        self.reads = np.zeros(program.levels, np.int64)
        self.writes = np.zeros(program.levels, np.int64)
        # The data of the row being run: the callback's leaves, or what the
        # row read for it.
        self._leaves: list[np.ndarray] | None = None
        self._read: Any = None
        self._lock = threading.Lock()
        _counters(store)

    # -- the rows, as the action machine's client ----------------------------------------

    def _host(self, level: int) -> int:
        """The store tier of schedule level `level` (>= 1)."""
        return level - 1 if self.legacy else level

    def _next_host_row(self) -> None:
        """Before a host row's store call: the device's own level-0 rows
        before it are recorded by the store, in one call
        (``sync(row, device=True)``, which also checks that no host row was
        skipped)."""
        if not self.legacy:
            self.store.sync(int(self.rows[self.hid]), device=True)
        self.hid += 1

    def _take(self) -> list[np.ndarray]:
        leaves, self._leaves = self._leaves, None
        assert leaves is not None, "a host row that moves device data ran without its callback"
        return leaves

    # A level-0 Save, Load or Delete is the device's own (a row of its
    # buffer): the store records it at the next host row (_next_host_row).

    def save(self, step: int, level: int) -> None:
        if level == 0:
            return
        self._next_host_row()
        self.store.save(step, self._take(), self._host(level))
        self.writes[level] += 1

    def load(self, step: int, level: int) -> None:
        if level == 0:
            return
        self._next_host_row()
        # Read-only views of the record, verified, not copied: the callback
        # returns them to XLA, which copies a host callback's results into
        # the program's buffers (tests/jax/test_jax_out_of_core.py pins
        # this), and the record is stored until a later action deletes it.
        self._read = self.store.load(step, self._host(level), copy=False)
        self.reads[level] += 1

    def delete(self, step: int, level: int) -> None:
        if level == 0:
            return
        self._next_host_row()
        self.store.delete(step, self._host(level))

    def move(self, step: int, src: int, dst: int) -> None:
        self._next_host_row()
        if src == 0:  # off the device: the callback's leaves
            if self.legacy:
                self.store.save(step, self._take(), dst - 1)
            else:
                self.store.move(step, 0, dst, state=self._take())
        elif dst == 0:  # onto the device: read for the callback
            if self.legacy:
                self._read = self.store.load(step, src - 1)
                self.store.delete(step, src - 1)
            else:
                self._read = self.store.move(step, src, 0)
        else:
            self.store.move(step, self._host(src), self._host(dst))
        self.reads[src] += 1
        self.writes[dst] += 1

    def _run_to(self, stop: int) -> None:
        """Run the table's rows ``[position, stop)``: the host rows through
        the store, the device's own rows (``Advance``, ``Reverse`` handed
        back, level-0 storage rows recorded at the next host row) skipped."""
        rows = Machine(
            self.schedule, self, start=self.position, stop=stop, returns=(ADVANCE, REVERSE)
        )
        for _ in rows:
            pass  # an Advance or a Reverse: the compiled loops ran it
        self.position = stop

    def _begin(self, row: int) -> None:
        if row < self.position or not self.started:  # a new run
            self.store.restart()
            self.position = self.hid = 0
            self.started = True

    # -- host side (Python, called by io_callback) ---------------------------------------

    def put(self, hid, *leaves):
        """A capture: the host row `hid` (``Save`` of a host level, ``Move``
        off the device) with the device's `leaves`."""
        with self._lock:
            t0 = time.perf_counter()
            row = int(self.rows[int(hid)])
            self._begin(row)
            # Host arrays (on the CPU backend, views of the device buffers):
            # the store copies them into its own, and restores numpy arrays.
            self._leaves = [np.asarray(x) for x in leaves]
            try:
                self._run_to(row + 1)
            finally:
                self._leaves = None
            counters = _counters(self.store)
            counters.saves += 1
            counters.save_s += time.perf_counter() - t0
            return np.int32(0)

    def get(self, hid):
        """A restore: the host row `hid` (``Load`` of a host level, ``Move``
        onto the device); returns the leaves it read."""
        with self._lock:
            t0 = time.perf_counter()
            row = int(self.rows[int(hid)])
            self._begin(row)
            try:
                self._run_to(row + 1)
                leaves, self._read = self._read, None
            finally:
                self._read = None
            out = tuple(
                np.asarray(x, s.dtype).reshape(s.shape) for x, s in zip(leaves, self.shapes)
            )
            counters = _counters(self.store)
            counters.loads += 1
            counters.stall_s += time.perf_counter() - t0
            return out

    def finish(self, token):
        """The end of a backward pass: the rows after the last callback
        (the last Deletes)."""
        with self._lock:
            if self.started:
                self._run_to(len(self.schedule))
                if not self.legacy:  # the device's last rows (its last Deletes)
                    self.store.sync(len(self.schedule), device=True)
            return np.int32(0)

    # -- device side (traced) ------------------------------------------------------------

    def instruction(self, hkind: Any, hid: Any, hslot: Any, cur: list, buf: list) -> Any:
        """The traced host instruction: a ``lax.switch`` over the four kinds.
        PRNG keys cross to the host as their ``key_data`` and come back
        wrapped with the implementation of the leaf they replace."""
        token = jax.ShapeDtypeStruct((), jnp.int32)

        def to_host(leaves):
            return [jax.random.key_data(x) if is_key(x) else x for x in leaves]

        def from_host(leaves, like):
            return [
                jax.random.wrap_key_data(x, impl=jax.random.key_impl(y)) if is_key(y) else x
                for x, y in zip(leaves, like, strict=True)
            ]

        def save_cur(cur, buf):
            io_callback(self.put, token, hid, *to_host(cur), ordered=True)
            return list(cur), list(buf)

        def load_cur(cur, buf):
            new = io_callback(self.get, tuple(self.shapes), hid, ordered=True)
            return from_host(new, cur), list(buf)

        def from_slot(cur, buf):
            io_callback(self.put, token, hid, *to_host(index_rows(buf, hslot)), ordered=True)
            return list(cur), list(buf)

        def to_slot(cur, buf):
            new = io_callback(self.get, tuple(self.shapes), hid, ordered=True)
            return list(cur), update_rows(buf, from_host(new, cur), hslot)

        def unused(cur, buf):  # no device slots: the slot kinds never run
            return list(cur), list(buf)

        has_slots = all(b.shape[0] > 0 for b in buf)
        branches: list[Callable] = [unused] * 4
        branches[H_SAVE], branches[H_LOAD] = save_cur, load_cur
        branches[H_FROM_SLOT] = from_slot if has_slots else unused
        branches[H_TO_SLOT] = to_slot if has_slots else unused
        return lax.switch(hkind, branches, list(cur), list(buf))

    def end_of_pass(self, token: Any) -> Any:
        """Run the rows after the last instruction (trailing Deletes)."""
        return io_callback(self.finish, jax.ShapeDtypeStruct((), jnp.int32), token, ordered=True)
