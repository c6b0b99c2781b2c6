"""TieredStore: schedules run through the asynchronous engine, every load checked."""

import dataclasses
import os
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vlcc_adjoint.schedules import (
    Advance,
    Delete,
    Level,
    Load,
    Move,
    Multistage,
    Periodic,
    Reverse,
    Revolve,
    Save,
    Schedule,
    StoreAll,
    actions_to_table,
    io_plan,
)
from vlcc_adjoint.storage import (
    CompressedMemoryTier,
    CorruptCheckpointError,
    MemoryTier,
    PlanMismatchError,
    StorageError,
    StoreStats,
    Tier,
    TieredStore,
    ZarrTier,
)

SHAPE = (24, 16)
NBYTES = 2 * 24 * 16 * 8 + 64 * 8  # bytes of a state, at most (two fields, a model)


@dataclasses.dataclass
class Fields:
    u: np.ndarray
    v: np.ndarray
    t: float


MODEL = np.linspace(1.0, 2.0, 64)  # a leaf that never changes (dedup)


def state(i, kind="dict"):
    """u_i: a deterministic function of i (two arrays and a float)."""
    u = np.full(SHAPE, float(i)) + np.arange(SHAPE[1]) * 1e-3
    v = -u[::-1].copy()
    if kind == "dict":
        return {"u": u, "aux": [v, i * 0.5]}
    if kind == "static":
        return {"u": u, "aux": [v, i * 0.5], "model": MODEL}
    if kind == "dataclass":
        return Fields(u, v, i * 0.5)
    return np.stack([u, v])  # a bare array


def same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(
            same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
        )
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


def check_budgets(store, tiers, prefetch_bytes):
    for tier in tiers:
        if tier.capacity_bytes is not None:
            assert tier.used_bytes <= tier.capacity_bytes
    s = store.stats()
    assert s.cache_bytes <= prefetch_bytes and s.peak_cache_bytes <= prefetch_bytes


def run(store, schedule, kind="dict", tiers=(), prefetch_bytes=0, out=False, mutate=True):
    """Walk the schedule's table, performing each I/O action on the store and
    checking every load against u_i; budgets checked after every action."""
    current = state(0, kind)
    for action in schedule:
        name = type(action).__name__
        if name == "Advance":
            current = state(action.stop, kind)
        elif name == "Save":
            store.save(action.step, current, action.level)
            if mutate and kind != "dataclass":
                # The caller keeps advancing in place: the record must not change.
                leaf = current["u"] if kind in ("dict", "static") else current
                leaf += 1000.0
                current = state(action.step, kind)
        elif name == "Load":
            target = state(10**6, kind) if out else None
            got = store.load(action.step, action.level, out=target)
            assert same(got, state(action.step, kind)), f"load of u_{action.step} is wrong"
            if out:
                dict_like = kind in ("dict", "static")
                leaf = got["u"] if dict_like else (got.u if kind == "dataclass" else got)
                want = target["u"] if dict_like else (target.u if kind == "dataclass" else target)
                assert leaf is want  # restored in place
            if mutate and kind != "dataclass":
                (got["u"] if kind in ("dict", "static") else got)[...] = -1.0
            current = state(action.step, kind)
        elif name == "Delete":
            store.delete(action.step, action.level)
        elif name == "Move":
            store.move(action.step, action.src, action.dst)
        check_budgets(store, tiers, prefetch_bytes)
    store.wait()
    check_budgets(store, tiers, prefetch_bytes)


def with_moves(schedule):
    """The schedule with level-1 traffic routed through Moves: ``Save(i, 1)``
    becomes ``Save(i, 0); Move(i, 0, 1)``, and a record's last ``Load(i, 1)``
    becomes ``Move(i, 1, 0); Load(i, 0)`` (its Delete then on level 0)."""
    plan = io_plan(schedule)
    actions = list(schedule)

    def touches_level0(a, step):
        return getattr(a, "step", None) == step and 0 in (
            getattr(a, "level", None),
            getattr(a, "src", None),
            getattr(a, "dst", None),
        )

    last = {
        int(r["last_read"])
        for r in plan.records
        if r["level"] == 1
        and r["reads"] > 0
        and not any(
            touches_level0(a, int(r["step"]))
            for a in actions[int(r["last_read"]) + 1 : int(r["end"])]
        )
    }
    moved = set()
    on0 = set()  # steps on level 0 (a Move needs the destination free)
    out = []
    for i, action in enumerate(schedule):
        if isinstance(action, Save) and action.level == 1 and action.step not in on0:
            out += [Save(action.step, 0), Move(action.step, 0, 1)]
        elif (
            isinstance(action, Load) and action.level == 1 and i in last and action.step not in on0
        ):
            out += [Move(action.step, 1, 0), Load(action.step, 0)]
            moved.add(action.step)
            on0.add(action.step)
        elif isinstance(action, Delete) and action.level == 1 and action.step in moved:
            out.append(Delete(action.step, 0))
            moved.discard(action.step)
            on0.discard(action.step)
        else:
            if isinstance(action, Save) and action.level == 0:
                on0.add(action.step)
            elif isinstance(action, Delete) and action.level == 0:
                on0.discard(action.step)
            out.append(action)
    return Schedule(actions_to_table(out), schedule.n_steps, [Level(None), Level(None)])


