"""Per-leaf integrity checksums: xxh3-64 of the leaf's bytes.

Why xxh3-64: it detects the failures a checkpoint store meets (a flipped
bit, a torn or truncated write, a chunk file from another record) with
probability 1 - 2^-64, and it is fast enough to check on every ``get``.  It
is not a cryptographic hash: it protects against accidents, not against an
attacker who can write to the store.

Two implementations of the *same* function, with bit-identical digests
(``tests/storage/test_checksum.py`` checks them against the ``xxhash`` package for
every length class and alignment, so the stored format, 16 hexadecimal
digits, is unchanged and records written before still verify):

* ``xxhash`` (C) for leaves below :data:`KERNEL_MIN_BYTES`, where a
  kernel call's fixed cost outweighs the pass it saves, and, with
  ``np.copyto`` for the copy, on a big-endian host (the only case where the
  kernel is not used: it reads the input as little-endian words; a warning
  says so once).
* The kernel of :mod:`._xxh3` for larger leaves: XXH3's long-input loop
  with explicit 8-lane vectors, compiled once per process at the first
  large leaf, run with the GIL released (a worker thread hashing does not
  stop the caller).  :func:`copy_checksum` copies a leaf and hashes it in
  the *same pass*: the source is read once and the hash rides on the
  copy's memory traffic, so the store's capture (``save``) and restore
  (``load``) each cost one pass instead of two; the capture writes leaves
  of :data:`STREAM_MIN_BYTES` and more with streaming (non-temporal)
  stores.  A kernel that fails to compile, or disagrees with ``xxhash`` on
  its self-test, raises: it is never replaced silently.

Records are made here (:func:`make_record`: the checksums are computed
once, at capture), and so are the checks every tier implementation applies
to them: :func:`check_record` on ``put`` (cheap: no hashing),
:func:`encode_spec` (the spec is strict JSON), :func:`verify_leaves` on
``get``, :func:`check_capacity`; the errors they raise are built by
:meth:`~vlcc_adjoint.storage.CorruptCheckpointError.in_record` and
:meth:`~vlcc_adjoint.storage.TierFullError.no_room`.  The package exports
them for tiers written elsewhere (the MPI tier, third parties).

``benchmarks/bench_store_calls.py`` measures every path (and whole ``save``
and ``load`` calls) against ``np.copyto`` of the same bytes; its results
live in ``benchmarks/results/``.

Reference: Y. Collet, xxHash, XXH3 (``xxhash.h`` v0.8, ``doc/xxhash_spec.md``),
https://github.com/Cyan4973/xxHash.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import xxhash

from ..errors import VlccTypeError, VlccValueError
from ..state import byte_view
from ._tier import CorruptCheckpointError, Record, check_key

__all__ = [
    "bytes_checksum",
    "check_capacity",
    "check_record",
    "copy_checksum",
    "direct_hash",
    "encode_spec",
    "leaf_checksum",
    "make_record",
    "step_of",
    "verify_leaves",
]

# xxhash holds the GIL while it hashes: hashing in slices of this many bytes
# bounds the time other threads (the engine's workers, the solver) wait.
_SLICE = 8 << 20

_HEX16 = re.compile(r"[0-9a-f]{16}")
# One encoder, built once: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))

#: ``xxhash.xxh3_64_hexdigest``, typed for what it is given here: numpy arrays,
#: whose buffer it reads directly (their stubs do not declare the buffer protocol).
_xxh3_64_hex: Callable[[Any], str] = xxhash.xxh3_64_hexdigest

#: Leaves at least this large are hashed (and copied) by the kernel; below
#: it the call's fixed cost (a microsecond or two) outweighs the pass it saves.
KERNEL_MIN_BYTES = 128 << 10
#: ``copy_checksum(stream=True)`` streams leaves at least this large: a
#: capture that size would push the solver's working set out of a 2 MiB L2
#: and pay a read for ownership of every destination line.  Smaller leaves
#: are written through the caches: there the solver's data survives the
#: copy, and streaming them measured slower in the seismic example's runs.
STREAM_MIN_BYTES = 1 << 20


def bytes_checksum(data) -> str:
    """xxh3-64 of a bytes-like object, as 16 hexadecimal characters."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    if len(view) <= _SLICE:
        return xxhash.xxh3_64_hexdigest(view)
    h = xxhash.xxh3_64()
    for start in range(0, len(view), _SLICE):
        h.update(view[start : start + _SLICE])
    return h.hexdigest()


