"""The store's ownership rules (explicit: leases and holders, never
reference counts), the tiers' declared capabilities, the plan warning, and
the state providers' independence from any one array library."""

import pathlib
import re
import sys
import threading
import warnings

import numpy as np
import pytest

from vlcc_adjoint.schedules import Level, Multistage, Revolve, StoreAll, io_plan
from vlcc_adjoint.storage import (
    BufferPool,
    CompressedMemoryTier,
    CorruptCheckpointError,
    MemoryTier,
    PlanMismatchError,
    Tier,
    TieredStore,
    ZarrTier,
    make_record,
)
from vlcc_adjoint.storage._pool import BufferPool as PrivateBufferPool

ROOT = pathlib.Path(__file__).resolve().parents[2] / "vlcc_adjoint"


class PlainTier(Tier):
    """A third-party tier that declares no capability: it keeps its own
    copies of the records (as a file tier would)."""

    def __init__(self):
        self.records = {}
        self.gets = 0

    @property
    def used_bytes(self):
        return sum(r.nbytes for r in list(self.records.values()))

    def put(self, key, record):
        from vlcc_adjoint.storage import make_record

        self.records[key] = make_record(
            dict(record.spec), [np.array(x, copy=True) for x in record.leaves]
        )

    def get(self, key):
        self.gets += 1
        return self.records[key]  # the arrays it keeps: not the caller's to own

    def delete(self, key):
        del self.records[key]

    def keys(self):
        return iter(list(self.records))


# -- ownership: a read-only array that owns its data can be made writeable again -------------


@pytest.mark.parametrize("tiers", ["memory", "plain"])
def test_a_read_only_owner_made_writeable_after_save_does_not_change_the_record(tiers):
    u = np.arange(100_000, dtype=np.float64)
    u.flags.writeable = False
    want = u.copy()
    tier = MemoryTier() if tiers == "memory" else PlainTier()
    with TieredStore([tier], workers=1) as store:
        store.save(0, {"u": u})
        u.flags.writeable = True  # numpy allows it: u owns its data
        u[:] = -1.0
        store.wait()
        got = store.load(0)
        assert np.array_equal(got["u"], want)
        assert store.stats().referenced_bytes == 0


def test_a_read_only_view_of_bytes_is_kept_by_reference():
    data = np.arange(1000, dtype=np.float64).tobytes()
    u = np.frombuffer(data, np.float64)[10:]
    with pytest.raises(ValueError):
        u.flags.writeable = True  # nobody can change it
    with TieredStore([MemoryTier()]) as store:
        store.save(0, {"u": u})
        assert store.stats().referenced_bytes == u.nbytes
        assert np.array_equal(store.load(0)["u"], u)


def test_arrays_a_tier_keeps_are_never_handed_to_the_caller_at_their_last_load():
    schedule = Multistage(12, levels=[Level(2, 0, 0), Level(20, 1, 1)])
    plan = io_plan(schedule)
    levels = sorted({int(k) for k in plan.records["level"]})
    tier = PlainTier()
    with TieredStore([MemoryTier(), tier], plan=plan, workers=1) as store:
        from vlcc_adjoint.schedules import ActionKind

        stored = {}
        for row in schedule.table:
            kind, a, b, lv, dst = (int(row[f]) for f in ("kind", "a", "b", "level", "dst"))
            if kind == ActionKind.SAVE:
                store.save(a, {"u": np.full(1000, float(a))}, lv)
            elif kind == ActionKind.LOAD:
                got = store.load(a, lv)
                got["u"][:] = -1.0  # the caller's own arrays: never the tier's
                stored[a] = True
            elif kind == ActionKind.DELETE:
                store.delete(a, lv)
            elif kind == ActionKind.MOVE:
                store.move(a, lv, dst)
        store.wait()  # the background worker writes and deletes the tier's records
        for rec in list(tier.records.values()):
            assert (rec.leaves[0] >= 0).all()
    assert 1 in levels and stored