def schedules(n, slots):
    return {
        "revolve": Revolve(n, slots),
        "multistage": Multistage(n, [Level(slots), Level(3, 1, 1)]),
        "multistage-disk": Multistage(n, [Level(1), Level(slots + 1, 0.5, 0.5)]),
        "periodic": Periodic(n, slots + 1, level=1, buffer_level=0),
        "storeall": StoreAll(n, level=1),
    }


class SlowTier(Tier):
    """A memory tier with latency, failures and a bug switch, for tests."""

    def __init__(self, latency=0.0, fail_put=(), block=0.0, capacity_bytes=None):
        self.inner = MemoryTier(capacity_bytes)
        self.capacity_bytes = capacity_bytes
        self.name = "slow"
        self.latency = latency
        self.fail_put = set(fail_put)
        self.block = block
        self.gets = 0
        self.get_threads = []  # the thread of each get, in order

    @property
    def used_bytes(self):
        return self.inner.used_bytes

    def put(self, key, record):
        time.sleep(self.latency + self.block)
        if record.spec["step"] in self.fail_put:
            raise OSError(28, "No space left on device")
        self.inner.put(key, record)

    def get(self, key):
        time.sleep(self.latency)
        self.gets += 1
        self.get_threads.append(threading.get_ident())
        return self.inner.get(key)

    def delete(self, key):
        self.inner.delete(key)

    def keys(self):
        return self.inner.keys()


# -- schedules through the store ---------------------------------------------------


@pytest.mark.parametrize(
    "name", ["revolve", "multistage", "multistage-disk", "periodic", "storeall"]
)
@pytest.mark.parametrize("kind", ["dict", "dataclass", "array"])
def test_every_load_returns_the_saved_state_for_each_schedule(name, kind, tmp_path):
    schedule = schedules(23, 3)[name]
    peak = schedule.stats().peak_slots
    nbytes = NBYTES
    tiers = [MemoryTier(capacity_bytes=max(peak[0], 1) * nbytes)]
    if len(peak) > 1:
        tiers.append(ZarrTier(tmp_path / "disk", capacity_bytes=max(peak[1], 1) * nbytes * 2))
    prefetch = 2 * nbytes
    with TieredStore(
        tiers, plan=io_plan(schedule), prefetch_bytes=prefetch, staging_bytes=2 * nbytes
    ) as store:
        run(store, schedule, kind, tiers, prefetch, out=(kind != "array"))
        stats = store.stats()
    assert stats.loads == sum(isinstance(a, Load) for a in schedule)
    assert all(t.records == 0 for t in stats.tiers)  # every schedule deletes what it saved


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 40),
    slots=st.integers(1, 5),
    name=st.sampled_from(["revolve", "multistage", "multistage-disk", "periodic", "storeall"]),
    budget=st.integers(0, 4),
    workers=st.sampled_from([0, 1, 2, "single-threaded"]),
    staging=st.integers(1, 3),
    second=st.sampled_from(["memory", "compressed", "slow"]),
    moves=st.booleans(),
    out=st.booleans(),
    dedup=st.sampled_from([False, True, "eager"]),
)
def test_random_plans_round_trip_within_every_budget(
    n, slots, name, budget, workers, staging, second, moves, out, dedup
):
    schedule = schedules(n, slots)[name]
    if moves and len(schedule.levels) == 2:
        schedule = with_moves(schedule)
    peak = schedule.stats().peak_slots
    tiers = [MemoryTier(capacity_bytes=max(peak[0], 1) * NBYTES)]
    if len(peak) > 1:
        cap = max(peak[1], 1) * NBYTES
        tiers.append(
            {
                "memory": lambda: MemoryTier(capacity_bytes=cap),
                "compressed": lambda: CompressedMemoryTier(capacity_bytes=cap + 4096),
                "slow": lambda: SlowTier(latency=0.0005, capacity_bytes=cap),
            }[second]()
        )
    prefetch = budget * NBYTES * 3 // 4  # not always a whole number of records
    kind = "static" if dedup else "dict"
    threads = {"workers": workers}
    if workers == "single-threaded":
        threads = {"workers": 0, "threadsafe": False}
    with TieredStore(
        tiers,
        plan=io_plan(schedule),
        prefetch_bytes=prefetch,
        staging_bytes=staging * NBYTES,
        dedup=dedup,
        **threads,
    ) as store:
        run(store, schedule, kind, tiers, prefetch, out=out)
        stats = store.stats()
        if dedup:
            assert len(store._table) == 0  # every shared leaf released with its last record
    assert stats.peak_cache_bytes <= prefetch
    assert stats.peak_staging_bytes <= max(staging * NBYTES, NBYTES)