def leaf_checksum(arr: np.ndarray) -> str:
    """xxh3-64 of a C-contiguous array's bytes (16 hexadecimal characters).

    Only the bytes are hashed; dtype and shape are checked against the
    record's metadata separately.  Large leaves are hashed with the GIL
    released (the kernel), so a worker thread hashing does not stop the
    caller's thread.
    """
    if not arr.flags.c_contiguous:
        raise VlccValueError("leaf_checksum needs a C-contiguous array")
    n = arr.nbytes
    if n >= KERNEL_MIN_BYTES and _LITTLE:
        kernels = _KERNELS or _build()
        if kernels:
            arr = _operand(arr)
            return f"{kernels[1](arr, arr, n):016x}"
    if n <= _SLICE:
        try:  # numpy hands xxhash its contiguous buffer directly
            return _xxh3_64_hex(arr)
        except (BufferError, TypeError, ValueError):
            pass
    return bytes_checksum(byte_view(arr))


def direct_hash(dtype: np.dtype, shape: tuple) -> Callable[[np.ndarray], str] | None:
    """``xxhash``'s own hex digest function if :func:`leaf_checksum` of a
    C-contiguous array of `dtype` and `shape` is exactly that call (a leaf
    below :data:`KERNEL_MIN_BYTES` whose dtype exports a buffer), else
    ``None``.  A store decides this once per state structure and then
    hashes each small leaf with one C call."""
    if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize >= KERNEL_MIN_BYTES:
        return None
    try:
        _xxh3_64_hex(np.empty(shape, dtype))
    except (BufferError, TypeError, ValueError):
        return None
    return _xxh3_64_hex


def copy_checksum(src: np.ndarray, dst: np.ndarray, *, stream: bool = False) -> str:
    """Copy `src` into `dst` and return xxh3-64 of the bytes copied.

    Equal to ``np.copyto(dst, src); leaf_checksum(dst)``, in one pass over
    `src` for leaves of :data:`KERNEL_MIN_BYTES` and more.

    **Arguments:**

    - `src`: a C-contiguous array.
    - `dst`: a C-contiguous, writeable array of the same dtype and shape
      that does not overlap `src`.
    - `stream`: write `dst` with non-temporal stores (from
      :data:`STREAM_MIN_BYTES`): for a copy nobody reads soon (a capture),
      which then neither waits for `dst`'s old contents nor evicts the
      caller's working set from the caches.
    """
    n = src.nbytes
    if (
        n >= KERNEL_MIN_BYTES
        and _LITTLE
        and src.dtype == dst.dtype
        and src.shape == dst.shape
        and src.flags.c_contiguous
        and dst.flags.c_contiguous
        and dst.flags.writeable
    ):
        kernels = _KERNELS or _build()
        if kernels:
            k = kernels[2] if stream and n >= STREAM_MIN_BYTES else kernels[0]
            return f"{k(_operand(src), _operand(dst), n):016x}"
    np.copyto(dst, src, casting="no")
    return leaf_checksum(dst)


# -- the kernel, built on first use --------------------------------------------------

#: The kernel reads the input as little-endian 64-bit words (XXH3's
#: definition); on a big-endian host np.copyto + xxhash do the work.
_LITTLE = sys.byteorder == "little"
_KERNELS = None  # (copy, hash, stream), each f(src, dst, nbytes), once built; () on big-endian
_ENGINE = None  # owns the kernels' machine code
_BUILD_LOCK = threading.Lock()
# Dtypes the kernels take as they are (numba types them); the others
# (float16, long double, non-native byte order, records, strings, dates)
# are passed as a byte view of the same memory.
_DIRECT = frozenset(
    np.dtype(t)
    for t in (
        np.bool_,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.float32,
        np.float64,
        np.complex64,
        np.complex128,
    )
)


def _operand(arr: np.ndarray) -> np.ndarray:
    """`arr` as a kernel takes it: itself, or its bytes (same memory)."""
    return arr if arr.dtype in _DIRECT else arr.view(np.uint8)


def _build():
    """The kernels (compiled once per process), or ``()`` on a big-endian
    host, with a warning.  Compile or self-test failures raise."""
    global _KERNELS, _ENGINE
    with _BUILD_LOCK:
        if _KERNELS is not None:
            return _KERNELS
        if not _LITTLE:
            warnings.warn(
                "vlcc_adjoint: this host is big-endian; checkpoint checksums use "
                "np.copyto + xxhash (the same digests, one more pass over the data)",
                RuntimeWarning,
                stacklevel=3,
            )
            _KERNELS = ()
            return _KERNELS
        from ._xxh3 import build

        _ENGINE, _KERNELS = build()
        return _KERNELS


# -- records and the checks every tier implementation shares --------------------------


