"""The store and threads: a thread-safe store shared by several threads, and
the single-threaded store (``threadsafe=False``), which takes no lock and
keeps every check."""

import threading

import numpy as np
import pytest

from vlcc_adjoint.errors import VlccValueError
from vlcc_adjoint.schedules import Level, Multistage, Revolve, io_plan
from vlcc_adjoint.storage import (
    CompressedMemoryTier,
    CorruptCheckpointError,
    MemoryTier,
    PlanMismatchError,
    StorageError,
    TieredStore,
    ZarrTier,
)


def field(step, n=1000):
    return {"u": np.full(n, float(step)) + np.arange(n) * 1e-6, "t": step * 0.5}


def same(a, b):
    return a["t"] == b["t"] and np.array_equal(a["u"], b["u"])


# -- a thread-safe store (the default) shared by threads ---------------------------------------


@pytest.mark.parametrize("slow", ["compressed", "zarr"])
def test_a_store_shared_by_threads_keeps_every_record(slow, tmp_path):
    second = CompressedMemoryTier() if slow == "compressed" else ZarrTier(tmp_path / "z")
    errors = []

    def worker(t, store):
        try:
            for i in range(40):
                step, level = 1000 * t + i, i % 2
                store.save(step, field(step), level)
                got = store.load(step, level)
                assert same(got, field(step))
                with store.lend(step, level) as views:
                    assert same(views, field(step))
                got["u"][:] = -1.0  # the caller's own arrays
                if i % 3:
                    store.delete(step, level)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    with TieredStore([MemoryTier(), second], workers=2) as store:
        threads = [threading.Thread(target=worker, args=(t, store)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == []
        store.wait()
        kept = [(s, k) for k in (0, 1) for s in store.steps(k)]
        assert len(kept) == 4 * len([i for i in range(40) if i % 3 == 0])
        for step, level in kept:
            assert same(store.load(step, level), field(step))
        stats = store.stats()
    assert stats.saves == 160 and stats.deletes == 160 - len(kept)
    assert store.threadsafe


# -- the single-threaded store -------------------------------------------------------------------


def test_a_single_threaded_store_takes_no_lock_and_starts_no_thread():
    tiers = [MemoryTier(), CompressedMemoryTier()]
    schedule = Multistage(30, levels=[Level(2, 0, 0), Level(6, 1, 1)])
    with TieredStore(tiers, plan=io_plan(schedule), threadsafe=False) as store:
        assert not store.threadsafe and store._mutex is None
        assert store._shared.mutex is None and not store._pool.threadsafe
        u = field(0)
        for action in schedule:
            kind = type(action).__name__
            if kind == "Advance":
                u = field(action.stop)
            elif kind == "Save":
                store.save(action.step, u, action.level)
            elif kind == "Load":
                u = store.load(action.step, action.level)
                assert same(u, field(action.step))
            elif kind == "Delete":
                store.delete(action.step, action.level)
            elif kind == "Move":
                store.move(action.step, action.src, action.dst)
        assert store._threads == []  # the slower level was written in the calls
        assert store.stats().tiers[1].puts > 0


def test_a_single_threaded_store_has_no_workers():
    with pytest.raises(VlccValueError, match="workers=0"):
        TieredStore([MemoryTier()], workers=2, threadsafe=False)
    TieredStore([MemoryTier()], workers=0, threadsafe=False).close()


def test_a_single_threaded_store_keeps_every_check():
    schedule = Revolve(6, 2)
    with TieredStore([MemoryTier()], plan=io_plan(schedule), threadsafe=False) as store:
        actions = list(schedule)
        first = next(a for a in actions if type(a).__name__ == "Save")
        with pytest.raises(PlanMismatchError, match="does not follow the plan"):
            store.save(first.step + 1, np.zeros(1000), first.level)
        store.save(first.step, np.zeros(1000), first.level)  # the plan stayed put
    tier = MemoryTier(capacity_bytes=2 * 8 * 1000 + 64)
    with TieredStore([tier], threadsafe=False) as store:
        store.save(0, np.zeros(1000))
        store.save(1, np.ones(1000))
        with pytest.raises(StorageError, match="does not fit on level 0"):
            store.save(2, np.ones(1000))
        key = next(k for k in tier.keys() if k.startswith("u1-"))
        tier.get(key).leaves[0].base[5] += 1.0  # damage behind the store's back
        for kwargs in ({}, {"copy": False}, {"out": np.zeros(1000)}):
            with pytest.raises(CorruptCheckpointError, match="step 1"):
                store.load(1, 0, **kwargs)
        assert np.array_equal(store.load(0), np.zeros(1000))


def test_a_single_threaded_store_may_be_called_from_one_thread_after_another():
    """As autograd calls a store from its own thread after the forward pass:
    calls that do not overlap, from different threads."""
    with TieredStore([MemoryTier()], threadsafe=False) as store:
        for i in range(5):
            th = threading.Thread(target=store.save, args=(i, field(i)))
            th.start()
            th.join()
        got = []
        th = threading.Thread(target=lambda: got.extend(store.load(i) for i in range(5)))
        th.start()
        th.join()
        assert all(same(g, field(i)) for i, g in enumerate(got))