def test_moves_through_a_disk_tier(tmp_path):
    schedule = with_moves(Multistage(30, [Level(1), Level(4, 0.5, 0.5)]))
    assert any(isinstance(a, Move) for a in schedule)
    tiers = [MemoryTier(), ZarrTier(tmp_path / "z")]
    with TieredStore(tiers, plan=io_plan(schedule), prefetch_bytes=3 * NBYTES) as store:
        run(store, schedule, "dict", tiers, 3 * NBYTES)
        assert store.stats().moves == sum(isinstance(a, Move) for a in schedule)


def test_prefetch_reads_every_restore_ahead_by_the_plan():
    # What the plan decides is counted, not timed: how much read time the
    # read-ahead hides depends on the machine's load (the store benchmarks
    # measure it). The forward's writes finish before the backward starts,
    # so no restore is served from a capture still being written.
    n = 24
    schedule = StoreAll(n, level=1)
    results = {}
    for budget in (0, 4 * NBYTES):
        slow = SlowTier(latency=0.002)
        with TieredStore(
            [MemoryTier(), slow], plan=io_plan(schedule), prefetch_bytes=budget
        ) as store:
            current = state(0)
            for action in schedule:
                if isinstance(action, Save):
                    store.save(action.step, current, 1)
                elif isinstance(action, Load):
                    assert same(store.load(action.step, 1), state(action.step))
                elif isinstance(action, Delete):
                    store.delete(action.step, 1)
                elif isinstance(action, Reverse) and action.step == n - 1:
                    store.wait()
                elif isinstance(action, Advance):
                    current = state(action.stop)
            results[budget] = (store.stats(), list(slow.get_threads))
    (off, off_threads), (on, _) = results[0], results[4 * NBYTES]
    loads = n - 1  # StoreAll restores every step but the last from its record
    assert off.prefetch_issued == 0 and off.prefetch_misses == loads and off.prefetch_hits == 0
    assert off_threads == [threading.get_ident()] * loads  # every read in load(), on the caller
    assert on.prefetch_issued > 0 and on.prefetch_hits == loads and on.prefetch_misses == 0
    assert on.staged_hits == 0
    assert on.peak_cache_bytes <= 4 * NBYTES


def test_records_past_their_last_read_leave_the_cache_at_once():
    schedule = StoreAll(12, level=1)
    with TieredStore(
        [MemoryTier(), MemoryTier()], plan=io_plan(schedule), prefetch_bytes=100 * NBYTES
    ) as store:
        current = state(0)
        for action in schedule:
            if isinstance(action, Save):
                store.save(action.step, current, 1)
            elif isinstance(action, Load):
                store.load(action.step, 1)
                store.wait()
                cached = store.stats().cache_bytes
                # Held: only records still to be read (at most the ones saved before it).
                assert cached <= action.step * NBYTES
            elif isinstance(action, Delete):
                store.delete(action.step, 1)
            elif type(action).__name__ == "Advance":
                current = state(action.stop)
        assert store.stats().cache_bytes == 0


# -- ownership -------------------------------------------------------------------


def test_load_out_restores_in_place_and_returns_out():
    with TieredStore([MemoryTier()]) as store:
        store.save(3, state(3))
        out = state(99)
        out["aux"][1] = 1.5  # the same non-array values: the very same object comes back
        u, v = out["u"], out["aux"][0]
        got = store.load(3, out=out)
        assert got is out and got["u"] is u and got["aux"][0] is v
        assert same(out, state(3))
        # A state whose non-array values differ comes back rebuilt around the same arrays.
        other = {"u": np.zeros(SHAPE), "aux": [np.zeros(SHAPE), 7.0]}
        got = store.load(3, out=other)
        assert got is not other and got["u"] is other["u"] and got["aux"][1] == 1.5
        with pytest.raises(ValueError, match="same shapes"):
            store.load(3, out={"u": np.zeros((2, 2)), "aux": [np.zeros(SHAPE), 0.0]})
        with pytest.raises(ValueError, match="not C-contiguous"):
            store.load(3, out={"u": np.zeros(SHAPE[::-1]).T, "aux": [np.zeros(SHAPE), 0.0]})


