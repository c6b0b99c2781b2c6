"""Device levels: records that are the caller's payloads, kept by a
:class:`~vlcc_adjoint.storage.DeviceTier`.

A level whose tier declares ``holds_payloads`` holds no host bytes: a
record there is whatever object the integration hands to ``save`` (clones
of device arrays, or nothing at all), kept by the tier as is.  What the
engine still does for such a level is what it does for every level but
the bytes: it follows the plan (each call checked against the schedule's
next I/O action, so the read-ahead of the host levels knows where the run
is), keeps the index of records and the counters, and ends the records.
The contract with the integration, the payload on ``Save`` and ``Load``
and the data carried by a ``Move`` between the device and a host level, is
written in :mod:`vlcc_adjoint.storage._device`; the ``Move`` itself runs in
:meth:`~._store.TieredStore.move`, which captures or reads the host side
on the engine's usual paths and calls :meth:`DevicePath.add` and
:meth:`DevicePath.remove` for the device side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...errors import VlccValueError
from ._common import LOAD, MOVE, SAVE, STORED, Entry

__all__ = ["DevicePath"]


class DevicePath:
    """Saves, loads and deletes of the records of device levels.

    They do not pump the read-ahead (:meth:`~._cache.ReadCache.pump`): a
    device level is never read ahead, and its actions move the plan's clock
    past no read of a host level, so the reads the read-ahead looks at are
    the same before and after them (a host level's next reads change only
    at that level's own calls, which pump).  An integration makes a
    level-0 call for every level-0 action of the schedule, so this keeps
    them at a few microseconds each.

    **Arguments:** the engine's :class:`~._common.Shared` and
    :class:`~._clock.PlanClock`, and the store's ``register(entry)`` and
    ``unregister(entry)`` (its index of records and the plan's record
    numbers).
    """

    def __init__(
        self,
        shared,
        clock,
        register: Callable[[Entry], None],
        unregister: Callable[[Entry], None],
    ):
        self.shared = shared
        self.clock = clock
        self.register = register
        self.unregister = unregister

    def save(self, step: int, payload: Any, level: int) -> None:
        """API lock held, step and level validated and not stored: keep
        `payload` as ``u_step`` on the device `level` (a ``Save``)."""
        clock = self.clock
        mark = clock.mark()
        record = clock.follow(SAVE, step, level)
        try:
            self.add(step, level, payload, record, "saves")
        except BaseException:
            clock.rewind(mark)
            raise

    def add(self, step: int, level: int, payload: Any, record: int, counter: str = "") -> Entry:
        """API lock held, the plan followed: a new record of ``u_step`` on the
        device `level`, holding `payload` (the plan's record `record`;
        `counter`: the store's counter of the call, if any).  Raises what the
        tier's ``keep`` raises (all slots taken), with nothing changed."""
        sh = self.shared
        tier = sh.tiers[level]
        entry = Entry(step, level, level, next(sh.seq), None, tier.slot_bytes, record)
        tier.keep(entry.key, payload, record)
        entry.state = STORED
        with sh.lock:
            self.register(entry)
            sh.count_put(entry)
            if counter:
                sh.n[counter] += 1
        return entry

    def load(self, entry: Entry, out: Any) -> Any:
        """API lock held: the payload of the device record `entry` (a ``Load``:
        the plan followed)."""
        if out is not None:
            raise VlccValueError(
                f"step {entry.step} on level {entry.level} is a device record: its payload is "
                "the caller's own object and cannot be restored into out=; call "
                "load(step, level) and use the payload it returns"
            )
        sh = self.shared
        self.clock.follow(LOAD, entry.step, entry.level)
        payload = sh.tiers[entry.tier].payload(entry.key)
        with sh.lock:
            sh.n["loads"] += 1
            c = sh.tc[entry.tier]
            c.gets += 1
            c.bytes_out += entry.nbytes
        return payload

    def catch_up(self, action_index: int) -> None:
        """API lock held: record the planned actions of device levels before
        schedule action `action_index`, which the device performed without
        calling the store (``TieredStore.sync(..., device=True)``), in
        order, each as its call would (a ``Save`` keeps no payload).

        Stops at the first planned action at or after `action_index`, or at
        one on a host level (left for :meth:`~._clock.PlanClock.sync` to
        report as skipped).  The actions are decoded from the plan's action
        codes (:func:`~._clock.action_code`), one integer each.
        """
        clock, sh = self.clock, self.shared
        if clock.ops is None:
            raise VlccValueError(
                "sync(..., device=True) records the device levels' planned actions: the store "
                "needs a plan (TieredStore(tiers, plan=io_plan(schedule)))"
            )
        codes, index, records = clock.codes, clock.index, clock.records
        base = clock.nlv + 1
        tiers, payloads, by_step, counts = sh.tiers, sh.payloads, sh.index, sh.tc
        register, unregister = self.register, self.unregister
        saves = loads = deletes = 0
        c, end = clock.cursor, len(codes)
        # One hold of the engine's lock for the whole catch-up: a row costs
        # a few dictionary operations, not a call of the store's.
        with sh.lock:
            try:
                while c < end and index[c] < action_index:
                    code = codes[c]
                    kind = code & 7
                    rest = (code >> 3) // base  # step * base + level (dst + 1 dropped)
                    level = rest % base
                    if kind == MOVE or not payloads[level]:
                        return  # a host action: skipped by the caller (sync reports it)
                    step = rest // base
                    tier = tiers[level]
                    if kind == SAVE:
                        record = records[c]
                        entry = Entry(
                            step, level, level, next(sh.seq), None, tier.slot_bytes, record
                        )
                        tier.keep(entry.key, None, record)
                        entry.state = STORED
                        register(entry)
                        sh.count_put(entry)
                        saves += 1
                    elif kind == LOAD:
                        entry = by_step[(step, level)]
                        counters = counts[level]
                        counters.gets += 1
                        counters.bytes_out += entry.nbytes
                        loads += 1
                    else:
                        entry = by_step[(step, level)]
                        tier.delete(entry.key)
                        unregister(entry)
                        sh.count_delete(entry)
                        deletes += 1
                    c += 1
                    clock.cursor, clock.now = c, index[c - 1]
            finally:
                sh.n["saves"] += saves
                sh.n["loads"] += loads
                sh.n["deletes"] += deletes

    def delete(self, entry: Entry) -> None:
        """API lock held, the plan followed: end the device record `entry`
        (a ``Delete``)."""
        self.remove(entry, "deletes")

    def remove(self, entry: Entry, counter: str = "") -> None:
        """API lock held: `entry` leaves its device level (a ``Delete``, or a
        ``Move`` away once the host copy is captured; `counter`: the store's
        counter of the call, if any); its payload is dropped."""
        sh = self.shared
        sh.tiers[entry.tier].delete(entry.key)
        with sh.lock:
            self.unregister(entry)
            sh.count_delete(entry)
            if counter:
                sh.n[counter] += 1