def test_flatten_traits_names_copies_immutable_and_rebuilt_leaves():
    from vlcc_adjoint.state import flatten_traits

    strided = np.arange(10.0)[::2]
    frozen = np.frombuffer(b"\0" * 16, np.float64)
    owner = np.ones(2)
    owner.flags.writeable = False
    leaves, _, traits = flatten_traits({"a": strided, "b": frozen, "c": owner, "d": np.ones(3)})
    assert traits.fresh == {0} and leaves[0] is not strided
    assert traits.immutable == {1}
    assert traits.rebuilt == frozenset()


# -- leases: memory shown to a caller is held explicitly -----------------------------------------


class Gated(ZarrTier):
    """A zarr tier whose puts wait for a gate: its records stay staged."""

    copies_on_put = True  # its put is ZarrTier's, after the wait

    def __init__(self, path):
        super().__init__(path)
        self.gate = threading.Event()

    def put(self, key, record):
        self.gate.wait(30)
        super().put(key, record)


@pytest.mark.parametrize("where", ["memory", "memory-by-get", "zarr", "zarr-staged"])
def test_a_lent_buffer_is_never_reused_while_its_lease_is_open(where, tmp_path):
    u = np.random.default_rng(3).standard_normal((300, 300))  # 720 KB: below ALIGNED_MIN
    if where == "memory":
        tiers, level = [MemoryTier()], 0
    elif where == "memory-by-get":

        class ByGet(MemoryTier):
            serves_put_arrays = False  # read through get: views of the buffers

        tiers, level = [ByGet()], 0
    elif where == "zarr":
        tiers, level = [MemoryTier(), ZarrTier(tmp_path / "z")], 1
    else:
        tiers, level = [MemoryTier(), Gated(tmp_path / "z")], 1
    with TieredStore(tiers, workers=1) as store:
        store.save(1, u, level)
        if where == "zarr-staged":
            lease = store.lend(1, level)  # from the staged capture
            assert store.stats().staged_hits == 1
            tiers[1].gate.set()
        else:
            store.wait()
            lease = store.lend(1, level)
        views = lease.state
        assert not views.flags.writeable and np.array_equal(views, u)
        store.delete(1, level)  # the record goes; the lease holds the memory
        for j in range(4):
            store.save(10 + j, np.full_like(u, float(j)), level)
            store.wait()
            got = store.load(10 + j, level)
            assert got.ctypes.data != views.ctypes.data
            store.delete(10 + j, level)
            store.wait()
        assert np.array_equal(views, u)  # never another record's bytes
        assert not lease.released
        lease.release()
        lease.release()  # idempotent
        assert lease.released


def test_a_lent_buffer_is_reused_once_its_lease_ends():
    u = np.random.default_rng(4).standard_normal((300, 300))
    with TieredStore([MemoryTier()], workers=0) as store:
        store.save(1, u)
        with store.lend(1) as views:
            where = views.ctypes.data
            assert np.array_equal(views, u)
            store.delete(1)
            store.save(2, u)
            assert store.load(2, copy=False).ctypes.data != where  # still lent
        store.delete(2)
        store.save(3, u)
        store.save(4, u)
        assert where in {store.load(k, copy=False).ctypes.data for k in (3, 4)}
        assert store.stats().pool_allocated == 2  # the lent buffer came back


def test_views_of_a_record_stay_valid_while_it_moves_and_end_with_its_delete():
    u = np.random.default_rng(5).standard_normal((300, 300))
    with TieredStore([MemoryTier(), CompressedMemoryTier()], workers=0) as store:
        store.save(1, u, 0)
        views = store.load(1, 0, copy=False)
        store.move(1, 0, 1)  # the buffers pass to the move, then to the pool
        for j in range(3):
            store.save(10 + j, np.full_like(u, float(j)), 0)
            store.delete(10 + j, 0)
        assert np.array_equal(views, u)  # the lease followed the record
        store.delete(1, 1)  # ... and ends with it
        store.save(20, np.zeros_like(u), 0)
        assert store.load(20, 0, copy=False).ctypes.data == views.ctypes.data


