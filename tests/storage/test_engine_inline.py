"""The memory levels' short path (storage/_engine/_inline.py): a save, load
or delete of a state whose structure the store has seen.  It must leave
the store exactly as the general path does, keep every check, and hand
anything unusual to the general path."""

import collections
import dataclasses

import numpy as np
import pytest
import xxhash

from vlcc_adjoint.schedules import Revolve, io_plan
from vlcc_adjoint.state import Layout, flatten, unflatten
from vlcc_adjoint.storage import CorruptCheckpointError, MemoryTier, StorageError, TieredStore
from vlcc_adjoint.storage._engine import _inline
from vlcc_adjoint.storage._pool import SMALL_BYTES, BufferPool


@dataclasses.dataclass
class Wave:
    prev: np.ndarray
    curr: np.ndarray


Pair = collections.namedtuple("Pair", "a b")


def states(i):
    """States of every structure a layout models, each a function of i."""
    x = np.linspace(0.0, 1.0, 8) + i
    return [
        x,
        {"u": x, "v": (x * 2).astype(np.float32)},
        [x, {"w": np.arange(3) + i}],
        (x, x[:4].copy()),
        Wave(x, -x),
        Pair(x, np.full((2, 3), i, np.int16)),
    ]


def same(a, b):
    if isinstance(a, np.ndarray):
        return (
            type(b) is np.ndarray
            and a.dtype == b.dtype
            and a.shape == b.shape
            and np.array_equal(a, b)
        )
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(
            same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
        )
    return a == b


class Counting:
    """Counts how often the short path took a save."""

    def __init__(self, monkeypatch):
        self.taken = 0
        real = _inline.InlinePath.save

        def save(path, step, state, level):
            done = real(path, step, state, level)
            self.taken += done
            return done

        monkeypatch.setattr(_inline.InlinePath, "save", save)


class General(MemoryTier):
    """A memory tier read through ``get``: the engine's general path."""

    serves_put_arrays = False


def test_layout_build_rebuilds_what_unflatten_rebuilds():
    for s in states(3):
        leaves, spec = flatten(s)
        layout = Layout.of(s, leaves, spec)
        copies = [leaf.copy() for leaf in leaves]
        assert same(layout.build(copies), unflatten(spec, copies))
        assert same(layout.build(copies), s)


def test_layout_build_refuses_leaves_that_do_not_fit_the_spec():
    s = {"u": np.zeros(4), "v": np.zeros((2, 2), np.float32)}
    layout = Layout.of(s)
    with pytest.raises(ValueError, match=r"leaf 1 is <f8\[2, 2\], the spec says <f4\[2, 2\]"):
        layout.build([np.zeros(4), np.zeros((2, 2))])
    with pytest.raises(ValueError, match=r"leaf 0 is <f8\[5\]"):
        layout.build([np.zeros(5), np.zeros((2, 2), np.float32)])
    with pytest.raises(ValueError, match="the spec has 2 leaves, got 1"):
        layout.build([np.zeros(4)])


@pytest.mark.parametrize("k", range(6))
def test_the_short_path_leaves_the_store_as_the_general_path_does(k, monkeypatch):
    counting = Counting(monkeypatch)
    fast_tier, slow_tier = MemoryTier(), General()
    with TieredStore([fast_tier], workers=0) as fast, TieredStore([slow_tier], workers=0) as slow:
        for i in range(6):
            for store in (fast, slow):
                store.save(i, states(i)[k], 0)
        assert counting.taken == 5  # the first save learns the structure; General: never
        for i in range(6):
            got = fast.load(i, 0)
            assert same(got, states(i)[k]) and same(got, slow.load(i, 0))
        # The same records in both tiers: spec, leaf bytes, checksums.
        for i in range(6):
            a = fast_tier.get(next(key for key in fast_tier.keys() if key.startswith(f"u{i}-")))
            b = slow_tier.get(next(key for key in slow_tier.keys() if key.startswith(f"u{i}-")))
            assert a.spec == b.spec and a.checksums == b.checksums
            assert all(
                np.array_equal(x, y) and x.dtype == y.dtype for x, y in zip(a.leaves, b.leaves)
            )
            assert a.checksums == tuple(xxhash.xxh3_64_hexdigest(x) for x in a.leaves)
        for i in range(6):
            fast.delete(i, 0)
            slow.delete(i, 0)
        f, s = fast.stats(), slow.stats()
        for name in (
            "saves",
            "loads",
            "deletes",
            "captured_bytes",
            "referenced_bytes",
            "pool_allocated",
            "pool_reused",
        ):
            assert getattr(f, name) == getattr(s, name), name
        for name in ("bytes_in", "puts", "deletes", "records", "raw_bytes", "used_bytes"):
            assert getattr(f.tiers[0], name) == getattr(s.tiers[0], name), name
        assert f.tiers[0].used_bytes == 0 and f.pool_reused == 0  # freed only at the end


