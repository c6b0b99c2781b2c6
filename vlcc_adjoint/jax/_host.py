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
"""

from __future__ import annotations

import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback

from ._program import H_FROM_SLOT, H_LOAD, H_SAVE, H_TO_SLOT, Program

__all__ = ["HostSession"]

_SAVE, _LOAD, _DELETE, _MOVE = 1, 2, 3, 4

# Records (step, store level) that runs have put in each store and not yet
# deleted: shared by every session on the store, so a run can delete what an
# abandoned run (of any trace) left behind.
_HELD: "weakref.WeakKeyDictionary[object, set]" = weakref.WeakKeyDictionary()


def check_store(store, program: Program):
    """Raise a clear error unless `store` can hold the program's host levels."""
    tiers = getattr(store, "tiers", None)
    if tiers is None or not all(hasattr(store, m) for m in ("save", "load", "delete", "move")):
        raise TypeError(
            f"checkpointed_scan: `store` must be a vlcc_adjoint.storage.TieredStore, got "
            f"{type(store).__name__}")
    needed = program.levels - 1
    if len(tiers) < needed:
        raise ValueError(
            f"checkpointed_scan: the schedule uses levels 1..{needed} below the device, but "
            f"the store has {len(tiers)} tier(s); store.tiers[k - 1] holds level k, so give "
            f"TieredStore({needed} tiers)")
    if getattr(store, "_plan", None) is not None:
        raise ValueError(
            "checkpointed_scan: build the TieredStore without plan=; its levels are the "
            "schedule's levels >= 1 (the device holds level 0), which an io_plan of the whole "
            "schedule does not describe")


class HostSession:
    """The host side of one traced ``checkpointed_scan`` with host levels.

    **Arguments:** `program` (its ``host_actions``), `store` (a
    ``TieredStore``; tier ``k - 1`` holds level ``k``), `leaf_avals` (shapes
    and dtypes of the carry's leaves).
    """

    def __init__(self, program: Program, store, leaf_avals):
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

    # -- host side (Python, called by io_callback) ---------------------------

    def _reset(self):
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
            kind, step, level, dst = self._begin(int(hid))
            target = level if kind == _SAVE else dst
            self.store.save(step, [np.asarray(x) for x in leaves], target - 1)
            self.held.add((step, target - 1))
            self.writes[target] += 1
            if kind == _MOVE:
                self.reads[0] += 1
            return np.int32(0)

    def get(self, hid):
        with self._lock:
            kind, step, level, dst = self._begin(int(hid))
            leaves = self.store.load(step, level - 1)
            self.reads[level] += 1
            if kind == _MOVE:  # to the device: the host copy goes
                self.store.delete(step, level - 1)
                self.held.discard((step, level - 1))
                self.writes[0] += 1
            return tuple(np.asarray(x, s.dtype).reshape(s.shape)
                         for x, s in zip(leaves, self.shapes))

    def finish(self, token):
        with self._lock:
            self._pure(len(self.actions))
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
