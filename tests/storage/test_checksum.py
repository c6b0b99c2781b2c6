"""The checksum kernel: xxh3-64 bit for bit (the xxhash package is the
referee), for every length class, alignment and dtype; the one fallback
(a big-endian host) says so and gives the same digests; a kernel that
disagrees with xxhash is refused, never used."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash

from vlcc_adjoint.storage import _checksum, _xxh3
from vlcc_adjoint.storage._checksum import (
    KERNEL_MIN_BYTES,
    STREAM_MIN_BYTES,
    copy_checksum,
    leaf_checksum,
)


def _lengths():
    """Byte lengths around XXH3's stripe (64) and block (1024) boundaries and
    the module's thresholds, whole and partial 8-byte words."""
    sizes = {241, 255, 256, 257, 1023, 1024, 1025, 1087, 4099}
    for edge in (KERNEL_MIN_BYTES, STREAM_MIN_BYTES):
        sizes |= {edge - 65, edge - 1, edge, edge + 1, edge + 63, edge + 1024 + 7}
    return sorted(sizes)


@pytest.mark.parametrize("stream", [False, True])
def test_kernels_are_xxh3_64_for_every_length_class_and_alignment(stream):
    copy_kernel, hash_kernel = _checksum._build()[2 if stream else 0], _checksum._build()[1]
    rng = np.random.default_rng(2)
    for n in _lengths():
        raw = rng.integers(0, 256, n + 16, dtype=np.uint8)
        for offset in (0, 1, 3, 8):
            src = raw[offset : offset + n]
            want = xxhash.xxh3_64_intdigest(src)
            assert hash_kernel(src, src, n) == want, (n, offset)
            for dst_offset in (0, 1, 8):
                dst = np.full(n + dst_offset, 7, np.uint8)[dst_offset:]
                assert copy_kernel(src, dst, n) == want, (n, offset, dst_offset)
                np.testing.assert_array_equal(dst, src)


@pytest.mark.parametrize(
    "dtype",
    ["<f8", "<f4", "<c16", "<i2", "?", "<f2", ">f8", "<M8[s]", [("a", "<i4"), ("b", "<f8")]],
)
def test_copy_checksum_and_leaf_checksum_hash_the_bytes_of_any_dtype(dtype):
    """Large leaves of any dtype (numba-typed or passed as bytes) and read-only
    sources: the digest is xxh3-64 of the bytes, the copy exact."""
    dtype = np.dtype(dtype)
    count = (STREAM_MIN_BYTES + 4096) // dtype.itemsize
    raw = np.random.default_rng(3).integers(0, 256, count * dtype.itemsize, dtype=np.uint8)
    src = raw.view(dtype).reshape(-1, 1 if count % 2 else 2)
    src.flags.writeable = False
    want = xxhash.xxh3_64_hexdigest(raw)
    for stream in (False, True):
        dst = np.zeros_like(src)
        assert copy_checksum(src, dst, stream=stream) == want
        assert dst.tobytes() == raw.tobytes()
    assert leaf_checksum(src) == want


def test_small_leaves_take_xxhash_with_the_same_digests():
    x = np.arange(1000.0)
    y = np.empty_like(x)
    assert copy_checksum(x, y) == xxhash.xxh3_64_hexdigest(x) == leaf_checksum(x)
    np.testing.assert_array_equal(x, y)


def test_a_big_endian_host_falls_back_to_copyto_and_xxhash_and_says_so(monkeypatch):
    monkeypatch.setattr(_checksum, "_LITTLE", False)
    monkeypatch.setattr(_checksum, "_KERNELS", None)
    x = np.random.default_rng(1).standard_normal(STREAM_MIN_BYTES // 8 + 3)
    y = np.empty_like(x)
    with pytest.warns(RuntimeWarning, match="big-endian"):
        assert _checksum._build() == ()
    assert copy_checksum(x, y, stream=True) == xxhash.xxh3_64_hexdigest(x)
    assert leaf_checksum(x) == xxhash.xxh3_64_hexdigest(x)
    np.testing.assert_array_equal(x, y)


def test_a_kernel_that_disagrees_with_xxhash_is_refused(monkeypatch):
    class Off:
        @staticmethod
        def xxh3_64_intdigest(data):
            return (xxhash.xxh3_64_intdigest(data) + 1) % (1 << 64)

    monkeypatch.setattr(_xxh3, "xxhash", Off)
    with pytest.raises(RuntimeError, match="disagrees with xxhash"):
        _xxh3.build()


def test_a_kernel_that_fails_to_build_raises_instead_of_falling_back(monkeypatch):
    def broken():
        raise OSError("no code generator for this target")

    monkeypatch.setattr(_checksum, "_KERNELS", None)
    monkeypatch.setattr(_xxh3, "_compile", broken)
    with pytest.raises(OSError, match="no code generator"):
        leaf_checksum(np.zeros(KERNEL_MIN_BYTES // 8))
