"""Host storage levels for the JAX interpreter: ``io_callback`` into a ``TieredStore``.

A schedule may keep checkpoints on levels >= 1 (host memory, compressed
memory, disk).  Level 0 is the device buffer; level ``k >= 1`` is the
store's tier ``k - 1`` (``store.tiers[0]`` is the first level *below* the
device).  The compiled program (:mod:`._program`) marks the actions that
move device data to or from the host as *host instructions*; each runs one
ordered ``jax.experimental.io_callback``:

    H_SAVE       the state in hand -> store.save(step, leaves, k - 1)
    H_LOAD       store.load(step, k - 1) -> the state in hand
    H_FROM_SLOT  device slot -> store.save   (Move(i, 0, k))
    H_TO_SLOT    store.load -> device slot   (Move(i, k, 0))

so the host is called only at captures and restores, never per step.
Host actions that move no device data (``Delete(i, k)``, ``Move(i, k, j)``
between host levels) run on the host, in table order, at the next callback
(or the one that ends the backward pass): the store sees every host action
of the schedule in table order.

Under ``jax.vmap`` the callbacks would sit under a batched ``lax.cond``,
which JAX refuses for IO effects ("IO effect not supported in
vmap-of-cond"); ``checkpointed_scan`` raises a clear error instead.

One :class:`HostSession` serves every run of one traced
``checkpointed_scan``: a callback whose action id is not after the last one
starts a new run.  A run's first callback deletes the records an abandoned
run (a forward pass whose backward pass never ran, in this trace or another)
left in the store, so one store serves one loop at a time: give two loops
that are live together two stores.

Read-ahead.  The schedule is known before the run, so every restore is too:
:func:`~vlcc_adjoint.schedules.io_plan` lists, per level, the reads in the
order the schedule needs them.  After each callback the session looks
along that list and starts, on a background thread, the reads of the next
records (``H_LOAD`` and ``H_TO_SLOT``) up to a byte budget, provided each
record is already written (its ``Save`` / ``Move`` ran at an earlier
callback).  The callback that needs a record then only collects it: the
read ran while the device computed the advances and adjoint steps in
between.  A restore's *stall* is the time its callback waited (all of the
read when nothing was started ahead); :func:`host_io_stats` reports it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback

from ..errors import VlccTypeError, VlccValueError
from ._program import H_FROM_SLOT, H_LOAD, H_SAVE, H_TO_SLOT, Program

if TYPE_CHECKING:
    from ..storage import TieredStore

__all__ = ["HostIOStats", "HostSession", "host_io_stats"]

_SAVE, _LOAD, _DELETE, _MOVE = 1, 2, 3, 4

#: The most restores read ahead at once.
LOOKAHEAD = 64

# Records (step, store level) that runs have put in each store and not yet
# deleted: shared by every session on the store, so a run can delete what an
# abandoned run (of any trace) left behind.
_HELD: weakref.WeakKeyDictionary[object, set] = weakref.WeakKeyDictionary()


@dataclasses.dataclass
class HostIOStats:
    """What the host levels of ``checkpointed_scan`` runs on one store did.

    **Attributes:**

    - `saves`: captures sent to a host level (``Save``, ``Move`` off the device).
    - `save_s`: seconds the compiled program spent in those callbacks.
    - `loads`: restores from a host level to the device.
    - `prefetched`: how many of them were started ahead (read-ahead hits).
    - `read_s`: seconds spent reading them (background and blocking).
    - `stall_s`: seconds the compiled program waited in restore callbacks
      (a read started ahead stalls only for the part still running).
    """

    saves: int = 0
    save_s: float = 0.0
    loads: int = 0
    prefetched: int = 0
    read_s: float = 0.0
    stall_s: float = 0.0


_STATS: weakref.WeakKeyDictionary[object, HostIOStats] = weakref.WeakKeyDictionary()


def host_io_stats(store: TieredStore, reset: bool = False) -> HostIOStats:
    """The host-level I/O of the ``checkpointed_scan`` runs on `store` so far.

    **Arguments:** `store`, the ``TieredStore`` passed to
    ``checkpointed_scan(..., store=store)``; `reset`: start counting afresh
    after this call.

    **Returns:** a :class:`HostIOStats` snapshot (zeros if no run used the
    store yet).
    """
    stats = _STATS.setdefault(store, HostIOStats())
    snap = dataclasses.replace(stats)
    if reset:
        _STATS[store] = HostIOStats()
    return snap


def check_store(store, program: Program):
    """Raise a clear error unless `store` can hold the program's host levels."""
    tiers = getattr(store, "tiers", None)
    if tiers is None or not all(hasattr(store, m) for m in ("save", "load", "delete", "move")):
        raise VlccTypeError(
            f"checkpointed_scan: `store` must be a vlcc_adjoint.storage.TieredStore, got "
            f"{type(store).__name__}"
        )
    needed = program.levels - 1
    if len(tiers) < needed:
        raise VlccValueError(
            f"checkpointed_scan: the schedule uses levels 1..{needed} below the device, but "
            f"the store has {len(tiers)} tier(s); store.tiers[k - 1] holds level k, so give "
            f"TieredStore({needed} tiers)"
        )
    if getattr(store, "_plan", None) is not None:
        raise VlccValueError(
            "checkpointed_scan: build the TieredStore without plan=; its levels are the "
            "schedule's levels >= 1 (the device holds level 0), which an io_plan of the whole "
            "schedule does not describe"
        )


