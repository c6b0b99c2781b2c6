"""Every tier honours the Tier contract (the suite of vlcc_adjoint.storage.testing:
exact round trips, hard capacities, checksummed reads, thread safety), the MPI
shared tier included; ZarrTier survives kill -9 and disk errors and writes a
store that plain zarr reads."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from vlcc_adjoint.state import flatten, unflatten
from vlcc_adjoint.storage import (
    CompressedMemoryTier,
    CorruptCheckpointError,
    MemoryTier,
    Record,
    StorageError,
    Tier,
    TieredStore,
    TierFullError,
    ZarrTier,
    check_capacity,
    check_record,
    encode_spec,
    make_record,
    verify_leaves,
)
from vlcc_adjoint.storage.codecs import ErrorBounded, FixedRate, Lossless
from vlcc_adjoint.storage.testing import TierContract

try:
    from test_state import STATES, assert_same_state
except ImportError:  # tests/storage run on its own: the referee lives in tests/state
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "state"))
    from test_state import STATES, assert_same_state


def record_of(state, step=None):
    leaves, spec = flatten(state)
    if step is not None:
        spec["step"] = step
    return make_record(spec, leaves)


def restored(tier, key):
    rec = tier.get(key)
    return unflatten(rec.spec, rec.leaves)


def disk_bytes(path, exclude=()):
    """Bytes of the files of every record directory of the store at ``path``."""
    total = 0
    for entry in os.scandir(path):
        if (
            entry.is_dir()
            and entry.name not in (".vlcc-scratch", ".vlcc-lock")
            and entry.name not in exclude
        ):
            for root, _, files in os.walk(entry.path):
                total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def _scratch_bytes(path):
    """Bytes of the recycled directories (the scratch's own zarr.json aside)."""
    return disk_bytes(os.path.join(path, ".vlcc-scratch"))


# -- the contract, run by every tier -------------------------------------------------------


class _Fresh:
    """A new directory under `root` per call (a contract test may make several tiers)."""

    def __init__(self, root):
        self.root, self.n = Path(root), 0

    def __call__(self):
        self.n += 1
        return self.root / f"t{self.n}"


class TestMemoryTier(TierContract):
    trace_examples = 40

    @pytest.fixture
    def make_tier(self):
        return lambda capacity_bytes=None: MemoryTier(capacity_bytes)

    def check(self, tier, model):
        super().check(tier, model)
        # exact: the leaves' bytes (each array once; these records share none)
        assert tier.used_bytes == sum(rec.nbytes for rec in model.values())


class TestCompressedMemoryTier(TierContract):
    @pytest.fixture
    def make_tier(self):
        return lambda capacity_bytes=None: CompressedMemoryTier(None, capacity_bytes)


class TestZarrTier(TierContract):
    @pytest.fixture
    def make_tier(self, tmp_path):
        fresh = _Fresh(tmp_path)
        return lambda capacity_bytes=None: ZarrTier(fresh(), capacity_bytes, recycle=3)

    def check(self, tier, model):
        super().check(tier, model)
        # exact: the files of the records on disk; recycled directories within capacity
        assert tier.used_bytes == disk_bytes(tier.path)
        if tier.capacity_bytes is not None:
            assert tier.used_bytes + tier.recycled_bytes <= tier.capacity_bytes
            assert tier.used_bytes + _scratch_bytes(tier.path) <= tier.capacity_bytes

    @pytest.mark.parametrize("key", ["../escape", "/abs", ".hidden", "a/b"])
    def test_a_refused_key_creates_nothing_on_disk(self, tmp_path, key):
        tier = ZarrTier(tmp_path / "store")
        with pytest.raises(ValueError, match="invalid record key"):
            tier.put(key, record_of(np.ones(2)))
        assert sorted(os.listdir(tmp_path)) == ["store"]
        assert sorted(os.listdir(tmp_path / "store")) == [
            ".vlcc-lock",
            ".vlcc-scratch",
            "zarr.json",
        ]

    def test_a_put_that_does_not_fit_leaves_no_directory(self, tmp_path):
        tier = ZarrTier(tmp_path / "s", capacity_bytes=100)
        with pytest.raises(StorageError, match="capacity"):
            tier.put("c", record_of(np.ones(1000)))
        assert not (tmp_path / "s" / "c").exists()


class TestSharedZarrTier(TierContract):
    """The MPI tier's rank-local protocol, on a one-rank communicator in this process
    (records are written under its pending area; commits are tested in tests/mpi)."""

    @pytest.fixture
    def make_tier(self, tmp_path):
        pytest.importorskip("mpi4py")
        from mpi4py import MPI

        from vlcc_adjoint.mpi import SharedZarrTier

        fresh = _Fresh(tmp_path)
        made = []

        def make(capacity_bytes=None):
            made.append(SharedZarrTier(fresh(), MPI.COMM_SELF, capacity_bytes))
            return made[-1]

        yield make
        for tier in made:
            tier.close()


class DictTier(Tier):
    """A tier written outside the package, with the public helpers only: what a
    third party writes (and, with a flag set, the mistakes the contract catches)."""

    def __init__(self, capacity_bytes=None, *, overfill=False, trust=False, share_spec=False):
        self.capacity_bytes = check_capacity(capacity_bytes)
        self.name = "dict"
        self._records: dict = {}
        self._used = 0
        self._lock = threading.Lock()
        self.overfill, self.trust, self.share_spec = overfill, trust, share_spec

    @property
    def used_bytes(self):
        return self._used

    def put(self, key, record):
        check_record(key, record)
        text = encode_spec(key, record.spec)
        leaves = tuple(leaf.copy() for leaf in record.leaves)
        need = sum(leaf.nbytes for leaf in leaves)
        with self._lock:
            if key in self._records:
                raise KeyError(f"record {key!r} is already in tier 'dict'")
            cap = self.capacity_bytes
            if cap is not None and self._used + need > cap and not self.overfill:
                raise TierFullError.no_room(key, self.name, need, self._used, cap)
            self._records[key] = (
                record.spec if self.share_spec else text,
                leaves,
                record.checksums,
            )
            self._used += need

    def get(self, key):
        with self._lock:
            spec, leaves, checksums = self._records[key]
        if not self.trust:
            verify_leaves(leaves, checksums, key, self.name, None)
        spec = spec if self.share_spec else json.loads(spec)
        return Record(spec, tuple(leaf.copy() for leaf in leaves), checksums)

    def delete(self, key):
        with self._lock:
            _, leaves, _ = self._records.pop(key)
            self._used -= sum(leaf.nbytes for leaf in leaves)

    def keys(self):
        with self._lock:
            return iter(list(self._records))


class TestDictTier(TierContract):
    @pytest.fixture
    def make_tier(self):
        return lambda capacity_bytes=None: DictTier(capacity_bytes)


@pytest.mark.parametrize(
    "flaw,test",
    [
        ("overfill", "test_a_put_that_does_not_fit_raises_and_changes_nothing"),
        ("overfill", "test_capacity_and_contents_under_random_traces"),
        ("trust", "test_a_record_that_fails_its_checksums_is_never_returned"),
        ("share_spec", "test_get_returns_the_spec_and_checksums_it_was_given"),
    ],
)
def test_the_contract_fails_a_tier_that_breaks_it(flaw, test):
    def make(capacity_bytes=None):
        return DictTier(capacity_bytes, **{flaw: True})

    with pytest.raises(BaseException) as info:
        getattr(TestDictTier(), test)(make)
    assert info.type is not KeyboardInterrupt and info.type.__name__ in (
        "AssertionError",
        "Failed",
        "MultipleFailures",
        "ExceptionGroup",
        "Flaky",
    ), info.value


# -- every state kind, through every tier --------------------------------------------------

FACTORIES = {
    "memory": lambda path: MemoryTier(),
    "compressed": lambda path: CompressedMemoryTier(),
    "zarr": lambda path: ZarrTier(path / "store"),
}


@pytest.mark.parametrize("kind", FACTORIES)
def test_every_state_kind_round_trips_through_every_tier(kind, tmp_path):
    tier = FACTORIES[kind](tmp_path)
    for i, (name, state) in enumerate(STATES.items()):
        key = f"s{i}"
        tier.put(key, record_of(state, step=i))
        assert_same_state(state, restored(tier, key), path=f"{kind}:{name}")
    assert sorted(tier.keys()) == sorted(f"s{i}" for i in range(len(STATES)))


@pytest.mark.parametrize("kind", FACTORIES)
def test_jax_state_round_trips_through_every_tier(kind, tmp_path):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    state = {
        "u": jnp.arange(12.0).reshape(3, 4),
        "bf": jnp.ones(5, jnp.bfloat16),
        "key": jax.random.key(1),
        "l": [jnp.zeros((2,), jnp.int32)],
    }
    tier = FACTORIES[kind](tmp_path)
    tier.put("j", record_of(state))
    out = restored(tier, "j")
    assert_same_state(state, out)
    assert isinstance(out["u"], jax.Array)


def test_make_record_copies_only_non_contiguous_leaves_and_checksums_them():
    u = np.arange(10.0)
    v = np.arange(20.0)[::2]
    rec = make_record({}, [u, v])
    assert rec.leaves[0] is u and rec.leaves[1].flags.c_contiguous
    assert np.array_equal(rec.leaves[1], v) and len(rec.checksums[0]) == 16
    assert rec.checksums[0] == make_record({}, [u.copy()]).checksums[0]
    with pytest.raises(TypeError, match="object"):
        make_record({}, [np.array([None])])


# -- memory tiers -----------------------------------------------------------------


def test_memory_tier_keeps_leaves_by_reference_and_hands_out_read_only_views():
    tier = MemoryTier()
    u = np.arange(1000.0)
    tier.put("a", make_record({}, [u]))
    got = tier.get("a").leaves[0]
    assert np.shares_memory(got, u) and not got.flags.writeable
    with pytest.raises(ValueError):
        got[0] = 1.0


def test_memory_tier_counts_an_array_shared_by_records_once():
    tier = MemoryTier(capacity_bytes=3000 * 8)
    model, u1, u2 = np.ones(2000), np.zeros(400), np.zeros(400)
    tier.put("a", make_record({}, [model, u1]))
    tier.put("b", make_record({}, [model, u2]))  # would not fit if model counted twice
    assert tier.used_bytes == 2800 * 8
    tier.delete("a")
    assert tier.used_bytes == 2400 * 8  # model still held by "b"
    tier.delete("b")
    assert tier.used_bytes == 0


def test_compressed_tier_counts_encoded_bytes_and_records_the_codec():
    tier = CompressedMemoryTier()
    smooth = np.repeat(np.arange(100.0), 100)
    tier.put("a", record_of({"u": smooth}))
    assert tier.used_bytes < smooth.nbytes / 4 and tier.raw_bytes == smooth.nbytes
    assert json.loads(tier._records["a"].blobs[0].codec) == Lossless().config()


def test_compressed_tier_decodes_records_written_with_another_codec():
    tier = CompressedMemoryTier(Lossless(compressor="zstd"))
    x = np.sin(np.arange(5000.0))
    tier.put("a", record_of(x))
    tier.codec = Lossless()  # the records say which codec wrote them
    np.testing.assert_array_equal(tier.get("a").leaves[0], x)


@pytest.mark.parametrize("codec", ["error-bounded", "fixed-rate"])
def test_lossy_codec_returns_the_bounded_approximation_with_consistent_checksums(codec, tmp_path):
    x = np.cumsum(np.random.default_rng(2).standard_normal(20000)) * 0.01
    if codec == "error-bounded":
        bound, tier = 1e-3, CompressedMemoryTier(ErrorBounded(1e-3))
    else:
        bits = 12
        bound = np.abs(x).max() / (2 ** (bits - 1) - 1)  # FixedRate's per-block guarantee, loosened
        tier = CompressedMemoryTier(FixedRate(bits))
    ints = np.arange(50, dtype=np.int64)
    tier.put("a", record_of({"x": x, "i": ints, "d": np.array(["2020-01-01"], "M8[D]")}))
    assert tier.used_bytes < x.nbytes / 3
    rec = tier.get("a")
    out = unflatten(rec.spec, rec.leaves)
    assert 0 < np.max(np.abs(out["x"] - x)) <= bound
    np.testing.assert_array_equal(out["i"], ints)
    # the approximation is self-consistent: it moves to an exact tier and verifies there
    disk = ZarrTier(tmp_path / "z")
    disk.put("a", rec)
    np.testing.assert_array_equal(disk.get("a").leaves[0], rec.leaves[0])


# -- checksums ------------------------------------------------------------------------


def _kernel_sizes():
    """Byte lengths around every boundary of XXH3's long-input path and of the
    kernel's thresholds: stripes (64), blocks (1024), KERNEL_MIN_BYTES,
    STREAM_MIN_BYTES, and lengths that are not whole 8-byte words."""
    from vlcc_adjoint.storage._checksum import KERNEL_MIN_BYTES, STREAM_MIN_BYTES

    sizes = set(range(232, 1100, 8)) | {241, 243, 1023, 1025, 2047, 2049, 4096 + 4}
    for edge in (1024, 2048, 16 * 1024, KERNEL_MIN_BYTES, STREAM_MIN_BYTES, 1 << 20):
        sizes |= {edge - 64, edge - 8, edge, edge + 8, edge + 64, edge + 1000 * 8}
    return sorted(sizes)


@pytest.mark.parametrize("stream", [False, True])
def test_copy_checksum_is_xxh3_64_of_the_copied_bytes_for_every_length_class(stream):
    """The fused copy-and-hash kernel is xxh3-64 bit for bit (the stored
    format is unchanged) and copies exactly, for any length and alignment
    (below KERNEL_MIN_BYTES, np.copyto and xxhash do the same)."""
    import xxhash

    from vlcc_adjoint.storage._checksum import _build, copy_checksum, leaf_checksum

    kernels = _build()
    assert kernels, "the LLVM kernel did not build on this host"
    copy_kernel, hash_kernel = kernels[2 if stream else 0], kernels[1]
    rng = np.random.default_rng(5)
    for n in _kernel_sizes():
        raw = rng.integers(0, 256, n + 16, dtype=np.uint8)
        for offset in (0, 4, 8):  # any alignment
            src = raw[offset : offset + n]
            want = xxhash.xxh3_64_hexdigest(src)
            for dst in (np.full(n, 7, np.uint8), np.full(n + 1, 7, np.uint8)[1:]):
                assert copy_checksum(src, dst, stream=stream) == want, (n, offset)
                np.testing.assert_array_equal(dst, src)
                if n > 240:  # the kernel itself, below the size the store hands it
                    dst[...] = 7
                    assert f"{copy_kernel(src, dst, n):016x}" == want, (n, offset)
                    np.testing.assert_array_equal(dst, src)
            assert leaf_checksum(src) == want
            if n > 240:
                assert f"{hash_kernel(src, src, n):016x}" == want
    # Other dtypes and shapes: only the bytes count.
    x = rng.standard_normal((300, 301)).astype(np.float32)  # an odd number of float32
    y = np.empty_like(x)
    assert copy_checksum(x, y, stream=stream) == xxhash.xxh3_64_hexdigest(x)
    np.testing.assert_array_equal(x, y)


def test_copy_checksum_falls_back_to_copyto_and_xxhash_without_the_kernel(monkeypatch):
    import xxhash

    from vlcc_adjoint.storage import _checksum

    monkeypatch.setattr(_checksum, "_KERNELS", ())
    x = np.random.default_rng(1).standard_normal(100_000)
    y = np.empty_like(x)
    assert _checksum.copy_checksum(x, y, stream=True) == xxhash.xxh3_64_hexdigest(x)
    assert _checksum.leaf_checksum(x) == xxhash.xxh3_64_hexdigest(x)
    np.testing.assert_array_equal(x, y)


def test_checksum_detects_every_single_bit_flip_swapped_blocks_and_truncation():
    """The damage a store meets, on a leaf the kernel hashes: any one flipped
    bit (every bit of the first and last stripes and blocks, and a sample of
    the rest), two 64-byte stripes or two 1024-byte blocks swapped, a lost
    tail, a zeroed page."""
    from vlcc_adjoint.storage._checksum import KERNEL_MIN_BYTES, leaf_checksum

    rng = np.random.default_rng(11)
    n = KERNEL_MIN_BYTES + 3 * 1024 + 8 * 13  # a partial last block
    data = rng.integers(0, 256, n, dtype=np.uint8)
    good = leaf_checksum(data)
    bits = list(range(0, 8 * 1100)) + list(range(8 * (n - 1100), 8 * n))
    bits += rng.integers(0, 8 * n, 3000).tolist()
    for bit in bits:
        data[bit // 8] ^= np.uint8(1 << (bit % 8))
        assert leaf_checksum(data) != good, f"flip of bit {bit} went unnoticed"
        data[bit // 8] ^= np.uint8(1 << (bit % 8))
    assert leaf_checksum(data) == good

    def swapped(a, i, j, size):
        out = a.copy()
        out[i : i + size], out[j : j + size] = a[j : j + size], a[i : i + size]
        return out

    assert leaf_checksum(swapped(data, 0, 64, 64)) != good
    assert leaf_checksum(swapped(data, 1024, 5 * 1024, 1024)) != good
    assert leaf_checksum(swapped(data, n - 128, n - 64, 64)) != good  # the last stripe
    assert leaf_checksum(data[:-8].copy()) != good
    assert leaf_checksum(data[:-1024].copy()) != good
    zeroed = data.copy()
    zeroed[4096:8192] = 0
    assert leaf_checksum(zeroed) != good


def test_memory_tier_adopted_records_read_back_with_a_fresh_spec():
    """The engine's fast put (MemoryTier._adopt) keeps the spec it is given;
    ``get`` still returns a fresh, equal dict and verified leaves."""
    tier = MemoryTier()
    rec = record_of({"u": np.arange(50.0)}, step=3)
    tier._adopt("a", rec)
    got = tier.get("a")
    assert got.spec == rec.spec and got.spec is not rec.spec and got.checksums == rec.checksums
    got.spec["step"] = 99
    assert tier.get("a").spec["step"] == 3
    np.testing.assert_array_equal(got.leaves[0], np.arange(50.0))
    with pytest.raises(KeyError, match="already"):
        tier._adopt("a", rec)
    assert tier.used_bytes == 400


# -- corruption -------------------------------------------------------------------


def test_memory_tier_detects_a_buffer_modified_after_put():
    tier = MemoryTier()
    u = np.arange(100.0)
    tier.put("a", record_of({"u": u}, step=7))
    u[42] += 1e-12  # someone wrote into the buffer they handed over
    with pytest.raises(CorruptCheckpointError, match=r"record 'a' \(step 7\).*'memory'") as info:
        tier.get("a")
    assert (info.value.key, info.value.tier, info.value.step) == ("a", "memory", 7)


def test_compressed_tier_detects_a_flipped_byte_in_its_blob():
    tier = CompressedMemoryTier()
    tier.put("a", record_of(np.arange(1000.0), step=3))
    blob = tier._records["a"].blobs[0]
    data = bytearray(blob.data)
    data[len(data) // 2] ^= 0x10
    blob.data = bytes(data)
    with pytest.raises(CorruptCheckpointError) as info:
        tier.get("a")
    assert (info.value.key, info.value.step) == ("a", 3)


def _chunk_file(tier, key, leaf=0):
    leaf_dir = os.path.join(tier.path, key, str(leaf))
    (name,) = [f for f in os.listdir(leaf_dir) if f.startswith("c")]
    return os.path.join(leaf_dir, name)


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove"])
def test_zarr_tier_detects_a_damaged_chunk_file(damage, tmp_path):
    tier = ZarrTier(tmp_path / "s")
    tier.put("a", record_of({"u": np.arange(4096.0)}, step=11))
    path = _chunk_file(tier, "a")
    if damage == "flip":
        with open(path, "r+b") as f:
            f.seek(1234)
            byte = f.read(1)
            f.seek(1234)
            f.write(bytes([byte[0] ^ 1]))
    elif damage == "truncate":
        os.truncate(path, 100)
    else:
        os.remove(path)
    with pytest.raises(CorruptCheckpointError, match="record 'a' .step 11.") as info:
        tier.get("a")
    assert info.value.tier == tier.name and info.value.step == 11
    tier.close()
    with pytest.raises(CorruptCheckpointError):  # and after a restart
        ZarrTier(tmp_path / "s").get("a")


def test_zarr_tier_reports_a_damaged_record_metadata_after_reopen(tmp_path):
    tier = ZarrTier(tmp_path / "s")
    tier.put("a", record_of(np.ones(10)))
    tier.put("b", record_of(np.ones(10)))
    with open(tmp_path / "s" / "a" / "zarr.json", "r+b") as f:
        f.seek(60)
        f.write(b"\x00garbage")
    meta = json.loads((tmp_path / "s" / "b" / "zarr.json").read_text())
    meta["attributes"]["vlcc_adjoint"]["leaves"][0]["dtype"] = "|O"
    (tmp_path / "s" / "b" / "zarr.json").write_text(json.dumps(meta))
    tier.close()
    again = ZarrTier(tmp_path / "s")
    assert sorted(again.keys()) == ["a", "b"] and sorted(again.damaged()) == ["a", "b"]
    for key in "ab":
        with pytest.raises(CorruptCheckpointError, match="zarr.json") as info:
            again.get(key)
        assert info.value.path == str(tmp_path / "s" / key / "zarr.json")
        assert info.value.key == key and info.value.tier == again.name


# -- zarr: format, resume, crashes, disk errors ------------------------------------


@pytest.mark.parametrize("durable", [False, True])
def test_plain_zarr_opens_the_store_and_reads_the_same_arrays(tmp_path, durable):
    zarr = pytest.importorskip("zarr")
    tier = ZarrTier(tmp_path / "s", durable=durable)
    state = {
        "u": np.random.default_rng(0).standard_normal((64, 32)),
        "big": np.arange(7, dtype=">i8"),
        "b": np.array([True, False]),
        "c": np.array([1 + 1j], np.complex64),
        "z": np.array(2.5),
        "e": np.zeros((0, 3), np.float32),
        "h": np.arange(4, dtype=np.float16),
        "t": 0.25,
    }
    for i in range(3):
        tier.put(f"step{i}", record_of(state, step=i))
    tier.delete("step1")
    tier.put("step3", record_of(state, step=3))  # a recycled directory
    tier.close()
    again = ZarrTier(tmp_path / "s", mode="r+")  # resumed: a record of it replaced
    again.put("step0", record_of(state, step=0))
    again.close()
    group = zarr.open_group(str(tmp_path / "s"), mode="r")
    assert {"step0", "step2", "step3"} <= set(group.group_keys())
    leaves, spec = flatten(state)
    for key in ("step0", "step2", "step3"):
        rec_group = group[key]
        attrs = rec_group.attrs["vlcc_adjoint"]
        assert attrs["spec"]["step"] == int(key[4:]) and attrs["key"] == key
        for i, leaf in enumerate(leaves):
            arr = rec_group[str(i)]
            assert arr.shape == leaf.shape
            assert arr.dtype == leaf.dtype.newbyteorder("=")
            np.testing.assert_array_equal(arr[...], leaf)


def test_zarr_tier_reopens_an_existing_store_with_its_records_and_bytes(tmp_path):
    tier = ZarrTier(tmp_path / "s")
    states = {f"r{i}": {"u": np.full((i + 1, 3), float(i)), "i": i} for i in range(5)}
    for key, state in states.items():
        tier.put(key, record_of(state))
    tier.delete("r2")
    used = tier.used_bytes
    del states["r2"]
    tier.close()
    again = ZarrTier(tmp_path / "s")
    assert sorted(again.keys()) == sorted(states) and again.used_bytes == used
    for key, state in states.items():
        assert_same_state(state, restored(again, key))
    again.delete("r0")  # reopened records delete and recycle like new ones
    again.put("r9", record_of(states["r1"]))
    assert_same_state(states["r1"], restored(again, "r9"))
    assert again.used_bytes == disk_bytes(again.path)
    again.close()
    with pytest.raises(StorageError, match="capacity"):
        ZarrTier(tmp_path / "s", capacity_bytes=10)


def test_zarr_tier_lists_foreign_nodes_as_damaged_leaves_them_alone_and_refuses_non_zarr_directories(
    tmp_path,
):
    zarr = pytest.importorskip("zarr")
    root = zarr.open_group(str(tmp_path / "s"), mode="w")
    root.create_array("mesh", shape=(4,), dtype="f8")[...] = np.arange(4.0)
    tier = ZarrTier(tmp_path / "s")
    # Not a record, and not silently dropped: a damaged record looks the same.
    assert list(tier.keys()) == ["mesh"] and list(tier.damaged()) == ["mesh"]
    with pytest.raises(CorruptCheckpointError, match="not a record") as info:
        tier.get("mesh")
    assert info.value.path == str(tmp_path / "s" / "mesh" / "zarr.json")
    tier.put("a", record_of(np.ones(3)))
    with pytest.raises(StorageError, match="use another key"):
        tier.put("mesh", record_of(np.ones(3)))
    assert tier.used_bytes == disk_bytes(tier.path)
    np.testing.assert_array_equal(
        zarr.open_group(str(tmp_path / "s"), mode="r")["mesh"][...], np.arange(4.0)
    )
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "data.txt").write_text("hello")
    with pytest.raises(StorageError, match="not a zarr v3 group"):
        ZarrTier(tmp_path / "other")


_WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from vlcc_adjoint.state import flatten
    from vlcc_adjoint.storage import ZarrTier, make_record

    tier = ZarrTier(sys.argv[1], recycle=2)
    for i in range(10_000):
        state = {"u": np.full(300_000 + 1000 * (i % 7), float(i)), "v": np.arange(i % 50), "i": i}
        leaves, spec = flatten(state)
        tier.put(f"r{i}", make_record(spec, leaves))
        if i >= 3:
            tier.delete(f"r{i - 3}")
        print(i, flush=True)
""")


def test_kill_9_mid_run_leaves_a_store_that_reopens_with_every_complete_record(tmp_path):
    path = tmp_path / "s"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    done = []
    try:
        for line in proc.stdout:
            done.append(int(line))
            if len(done) >= 8 + random.Random(0).randrange(4):
                break
        proc.send_signal(signal.SIGKILL)  # mid-write of the next record, most likely
        proc.wait(timeout=30)
        done += [int(line) for line in proc.stdout.read().split()]  # printed before the kill
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(done) >= 8, "the writer died early"
    last = done[-1]
    tier = ZarrTier(path)
    keys = set(tier.keys())
    # After printing `last` the writer had r{last-2}..r{last}; it may have
    # completed r{last+1} and deleted r{last-2} since.  Nothing else is allowed.
    assert {f"r{last - 1}", f"r{last}"} <= keys
    assert keys <= {f"r{i}" for i in range(last - 2, last + 2)}
    for key in keys:
        i = int(key[1:])
        state = restored(tier, key)
        assert (
            state["i"] == i
            and np.all(state["u"] == float(i))
            and state["u"].size == 300_000 + 1000 * (i % 7)
        )
    assert tier.used_bytes == disk_bytes(path)
    assert sorted(os.listdir(path / ".vlcc-scratch")) == ["zarr.json"]  # scratch cleaned


def _failing_write(after_bytes, err=errno.ENOSPC):
    real = os.write
    written = [0]

    def write(fd, data):
        if written[0] >= after_bytes:
            raise OSError(err, os.strerror(err))
        n = real(fd, memoryview(data)[: max(1, min(len(data), after_bytes - written[0]))])
        written[0] += n
        return n

    return write


@pytest.mark.parametrize("after_bytes", [0, 5000])
@pytest.mark.parametrize("recycled", [False, True])
def test_disk_full_raises_storage_error_naming_the_key_and_leaves_nothing(
    after_bytes, recycled, tmp_path, monkeypatch
):
    tier = ZarrTier(tmp_path / "s")
    tier.put("keep", record_of({"u": np.ones(2000)}))
    if recycled:
        tier.put("old", record_of({"u": np.ones(2000)}))
        tier.delete("old")
    used = tier.used_bytes
    with monkeypatch.context() as m:
        m.setattr(os, "write", _failing_write(after_bytes))
        with pytest.raises(StorageError, match=r"record 'full' \(step 4\).*No space left") as info:
            tier.put("full", record_of({"u": np.ones(2000)}, step=4))
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOSPC
    assert tier.used_bytes == used and sorted(tier.keys()) == ["keep"]
    assert not (tmp_path / "s" / "full").exists()
    assert sorted(os.listdir(tmp_path / "s" / ".vlcc-scratch")) == ["zarr.json"]
    tier.put("full", record_of({"u": np.ones(2000)}))  # works once the disk has room
    tier.close()
    assert sorted(ZarrTier(tmp_path / "s").keys()) == ["full", "keep"]


def test_a_removed_store_directory_gives_storage_error_and_exact_accounting(tmp_path):
    import shutil

    tier = ZarrTier(tmp_path / "s")
    tier.put("a", record_of(np.ones(10)))
    shutil.rmtree(tmp_path / "s")
    with pytest.raises(StorageError, match=r"record 'b'.*removed"):
        tier.put("b", record_of(np.ones(10)))
    assert sorted(tier.keys()) == ["a"]
    tier.delete("a")  # its files are gone already; forgetting it still works
    assert tier.used_bytes == 0


def test_permission_denied_gives_storage_error_with_the_remedy(tmp_path, monkeypatch):
    tier = ZarrTier(tmp_path / "s")

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    with monkeypatch.context() as m:
        m.setattr(os, "mkdir", denied)
        with pytest.raises(StorageError, match=r"record 'a'.*writable"):
            tier.put("a", record_of(np.ones(10)))
    assert tier.used_bytes == 0 and list(tier.keys()) == []


def test_durable_mode_round_trips(tmp_path):
    tier = ZarrTier(tmp_path / "s", durable=True)
    for i in range(3):
        tier.put(f"a{i}", record_of({"u": np.arange(100.0) * i}))
    tier.delete("a1")
    tier.put("a3", record_of({"u": np.arange(100.0) * 3}))
    np.testing.assert_array_equal(
        ZarrTier(tmp_path / "s", mode="r").get("a3").leaves[0], np.arange(100.0) * 3
    )


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names fds through /proc")
def test_durable_put_syncs_every_file_and_directory_before_the_rename(tmp_path, monkeypatch):
    """Fresh and recycled records: every file and directory of the record,
    then the store root after the rename; the chunks leave the page cache."""
    tier = ZarrTier(tmp_path / "s", durable=True)
    events = []
    real_fsync, real_rename = os.fsync, os.rename
    fadvise = getattr(os, "posix_fadvise", None)

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(src, dst):
        events.append(("rename", os.fspath(dst)))
        real_rename(src, dst)

    def advise(fd, offset, length, advice):
        events.append(("drop", os.readlink(f"/proc/self/fd/{fd}")))
        fadvise(fd, offset, length, advice)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    if fadvise is not None:
        monkeypatch.setattr(os, "posix_fadvise", advise)
    state = {"u": np.arange(1000.0), "v": np.ones((3, 4), np.float32)}
    for key in ("a", "b"):  # "b" rewrites "a"'s recycled directory
        events.clear()
        tier.put(key, record_of(state))
        final = str(tmp_path / "s" / key)
        at = events.index(("rename", final))
        work = {p for kind, p in events[:at] if kind == "fsync"}
        root = min(work, key=len)  # the directory written, renamed to `final` after
        assert all(p == root or p.startswith(root + os.sep) for p in work)
        synced = {os.path.relpath(p, root) for p in work}
        on_disk = {
            os.path.relpath(os.path.join(d, f), final)
            for d, dirs, files in os.walk(final)
            for f in dirs + files
        } | {"."}
        # a recycled record keeps its leaves' unchanged metadata (synced when written)
        kept = {"0/zarr.json", "1/zarr.json"} if key == "b" else set()
        assert synced == on_disk - kept, (key, synced ^ (on_disk - kept))
        assert events[at + 1 :] == [("fsync", str(tmp_path / "s"))]
        if fadvise is not None:
            dropped = {os.path.relpath(p, root) for kind, p in events[:at] if kind == "drop"}
            assert dropped == {"0/c.0", "1/c.0.0"}
        if key == "a":
            tier.delete("a")
    np.testing.assert_array_equal(
        ZarrTier(tmp_path / "s", mode="r").get("b").leaves[0], np.arange(1000.0)
    )


def test_a_store_with_a_zarr_tier_writes_on_at_least_two_threads(tmp_path):
    with TieredStore([ZarrTier(tmp_path / "s")]) as store:
        assert "workers=" in repr(store)
        assert int(repr(store).rsplit("workers=", 1)[1].rstrip(")")) >= 2
    with TieredStore([MemoryTier(), ZarrTier(tmp_path / "t")], workers=1) as store:
        assert repr(store).endswith("workers=1)")  # an explicit count is kept
    expected = max(1, min(4, (os.cpu_count() or 2) - 1))
    with TieredStore([MemoryTier(), CompressedMemoryTier()]) as store:
        assert repr(store).endswith(f"workers={expected})")


def test_recycled_directories_are_rewritten_exactly_across_changing_layouts(tmp_path):
    tier = ZarrTier(tmp_path / "s", recycle=2)
    rng = random.Random(3)
    live = {}
    for i in range(60):
        nleaves = rng.randint(1, 4)
        state = []
        for _ in range(nleaves):
            leaf = (np.arange(rng.randint(0, 40)) % 3).astype(
                rng.choice(["<f8", ">f4", "|b1", "<i2"])
            )
            state.append(leaf.reshape(-1, 1) if rng.random() < 0.3 else leaf)
        key = f"k{i}" + "x" * rng.randint(0, 30)
        tier.put(key, record_of(state, step=i))
        live[key] = state
        if len(live) > 3:
            old = rng.choice(sorted(live))
            tier.delete(old)
            del live[old]
        assert tier.used_bytes == disk_bytes(tier.path)
    again = ZarrTier(tmp_path / "s", mode="r")
    for key, state in live.items():
        assert_same_state(state, restored(again, key))
    assert again.used_bytes == tier.used_bytes


def test_zarr_tier_capacity_counts_recycled_directories(tmp_path):
    rec = record_of(np.ones(1000))
    probe = ZarrTier(tmp_path / "p")
    probe.put("a", rec)
    one = probe.used_bytes
    tier = ZarrTier(tmp_path / "s", capacity_bytes=2 * one, recycle=4)
    tier.put("a", rec)
    tier.put("b", rec)
    tier.delete("a")
    tier.delete("b")
    assert tier.used_bytes == 0 and tier.recycled_bytes == 2 * one
    tier.put("c", record_of(np.ones(2000)))  # needs the room the recycled directories hold
    assert tier.used_bytes + tier.recycled_bytes <= 2 * one
    np.testing.assert_array_equal(tier.get("c").leaves[0], np.ones(2000))
    tier.close()
    assert tier.recycled_bytes == 0
