"""Reads of records that are not in the page cache: page-aligned pool
buffers, direct I/O, and read buffers reused through the pool.

The durable zarr tier drops its chunks from the page cache once they are
synced, so reads come from the device.  They land in page-aligned buffers
from the store's pool (memory touched before), with ``O_DIRECT`` where the
file system accepts it (no copy through the page cache); buffers lent as
read-only views come back to the pool once their lease ends (the record's
deletion, or the release of a ``lend``).
"""

import fcntl
import os
import subprocess
import sys

import numpy as np
import pytest

from vlcc_adjoint.schedules import StoreAll, io_plan
from vlcc_adjoint.storage import (
    BufferPool,
    CorruptCheckpointError,
    MemoryTier,
    TieredStore,
    ZarrTier,
    make_record,
)
from vlcc_adjoint.storage import format as F
from vlcc_adjoint.storage._files import read_direct, read_exactly
from vlcc_adjoint.storage._pool import ALIGNED_MIN, PAGE, owns_memory

MIB = 1 << 20


def address(arr) -> int:
    return arr.__array_interface__["data"][0]


def accepts_direct_io(directory) -> bool:
    """Whether the file system of `directory` opens files with O_DIRECT."""
    flag = getattr(os, "O_DIRECT", None)
    if flag is None:
        return False
    probe = os.path.join(directory, "probe")
    with open(probe, "wb") as f:
        f.write(b"\0" * PAGE)
    try:
        os.close(os.open(probe, os.O_RDONLY | flag))
    except OSError:
        return False
    finally:
        os.unlink(probe)
    return True


# -- the pool's buffers ---------------------------------------------------------------------


