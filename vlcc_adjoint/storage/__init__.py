"""Where checkpoints live: tiers, codecs and the asynchronous engine.

A :class:`Tier` is one storage level (memory, compressed memory, zarr on
disk, or the device slots of an accelerator integration, :class:`DeviceTier`);
:class:`TieredStore` runs them as a hierarchy, capturing behind the
computation and prefetching ahead of it from a schedule's
:func:`~vlcc_adjoint.schedules.io_plan`.

A new tier implements the :class:`Tier` protocol; :class:`Record`,
:func:`make_record` and :func:`check_key` are part of that protocol (what
``get`` returns, how to build it, which keys are valid).  The checks every
tier applies are public too, for tiers written outside this package:
:func:`check_record` and :func:`encode_spec` on ``put``,
:func:`verify_leaves` (with :func:`leaf_checksum`) on ``get``,
:func:`check_capacity` and :func:`step_of`.  A new tier proves that it
honours the protocol by running the contract suite of
:mod:`vlcc_adjoint.storage.testing`.  Persistent tiers read and write their
files through :mod:`vlcc_adjoint.storage.format`.
"""

from ..errors import deprecated_getattr as _deprecated_getattr
from . import codecs as codecs
from ._checksum import check_capacity as check_capacity
from ._checksum import check_record as check_record
from ._checksum import encode_spec as encode_spec
from ._checksum import leaf_checksum as leaf_checksum
from ._checksum import make_record as make_record
from ._checksum import step_of as step_of
from ._checksum import verify_leaves as verify_leaves
from ._compressed import CompressedMemoryTier as CompressedMemoryTier
from ._device import DeviceTier as DeviceTier
from ._engine import PlanMismatchError as PlanMismatchError
from ._engine import TieredStore as TieredStore
from ._memory import MemoryTier as MemoryTier
from ._pool import BufferPool as BufferPool
from ._stats import StoreStats as StoreStats
from ._stats import TierStats as TierStats
from ._tier import CorruptCheckpointError as CorruptCheckpointError
from ._tier import Record as Record
from ._tier import StorageError as StorageError
from ._tier import Tier as Tier
from ._tier import TierFullError as TierFullError
from ._tier import check_key as check_key
from ._zarr import ZarrTier as ZarrTier
from .format import StoreLockedError as StoreLockedError


def _leaf_table():
    from ._dedup import LeafTable

    return LeafTable


#: Internals once exported here; still importable, with a DeprecationWarning.
__getattr__ = _deprecated_getattr(
    __name__,
    {
        "LeafTable": (
            _leaf_table,
            "TieredStore(..., dedup=True), which owns its leaf table "
            "(the class itself is internal: vlcc_adjoint.storage._dedup.LeafTable)",
        ),
    },
)

__all__ = [
    "BufferPool",
    "CompressedMemoryTier",
    "CorruptCheckpointError",
    "DeviceTier",
    "MemoryTier",
    "PlanMismatchError",
    "Record",
    "StorageError",
    "StoreLockedError",
    "StoreStats",
    "Tier",
    "TierFullError",
    "TierStats",
    "TieredStore",
    "ZarrTier",
    "check_capacity",
    "check_key",
    "check_record",
    "codecs",
    "encode_spec",
    "leaf_checksum",
    "make_record",
    "step_of",
    "verify_leaves",
]