def test_mutating_a_loaded_state_or_the_saved_one_never_changes_the_record(tmp_path):
    for tiers in ([MemoryTier()], [MemoryTier(), ZarrTier(tmp_path / "z")]):
        level = len(tiers) - 1
        with TieredStore(tiers, workers=2) as store:
            s = state(5)
            store.save(5, s, level)
            s["u"][...] = 123.0  # right after save returns
            s["aux"][0][...] = 7.0
            store.wait()
            got = store.load(5, level)
            got["u"][...] = -1.0
            got["aux"][0][...] = -2.0
            assert same(store.load(5, level), state(5))


def test_only_leaves_nobody_can_change_are_kept_by_reference():
    # Read-only down to an immutable bytes buffer: numpy refuses to make it
    # writeable again, so the store keeps it by reference.
    model = np.frombuffer(np.linspace(0, 1, 1000).tobytes(), np.float64)
    owner = np.ones(10)
    owner.flags.writeable = False  # read-only, but it owns its data: its owner may flip it back
    base = np.ones(10)
    view = base[:]
    view.flags.writeable = False  # read-only, but its base is not: copied
    with TieredStore([MemoryTier()]) as store:
        store.save(0, {"u": view, "model": model, "owner": owner})
        stats = store.stats()
        assert stats.referenced_bytes == model.nbytes and stats.captured_bytes == 160
        base[:] = 5.0
        owner.flags.writeable = True
        owner[:] = 7.0
        got = store.load(0)
        assert np.array_equal(got["model"], model) and got["model"] is not model
        assert np.array_equal(got["u"], np.ones(10))
        assert np.array_equal(got["owner"], np.ones(10))


def test_jax_arrays_are_kept_by_reference_and_come_back_as_jax_arrays():
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.arange(64.0)
    with TieredStore([MemoryTier()]) as store:
        store.save(0, {"x": x, "n": np.arange(4)})
        assert store.stats().referenced_bytes == x.nbytes
        got = store.load(0)
        assert isinstance(got["x"], type(x)) and np.array_equal(np.asarray(got["x"]), x)
        out = {"x": jnp.zeros(64), "n": np.zeros(4, int)}
        got = store.load(0, out=out)
        assert got["n"] is out["n"] and np.array_equal(np.asarray(got["x"]), x)


def test_reads_of_a_record_still_being_written_are_served_from_the_staged_copy():
    gate = threading.Event()

    class Gated(SlowTier):
        def put(self, key, record):
            gate.wait(20)  # held until the load has returned
            super().put(key, record)

    slow = Gated()
    with TieredStore([MemoryTier(), slow]) as store:
        store.save(1, state(1), 1)
        assert same(store.load(1, 1), state(1))
        assert list(slow.keys()) == []  # the load did not wait for the put
        gate.set()
        assert store.stats().staged_hits == 1 and slow.gets == 0


def test_dedup_stores_an_unchanged_leaf_once():
    model = np.random.default_rng(0).random(4096)
    for mode in (True, "eager"):
        tier = MemoryTier()
        with TieredStore([tier], dedup=mode) as store:
            for i in range(5):
                store.save(i, {"u": np.full(16, float(i)), "model": model.copy()})
            store.wait()
            stats = store.stats()
            assert stats.dedup_hits == 4 and stats.dedup_bytes_saved == 4 * model.nbytes
            assert tier.used_bytes == model.nbytes + 5 * 16 * 8
            for i in range(5):
                got = store.load(i)
                assert np.array_equal(got["model"], model) and got["u"][0] == i
            for i in range(5):
                store.delete(i)
            store.wait()
            assert tier.used_bytes == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_capture_buffers_are_reused(workers, tmp_path):
    with TieredStore([MemoryTier()], workers=workers) as store:
        s = state(0)
        for i in range(20):
            store.save(i, s)
            store.delete(i)
            store.wait()
        stats = store.stats()
    assert stats.pool_reused >= 18 * 2 and stats.pool_allocated <= 4
    # A disk tier copies on put: the capture buffer is free once the put is done.
    with TieredStore([ZarrTier(tmp_path / "z")], workers=workers) as store:
        for i in range(10):
            store.save(i, s)
            store.wait()
        stats = store.stats()
    assert stats.pool_reused >= 8 * 2 and stats.pool_allocated <= 4


def test_reserve_preallocates_capture_buffers():
    with TieredStore([MemoryTier()], workers=0) as store:
        store.reserve(state(0), count=3)
        for i in range(3):
            store.save(i, state(i))
        assert store.stats().pool_allocated == 0