@pytest.mark.parametrize("workers", [0, 1])
def test_a_memory_record_damaged_before_its_move_is_reported_not_moved(workers):
    tier = MemoryTier()
    with TieredStore([tier, CompressedMemoryTier()], workers=workers) as store:
        store.save(1, np.arange(1000.0), 0)
        (key,) = tier.keys()
        tier.get(key).leaves[0].base[7] += 1.0  # damage behind the store's back
        with pytest.raises(CorruptCheckpointError, match="step 1 on level 0"):
            store.move(1, 0, 1)
            store.wait()


def test_lend_is_a_load_of_the_plan():
    schedule = StoreAll(3, level=0)
    with TieredStore([MemoryTier()], plan=io_plan(schedule), workers=0) as store:
        loads = []
        for action in schedule:
            kind = type(action).__name__
            if kind == "Save":
                store.save(action.step, np.full(8, float(action.step)), action.level)
            elif kind == "Load":
                if action.step > 0:  # a stored step, but not the plan's
                    with pytest.raises(PlanMismatchError):
                        store.lend(action.step - 1, action.level)
                with store.lend(action.step) as views:  # the plan's level
                    loads.append(float(views[0]))
            elif kind == "Delete":
                store.delete(action.step, action.level)
    assert loads == [float(a.step) for a in schedule if type(a).__name__ == "Load"]
    assert len(loads) >= 2


def test_a_lease_open_at_close_keeps_its_views():
    u = np.arange(1000.0)
    store = TieredStore([MemoryTier()], workers=0)
    store.save(0, u)
    lease = store.lend(0)
    store.close()
    assert np.array_equal(lease.state, u)
    lease.release()


def test_nothing_in_the_package_asks_the_interpreter_for_reference_counts():
    """Ownership is explicit: reference counts change meaning across CPython
    versions, debuggers and the free-threaded build, and C code holds none."""
    offenders = [
        f"{p.relative_to(ROOT)}:{i + 1}"
        for p in sorted(ROOT.rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines())
        if "getrefcount" in line or "refcheck" in line
    ]
    assert offenders == []


# -- tier capabilities --------------------------------------------------------------------------


CAPABILITIES = (
    "retains_references",
    "copies_on_put",
    "serves_put_arrays",
    "fresh_gets",
    "reads_into",
    "adopts_leaves",
    "persistent",
    "waits_on_io",
)


def test_tiers_declare_their_capabilities_with_safe_defaults():
    assert [getattr(Tier, name) for name in CAPABILITIES] == [False] * len(CAPABILITIES)
    assert MemoryTier.retains_references and MemoryTier.serves_put_arrays
    assert MemoryTier.adopts_leaves and not MemoryTier.copies_on_put
    assert not MemoryTier.fresh_gets and not MemoryTier.persistent
    assert CompressedMemoryTier.fresh_gets and CompressedMemoryTier.copies_on_put
    assert not CompressedMemoryTier.retains_references


def test_a_subclass_that_replaces_a_method_loses_the_capabilities_that_describe_it():
    class TimedGet(ZarrTier):
        def get(self, key):  # may return anything, takes no `take`
            return super().get(key)

    class TimedPut(CompressedMemoryTier):
        def put(self, key, record):
            super().put(key, record)

    class Vouched(CompressedMemoryTier):
        copies_on_put = True  # declared again: it still copies

        def put(self, key, record):
            super().put(key, record)

    class Adopting(MemoryTier):
        def adopt(self, key, record):
            super().adopt(key, record)

    assert not (TimedGet.fresh_gets or TimedGet.reads_into or TimedGet.serves_put_arrays)
    assert TimedGet.persistent and TimedGet.waits_on_io  # about other methods: kept
    assert not TimedPut.copies_on_put and TimedPut.fresh_gets
    assert Vouched.copies_on_put
    assert not Adopting.adopts_leaves and Adopting.retains_references
    assert ZarrTier.fresh_gets and ZarrTier.reads_into  # the declaring classes keep them


