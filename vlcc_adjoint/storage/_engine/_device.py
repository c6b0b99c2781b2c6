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
from ._common import LOAD, SAVE, STORED, Entry

__all__ = ["DevicePath"]


class DevicePath:
    """Saves, loads and deletes of the records of device levels.

    **Arguments:** the engine's :class:`~._common.Shared`,
    :class:`~._clock.PlanClock` and :class:`~._cache.ReadCache`, and the
    store's ``register(entry)`` and ``unregister(entry)`` (its index of
    records and the plan's record numbers).
    """

    def __init__(
        self,
        shared,
        clock,
        cache,
        register: Callable[[Entry], None],
        unregister: Callable[[Entry], None],
    ):
        self.shared = shared
        self.clock = clock
        self.cache = cache
        self.register = register
        self.unregister = unregister

    def save(self, step: int, payload: Any, level: int) -> None:
        """API lock held, step and level validated and not stored: keep
        `payload` as ``u_step`` on the device `level` (a ``Save``)."""
        clock = self.clock
        mark = clock.mark()
        record = clock.follow(SAVE, step, level)
        try:
            self.add(step, level, payload, record)
        except BaseException:
            clock.rewind(mark)
            raise
        with self.shared.lock:
            self.shared.n["saves"] += 1

    def add(self, step: int, level: int, payload: Any, record: int) -> Entry:
        """API lock held, the plan followed: a new record of ``u_step`` on the
        device `level`, holding `payload` (the plan's record `record`).
        Raises what the tier's ``keep`` raises (all slots taken), with
        nothing changed."""
        sh = self.shared
        tier = sh.tiers[level]
        entry = Entry(step, level, level, next(sh.seq), None, tier.slot_bytes, record)
        tier.keep(entry.key, payload, record)
        entry.state = STORED
        with sh.lock:
            self.register(entry)
            sh.count_put(entry)
            self.cache.pump()
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
            self.cache.pump()
        return payload

    def delete(self, entry: Entry) -> None:
        """API lock held, the plan followed: end the device record `entry`
        (a ``Delete``)."""
        self.remove(entry)
        with self.shared.lock:
            self.shared.n["deletes"] += 1

    def remove(self, entry: Entry) -> None:
        """API lock held: `entry` leaves its device level (a ``Delete``, or a
        ``Move`` away once the host copy is captured); its payload is
        dropped."""
        sh = self.shared
        sh.tiers[entry.tier].delete(entry.key)
        with sh.lock:
            self.unregister(entry)
            sh.count_delete(entry)
            self.cache.pump()