class HostSession:
    """The host side of one traced ``checkpointed_scan`` with host levels.

    **Arguments:** `program` (its ``host_actions``), `store` (a
    ``TieredStore``; tier ``k - 1`` holds level ``k``), `leaf_avals` (shapes
    and dtypes of the carry's leaves), `plan` (the schedule's
    :class:`~vlcc_adjoint.schedules.IOPlan`: enables read-ahead; ``None``:
    every restore reads when it is needed), `prefetch_bytes` (the most bytes
    of records read ahead and not yet collected).
    """

    def __init__(
        self, program: Program, store, leaf_avals, plan=None, prefetch_bytes: int = 256 << 20
    ):
        check_store(store, program)
        self.actions = program.host_actions
        self.store = store
        self.shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in leaf_avals]
        self.next_id = 0
        self.started = False
        self.held = _HELD.setdefault(store, set())  # (step, store level) not yet deleted
        self.reads = np.zeros(program.levels, np.int64)
        self.writes = np.zeros(program.levels, np.int64)
        self._lock = threading.Lock()
        record_bytes = sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in self.shapes)
        # Reads started ahead: within the byte budget, and at most LOOKAHEAD.
        self.depth = (
            min(LOOKAHEAD, int(prefetch_bytes) // max(1, record_bytes)) if plan is not None else 0
        )
        self.ahead_hid, self.ahead_ready = _restores(program, plan)
        self.pending: dict[int, Future] = {}  # host action id -> its read, started ahead
        self._pool: ThreadPoolExecutor | None = None

    # -- host side (Python, called by io_callback) ---------------------------

    def _stats(self) -> HostIOStats:
        return _STATS.setdefault(self.store, HostIOStats())

    def _read(self, step: int, level: int):
        t0 = time.perf_counter()
        leaves = self.store.load(step, level - 1)
        out = tuple(np.asarray(x, s.dtype).reshape(s.shape) for x, s in zip(leaves, self.shapes))
        return out, time.perf_counter() - t0

    def _ahead(self):
        """Start the reads of the next restores whose records are written."""
        if self.depth <= 0:
            return
        q = int(np.searchsorted(self.ahead_hid, self.next_id))
        for r in range(q, min(q + self.depth, len(self.ahead_hid))):
            hid = int(self.ahead_hid[r])
            if hid in self.pending or self.ahead_ready[r] >= self.next_id:
                continue  # started already, or its record is not written yet
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="vlcc-jax-read-ahead")
            _, step, level, _ = (int(v) for v in self.actions[hid])
            self.pending[hid] = self._pool.submit(self._read, step, level)

    def _drop_pending(self):
        # Reads started for a run that was abandoned: their records are about
        # to be deleted; wait for each so none outlives its record.  A failed
        # one is not reported: no restore of this run will ever need it.
        for future in self.pending.values():
            future.cancel()
            if not future.cancelled():
                future.exception()
        self.pending.clear()

    def _reset(self):
        self._drop_pending()
        for step, level in sorted(self.held):
            self.store.delete(step, level)
        self.held.clear()
        self.next_id = 0

    def _pure(self, upto: int):
        """Run the actions ``[next_id, upto)``, which move no device data."""
        for q in range(self.next_id, upto):
            kind, step, level, dst = (int(v) for v in self.actions[q])
            if kind == _DELETE:
                self.store.delete(step, level - 1)
                self.held.discard((step, level - 1))
            elif kind == _MOVE and level > 0 and dst > 0:
                self.store.move(step, level - 1, dst - 1)
                self.held.discard((step, level - 1))
                self.held.add((step, dst - 1))
                self.reads[level] += 1
                self.writes[dst] += 1
            else:  # pragma: no cover - the compiler makes these instructions
                raise AssertionError(f"host action {q} {self.actions[q]} moves device data")
        self.next_id = max(self.next_id, upto)

    def _begin(self, hid: int):
        if hid < self.next_id or not self.started:  # a new run
            self._reset()
            self.started = True
        self._pure(hid)
        self.next_id = hid + 1
        return (int(v) for v in self.actions[hid])

    def put(self, hid, *leaves):
        with self._lock:
            t0 = time.perf_counter()
            kind, step, level, dst = self._begin(int(hid))
            target = level if kind == _SAVE else dst
            self.store.save(step, [np.asarray(x) for x in leaves], target - 1)
            self.held.add((step, target - 1))
            self.writes[target] += 1
            if kind == _MOVE:
                self.reads[0] += 1
            self._ahead()
            stats = self._stats()
            stats.saves += 1
            stats.save_s += time.perf_counter() - t0
            return np.int32(0)

    def get(self, hid):
        with self._lock:
            t0 = time.perf_counter()
            hid = int(hid)
            if hid < self.next_id or not self.started:
                self._drop_pending()  # a new run: nothing started ahead is for it
            future = self.pending.pop(hid, None)
            kind, step, level, dst = self._begin(hid)
            if future is not None:
                out, read_s = future.result()
            else:
                out, read_s = self._read(step, level)
            self.reads[level] += 1
            if kind == _MOVE:  # to the device: the host copy goes
                self.store.delete(step, level - 1)
                self.held.discard((step, level - 1))
                self.writes[0] += 1
            stats = self._stats()
            stats.loads += 1
            stats.prefetched += future is not None
            stats.read_s += read_s
            stats.stall_s += time.perf_counter() - t0
            self._ahead()
            return out

    def finish(self, token):
        with self._lock:
            self._pure(len(self.actions))
            self._drop_pending()
            return np.int32(0)

    # -- device side (traced) ------------------------------------------------

    def instruction(self, hkind, hid, hslot, cur, buf, index, update):
        """The traced host instruction: a ``lax.switch`` over the four kinds."""
        token = jax.ShapeDtypeStruct((), jnp.int32)

        def save_cur(cur, buf):
            io_callback(self.put, token, hid, *cur, ordered=True)
            return list(cur), list(buf)

        def load_cur(cur, buf):
            new = io_callback(self.get, tuple(self.shapes), hid, ordered=True)
            return list(new), list(buf)

        def from_slot(cur, buf):
            io_callback(self.put, token, hid, *index(buf, hslot), ordered=True)
            return list(cur), list(buf)

        def to_slot(cur, buf):
            new = io_callback(self.get, tuple(self.shapes), hid, ordered=True)
            return list(cur), update(buf, list(new), hslot)

        def unused(cur, buf):  # no device slots: the slot kinds never run
            return list(cur), list(buf)

        has_slots = all(b.shape[0] > 0 for b in buf)
        branches = [None] * 4
        branches[H_SAVE], branches[H_LOAD] = save_cur, load_cur
        branches[H_FROM_SLOT] = from_slot if has_slots else unused
        branches[H_TO_SLOT] = to_slot if has_slots else unused
        return lax.switch(hkind, branches, list(cur), list(buf))

    def end_of_pass(self, token):
        """Run the host actions after the last instruction (trailing Deletes)."""
        return io_callback(self.finish, jax.ShapeDtypeStruct((), jnp.int32), token, ordered=True)