# -- capacity ------------------------------------------------------------------------


def test_a_record_that_does_not_fit_raises_naming_step_level_and_remedy():
    with TieredStore([MemoryTier(capacity_bytes=NBYTES + 10)]) as store:
        store.save(0, state(0))
        with pytest.raises(StorageError, match=r"step 1 .* level 0.*(larger capacity|fewer slots)"):
            store.save(1, state(1))
        store.delete(0)
        store.save(1, state(1))  # the delete frees the room (even while it is pending)
        assert same(store.load(1), state(1))


def test_spill_policy_stores_on_the_next_tier_and_loads_find_it(tmp_path):
    schedule = Revolve(20, 4)
    tiers = [MemoryTier(capacity_bytes=2 * NBYTES), ZarrTier(tmp_path / "z")]
    with TieredStore(
        tiers, plan=io_plan(schedule), policy="spill", prefetch_bytes=2 * NBYTES
    ) as store:
        run(store, schedule, "dict", tiers, 2 * NBYTES)
        assert store.stats().spills > 0


# -- failures ------------------------------------------------------------------------


def test_a_failed_background_write_surfaces_on_the_next_call_naming_the_step():
    slow = SlowTier(fail_put={3})
    store = TieredStore([MemoryTier(), slow])
    store.save(3, state(3), 1)
    deadline = time.time() + 5
    with pytest.raises(StorageError, match=r"step 3 to level 1.*No space left") as info:
        while time.time() < deadline:
            store.save(4, state(4), 0)
            store.delete(4, 0)
            time.sleep(0.01)
    assert isinstance(info.value.__cause__, OSError)
    with pytest.raises(StorageError, match="step 3 on level 1 is lost"):
        store.load(3, 1)
    store.close()
    assert all(not th.is_alive() for th in store._threads)


def test_failures_surface_on_wait_and_close_and_workers_survive():
    slow = SlowTier(fail_put={1, 2})
    store = TieredStore([slow], workers=1)
    store.save(1, state(1))
    with pytest.raises(StorageError, match="step 1"):
        store.wait()
    store.save(5, state(5))  # the worker is alive and keeps writing
    store.wait()
    assert same(store.load(5), state(5))
    store.save(2, state(2))
    with pytest.raises(StorageError, match="step 2"):
        store.close()
    assert all(not th.is_alive() for th in store._threads)
    with pytest.raises(StorageError, match="closed"):
        store.save(6, state(6))


def test_synchronous_store_raises_in_the_call():
    with TieredStore([SlowTier(fail_put={0})], workers=0) as store:
        with pytest.raises(StorageError, match=r"step 0.*No space") as info:
            store.save(0, state(0))
        assert isinstance(info.value.__cause__, OSError)


def test_close_flushes_a_briefly_blocking_tier_and_never_hangs():
    slow = SlowTier(block=0.15)
    store = TieredStore([slow], staging_bytes=10 * NBYTES)
    for i in range(4):
        store.save(i, state(i))
    store.close(timeout=60)  # raises if the flush does not end in time
    assert len(list(slow.keys())) == 4  # flushed
    assert all(not th.is_alive() for th in store._threads)
    store.close()  # idempotent


def test_close_with_timeout_gives_up_on_a_hanging_tier():
    gate = threading.Event()

    class Hanging(SlowTier):
        def put(self, key, record):
            gate.wait(60)
            super().put(key, record)

    store = TieredStore([Hanging()], workers=1)
    store.save(0, state(0))
    with pytest.raises(StorageError, match="timed out|gave up"):
        store.close(timeout=0.3)
    gate.set()


def test_context_manager_closes_on_exception_and_reraises_it():
    store = None
    with pytest.raises(ZeroDivisionError):
        with TieredStore([MemoryTier(), SlowTier(block=0.05)]) as store:
            store.save(0, state(0), 1)
            1 / 0
    assert store._closed and all(not th.is_alive() for th in store._threads)
    # A failing close does not hide the body's exception.
    with pytest.raises(KeyError) as info:
        with TieredStore([SlowTier(fail_put={0})]) as store:
            store.save(0, state(0))
            time.sleep(0.05)
            raise KeyError("body")
    assert any("closing the TieredStore" in note for note in info.value.__notes__)