def make_record(spec: dict, leaves: Sequence[np.ndarray]) -> Record:
    """A :class:`Record` of `leaves` with their checksums computed now.

    **Arguments:**

    - `spec`: the state's JSON spec (:func:`vlcc_adjoint.state.flatten`),
      optionally with metadata; an integer ``spec["step"]`` is named in
      corruption reports.
    - `leaves`: numpy arrays.  C-contiguous ones are kept by reference (the
      caller hands them over); others are copied to C order once.

    **Returns:** the record, whose ``checksums`` are xxh3-64 of each leaf's
    bytes (:func:`leaf_checksum`), verified by every tier on ``get``.
    """
    out = []
    for i, leaf in enumerate(leaves):
        if type(leaf) is not np.ndarray:
            raise VlccTypeError(
                f"leaf {i} is a {type(leaf).__name__}; records hold numpy arrays "
                "(flatten the state with vlcc_adjoint.state.flatten first)"
            )
        if leaf.dtype.hasobject:
            raise VlccTypeError(
                f"leaf {i} is an object array, which cannot be stored without pickle; "
                "convert it to a numeric dtype"
            )
        out.append(leaf if leaf.flags.c_contiguous else np.ascontiguousarray(leaf))
    return Record(spec, tuple(out), tuple(leaf_checksum(leaf) for leaf in out))


def step_of(spec: object) -> int | None:
    """The checkpointed step a spec carries (``spec["step"]``), if any."""
    step = spec.get("step") if isinstance(spec, dict) else None
    return step if type(step) is int else None


#: :meth:`CorruptCheckpointError.in_record`, under the name the tiers use.
def check_record(key: str, record: Record) -> None:
    """Validate what a tier is asked to store (cheap: no hashing)."""
    check_key(key)
    if not isinstance(record, Record):
        raise VlccTypeError(
            f"tiers store Record objects, got {type(record).__name__}; build one "
            "with vlcc_adjoint.storage.make_record(spec, leaves)"
        )
    if len(record.checksums) != len(record.leaves):
        raise VlccValueError(
            f"record {key!r} has {len(record.leaves)} leaves but "
            f"{len(record.checksums)} checksums; build it with make_record"
        )
    for i, checksum in enumerate(record.checksums):
        if not (type(checksum) is str and _HEX16.fullmatch(checksum)):
            raise VlccValueError(
                f"checksum {i} of record {key!r} is {checksum!r}, not 16 hex digits "
                "(xxh3-64); build the record with make_record"
            )
    for i, leaf in enumerate(record.leaves):
        if type(leaf) is not np.ndarray or not leaf.flags.c_contiguous or leaf.dtype.hasobject:
            raise VlccTypeError(
                f"leaf {i} of record {key!r} must be a C-contiguous numpy array of a "
                "non-object dtype; build the record with make_record"
            )


def encode_spec(key: str, spec: Any) -> str:
    """``spec`` as strict JSON text (no NaN/Infinity), or a ``ValueError`` naming the key."""
    try:
        return _ENCODER.encode(spec)
    except (TypeError, ValueError) as err:
        raise VlccValueError(
            f"the spec of record {key!r} is not pure JSON ({err}); specs hold only dicts, lists, "
            "strings, finite numbers, bools and None (vlcc_adjoint.state.flatten makes such specs)"
        ) from None


def verify_leaves(
    leaves: Sequence[np.ndarray], checksums: Sequence[str], key: str, tier: str, step: int | None
) -> None:
    """Recompute every leaf's checksum (:func:`leaf_checksum`) and compare it with
    `checksums`, the record's; a mismatch raises :class:`CorruptCheckpointError`
    naming record `key` (of `step`) in tier `tier` and the leaf."""
    for i, (leaf, want) in enumerate(zip(leaves, checksums)):
        got = leaf_checksum(leaf)
        if got != want:
            raise CorruptCheckpointError.in_record(
                f"leaf {i} ({leaf.dtype.str}{list(leaf.shape)}) has checksum {got}, "
                f"the record says {want}",
                key,
                tier,
                step,
            )


def check_capacity(capacity_bytes: int | np.integer | None) -> int | None:
    """``capacity_bytes`` validated: ``None`` (unbounded) or an int >= 0."""
    if capacity_bytes is None:
        return None
    if (
        isinstance(capacity_bytes, (bool, float))
        or not isinstance(capacity_bytes, (int, np.integer))
        or capacity_bytes < 0
    ):
        raise VlccValueError(
            f"capacity_bytes must be None (unbounded) or an int >= 0, got {capacity_bytes!r}"
        )
    return int(capacity_bytes)


#: :meth:`TierFullError.no_room`, under the name the tiers use.
