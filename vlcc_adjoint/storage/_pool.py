"""A pool of reusable capture buffers.

Why: writing into freshly allocated memory pays a page fault for every page
on first touch, while copying into memory that was touched before runs at
memory bandwidth (``benchmarks/bench_store_calls.py`` measures both).  A
checkpointing run captures states of the same few
shapes over and over, so the store copies each state into a buffer that an
earlier, now deleted, checkpoint used.

Buffers are plain owning numpy arrays, pooled by exact ``(dtype, shape)``
(a time loop saves the same shapes every time, and an exact key keeps every
buffer an owning, C-contiguous array whose views all point back to it).

When is a buffer free?  A buffer handed to a tier may still be referenced by
it (a :class:`~vlcc_adjoint.storage.MemoryTier` keeps records by reference),
by a reader in another thread, or by a view somebody kept.  Rather than trust
every party to report back, :meth:`BufferPool.recycle` asks CPython: an array
whose reference count is what the pool's own local variable accounts for is
referenced by nobody else, and no view of it exists (a numpy view holds a
reference to its base; an exported buffer, e.g. a ``memoryview``, holds one
to its exporter).  Anything else is simply not reused and is left to the
garbage collector.  This is the test numpy's own ``ndarray.resize`` makes
(``refcheck=True``) before it reallocates an array in place.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence

import numpy as np
from numpy.typing import DTypeLike

__all__ = ["BufferPool"]


def _sole_refcount() -> int:
    # Calibrate: the reference count of an array held only by one local
    # variable, as seen by sys.getrefcount in the same code shape as recycle().
    holder = [np.empty(1)]
    arr = holder.pop()
    return sys.getrefcount(arr)


_SOLE = _sole_refcount()


class BufferPool:
    """Free lists of owning numpy arrays, keyed by ``(dtype, shape)``.

    Thread-safe.  Holds at most `max_free_bytes` of free buffers; buffers
    returned beyond that are dropped (freed by the garbage collector).

    **Arguments:**

    - `max_free_bytes`: the most bytes kept in the free lists.
    """

    def __init__(self, max_free_bytes: int):
        self.max_free_bytes = int(max_free_bytes)
        self.free_bytes = 0
        self.reused = 0  # buffers handed out from the free lists
        self.allocated = 0  # buffers freshly allocated
        self.recycled = 0  # buffers taken back
        self.refused = 0  # buffers not taken back (still referenced, or pool full)
        self._free: dict[tuple, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def take(self, dtype: DTypeLike, shape: Sequence[int]) -> np.ndarray:
        """A C-contiguous, writeable array of `dtype` and `shape` (contents undefined)."""
        return self.take_key((np.dtype(dtype), tuple(shape)))  # equal dtypes: the same layout

    def take_key(self, key: tuple) -> np.ndarray:
        """:meth:`take` for a key ``(dtype, shape)`` made once by the caller
        (a ``np.dtype`` and a tuple of ints)."""
        with self._lock:
            free = self._free.get(key)
            if free:
                arr = free.pop()
                self.free_bytes -= arr.nbytes
                self.reused += 1
                return arr
            self.allocated += 1
        return np.empty(key[1], key[0])

    def reserve(self, dtype: DTypeLike, shape: Sequence[int], count: int) -> None:
        """Allocate and touch `count` buffers ahead of time (moves the
        first-touch cost out of the time loop), within `max_free_bytes`."""
        for _ in range(count):
            holder = [np.empty(shape, dtype)]
            holder[0].fill(0)
            if not self.recycle(holder):
                break

    def recycle(self, arrays: list, key: tuple | None = None) -> int:
        """Take back the arrays in `arrays` (the list is emptied).

        Each array is kept for reuse only if nobody else references it (see
        the module docstring), it owns its memory, is writeable and
        C-contiguous, and the pool has room.  The caller must drop its own
        other references first.

        **Arguments:**

        - `arrays`: a list of arrays.
        - `key`: for a list of one array, its ``(dtype, shape)`` as
          :meth:`take_key` takes it, if the caller has it.

        **Returns:** the number of arrays taken back.
        """
        if key is not None and len(arrays) == 1:
            arr = arrays.pop()
            if (sys.getrefcount(arr) > _SOLE or arr.base is not None
                    or not arr.flags.writeable or not arr.flags.c_contiguous):
                self.refused += 1
                return 0
            with self._lock:
                nbytes = arr.nbytes
                if self.free_bytes + nbytes > self.max_free_bytes:
                    self.refused += 1
                    return 0
                free = self._free.get(key)
                if free is None:
                    self._free[key] = [arr]
                else:
                    free.append(arr)
                self.free_bytes += nbytes
                self.recycled += 1
            return 1
        keep = []
        while arrays:
            arr = arrays.pop()
            if (sys.getrefcount(arr) > _SOLE or arr.base is not None
                    or not arr.flags.writeable or not arr.flags.c_contiguous):
                self.refused += 1
                continue
            keep.append(arr)
        arr = None
        taken = 0
        if keep:
            with self._lock:  # once per call, not per array
                for arr in keep:
                    if self.free_bytes + arr.nbytes > self.max_free_bytes:
                        self.refused += 1
                        continue
                    self._free.setdefault((arr.dtype, arr.shape), []).append(arr)
                    self.free_bytes += arr.nbytes
                    self.recycled += 1
                    taken += 1
            keep.clear()
        return taken

    def clear(self) -> None:
        """Drop every free buffer."""
        with self._lock:
            self._free.clear()
            self.free_bytes = 0