def test_corruption_is_detected_and_names_the_step(tmp_path):
    tier = MemoryTier()
    with TieredStore([tier]) as store:
        store.save(7, state(7))
        store.wait()
        (key,) = tier.keys()
        stored = tier.get(key).leaves[0].base  # the tier's own buffer
        stored[0, 0] += 1.0
        with pytest.raises(CorruptCheckpointError, match="step 7") as info:
            store.load(7)
        assert info.value.step == 7
    disk = ZarrTier(tmp_path / "z")
    with TieredStore([MemoryTier(), disk], close_tiers=False) as store:
        store.save(8, state(8), 1)
        store.wait()
        (key,) = disk.keys()
        chunk = next(
            os.path.join(d, f)
            for d, _, files in os.walk(tmp_path / "z" / key)
            for f in files
            if f.startswith("c")
        )
        with open(chunk, "r+b") as fh:
            fh.seek(3)
            byte = fh.read(1)
            fh.seek(3)
            fh.write(bytes([byte[0] ^ 0xFF]))
        with pytest.raises(CorruptCheckpointError, match="step 8"):
            store.load(8, 1)


# -- the plan ----------------------------------------------------------------------------


def test_calls_off_the_plan_raise_naming_the_expected_action():
    schedule = Revolve(10, 3)
    with TieredStore([MemoryTier()], plan=io_plan(schedule)) as store:
        with pytest.raises(PlanMismatchError, match=r"expected action 0, Save\(step=0, level=0\)"):
            store.save(1, state(1))
        store.save(0, state(0))
        with pytest.raises(PlanMismatchError, match="expected action"):
            store.load(0)
        with pytest.raises(PlanMismatchError, match="was not performed"):
            store.sync(len(schedule.table))


def test_without_a_plan_level_none_finds_the_step():
    with TieredStore([MemoryTier(), MemoryTier()]) as store:
        store.save(2, state(2), 1)
        store.save(2, state(2), 0)
        assert same(store.load(2), state(2))
        store.delete(2)
        assert store.steps(0) == [] and store.steps(1) == []
        with pytest.raises(StorageError, match="not stored"):
            store.load(2)
        with pytest.raises(StorageError, match="already stored"):
            store.save(3, state(3))
            store.save(3, state(3))


def test_stats_report_traffic_compression_and_time():
    tiers = [MemoryTier(), CompressedMemoryTier()]
    with TieredStore(tiers) as store:
        zeros = {"u": np.zeros((256, 256))}
        for i in range(3):
            store.save(i, zeros, 1)
        store.wait()
        for i in range(3):
            store.load(i, 1)
        stats = store.stats()
    assert isinstance(stats, StoreStats)
    t1 = stats.tiers[1]
    assert t1.puts == 3 and t1.bytes_in == 3 * zeros["u"].nbytes and t1.records == 3
    assert t1.compression_ratio > 10
    assert stats.io_seconds > 0 and 0 <= stats.hidden_fraction <= 1
    assert "level 1" in str(stats)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.saves = 0


# -- memory levels run in the caller ----------------------------------------------


def test_memory_level_saves_loads_and_deletes_run_in_the_caller_without_workers():
    tier = MemoryTier()
    with TieredStore([tier], workers=2) as store:
        s = state(3)
        store.save(3, s)
        # Complete when save returns: no background write, no thread started.
        assert list(tier.keys()) and store.stats().tiers[0].puts == 1
        s["u"][...] = 5.0  # the record is the store's own
        assert same(store.load(3), state(3))
        out = state(3)
        out["u"][...] = out["aux"][0][...] = 0.0
        assert store.load(3, out=out) is out and same(out, state(3))
        store.delete(3)
        assert list(tier.keys()) == [] and tier.used_bytes == 0
        assert store._threads == [] and store._outstanding == 0


def test_load_copy_false_returns_read_only_views_valid_until_the_records_delete(tmp_path):
    big = {"u": np.random.default_rng(0).standard_normal((400, 300)), "i": 4}
    tiers = [MemoryTier(), ZarrTier(tmp_path / "z")]
    with TieredStore(tiers) as store:
        for level in (0, 1):
            store.save(1, big, level)
            views = store.load(1, level, copy=False)
            assert views["i"] == 4 and np.array_equal(views["u"], big["u"])
            assert not views["u"].flags.writeable
            with pytest.raises(ValueError):
                views["u"][0, 0] = 1.0
            if level == 0:  # a memory record: no copy at all
                (key,) = tiers[0].keys()
                assert np.shares_memory(views["u"], tiers[0].get(key).leaves[0])
            with pytest.raises(ValueError, match="copy=False"):
                store.load(1, level, out={"u": np.zeros((400, 300)), "i": 4}, copy=False)
            # While the record is stored, no save or read reuses its buffers.
            for j in range(3):
                store.save(10 + j, {"u": np.full((400, 300), float(j)), "i": 0}, level)
                store.wait()
                store.load(10 + j, level)
                store.delete(10 + j, level)
                store.wait()
            assert np.array_equal(views["u"], big["u"])
            store.delete(1, level)
            store.wait()


