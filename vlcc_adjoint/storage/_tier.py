"""The storage-tier protocol: what every level of the hierarchy implements.

A *tier* is a keyed store of :class:`Record` objects with a hard capacity.
It is deliberately small (zarr-python's ``Store`` is the model): ``put``,
``get``, ``delete``, ``keys`` and two byte counters.  Everything above a tier
(the asynchronous :class:`~vlcc_adjoint.storage.TieredStore`, the lineage)
talks to this interface only, so a new tier is one small class.

Contract, checked by ``tests/storage/test_tiers.py`` for every implementation:

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

Records are made with :func:`~vlcc_adjoint.storage.make_record`, which
computes the per-leaf xxh3-64 checksums once, at capture; tiers verify them
on every ``get``.  This module depends on nothing else of the storage
package: the checksums (and ``make_record``) are in :mod:`._checksum`, which
builds on the types defined here.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from collections.abc import Iterator

import numpy as np

from ..errors import VlccError, VlccValueError

__all__ = [
    "CorruptCheckpointError",
    "Record",
    "StorageError",
    "Tier",
    "TierFullError",
    "check_key",
]

#: The capabilities that describe a method (see :class:`Tier`): a subclass
#: that defines the method anew must declare them anew.
_DESCRIBES = {
    "put": ("copies_on_put",),
    "get": ("serves_put_arrays", "fresh_gets", "reads_into"),
    "adopt": ("adopts_leaves",),
    "adopt_leaves": ("adopts_leaves",),
}

_KEY = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,199}")


class StorageError(VlccError, RuntimeError):
    """A storage operation failed; the message names the step, tier and cause."""


class TierFullError(StorageError):
    """A record does not fit in a tier's remaining capacity."""

    @classmethod
    def no_room(cls, key: str, tier: str, need: int, used: int, capacity: int) -> TierFullError:
        """The error of a ``put`` of record `key` that needs `need` bytes in
        tier `tier`, which holds `used` of its `capacity`: the numbers and the
        remedy."""
        return cls(
            f"record {key!r} needs {need} bytes but tier {tier!r} has {capacity - used} of "
            f"{capacity} free; delete records first (the engine evicts), or give the tier a "
            "larger capacity_bytes"
        )


class CorruptCheckpointError(StorageError):
    """A stored record failed its integrity check (checksum or structure).

    **Attributes:** `key` (the record), `tier` (the tier's name), `step`
    (the checkpointed step, when known) and `path` (the damaged file, when
    the damage is in one).
    """

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        tier: str | None = None,
        step: int | None = None,
        path: str | None = None,
    ):
        super().__init__(message)
        self.key = key
        self.tier = tier
        self.step = step
        self.path = path

    @classmethod
    def in_record(
        cls, problem: str, key: str, tier: str, step: int | None, path: str | None = None
    ) -> CorruptCheckpointError:
        """The error of record `key` (of checkpointed `step`, when known) in tier
        `tier`, whose data failed a check: `problem` says which (and `path`
        names the damaged file, when the damage is in one); the message says
        what to do."""
        at = f" (step {step})" if step is not None else ""
        return cls(
            f"record {key!r}{at} in tier {tier!r} is corrupt: {problem}. The stored data was "
            "damaged or modified after it was saved; delete the record and recompute the "
            "state from an earlier checkpoint",
            key=key,
            tier=tier,
            step=step,
            path=path,
        )


