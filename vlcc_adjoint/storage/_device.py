"""DeviceTier: level 0 of an integration whose checkpoints live on the device.

An accelerator integration keeps the schedule's level-0 checkpoints where
the computation is: rows of a device buffer inside a compiled program, or
clones of the state's arrays on their own device.  Their bytes
never reach the host, so no host tier can hold them; yet the schedule's
plan speaks of level 0 as of every other level, and the store can run that
plan (planned read-ahead, Belady eviction, the plan check) only if it sees
every level.  A :class:`DeviceTier` is that level in the store: it holds,
per level-0 record, an opaque *payload* the integration hands over (a list
of device array clones, or nothing at all when the slots are rows of a
compiled program's own buffer), counts the records against the level's slots, and tells which slot
each record occupies.

The contract between a :class:`~vlcc_adjoint.storage.TieredStore` and an
integration, for a store whose tier 0 is a :class:`DeviceTier` and whose
plan is ``io_plan(schedule)`` of the whole schedule (levels numbered as in
the schedule):

=============================  ==============================================
schedule action                the integration calls
=============================  ==============================================
``Save(i, 0)``                 ``store.save(i, payload, 0)``: `payload` is
                               kept as is (no flatten, no copy, no checksum)
``Load(i, 0)``                 ``store.load(i, 0)``: returns the payload
``Delete(i, 0)``               ``store.delete(i, 0)``
``Move(i, 0, k)``              ``store.move(i, 0, k, state=leaves)``: the
                               device record ends and `leaves` (the record's
                               data, brought to the host by the caller: the
                               store cannot read a device) is captured onto
                               level ``k`` as ``save`` would capture it; or
                               ``fetch=fn`` instead of `state`: the store
                               captures ``fn(payload)``
``Move(i, k, 0)``              ``state = store.move(i, k, 0, place=fn)``: the
                               store reads the record of level ``k`` (from its
                               read-ahead cache when the plan prefetched it),
                               deletes it there, and returns what it read; the
                               new device record's payload is ``fn(state)``
                               (``None`` without `place`)
``Save`` / ``Load`` /          as for any store; levels ``k >= 1`` are
``Delete`` / ``Move`` on       ``store.tiers[k]``
host levels
=============================  ==============================================

Every call follows the plan, so the store's clock knows where the run is
even while the device runs level-0 actions on its own: an integration that
cannot call back for each of them (a compiled program calls the host only
at captures and restores of host levels) makes the level-0 calls in table order at its
next call back (the store then sees every action of the schedule in order,
a little late; a level-0 call costs a few microseconds of bookkeeping).

Slots.  ``DeviceTier(slots)`` refuses a record beyond `slots` at once
(:class:`~vlcc_adjoint.storage.TierFullError`).  Built with the schedule's
level-0 :class:`~vlcc_adjoint.schedules.SlotMap`
(``DeviceTier(assign_slots(plan, 0))``, the one map a compiled program
takes its buffer rows from) it also knows each record's slot,
:meth:`DeviceTier.slot`, and refuses a record whose slot is taken: the
integration and the store then agree on every slot, or the run stops at
the first disagreement.

A payload is the caller's object: the store hands back the very object it
was given (no copy; nothing protects it from changes in place, which is
the integration's business, e.g. by checking version counters at ``Load``).
Payloads hold no host bytes, so a device tier takes no part in the store's
memory budget, its capture buffers or its checksums; it declares none of
the byte capabilities of :class:`~vlcc_adjoint.storage.Tier` and refuses
``put`` and ``get`` of host records.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from ..errors import VlccKeyError, VlccTypeError, VlccValueError
from ._tier import Record, StorageError, Tier, TierFullError

__all__ = ["DeviceTier"]


class _SlotMap(Protocol):
    """What :class:`DeviceTier` reads of a
    :class:`~vlcc_adjoint.schedules.SlotMap` (storage does not import the
    schedules package)."""

    level: int
    slots: int
    record_slot: np.ndarray


class DeviceTier(Tier):
    """The device slots of level 0 as a tier of a ``TieredStore`` (module docstring).

    **Arguments:**

    - `slots`: the level's slots: an int (the most records held at once;
      ``None``: unbounded), or the schedule's level-0
      :class:`~vlcc_adjoint.schedules.SlotMap`
      (``assign_slots(io_plan(schedule), 0)``), which also gives each
      record its slot.
    - `slot_bytes`: the device bytes of one record (the state's bytes), for
      the store's statistics (``used_bytes``, bytes in and out); ``0``
      when unknown.
    - `name`: the tier's name in messages and statistics.

    Capabilities: ``holds_payloads`` (records are payloads, see the module
    docstring); none of the byte capabilities.
    """

    #: Records are opaque payloads kept for the caller (see the module docstring).
    holds_payloads = True

    def __init__(
        self,
        slots: int | _SlotMap | None = None,
        *,
        slot_bytes: int = 0,
        name: str = "device",
    ):
        self.slot_map: _SlotMap | None = None
        if slots is not None and not isinstance(slots, (int, np.integer)):
            if not all(hasattr(slots, a) for a in ("slots", "record_slot", "level")):
                raise VlccTypeError(
                    f"DeviceTier(slots=) takes an int or a SlotMap, got {type(slots).__name__}; "
                    "e.g. DeviceTier(assign_slots(io_plan(schedule), 0))"
                )
            if slots.level != 0:
                raise VlccValueError(
                    f"DeviceTier holds level 0, got the SlotMap of level {slots.level}; pass "
                    "assign_slots(plan, 0)"
                )
            self.slot_map = slots
            slots = int(slots.slots)
        if slots is not None and (isinstance(slots, bool) or int(slots) < 0):
            raise VlccValueError(f"DeviceTier slots must be an int >= 0 or None, got {slots!r}")
        if isinstance(slot_bytes, bool) or not isinstance(slot_bytes, (int, np.integer)):
            raise VlccTypeError(f"slot_bytes must be an int >= 0, got {slot_bytes!r}")
        if slot_bytes < 0:
            raise VlccValueError(f"slot_bytes must be an int >= 0, got {slot_bytes!r}")
        self.slots = None if slots is None else int(slots)
        self.slot_bytes = int(slot_bytes)
        self.name = name
        self.capacity_bytes = None if self.slots is None else self.slots * self.slot_bytes
        self._lock = threading.Lock()
        self._payloads: dict[str, Any] = {}
        self._slot_of: dict[str, int] = {}  # key -> slot (with a slot map)
        self._taken: set[int] = set()

    # -- what the store calls ----------------------------------------------------------

    def keep(self, key: str, payload: Any, record: int = -1) -> None:
        """Hold `payload` as the record `key` (the plan's record number
        `record`, ``-1`` without a plan).

        Raises :class:`TierFullError` when all slots are taken, or when the
        slot map gives the record a slot still held by another record;
        ``KeyError`` if `key` is taken.
        """
        with self._lock:
            if key in self._payloads:
                raise VlccKeyError(f"record {key!r} is already on tier {self.name!r}")
            if self.slots is not None and len(self._payloads) >= self.slots:
                raise TierFullError(
                    f"record {key!r} does not fit: all {self.slots} slots of tier {self.name!r} "
                    "hold records; delete one first (the schedule's Delete), or give the tier "
                    "the schedule's level-0 slots (DeviceTier(assign_slots(plan, 0)))"
                )
            slot = -1
            if self.slot_map is not None:
                if not 0 <= record < len(self.slot_map.record_slot):
                    raise StorageError(
                        f"record {key!r} is not a record of the plan this tier's slot map was "
                        "made from (a call off the plan, or a store without plan=); build the "
                        "store with plan=io_plan(schedule) and DeviceTier(assign_slots(plan, 0))"
                    )
                slot = int(self.slot_map.record_slot[record])
                if slot < 0 or slot in self._taken:
                    raise TierFullError(
                        f"record {key!r} (plan record {record}) needs slot {slot} of tier "
                        f"{self.name!r}, which holds another record: the slot map is not of "
                        "this store's plan; build both from the same io_plan(schedule)"
                    )
                self._taken.add(slot)
                self._slot_of[key] = slot
            self._payloads[key] = payload

    def payload(self, key: str) -> Any:
        """The payload of record `key` (the object :meth:`keep` was given);
        ``KeyError`` if absent."""
        try:
            return self._payloads[key]
        except KeyError:
            raise VlccKeyError(f"no record {key!r} on tier {self.name!r}") from None

    def slot(self, key: str) -> int | None:
        """The slot record `key` occupies (from the slot map; ``None``
        without one); ``KeyError`` if absent."""
        with self._lock:
            if key not in self._payloads:
                raise VlccKeyError(f"no record {key!r} on tier {self.name!r}")
            return self._slot_of.get(key)

    # -- the Tier protocol ---------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return len(self._payloads) * self.slot_bytes

    def put(self, key: str, record: Record) -> None:
        raise StorageError(
            f"tier {self.name!r} is a DeviceTier: it holds device payloads, not host records; "
            "save to it through TieredStore.save(step, payload, level), which keeps the payload"
        )

    def get(self, key: str) -> Record:
        raise StorageError(
            f"tier {self.name!r} is a DeviceTier: its records are device payloads, which have "
            "no host bytes to read; TieredStore.load(step, level) returns the payload"
        )

    def delete(self, key: str) -> None:
        with self._lock:
            if key not in self._payloads:
                raise VlccKeyError(f"no record {key!r} on tier {self.name!r}")
            del self._payloads[key]
            slot = self._slot_of.pop(key, None)
            if slot is not None:
                self._taken.discard(slot)

    def keys(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._payloads))

    def __contains__(self, key: str) -> bool:
        return key in self._payloads

    def close(self) -> None:
        with self._lock:
            self._payloads.clear()
            self._slot_of.clear()
            self._taken.clear()

    def __repr__(self) -> str:
        slots = "unbounded" if self.slots is None else f"{self.slots} slots"
        return f"DeviceTier({len(self._payloads)} records, {slots})"
