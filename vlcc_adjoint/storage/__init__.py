"""Where checkpoints live: tiers, codecs and the asynchronous engine.

A :class:`Tier` is one storage level (memory, compressed memory, zarr on
disk); :class:`TieredStore` runs them as a hierarchy, capturing behind the
computation and prefetching ahead of it from a schedule's
:func:`~vlcc_adjoint.schedules.io_plan`.

A new tier implements the :class:`Tier` protocol; :class:`Record`,
:func:`make_record` and :func:`check_key` are part of that protocol (what
``get`` returns, how to build it, which keys are valid) and stay public.
"""

from ..errors import deprecated_getattr as _deprecated_getattr
from . import codecs as codecs
from ._compressed import CompressedMemoryTier as CompressedMemoryTier
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
from ._tier import make_record as make_record
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
    "check_key",
    "codecs",
    "make_record",
]
