"""Per-leaf integrity checksums: xxh3-64 of the leaf's bytes.

Why xxh3-64: it detects the failures a checkpoint store meets (a flipped
bit, a torn or truncated write, a chunk file from another record) with
probability 1 - 2^-64 and runs at 6-10 GB/s on one core of the shared
2-core VM (``benchmarks/bench_tiers.py``; ~20 GB/s on a desktop), faster than
copying a large state (1.5-3 GB/s there), so checking every ``get`` is
affordable.  It is not a
cryptographic hash: it protects against accidents, not against an attacker
who can write to the store.

``xxhash`` holds the GIL while hashing, so large leaves are hashed in 8 MiB
slices: the solver's thread and the engine's other workers get the
interpreter back between slices instead of waiting for a whole leaf.
"""

from __future__ import annotations

import json
import re

import numpy as np
import xxhash

from ..state import _SLICE, byte_view
from ._tier import CorruptCheckpointError, Record, TierFullError, check_key

__all__ = ["bytes_checksum", "leaf_checksum"]

_HEX16 = re.compile(r"[0-9a-f]{16}")
# One encoder, built once: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def bytes_checksum(data) -> str:
    """xxh3-64 of a bytes-like object, as 16 hexadecimal characters."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    if len(view) <= _SLICE:
        return xxhash.xxh3_64_hexdigest(view)
    h = xxhash.xxh3_64()
    for start in range(0, len(view), _SLICE):
        h.update(view[start:start + _SLICE])
    return h.hexdigest()


def leaf_checksum(arr: np.ndarray) -> str:
    """xxh3-64 of a C-contiguous array's bytes (16 hexadecimal characters).

    Only the bytes are hashed; dtype and shape are checked against the
    record's metadata separately.
    """
    if not arr.flags.c_contiguous:
        raise ValueError("leaf_checksum needs a C-contiguous array")
    return bytes_checksum(byte_view(arr))


# -- helpers shared by the tier implementations ----------------------------------

def step_of(spec) -> int | None:
    """The checkpointed step a spec carries (``spec["step"]``), if any."""
    step = spec.get("step") if isinstance(spec, dict) else None
    return step if type(step) is int else None


def where(key: str, tier: str, step: int | None) -> str:
    """``"record 'k' (step 7) in tier 'memory'"``, for messages."""
    at = f" (step {step})" if step is not None else ""
    return f"record {key!r}{at} in tier {tier!r}"


def corrupt(message: str, key: str, tier: str, step: int | None) -> CorruptCheckpointError:
    """A :class:`CorruptCheckpointError` whose message names the record and says what to do."""
    return CorruptCheckpointError(
        f"{where(key, tier, step)} is corrupt: {message}. The stored data was damaged or "
        "modified after it was saved; delete the record and recompute the state from an "
        "earlier checkpoint",
        key=key, tier=tier, step=step,
    )


def check_record(key: str, record: Record) -> None:
    """Validate what a tier is asked to store (cheap: no hashing)."""
    check_key(key)
    if not isinstance(record, Record):
        raise TypeError(f"tiers store Record objects, got {type(record).__name__}; build one "
                        "with vlcc_adjoint.storage.make_record(spec, leaves)")
    if len(record.checksums) != len(record.leaves):
        raise ValueError(f"record {key!r} has {len(record.leaves)} leaves but "
                         f"{len(record.checksums)} checksums; build it with make_record")
    for i, checksum in enumerate(record.checksums):
        if not (type(checksum) is str and _HEX16.fullmatch(checksum)):
            raise ValueError(f"checksum {i} of record {key!r} is {checksum!r}, not 16 hex digits "
                             "(xxh3-64); build the record with make_record")
    for i, leaf in enumerate(record.leaves):
        if type(leaf) is not np.ndarray or not leaf.flags.c_contiguous or leaf.dtype.hasobject:
            raise TypeError(f"leaf {i} of record {key!r} must be a C-contiguous numpy array of a "
                            "non-object dtype; build the record with make_record")


def encode_spec(key: str, spec) -> str:
    """``spec`` as strict JSON text (no NaN/Infinity), or a ``ValueError`` naming the key."""
    try:
        return _ENCODER.encode(spec)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"the spec of record {key!r} is not pure JSON ({err}); specs hold only dicts, lists, "
            "strings, finite numbers, bools and None (vlcc_adjoint.state.flatten makes such specs)"
        ) from None


def verify_leaves(leaves, checksums, key: str, tier: str, step: int | None) -> None:
    """Recompute every leaf's checksum; :class:`CorruptCheckpointError` on a mismatch."""
    for i, (leaf, want) in enumerate(zip(leaves, checksums)):
        got = leaf_checksum(leaf)
        if got != want:
            raise corrupt(f"leaf {i} ({leaf.dtype.str}{list(leaf.shape)}) has checksum {got}, "
                          f"the record says {want}", key, tier, step)


def check_capacity(capacity_bytes) -> int | None:
    """``capacity_bytes`` validated: ``None`` (unbounded) or an int >= 0."""
    if capacity_bytes is None:
        return None
    if isinstance(capacity_bytes, (bool, float)) or not isinstance(capacity_bytes, (int, np.integer)) \
            or capacity_bytes < 0:
        raise ValueError(f"capacity_bytes must be None (unbounded) or an int >= 0, got {capacity_bytes!r}")
    return int(capacity_bytes)


def full(key: str, tier: str, need: int, used: int, capacity: int) -> TierFullError:
    """A :class:`TierFullError` with the numbers and the remedy."""
    return TierFullError(
        f"record {key!r} needs {need} bytes but tier {tier!r} has {capacity - used} of "
        f"{capacity} free; delete records first (the engine evicts), or give the tier a larger "
        "capacity_bytes"
    )

