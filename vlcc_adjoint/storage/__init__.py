"""Where checkpoints live: tiers, codecs and the asynchronous engine.

A :class:`Tier` is one storage level (memory, compressed memory, zarr on
disk); :class:`TieredStore` runs them as a hierarchy, capturing behind the
computation and prefetching ahead of it from a schedule's
:func:`~vlcc_adjoint.schedules.io_plan`.
"""

from ._tier import CorruptCheckpointError as CorruptCheckpointError
from ._tier import Record as Record
from ._tier import StorageError as StorageError
from ._tier import Tier as Tier
from ._tier import TierFullError as TierFullError
from ._tier import check_key as check_key
from ._engine import PlanMismatchError as PlanMismatchError
from ._engine import TieredStore as TieredStore
from ._pool import BufferPool as BufferPool
from ._stats import StoreStats as StoreStats
from ._stats import TierStats as TierStats
from ._tier import make_record as make_record
from ._memory import MemoryTier as MemoryTier
from ._compressed import CompressedMemoryTier as CompressedMemoryTier
from ._zarr import ZarrTier as ZarrTier
from .format import StoreLockedError as StoreLockedError
from ._dedup import LeafTable as LeafTable
from . import codecs as codecs