def test_a_record_deleted_ends_the_lease_of_its_views_and_its_buffer_is_reused():
    """The contract of load(copy=False): the views are valid until the
    record's delete; then the store reuses the memory (see lend to keep it)."""
    u = np.random.default_rng(1).standard_normal((400, 300))
    with TieredStore([MemoryTier()], workers=0) as store:
        store.save(1, u)
        views = store.load(1, copy=False)
        where = views.ctypes.data
        store.delete(1)
        store.save(2, np.zeros_like(u))
        reused = store.load(2, copy=False)
        assert reused.ctypes.data == where  # the lease ended with the record


def test_every_kind_of_load_detects_a_corrupt_memory_record_and_names_the_step():
    tier = MemoryTier()
    schedule = StoreAll(4, level=0)
    with TieredStore([tier], plan=io_plan(schedule)) as store:
        big = {"u": np.random.default_rng(1).standard_normal((300, 300))}  # the kernel's path
        for action in schedule:
            if isinstance(action, Save):
                store.save(action.step, big if action.step == 2 else state(action.step), 0)
            if isinstance(action, Load) and action.step == 2:
                break
            if isinstance(action, Load):
                store.load(action.step, 0)
            if isinstance(action, Delete):
                store.delete(action.step, 0)
        key = next(k for k in tier.keys() if k.startswith("u2-"))
        tier.get(key).leaves[0].base[123, 45] += 1e-9
        for kwargs in ({}, {"copy": False}, {"out": {"u": np.zeros((300, 300))}}):
            with pytest.raises(CorruptCheckpointError, match="step 2") as info:
                store.load(2, 0, **kwargs)
            assert info.value.step == 2  # and the plan stays at this Load, for the next try


@pytest.mark.parametrize("second", ["memory", "compressed", "slow"])
def test_large_and_odd_leaves_round_trip_through_the_fused_capture(second):
    """Leaves on every path of the capture kernel (streamed, plain, odd
    lengths, misaligned data, below the kernel's size), saved to a memory
    level and to a background level; the stored checksums are xxh3-64 of
    the bytes."""
    import xxhash

    rng = np.random.default_rng(7)
    raw = rng.standard_normal(200_001).astype(np.float32)
    s = {
        "big": rng.standard_normal((2048, 300)),  # 4.9 MB: streamed
        "mid": rng.standard_normal(20_000),  # 160 KB: the kernel, cached stores
        "small": rng.standard_normal(5000),  # 40 KB: np.copyto and xxhash
        "odd": rng.standard_normal(30_001).astype(np.float32),  # not whole 8-byte words
        "shifted": raw[1:],  # 4-byte aligned
        "tiny": np.arange(3),
    }
    want = {k: np.array(v, copy=True) for k, v in s.items()}
    second_tier = {
        "memory": MemoryTier,
        "compressed": CompressedMemoryTier,
        "slow": lambda: SlowTier(latency=0.001),
    }[second]()
    tiers = [MemoryTier(), second_tier]
    with TieredStore(tiers) as store:
        for level in (0, 1):
            store.save(level, s, level)
            for v in s.values():
                v += 1  # the caller moves on at once
            store.wait()
            key = next(iter(tiers[level].keys()))
            rec = tiers[level].get(key)
            assert rec.checksums == tuple(
                xxhash.xxh3_64_hexdigest(np.ascontiguousarray(x)) for x in rec.leaves
            )
            for got in (store.load(level, level), store.load(level, level, copy=False)):
                assert all(np.array_equal(got[k], want[k]) for k in want)
            out = {k: np.zeros_like(v) for k, v in want.items()}
            out["shifted"] = np.zeros(200_000, np.float32)
            got = store.load(level, level, out=out)
            assert got is out and all(np.array_equal(out[k], want[k]) for k in want)
            for k, v in s.items():
                np.copyto(v, want[k])


def test_a_failing_put_on_a_level_kept_by_reference_raises_in_save_naming_the_step():
    class Fragile(SlowTier):
        retains_references = True

    with TieredStore([Fragile(fail_put={3})], workers=1) as store:
        store.save(2, state(2))
        with pytest.raises(StorageError, match=r"saving step 3 to level 0.*No space") as info:
            store.save(3, state(3))
        assert isinstance(info.value.__cause__, OSError)
        with pytest.raises(StorageError, match="step 3 on level 0 is lost"):
            store.load(3)
        assert same(store.load(2), state(2))
        assert store._threads == []  # written in the caller


