"""The storage-tier protocol: what every level of the hierarchy implements.

A *tier* is a keyed store of :class:`Record` objects with a hard capacity.
It is deliberately small (zarr-python's ``Store`` is the model): ``put``,
``get``, ``delete``, ``keys`` and two byte counters.  Everything above a tier
(the asynchronous :class:`~vlcc_adjoint.storage.TieredStore`, the lineage)
talks to this interface only, so a new tier is one small class.

Contract, checked by ``tests/test_tiers.py`` for every implementation:

* ``used_bytes <= capacity_bytes`` at all times.  A ``put`` that does not fit
  raises :class:`TierFullError` and changes nothing; a tier never evicts on
  its own (eviction is the engine's decision, made with the schedule's
  foreknowledge).
* ``get`` returns a record equal to the one ``put`` (same spec, same leaf
  bytes) or raises: :class:`KeyError` when the key is absent,
  :class:`CorruptCheckpointError` when a checksum does not match.  Never a
  silently wrong record.  (A tier with a lossy codec returns the decoded
  approximation, with checksums of what it returns.)
* Keys are short strings of ``[A-Za-z0-9_.-]`` not starting with ``.``
  (:func:`check_key`), so no key can name a path outside a tier's directory.
* Tiers are safe to call from the engine's worker threads: an implementation
  serialises its own bookkeeping.

Records are made with :func:`make_record`, which computes the per-leaf
xxh3-64 checksums once, at capture; tiers verify them on every ``get``.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from collections.abc import Iterator

import numpy as np

__all__ = [
    "CorruptCheckpointError",
    "Record",
    "StorageError",
    "Tier",
    "TierFullError",
    "check_key",
    "make_record",
]

_KEY = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,199}")


class StorageError(RuntimeError):
    """A storage operation failed; the message names the step, tier and cause."""


class TierFullError(StorageError):
    """A record does not fit in a tier's remaining capacity."""


class CorruptCheckpointError(StorageError):
    """A stored record failed its integrity check (checksum or structure).

    **Attributes:** `key` (the record), `tier` (the tier's name), `step`
    (the checkpointed step, when known) and `path` (the damaged file, when
    the damage is in one).
    """

    def __init__(self, message: str, *, key: str | None = None, tier: str | None = None,
                 step: int | None = None, path: str | None = None):
        super().__init__(message)
        self.key = key
        self.tier = tier
        self.step = step
        self.path = path


def check_key(key: str) -> str:
    """``key`` if it is a safe record key, else a ``ValueError`` saying why."""
    if not isinstance(key, str) or _KEY.fullmatch(key) is None:
        raise ValueError(
            f"invalid record key {key!r}: use 1-200 characters of A-Z a-z 0-9 _ . - "
            "not starting with '.' (keys must not name paths outside the store)"
        )
    return key


@dataclasses.dataclass(frozen=True)
class Record:
    """One checkpoint in flattened form: the unit every tier stores.

    **Attributes:**

    - `spec`: the JSON-serialisable structure of the state
      (:func:`vlcc_adjoint.state.flatten`), plus any metadata.
    - `leaves`: the state's arrays, C-contiguous.  A tier may keep these
      arrays by reference: whoever hands a record to ``put`` gives up the
      right to modify them.
    - `checksums`: one integrity hash per leaf (hex strings), computed once
      when the record is made and verified by every tier on ``get``.
    """

    spec: dict
    leaves: tuple[np.ndarray, ...]
    checksums: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of leaf data (uncompressed)."""
        return sum(leaf.nbytes for leaf in self.leaves)


def make_record(spec: dict, leaves) -> Record:
    """A :class:`Record` of `leaves` with their checksums computed now.

    **Arguments:**

    - `spec`: the state's JSON spec (:func:`vlcc_adjoint.state.flatten`),
      optionally with metadata; an integer ``spec["step"]`` is named in
      corruption reports.
    - `leaves`: numpy arrays.  C-contiguous ones are kept by reference (the
      caller hands them over); others are copied to C order once.

    **Returns:** the record, whose ``checksums`` are xxh3-64 of each leaf's
    bytes, verified by every tier on ``get``.
    """
    from ._checksum import leaf_checksum  # here: _checksum imports this module

    out = []
    for i, leaf in enumerate(leaves):
        if type(leaf) is not np.ndarray:
            raise TypeError(f"leaf {i} is a {type(leaf).__name__}; records hold numpy arrays "
                            "(flatten the state with vlcc_adjoint.state.flatten first)")
        if leaf.dtype.hasobject:
            raise TypeError(f"leaf {i} is an object array, which cannot be stored without pickle; "
                            "convert it to a numeric dtype")
        out.append(leaf if leaf.flags.c_contiguous else np.ascontiguousarray(leaf))
    return Record(spec, tuple(out), tuple(leaf_checksum(leaf) for leaf in out))


class Tier(abc.ABC):
    """A storage level: a keyed store of :class:`Record` with a hard capacity.

    Subclasses set :attr:`name` and implement the five abstract methods;
    ``capacity_bytes`` is ``None`` for unbounded.  A tier whose ``put``
    keeps the leaf arrays by reference (no I/O, like
    :class:`~vlcc_adjoint.storage.MemoryTier`) sets ``retains_references =
    True``: a :class:`~vlcc_adjoint.storage.TieredStore` then writes to it
    in the caller instead of on a worker thread.
    """

    name: str = "tier"
    capacity_bytes: int | None = None

    @property
    @abc.abstractmethod
    def used_bytes(self) -> int:
        """Bytes this tier holds now (after compression, for compressed tiers)."""

    @abc.abstractmethod
    def put(self, key: str, record: Record) -> None:
        """Store `record` under `key` (replacing nothing: the key must be new).

        Raises :class:`TierFullError` if it does not fit, ``KeyError`` if the
        key is taken.
        """

    @abc.abstractmethod
    def get(self, key: str) -> Record:
        """The record under `key`, verified; ``KeyError`` if absent."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the record under `key`; ``KeyError`` if absent."""

    @abc.abstractmethod
    def keys(self) -> Iterator[str]:
        """The keys of all complete records."""

    def __contains__(self, key: str) -> bool:
        return key in set(self.keys())

    def free_bytes(self) -> int | None:
        """Capacity left, or ``None`` when unbounded."""
        if self.capacity_bytes is None:
            return None
        return self.capacity_bytes - self.used_bytes

    def close(self) -> None:
        """Release resources (files, pools).  Idempotent."""

    def __repr__(self) -> str:
        cap = "unbounded" if self.capacity_bytes is None else f"{self.capacity_bytes} B"
        return f"{type(self).__name__}(used={self.used_bytes} B, capacity={cap})"