def _restores(program: Program, plan) -> tuple[np.ndarray, np.ndarray]:
    """The restores to read ahead, from the schedule's :class:`IOPlan`.

    Returns ``(hid, ready)``, sorted by ``hid``: the host action id of every
    read that brings a record to the device (``Load(i, k)``, ``Move(i, k,
    0)`` for ``k >= 1``), and the host action id of the ``Save`` / ``Move``
    that wrote the record it reads (the read may start once that ran).
    """
    empty = np.zeros(0, np.int64)
    if plan is None or len(program.host_index) == 0:
        return empty, empty
    index = program.host_index
    hids, ready = [], []
    for lv in plan.levels[1:]:
        if len(lv) == 0:
            continue
        hid = np.searchsorted(index, lv.index)
        assert np.array_equal(index[hid], lv.index), "the plan is not of this schedule"
        acts = program.host_actions[hid]
        to_device = (acts[:, 0] == _LOAD) | ((acts[:, 0] == _MOVE) & (acts[:, 3] == 0))
        start = plan.records["start"][lv.record[to_device]]
        hids.append(hid[to_device])
        ready.append(np.searchsorted(index, start))
    if not hids:
        return empty, empty
    hid, ready = np.concatenate(hids), np.concatenate(ready)
    order = np.argsort(hid, kind="stable")
    return hid[order].astype(np.int64), ready[order].astype(np.int64)