def test_large_pool_buffers_start_on_a_page_and_small_ones_are_plain_arrays():
    pool = BufferPool(64 * MIB)
    big = pool.take(np.float64, (ALIGNED_MIN // 8 + 3,))
    assert owns_memory(big) and big.base is not None
    assert address(big) % PAGE == 0 and big.flags.c_contiguous and big.flags.writeable
    small = pool.take(np.float64, (100,))
    assert small.base is None and owns_memory(small)
    for dtype in (np.int16, np.complex128, np.bool_, "M8[s]"):
        arr = pool.take(dtype, (MIB, 2))
        assert arr.dtype == np.dtype(dtype) and arr.shape == (MIB, 2)
        assert address(arr) % PAGE == 0


def test_a_leased_buffer_is_never_reused_while_its_lease_is_open():
    pool = BufferPool(64 * MIB)
    buf = pool.take(np.float32, (MIB,))
    where = address(buf)
    lease = pool.lend([buf])
    view = buf[10:20]
    view.flags.writeable = False
    assert pool.recycle([buf]) == 0  # its owner is done, the borrower is not
    assert pool.deferred == 1 and pool.free_bytes == 0
    for _ in range(3):
        other = pool.take(np.float32, (MIB,))
        assert address(other) != where  # never the memory a leased view shows
        other.fill(7.0)
    assert not (view == 7.0).any()
    lease.release()
    assert pool.free_bytes == 4 * MIB
    again = pool.take(np.float32, (MIB,))
    assert address(again) == where  # the lease ended: the buffer is free
    lease.release()  # idempotent
    assert pool.free_bytes == 0


def test_a_lease_ended_before_the_owner_gives_the_buffer_back_defers_nothing():
    pool = BufferPool(64 * MIB)
    buf = pool.take(np.float64, (MIB,))
    with pool.lend([buf]) as lease:
        assert lease.open and pool.leased(buf)
    assert not lease.open and not pool.leased(buf)
    assert pool.recycle([buf]) == 1 and pool.deferred == 0
    pool.take(np.float64, (MIB,))
    assert pool.reused == 1


def test_a_buffer_under_two_leases_waits_for_both():
    pool = BufferPool(64 * MIB)
    buf = pool.take(np.float64, (1000,))
    first, second = pool.lend([buf]), pool.lend([buf])
    pool.recycle([buf])
    first.release()
    assert pool.free_bytes == 0 and pool.leased(buf)
    second.release()
    assert pool.free_bytes == buf.nbytes and not pool.leased(buf)


def test_a_buffer_whose_lease_ends_when_the_pool_is_full_is_dropped():
    pool = BufferPool(2 * 8 * MIB)
    kept = [pool.take(np.float64, (MIB,)) for _ in range(3)]
    lease = pool.lend(kept[:1])
    assert pool.recycle(list(kept)) == 2  # the leased one is deferred, not free
    assert pool.free_bytes == 2 * 8 * MIB
    lease.release()  # no room left: dropped (the garbage collector frees it)
    assert pool.free_bytes == 2 * 8 * MIB and pool.refused == 1
    pool.clear()
    assert pool.free_bytes == 0


def test_a_closed_pool_keeps_nothing_given_back_later():
    pool = BufferPool(64 * MIB)
    buf, other = pool.take(np.float64, (100,)), pool.take(np.float64, (100,))
    lease = pool.lend([buf])
    pool.recycle([buf, other])
    pool.close()
    assert pool.free_bytes == 0
    lease.release()  # the deferred buffer: dropped, not kept
    assert pool.free_bytes == 0 and pool.recycle([np.empty(100)]) == 0


def test_a_buffer_given_back_twice_is_on_the_free_list_once():
    pool = BufferPool(64 * MIB)
    buf = pool.take(np.float64, (100,))
    assert pool.recycle([buf]) == 1
    assert pool.recycle([buf]) == 0
    first, second = pool.take(np.float64, (100,)), pool.take(np.float64, (100,))
    assert first is buf and second is not buf


def test_memory_shared_with_another_view_is_not_the_pools():
    block = np.zeros(2 * ALIGNED_MIN, np.uint8)
    a, b = block[:ALIGNED_MIN], block[ALIGNED_MIN:]
    del block
    assert not owns_memory(a)  # b shares the block
    start = address(b) - ALIGNED_MIN
    pool = BufferPool(64 * MIB)
    assert pool.recycle([a.view(np.float64)]) == 0
    got = address(pool.take(np.float64, (ALIGNED_MIN // 8,)))
    assert not start <= got < start + 2 * ALIGNED_MIN and pool.reused == 0
    # A block one page larger than the view, as the pool's own, but not made
    # by the pool: not the pool's either.
    lookalike = np.zeros(ALIGNED_MIN + PAGE, np.uint8)[:ALIGNED_MIN]
    assert not owns_memory(lookalike) and pool.recycle([lookalike]) == 0
    # Part of a pool buffer is not a buffer.
    buf = pool.take(np.uint8, (2 * ALIGNED_MIN,))
    assert not owns_memory(buf[:ALIGNED_MIN]) and not owns_memory(buf[PAGE:])
    assert pool.recycle([buf[:ALIGNED_MIN]]) == 0


def test_the_pools_decisions_do_not_depend_on_the_interpreters_reference_counts():
    """Under a tracer that reads every frame's locals (as debuggers do, which
    adds references), a buffer is reused exactly when its owner gave it back
    and no lease holds it: the same decisions as without the tracer."""
    probe = (
        "import sys\n"
        "def tracer(frame, event, arg):\n"
        "    frame.f_locals\n"
        "    return tracer\n"
        "if sys.argv[1] == 'trace':\n"
        "    sys.settrace(tracer)\n"
        "from vlcc_adjoint.storage import BufferPool\n"
        "import numpy as np\n"
        "pool = BufferPool(1 << 26)\n"
        "buf = pool.take(np.float64, (1 << 18,))\n"
        "lent = buf[:4]\n"
        "lease = pool.lend([buf])\n"
        "pool.recycle([buf])\n"
        "while_lent = pool.take(np.float64, (1 << 18,))\n"
        "lease.release()\n"
        "after = pool.take(np.float64, (1 << 18,))\n"
        "print(while_lent.ctypes.data == lent.ctypes.data, after.ctypes.data == lent.ctypes.data)\n"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", probe, mode], capture_output=True, text=True, check=True
        ).stdout.split()
        for mode in ("trace", "plain")
    ]
    assert runs[0] == runs[1] == ["False", "True"]


# -- direct reads -------------------------------------------------------------------------------


@pytest.mark.parametrize("nbytes", [MIB, 3 * MIB + 123, 9 * MIB + PAGE])
def test_read_into_with_direct_io_reads_every_byte(tmp_path, nbytes):
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    path = tmp_path / "chunk"
    F.write_file(str(path), data, durable=True)
    pool = BufferPool(0)
    for out in (
        pool.take(np.uint8, (nbytes,)),  # page-aligned: direct where accepted
        np.empty(nbytes + 1, np.uint8)[1:],
    ):  # not aligned: buffered
        out.fill(0)
        F.read_into(str(path), out, direct=True)
        assert np.array_equal(out, data)


def test_read_direct_reads_the_whole_pages_directly_and_leaves_the_descriptor_buffered(tmp_path):
    nbytes = 2 * MIB + 100
    data = np.arange(nbytes, dtype=np.uint64).astype(np.uint8)
    path = str(tmp_path / "chunk")
    F.write_file(path, data, durable=True)
    out = BufferPool(0).take(np.uint8, (nbytes,))
    fd = os.open(path, os.O_RDONLY)
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        done = read_direct(fd, memoryview(out), address(out))
        assert done == (2 * MIB if accepts_direct_io(tmp_path) else 0)
        assert fcntl.fcntl(fd, fcntl.F_GETFL) == flags  # O_DIRECT cleared again
        assert os.lseek(fd, 0, os.SEEK_CUR) == done
        assert read_exactly(fd, memoryview(out)[done:])
    finally:
        os.close(fd)
    assert np.array_equal(out, data)
    # An unaligned buffer, or less than a page: nothing read directly.
    fd = os.open(path, os.O_RDONLY)
    try:
        odd = np.empty(nbytes + 1, np.uint8)[1:]
        assert read_direct(fd, memoryview(odd), address(odd)) == 0
        assert read_direct(fd, memoryview(out)[: PAGE - 1], address(out)) == 0
    finally:
        os.close(fd)


def test_a_file_shorter_than_its_metadata_says_is_refused_before_a_direct_read(tmp_path):
    path = str(tmp_path / "chunk")
    F.write_file(path, np.ones(MIB, np.uint8), durable=True)
    out = BufferPool(0).take(np.uint8, (2 * MIB,))
    with pytest.raises(CorruptCheckpointError, match="chunk"):
        F.read_into(path, out, direct=True)


# -- the zarr tier and the store -------------------------------------------------------------


def test_zarr_get_reads_into_the_arrays_take_gives(tmp_path):
    leaves = [
        np.arange(MIB // 2 + 5, dtype=np.float64),
        np.array([True, False]),
        np.arange(6).astype("M8[s]").reshape(2, 3),
        np.empty((0, 3)),
    ]
    given = []

    def take(dtype, shape):
        given.append(BufferPool(0).take(dtype, shape))
        return given[-1]

    for durable in (False, True):
        with ZarrTier(tmp_path / f"z{durable}", durable=durable) as tier:
            tier.put("r", make_record({"step": 0}, leaves))
            given.clear()
            rec = tier.get("r", take=take)
            assert [a is b for a, b in zip(rec.leaves, given)] == [True] * 3
            for got, want in zip(rec.leaves, leaves):
                assert got.dtype == want.dtype and np.array_equal(got, want)


def test_a_damaged_chunk_read_directly_names_its_file(tmp_path):
    with ZarrTier(tmp_path / "z", durable=True) as tier:
        tier.put("r", make_record({"step": 0}, [np.ones(MIB)]))
        chunk = tmp_path / "z" / "r" / "0" / "c.0"
        with open(chunk, "r+b") as f:
            f.seek(3 * MIB)
            f.write(b"\x7f")
            os.fsync(f.fileno())
        with pytest.raises(CorruptCheckpointError, match="leaf 0") as err:
            tier.get("r", take=lambda d, s: BufferPool(0).take(d, s))
        assert "step 0" in str(err.value) and "r" in str(err.value)


@pytest.mark.parametrize("copy", [False, True])
def test_the_read_ahead_reads_into_reused_pool_buffers(tmp_path, copy):
    count, n = 12, MIB // 2  # 4 MiB records
    schedule = StoreAll(count + 1, level=1)
    states = [np.full(n, float(i)) for i in range(count + 1)]
    store = TieredStore(
        [MemoryTier(), ZarrTier(tmp_path / "z", durable=True)],
        plan=io_plan(schedule),
        prefetch_bytes=2 * n * 8,
    )
    with store:
        before = None
        for action in schedule:
            kind = type(action).__name__
            if kind == "Save":
                store.save(action.step, states[action.step], action.level)
            elif kind == "Load":
                if before is None:  # the forward pass is over
                    store.wait()
                    before = store.stats()
                state = store.load(action.step, action.level, copy=copy)
                assert np.array_equal(state, states[action.step])
            elif kind == "Delete":  # ends the lease of views lent: the buffers come back
                store.delete(action.step, action.level)
        stats = store.stats()
        free, limit = store._capture.pool.free_bytes, store._capture.pool.max_free_bytes
    assert stats.prefetch_hits >= count - 1
    if not copy:  # read-only views come back: a few buffers serve every read
        assert stats.pool_allocated - before.pool_allocated <= 3
        assert stats.pool_reused - before.pool_reused >= count - 3
    assert free <= limit


def test_only_a_durable_tier_reads_directly(tmp_path, monkeypatch):
    calls = []
    real = F.read_direct

    def spy(fd, view, where):
        calls.append(real(fd, view, where))
        return calls[-1]

    monkeypatch.setattr(F, "read_direct", spy)
    take = BufferPool(0).take
    for durable in (False, True):
        calls.clear()
        with ZarrTier(tmp_path / f"z{durable}", durable=durable) as tier:
            tier.put("r", make_record({"step": 0}, [np.ones(MIB), np.ones(10)]))
            assert np.array_equal(tier.get("r", take=take).leaves[0], np.ones(MIB))
        # durable chunks left the page cache: read directly (the large leaf only)
        want = [8 * MIB if accepts_direct_io(tmp_path) else 0] if durable else []
        assert calls == want


def test_a_subclass_that_overrides_get_without_take_is_read_as_before(tmp_path):
    seen = []

    class Timed(ZarrTier):
        def get(self, key):  # the signature of Tier.get, as a user writes it
            seen.append(key)
            return super().get(key)

    schedule = StoreAll(4, level=1)
    store = TieredStore(
        [MemoryTier(), Timed(tmp_path / "z")], plan=io_plan(schedule), prefetch_bytes=0
    )  # every load reads the tier
    with store:
        for action in schedule:
            kind = type(action).__name__
            if kind == "Save":
                store.save(action.step, np.full(1000, float(action.step)), action.level)
            elif kind == "Load":
                store.wait()  # written: the load reads the tier
                assert np.array_equal(
                    store.load(action.step, action.level), np.full(1000, float(action.step))
                )
            elif kind == "Delete":
                store.delete(action.step, action.level)
    assert len(seen) == 3


def test_a_subarray_dtype_gets_the_shape_numpy_gives_it():
    dtype = np.dtype(("f8", (4,)))
    arr = BufferPool(0).take(dtype, (MIB // 16,))
    assert arr.shape == np.empty(MIB // 16, dtype).shape == (MIB // 16, 4)