def test_a_tier_that_may_keep_what_it_was_put_never_sees_its_arrays_reused():
    """A third-party tier that keeps the record's arrays by reference, as a
    Record allows, and declares nothing: the store never reuses them."""

    class Keeper(PlainTier):
        def put(self, key, record):
            self.records[key] = record  # by reference: allowed

    tier = Keeper()
    with TieredStore([tier], workers=1, pool_bytes=1 << 30) as store:
        for i in range(6):
            store.save(i, {"u": np.full(1000, float(i))})
            store.wait()
        for i in range(6):
            assert np.array_equal(store.load(i)["u"], np.full(1000, float(i)))
        stats = store.stats()
    assert stats.pool_reused == 0


def test_the_engine_reads_capabilities_not_types():
    class Recorder(PlainTier):
        retains_references = True  # declared: written in the caller, no thread

    tier = Recorder()
    with TieredStore([tier], workers=2) as store:
        store.save(0, {"u": np.ones(10)})
        assert store._threads == [] and list(tier.keys())  # complete when save returns
        assert np.array_equal(store.load(0)["u"], np.ones(10))
        assert tier.gets == 1  # read through get: it does not serve the arrays it was given

    class Served(MemoryTier):
        serves_put_arrays = False  # a subclass whose get is its own

        def get(self, key):
            self.calls = getattr(self, "calls", 0) + 1
            return super().get(key)

    served = Served()
    with TieredStore([served], workers=0) as store:
        store.save(0, {"u": np.ones(10)})
        store.load(0)
        assert served.calls == 1

    plain = PlainTier()
    with TieredStore([plain], workers=1) as store:
        store.save(0, {"u": np.ones(10)})
        store.wait()
        assert store._threads  # no capability declared: written on a worker
        assert np.array_equal(store.load(0)["u"], np.ones(10))


def test_tier_adopt_defaults_to_put_and_adopt_leaves_to_adopt():
    tier = PlainTier()
    tier.adopt("k", make_record({"step": 0}, [np.ones(3)]))
    record = make_record({"step": 1}, [np.ones(3)])
    tier.adopt_leaves("j", record.spec, record.leaves, record.checksums)
    assert sorted(tier.keys()) == ["j", "k"]


def test_the_short_path_calls_a_subclasss_own_adopt():
    seen = []

    class Adopting(MemoryTier):
        def adopt(self, key, record):
            seen.append(key)
            super().adopt(key, record)

    with TieredStore([Adopting()], workers=0) as store:
        for i in range(4):
            store.save(i, np.full(8, float(i)))
    assert len(seen) == 4


# -- a plan that does not reach every tier ------------------------------------------------------


def test_a_one_level_plan_over_three_tiers_warns_naming_the_unused_levels():
    tiers = [MemoryTier(), MemoryTier(name="second"), CompressedMemoryTier()]
    with pytest.warns(
        UserWarning,
        match=r"level\(s\) 1 \(second\), 2 \(compressed-memory\) "
        r"will never be used.*Multistage",
    ):
        TieredStore(tiers, plan=io_plan(Revolve(10, 3))).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TieredStore(tiers, plan=io_plan(Revolve(10, 3)), policy="spill").close()  # overflow
        warnings.simplefilter("error")
        TieredStore(tiers).close()  # no plan: the caller picks the levels
        TieredStore(tiers[:1], plan=io_plan(Revolve(10, 3))).close()
        two = Multistage(10, levels=[Level(2, 0, 0), Level(8, 1, 1)])
        TieredStore(tiers[:2], plan=io_plan(two)).close()


# -- public names -----------------------------------------------------------------------------


def test_buffer_pool_is_public():
    assert BufferPool is PrivateBufferPool
    pool = BufferPool(1 << 20)
    buf = pool.take(np.float64, (4,))
    assert buf.shape == (4,) and buf.flags.writeable