@pytest.mark.parametrize("size", [16, SMALL_BYTES // 8])
def test_the_short_path_reuses_pooled_buffers_and_hands_out_the_callers_own_arrays(size):
    x = np.arange(float(size))
    with TieredStore([MemoryTier()], workers=0) as store:
        for i in range(10):
            store.save(i, {"x": x}, 0)
            got = store.load(i, 0)
            got["x"] += 1  # the caller's own: the record does not change
            assert np.array_equal(store.load(i, 0)["x"], x)
            store.delete(i, 0)
        stats = store.stats()
    if x.nbytes >= SMALL_BYTES:
        assert stats.pool_reused >= 8 and stats.pool_allocated <= 2
    else:  # below the pool's min_bytes: new arrays, neither pooled nor counted
        assert stats.pool_reused == 0 and stats.pool_allocated == 0


def test_the_pool_neither_keeps_nor_counts_buffers_below_its_min_bytes():
    pool = BufferPool(1 << 20, min_bytes=SMALL_BYTES)
    small, large = pool.take(np.float64, (8,)), pool.take(np.float64, (SMALL_BYTES // 8,))
    assert pool.allocated == 1  # the large one
    assert pool.recycle([small, large]) == 1 and pool.recycled == 1 and pool.refused == 0
    assert pool.take(np.float64, (8,)) is not small  # dropped, not kept
    assert pool.take(np.float64, (SMALL_BYTES // 8,)) is large and pool.reused == 1
    # A pool without min_bytes (the default) keeps small buffers too.
    plain = BufferPool(1 << 20)
    buf = plain.take(np.float64, (8,))
    assert plain.recycle([buf]) == 1 and plain.take(np.float64, (8,)) is buf


def test_a_short_path_record_changed_behind_the_stores_back_is_refused_naming_the_step():
    tier = MemoryTier()
    with TieredStore([tier], workers=0) as store:
        for i in range(3):
            store.save(i, np.full(8, float(i)), 0)
        key = next(k for k in tier.keys() if k.startswith("u2-"))
        tier.get(key).leaves[0].base[3] += 1e-9
        with pytest.raises(CorruptCheckpointError, match="step 2 on level 0") as info:
            store.load(2, 0)
        assert info.value.step == 2
        assert np.array_equal(store.load(1, 0), np.full(8, 1.0))


def test_a_record_missing_from_its_tier_is_reported_not_returned():
    tier = MemoryTier()
    with TieredStore([tier], workers=0) as store:
        store.save(0, np.zeros(8), 0)
        store.save(1, np.ones(8), 0)
        tier.delete(next(k for k in tier.keys() if k.startswith("u1-")))
        with pytest.raises(StorageError, match="removed behind the store's back"):
            store.load(1, 0)


def test_a_failing_put_on_the_short_path_raises_in_save_and_the_record_is_lost(monkeypatch):
    counting = Counting(monkeypatch)

    class Fragile(MemoryTier):
        def adopt(self, key, record):
            if key.startswith("u3-"):
                raise OSError("No space left on device")
            super().adopt(key, record)

    with TieredStore([Fragile()], workers=0) as store:
        store.save(1, np.ones(8), 0)
        store.save(2, np.full(8, 2.0), 0)
        with pytest.raises(StorageError, match=r"saving step 3 to level 0.*No space"):
            store.save(3, np.full(8, 3.0), 0)
        with pytest.raises(StorageError, match="step 3 on level 0 is lost"):
            store.load(3, 0)
        assert np.array_equal(store.load(2, 0), np.full(8, 2.0))
        assert store.stats().saves == 3
    assert counting.taken >= 1


def test_a_tier_that_refuses_a_put_the_check_admitted_spills_on_the_short_path(monkeypatch):
    counting = Counting(monkeypatch)

    class Optimist(MemoryTier):
        @property
        def used_bytes(self):  # reports room it does not have: the put refuses
            return 0

    first, second = Optimist(capacity_bytes=2 * 64), MemoryTier()
    with TieredStore([first, second], workers=0, policy="spill") as store:
        for i in range(4):
            store.save(i, np.full(8, float(i)), 0)
        assert store.steps(1) == [] and store.stats().spills == 2
        assert len(list(second.keys())) == 2
        for i in range(4):
            assert np.array_equal(store.load(i, 0), np.full(8, float(i)))
            store.delete(i, 0)
        assert first._used == 0 and second.used_bytes == 0
    assert counting.taken >= 2


def test_a_save_that_needs_room_first_takes_the_general_path_and_raises(monkeypatch):
    counting = Counting(monkeypatch)
    with TieredStore([MemoryTier(capacity_bytes=2 * 64)], workers=0) as store:
        store.save(0, np.zeros(8), 0)
        store.save(1, np.zeros(8), 0)
        taken = counting.taken
        with pytest.raises(StorageError, match=r"step 2 \(64 B\) does not fit on level 0"):
            store.save(2, np.zeros(8), 0)
        assert counting.taken == taken
        store.delete(0, 0)
        store.save(2, np.zeros(8), 0)
        assert counting.taken == taken + 1


def test_read_only_leaves_take_the_general_path():
    frozen = np.frombuffer(np.arange(8.0).tobytes(), np.float64)  # immutable: by reference
    with TieredStore([MemoryTier()], workers=0) as store:
        store.save(0, np.arange(8.0), 0)  # learns the structure
        store.save(1, frozen, 0)
        assert store.stats().referenced_bytes == 64
        assert np.array_equal(store.load(1, 0), np.arange(8.0))


def test_the_plan_is_followed_on_the_short_path():
    from vlcc_adjoint.storage import PlanMismatchError

    schedule = Revolve(6, 2)
    with TieredStore([MemoryTier()], plan=io_plan(schedule)) as store:
        store.save(0, np.zeros(8), 0)
        with pytest.raises(PlanMismatchError, match="does not follow the plan"):
            store.save(4, np.zeros(8), 0)
        assert store.steps(0) == [0]


def test_the_plan_clock_checks_a_call_by_the_code_action_code_gives_it():
    # follow computes a Save/Load/Delete's code as step * per_step +
    # offsets[kind][level], which must be action_code's own value.
    from vlcc_adjoint.storage import PlanMismatchError
    from vlcc_adjoint.storage._engine._clock import PlanClock, action_code

    schedule = Revolve(30, 3)
    clock = PlanClock(io_plan(schedule), 2, None)
    for kind in range(8):
        for level in range(2):
            for step in (0, 1, 7, 29, 10**6):
                want = action_code(kind, step, level, -1, 2)
                assert step * clock.per_step + clock.offsets[kind][level] == want
    # and a call off the plan is refused, naming the action it expected
    with TieredStore([MemoryTier()], plan=io_plan(schedule), workers=0) as store:
        first = schedule[0]
        with pytest.raises(PlanMismatchError, match="expected action"):
            store.save(first.step + 1, np.zeros(8), 0)


def test_load_and_delete_of_a_stored_step_still_validate_what_the_index_does_not_tell():
    # load and delete look a record up before validating: a hit is a step
    # and level validated by the record's save; anything else is validated.
    from vlcc_adjoint.errors import VlccValueError

    with TieredStore([MemoryTier(), MemoryTier()], workers=0) as store:
        store.save(1, np.zeros(8), 0)
        store.save(0, np.ones(8), 1)
        for bad in (True, -1, 1.0, "1"):  # (True == 1 and hash(True) == hash(1))
            with pytest.raises(VlccValueError, match="step must be an int"):
                store.load(bad, 0)
            with pytest.raises(VlccValueError, match="step must be an int"):
                store.delete(bad, 0)
        with pytest.raises(VlccValueError, match="level must be an int"):
            store.load(0, True)  # level True would find step 0 on level 1
        with pytest.raises(VlccValueError, match="level must be an int"):
            store.delete(0, True)
        assert np.array_equal(store.load(np.int64(1), np.int64(0)), np.zeros(8))
        store.delete(np.int64(1), np.int64(0))
        store.delete(0, 1)
        assert store.stats().deletes == 2
