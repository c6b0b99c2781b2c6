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