# -- no array library named in the core -------------------------------------------------------


def test_storage_and_state_never_name_jax():
    paths = sorted((ROOT / "storage").rglob("*.py")) + [
        ROOT / name for name in ("state.py", "_providers.py", "_layout.py", "_dtype_json.py")
    ]
    offenders = [
        f"{p.relative_to(ROOT)}:{i + 1}"
        for p in paths
        for i, line in enumerate(p.read_text().splitlines())
        if re.search(r"jax", line, re.IGNORECASE)
    ]
    assert offenders == []


def test_the_jax_provider_registers_lazily_without_importing_the_integration():
    import subprocess

    code = """
import sys, numpy as np
import vlcc_adjoint
from vlcc_adjoint.storage import MemoryTier, TieredStore
from vlcc_adjoint.state import flatten, unflatten
assert "vlcc_adjoint.jax" not in sys.modules and "jax" not in sys.modules
import jax.numpy as jnp
x = jnp.arange(8.0)
with TieredStore([MemoryTier()]) as store:
    store.save(0, {"x": x})
    assert store.stats().referenced_bytes == x.nbytes
    got = store.load(0)
assert isinstance(got["x"], type(x))
leaves, spec = flatten({"x": x})
assert spec["tree"]["items"][0] == {"leaf": 0, "jax": True}
print("ok", "vlcc_adjoint.jax._state" in sys.modules)
"""
    pytest.importorskip("jax")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["ok", "True"]


def test_a_spec_with_jax_tags_loads_in_a_process_that_never_imported_jax():
    import subprocess

    code = """
import sys, json, numpy as np
from vlcc_adjoint.state import unflatten
spec = json.loads('{"format": "vlcc-state/1", "tree": {"dict": ["x", "k"], "items": '
                  '[{"leaf": 0, "jax": true}, {"leaf": 1, "jax": "key", "impl": "threefry2x32"}]},'
                  ' "leaves": [{"dtype": "<f4", "shape": [3]}, {"dtype": "<u4", "shape": [2]}]}')
assert "jax" not in sys.modules
out = unflatten(spec, [np.ones(3, np.float32), np.array([0, 7], np.uint32)])
import jax
assert isinstance(out["x"], jax.Array) and jax.dtypes.issubdtype(out["k"].dtype, jax.dtypes.prng_key)
print("ok")
"""
    pytest.importorskip("jax")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


def test_an_unknown_leaf_tag_names_the_remedy():
    from vlcc_adjoint.state import UnknownStateTypeError, unflatten

    spec = {
        "format": "vlcc-state/1",
        "tree": {"leaf": 0, "cupy": True},
        "leaves": [{"dtype": "<f8", "shape": [2]}],
    }
    with pytest.raises(UnknownStateTypeError, match="register_leaf_provider"):
        unflatten(spec, [np.ones(2)])


def test_a_registered_leaf_provider_round_trips_its_arrays():
    from vlcc_adjoint.state import LeafProvider, flatten, register_leaf_provider, unflatten

    class Boxed:
        def __init__(self, a):
            self.a = a

    register_leaf_provider(
        LeafProvider(
            tag="boxed",
            claims=lambda cls: cls is Boxed,
            to_numpy=lambda b: (b.a, {"boxed": True}),
            from_numpy=lambda a, node: Boxed(a),
            immutable=False,
            rebuilt=True,
        )
    )
    leaves, spec = flatten({"b": Boxed(np.arange(3.0))})
    assert spec["tree"]["items"][0] == {"leaf": 0, "boxed": True}
    out = unflatten(spec, leaves)
    assert isinstance(out["b"], Boxed) and np.array_equal(out["b"].a, np.arange(3.0))
    with pytest.raises(ValueError, match="spec's own keys"):
        register_leaf_provider(
            LeafProvider(tag="leaf", claims=bool, to_numpy=None, from_numpy=None)
        )