def check_key(key: str) -> str:
    """``key`` if it is a safe record key, else a ``ValueError`` saying why."""
    if not isinstance(key, str) or _KEY.fullmatch(key) is None:
        raise VlccValueError(
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


class Tier(abc.ABC):
    """A storage level: a keyed store of :class:`Record` with a hard capacity.

    Subclasses set :attr:`name` and implement the five abstract methods;
    ``capacity_bytes`` is ``None`` for unbounded.

    **Capabilities.**  Like zarr's ``Store`` (``supports_writes``,
    ``read_only``, ...), a tier declares what it does as class attributes,
    and the :class:`~vlcc_adjoint.storage.TieredStore` reads them instead of
    guessing from the tier's type or its methods' signatures.  The defaults
    are the safe answers for a tier that stores its own copy of every record
    somewhere (a file, a server): a tier that declares nothing is written
    on a worker thread, read through ``get``, and every array it returns is
    copied before the caller may change it.

    - :attr:`retains_references`: ``put`` keeps the record's leaf arrays by
      reference, with no I/O (a memory tier).  The store then writes to the
      tier in the calling thread (a thread hand-off would cost more than the
      ``put``) and owns those arrays' memory until the record's ``delete``:
      only then may it reuse them (the tier's ``delete`` drops its
      references).
    - :attr:`copies_on_put`: ``put`` keeps no reference to the arrays it is
      given once it returns (it encodes, compresses or writes them), so the
      store may reuse their memory at once.  A tier that declares neither
      this nor ``retains_references`` may keep the arrays (a
      :class:`Record`'s leaves may be kept by reference): the store then
      shares them with the tier from the ``put`` on and never reuses them.
    - :attr:`serves_put_arrays`: with ``retains_references``, ``get``
      returns the very arrays ``put`` received (as read-only views, after
      verifying their checksums), so the store may read a record from those
      arrays itself, verifying each leaf in the pass that copies it out.
    - :attr:`fresh_gets`: every ``get`` returns newly allocated arrays that
      the tier keeps no reference to (decoded or read from a file), so the
      store owns them: it may hand them to the caller, or reuse them,
      without a copy.
    - :attr:`reads_into`: with ``fresh_gets``, ``get`` takes a keyword
      argument ``take``: a function ``take(dtype, shape)`` that returns the
      writeable, C-contiguous array to read a leaf into (the store passes
      its buffer pool's, so that a read lands in memory touched before, and
      page-aligned for direct I/O).  The arrays returned are those arrays,
      and the tier keeps no reference to them.
    - :attr:`adopts_leaves`: :meth:`adopt_leaves` stores a record given in
      parts without building it (faster for the store's small captures);
      without it the store builds the record and calls ``adopt``.
    - :attr:`persistent`: records survive the process (a directory on disk);
      a restart or another process can read them.
    - :attr:`waits_on_io`: ``put`` and ``get`` spend their time waiting for
      a device (file writes, ``fsync``, reads: system calls that release the
      GIL), not computing.  The store then runs at least two background
      threads even on a two-core machine, so that one record is written
      into the page cache while another one's ``fsync`` waits for the disk.

    A declaration describes the methods of the class that makes it.  A
    subclass that defines its own ``get`` without declaring
    ``serves_put_arrays``, ``fresh_gets`` and ``reads_into`` again in its
    class body gets ``False`` for them (its ``get`` may return anything, and
    may not take ``take``); one that defines its own ``put`` without
    declaring ``copies_on_put`` again gets ``False``; one that defines its
    own ``adopt`` or
    ``adopt_leaves`` without declaring ``adopts_leaves`` again gets
    ``False`` (its ``adopt`` is called for every adoption).  So a subclass
    that wraps ``get`` to time it (``def get(self, key)``) keeps working,
    read the safe way.
    """

    name: str = "tier"
    capacity_bytes: int | None = None
    retains_references: bool = False
    copies_on_put: bool = False
    serves_put_arrays: bool = False
    fresh_gets: bool = False
    reads_into: bool = False
    adopts_leaves: bool = False
    persistent: bool = False
    waits_on_io: bool = False

    def __init_subclass__(cls, **kwargs) -> None:
        # A capability is a statement about methods: it holds for the class
        # that declares it, and a subclass that replaces those methods must
        # declare it again (see "Capabilities" above).
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        for method, names in _DESCRIBES.items():
            if method in own:
                for name in names:
                    if name not in own:
                        setattr(cls, name, False)

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

    def adopt(self, key: str, record: Record) -> None:
        """``put`` of a record the caller vouches for: C-contiguous leaves,
        checksums computed from them, a pure-JSON spec that nobody changes
        afterwards (a :class:`~vlcc_adjoint.storage.TieredStore`'s own
        captures).  A tier may skip its validation; by default it is ``put``.
        """
        self.put(key, record)

    def adopt_leaves(
        self, key: str, spec: dict, leaves: tuple[np.ndarray, ...], checksums: tuple[str, ...]
    ) -> None:
        """:meth:`adopt` of ``Record(spec, leaves, checksums)``, given in
        parts (the store's short path for small states, which spares
        building the record).  By default it builds the record and calls
        :meth:`adopt`; a tier may store the parts directly."""
        self.adopt(key, Record(spec, tuple(leaves), tuple(checksums)))

    def free_bytes(self) -> int | None:
        """Capacity left, or ``None`` when unbounded."""
        if self.capacity_bytes is None:
            return None
        return self.capacity_bytes - self.used_bytes

    def close(self) -> None:  # noqa: B027 - optional: a tier without resources has none to release
        """Release resources (files, pools).  Idempotent."""

    def __repr__(self) -> str:
        cap = "unbounded" if self.capacity_bytes is None else f"{self.capacity_bytes} B"
        return f"{type(self).__name__}(used={self.used_bytes} B, capacity={cap})"
