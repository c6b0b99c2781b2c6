"""DeviceTier: level 0 of an accelerator integration inside a planned TieredStore.

The contract (``vlcc_adjoint/storage/_device.py``) tested with plain numpy
payloads: a ``Save``/``Load`` of level 0 keeps and returns the caller's
payload as is, a ``Move`` off the device captures the data the caller
supplies, a ``Move`` onto it returns what the store read (read ahead by the
plan from a slow level), and the plan check sees every action of the
schedule in table order.  Referee: :func:`table_trace`'s replay of the
table (which state each ``Reverse`` must see).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.schedules.tables import level0_moves
from vlcc_adjoint.errors import VlccError
from vlcc_adjoint.schedules import (
    ADVANCE,
    DELETE,
    LOAD,
    REVERSE,
    SAVE,
    Level,
    Machine,
    Multistage,
    Periodic,
    Schedule,
    SlotMap,
    assign_slots,
    io_plan,
    simulate,
)
from vlcc_adjoint.storage import (
    DeviceTier,
    MemoryTier,
    PlanMismatchError,
    StorageError,
    TieredStore,
    TierFullError,
    ZarrTier,
)


def _state(i: int) -> np.ndarray:
    return np.arange(4.0) + 10.0 * i


class Device:
    """A numpy stand-in for an accelerator integration, run by the action
    machine: the state in hand is an array; a level-0 record's payload is
    ``("on device", copy)``, kept by the store's DeviceTier; ``Advance`` and
    ``Reverse`` are handed back (the device's own work)."""

    def __init__(self, store: TieredStore):
        self.store = store
        self.u: np.ndarray | None = _state(0)
        self.seen: list[int] = []  # the step of the state in hand at each Reverse

    def save(self, i, level):
        assert self.u is not None
        if level == 0:
            self.store.save(i, ("on device", self.u.copy()), 0)
        else:
            self.store.save(i, self.u, level)

    def load(self, i, level):
        got = self.store.load(i, level)
        self.u = (got[1] if level == 0 else got).copy()

    def delete(self, i, level):
        self.store.delete(i, level)

    def move(self, i, src, dst):
        if src == 0:
            self.store.move(i, 0, dst, fetch=lambda payload: payload[1])
        elif dst == 0:
            self.store.move(i, src, 0, place=lambda host: ("on device", host.copy()))
        else:
            self.store.move(i, src, dst)

    def run(self, schedule: Schedule) -> None:
        for kind, a, b, _, _ in Machine(schedule, self, returns=(ADVANCE, REVERSE)):
            if kind == ADVANCE:
                assert self.u is not None
                self.u = _state(b) if np.array_equal(self.u, _state(a)) else None
            else:
                assert self.u is not None
                self.seen.append(int(self.u[0] // 10))
                self.u = None


def _planned(schedule: Schedule, *host_tiers, **options) -> TieredStore:
    plan = io_plan(schedule)
    device = DeviceTier(assign_slots(plan, 0), slot_bytes=_state(0).nbytes)
    return TieredStore([device, *host_tiers], plan=plan, **options)


@pytest.mark.parametrize("threadsafe", [True, False])
def test_a_whole_schedule_runs_through_a_planned_store_with_a_device_level(threadsafe):
    schedule = level0_moves()
    with _planned(schedule, MemoryTier(), threadsafe=threadsafe) as store:
        device = Device(store)
        device.run(schedule)
        assert device.seen == [2, 1, 0]  # each adjoint step had its own state
        assert store.steps(0) == [] and store.steps(1) == []
        store.sync(len(schedule))  # no I/O action of the plan was skipped
        stats = store.stats()
    assert stats.tiers[0].puts == simulate(schedule).writes[0]
    assert stats.tiers[0].bytes_in == simulate(schedule).writes[0] * _state(0).nbytes


def test_payloads_are_kept_and_returned_as_given():
    schedule = level0_moves()
    with _planned(schedule, MemoryTier()) as store:
        payload = ["anything", object()]
        store.save(0, payload, 0)
        assert store.steps(0) == [0]
        assert store.tiers[0].slot(next(iter(store.tiers[0].keys()))) == 0
        store.save(1, None, 0)  # nothing at all, as JAX keeps level 0
        # Move(0, 0, 1): the data comes from the caller; the device record ends.
        data = _state(0)
        store.move(0, 0, 1, state=data)
        data[:] = -1.0  # the caller's array is theirs again: the record is a copy
        assert store.steps(0) == [1] and store.steps(1) == [0]
        store.save(2, payload, 0)
        store.move(2, 0, 1, fetch=lambda p: _state(2) if p is payload else None)
        # Move(2, 1, 0): the store reads, returns what it read, `place` makes the payload.
        got = store.move(2, 1, 0, place=lambda host: ("placed", host))
        np.testing.assert_array_equal(got, _state(2))
        store.delete(2, 0)
        assert store.load(1, 0) is None
        store.delete(1, 0)
        np.testing.assert_array_equal(store.move(0, 1, 0), _state(0))
        assert store.load(0, 0) is None  # no `place`: the device payload is None
        store.delete(0, 0)


def test_the_plan_check_sees_the_device_level():
    schedule = level0_moves()
    with _planned(schedule, MemoryTier()) as store:
        store.save(0, None, 0)
        with pytest.raises(PlanMismatchError, match=r"expected action 2, Save\(step=1, level=0\)"):
            store.save(5, None, 0)
        with pytest.raises(PlanMismatchError, match="Save"):
            store.load(0, 0)
        assert store.steps(0) == [0]  # the refused calls changed nothing
        store.save(1, None, 0)


def test_restores_to_the_device_are_read_ahead_by_the_plan(tmp_path):
    """Device -> disk -> device: Periodic keeps its checkpoints on a ZarrTier
    and reverses each interval from device slots; every Move onto the
    device (here: a Load of level 1 in the stand-in) is served by the
    read-ahead the plan started, none read in the call."""
    schedule = Periodic(40, 8, level=1, buffer_level=0)
    with _planned(schedule, ZarrTier(tmp_path / "disk", mode="w"), workers=2) as store:
        device = Device(store)
        device.run(schedule)
        assert device.seen == list(range(39, -1, -1))
        stats = store.stats()
    reads = simulate(schedule).reads[1]
    assert reads > 0
    assert stats.prefetch_hits + stats.staged_hits == reads
    assert stats.prefetch_misses == 0


def test_a_multilevel_schedule_runs_with_level_zero_in_the_store(tmp_path):
    schedule = Multistage(30, [Level(2, 0.0, 0.0), Level(2, 0.2, 0.2), Level(30, 2.0, 2.0)])
    assert simulate(schedule).writes[2] > 0
    with _planned(schedule, MemoryTier(), ZarrTier(tmp_path / "disk", mode="w")) as store:
        device = Device(store)
        device.run(schedule)
        assert device.seen == list(range(29, -1, -1))


def test_slots_are_counted_and_a_foreign_slot_map_is_refused():
    tier = DeviceTier(2)
    with TieredStore([tier, MemoryTier()]) as store:
        store.save(0, None, 0)
        store.save(1, None, 0)
        with pytest.raises(TierFullError, match="all 2 slots"):
            store.save(2, None, 0)
        assert store.steps(0) == [0, 1]
        store.delete(0, 0)
        store.save(2, None, 0)
    # A slot map that disagrees with the store's plan: every record in slot
    # 0 (the second live record finds it taken), or too few records.
    schedule = Periodic(6, 2)
    plan = io_plan(schedule)
    good = assign_slots(plan, 0)
    first, second = (int(s) for s in plan.records["step"][:2])  # two Saves on level 0
    clash = SlotMap(0, 2, np.zeros_like(good.record_slot), good.action_slot)
    with TieredStore([DeviceTier(clash)], plan=plan) as store:
        store.save(first, None, 0)
        with pytest.raises(TierFullError, match="needs slot 0"):
            store.save(second, None, 0)
        assert store.steps(0) == [first]
    short = SlotMap(0, good.slots, good.record_slot[:1], good.action_slot)
    with TieredStore([DeviceTier(short)], plan=plan) as store:
        store.save(first, None, 0)
        with pytest.raises(StorageError, match="not a record of the plan"):
            store.save(second, None, 0)


def test_misuse_is_refused_naming_the_fix():
    with pytest.raises(VlccError, match="can only be level 0"):
        TieredStore([MemoryTier(), DeviceTier()])
    with pytest.raises(VlccError, match="prefetch_levels include level 0"):
        TieredStore([DeviceTier(), MemoryTier()], prefetch_levels=[0, 1])
    with pytest.raises(VlccError, match="int or a SlotMap"):
        DeviceTier("three")
    with pytest.raises(VlccError, match="holds level 0"):
        DeviceTier(assign_slots(io_plan(Periodic(6, 2, level=1, buffer_level=0)), 1))
    with TieredStore([DeviceTier(), MemoryTier()]) as store:
        store.save(0, ("payload",), 0)
        store.save(1, _state(1), 1)
        with pytest.raises(VlccError, match="state= or as fetch="):
            store.move(0, 0, 1)
        with pytest.raises(VlccError, match="reads a host level's records itself"):
            store.move(1, 1, 0, state=_state(1))
        with pytest.raises(VlccError, match="cannot be restored into out="):
            store.load(0, 0, out=_state(0))
        with pytest.raises(VlccError, match="no store memory to lend"):
            store.lend(0, 0)
        with pytest.raises(StorageError, match="device payloads"):
            store.tiers[0].put("k", None)
        with pytest.raises(StorageError, match="no host bytes"):
            store.tiers[0].get("k")
    with TieredStore([DeviceTier(), MemoryTier(), MemoryTier()]) as store:
        store.save(1, _state(1), 1)
        with pytest.raises(VlccError, match="is a host level"):
            store.move(1, 1, 2, place=lambda x: x)


def test_restart_runs_the_plan_again_after_a_run_or_an_abandoned_one(tmp_path):
    schedule = Periodic(12, 4, level=1, buffer_level=0)
    with _planned(schedule, ZarrTier(tmp_path / "disk", mode="w")) as store:
        Device(store).run(schedule)
        with pytest.raises(PlanMismatchError, match="past the end of the plan"):
            store.save(0, _state(0), 1)
        store.restart()  # a whole run again
        device = Device(store)
        device.run(schedule)
        assert device.seen == list(range(11, -1, -1))
        # Half a run (the forward sweep alone) leaves records behind ...
        store.restart()
        rows = Machine(schedule, Device(store), returns=(ADVANCE, REVERSE))
        for kind, *_ in rows:
            if kind == REVERSE:
                break
        assert store.steps(0) or store.steps(1)
        # ... which the next restart deletes, off the plan.
        store.restart()
        assert store.steps(0) == [] and store.steps(1) == []
        device = Device(store)
        device.run(schedule)
        assert device.seen == list(range(11, -1, -1))


def test_sync_with_device_records_the_device_levels_own_actions():
    """An integration whose device runs level 0 itself (a compiled
    program) reports progress instead of each action: sync(r, device=True)
    records the level-0 actions before r, as their calls would."""
    schedule = Periodic(12, 4, level=1, buffer_level=0)
    table = schedule.table
    host_rows = [r for r in range(len(table)) if table[r]["level"] == 1]
    with _planned(schedule, MemoryTier()) as store:
        first = host_rows[0]  # Save(0, 1), after nothing on level 0
        store.sync(first, device=True)
        store.save(0, _state(0), 1)
        # Jump to the first Load of level 1: the level-0 rows before it (the
        # forward sweep's saves of the last interval) are recorded ...
        load = next(r for r in host_rows if table[r]["kind"] == LOAD)
        skipped = [r for r in host_rows if first < r < load]
        assert skipped  # ... but host Saves lie in between: refused, naming one
        with pytest.raises(PlanMismatchError, match="was not performed"):
            store.sync(load, device=True)
        for r in skipped:
            store.sync(r, device=True)
            store.save(int(table[r]["a"]), _state(int(table[r]["a"])), 1)
        store.sync(load, device=True)
        saved = [int(r["a"]) for r in table[:load] if r["kind"] == SAVE and r["level"] == 0]
        deleted = [int(r["a"]) for r in table[:load] if r["kind"] == DELETE and r["level"] == 0]
        assert store.steps(0) == sorted(set(saved) - set(deleted))
        assert store.stats().tiers[0].puts == len(saved)
        # The rest of the run, device rows recorded at each host row.
        for r in host_rows[host_rows.index(load) :]:
            store.sync(r, device=True)
            row = table[r]
            if row["kind"] == LOAD:
                store.load(int(row["a"]), 1)
            else:
                store.delete(int(row["a"]), 1)
        store.sync(len(table), device=True)
        assert store.steps(0) == store.steps(1) == []
    with TieredStore([DeviceTier(), MemoryTier()]) as store:
        with pytest.raises(VlccError, match="needs a plan"):
            store.sync(3, device=True)