def test_the_executor_hands_on_load_read_only_views_of_the_record():
    """run_adjoint's on_load path loads with copy=False: the solver gets the
    record itself, read-only, and copies it into its own buffers."""
    from vlcc_adjoint.execute import run_adjoint

    class Solver:
        def __init__(self):
            self.live = np.zeros(50_000)
            self.seen = []

        def forward(self, u, i):
            u *= 1.001
            u += 1.0
            return u

        def adjoint(self, u, lam, i):
            return lam * 1.001 + u.sum() * 1e-9

        def on_load(self, stored, step, out):
            self.seen.append(stored.flags.writeable)
            np.copyto(self.live, stored)
            return self.live

    solver = Solver()
    plain = run_adjoint(
        type("Plain", (), {"forward": Solver.forward, "adjoint": Solver.adjoint})(),
        Revolve(30, 4),
        np.zeros(50_000),
        np.ones(50_000),
    )
    result = run_adjoint(solver, Revolve(30, 4), solver.live, np.ones(50_000))
    assert solver.seen and not any(solver.seen)
    np.testing.assert_allclose(result.adjoint, plain.adjoint, rtol=1e-12)


# -- states of a recurring structure (the store's Layout fast path) ---------------------


@dataclasses.dataclass
class _Wave:
    prev: np.ndarray
    curr: np.ndarray


def test_states_of_changing_structure_round_trip_through_one_store():
    from vlcc_adjoint.state import flatten

    rng = np.random.default_rng(3)
    states = [_Wave(rng.standard_normal(5), rng.standard_normal(5)) for _ in range(3)]
    states += [
        _Wave(rng.standard_normal(6), rng.standard_normal(5)),  # another shape
        _Wave(rng.standard_normal(5).astype(np.float32), rng.standard_normal(5)),
        (rng.standard_normal(5), rng.standard_normal(5)),  # another container
        {"u": rng.standard_normal(2), "t": 0.5},  # no layout
        _Wave(rng.standard_normal(5), rng.standard_normal(5)),
    ]
    with TieredStore([MemoryTier()], workers=0) as store:
        for i, s in enumerate(states):
            store.save(i, s)
        for i, s in enumerate(states):
            got = store.load(i)
            assert type(got) is type(s)
            for a, b in zip(flatten(got)[0], flatten(s)[0]):
                assert a.dtype == b.dtype and np.array_equal(a, b)
        out = _Wave(np.zeros(5), np.zeros(5))
        assert store.load(7, out=out) is out and np.array_equal(out.curr, states[7].curr)
        assert store.load(0, out=out) is out and np.array_equal(out.prev, states[0].prev)


def test_load_into_out_refuses_mismatched_arrays_on_every_path():
    s = _Wave(np.arange(5.0), np.arange(5.0) + 1)
    with TieredStore([MemoryTier()], workers=0) as store:
        store.save(0, s)
        store.save(1, s)  # the second save of a structure takes the fast path
        for step in (0, 1):
            with pytest.raises(ValueError, match="out= array 1 is <f8\\[4\\]"):
                store.load(step, out=_Wave(np.zeros(5), np.zeros(4)))
            with pytest.raises(ValueError, match="out= has 1 arrays"):
                store.load(step, out=np.zeros(5))
            ro = np.zeros(5)
            ro.flags.writeable = False
            with pytest.raises(ValueError, match="out= array 0 is read-only"):
                store.load(step, out=_Wave(ro, np.zeros(5)))
            with pytest.raises(ValueError, match="out= array 0 is not C-contiguous"):
                store.load(step, out=_Wave(np.zeros(10)[::2], np.zeros(5)))
            out = _Wave(np.zeros(5), np.zeros(5))
            assert store.load(step, out=out) is out and np.array_equal(out.curr, s.curr)


def test_pooled_buffers_never_make_the_store_hold_more_than_its_levels_allow(tmp_path):
    # make_store's budget: memory capacity + staging + read cache.  Free
    # buffers are pooled only within that total.
    s = _Wave(np.ones(1000), np.ones(1000))
    nbytes = 16000
    mem = MemoryTier(capacity_bytes=2 * nbytes)
    store = TieredStore([mem], workers=0, staging_bytes=0, prefetch_bytes=0, pool_bytes=10**9)
    with store:
        for i in range(6):
            store.save(i, s)
            store.save(100 + i, s)
            assert mem.used_bytes + store._pool.free_bytes <= 2 * nbytes
            store.delete(i)
            assert mem.used_bytes + store._pool.free_bytes <= 2 * nbytes
            store.delete(100 + i)
            assert mem.used_bytes + store._pool.free_bytes <= 2 * nbytes
        assert store.stats().pool_reused >= 16  # and reused while they fit
