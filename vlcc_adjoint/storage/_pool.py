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

Large buffers (``ALIGNED_MIN`` bytes and more) start on a page boundary, so
that a file can be read into them with direct I/O (``O_DIRECT``: the device
writes into the buffer, no copy through the page cache; see
:func:`vlcc_adjoint.storage.format.read_into`).  Such a buffer is a view of
a private byte block a little larger than it; the reference test then also
asks that nothing but the buffer references the block (numpy points every
view of the buffer at the block itself).

A buffer given back while somebody still holds it (a read-only view lent
by ``load(copy=False)``) is kept aside, *pending*, within the same byte
limit, and reused by a later :meth:`BufferPool.take` once its last outside
reference is gone; pending buffers, oldest first, are the first dropped
when room is needed.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Sequence

import numpy as np
from numpy.typing import DTypeLike

__all__ = ["ALIGNED_MIN", "BufferPool", "PAGE", "empty", "unshared_memory"]

#: The alignment of large buffers (a page; a multiple of every disk's block size).
PAGE = 4096

#: Buffers of at least this many bytes start on a ``PAGE`` boundary.
ALIGNED_MIN = 1 << 20

#: Most buffers kept pending (given back while still referenced).
_MAX_PENDING = 64


def _sole_refcount() -> int:
    # Calibrate: the reference count of an array held only by one local
    # variable, as seen by sys.getrefcount in the same code shape as recycle().
    holder = [np.empty(1)]
    arr = holder.pop()
    return sys.getrefcount(arr)


def _block_refcount() -> int:
    # Calibrate: the reference count of an aligned buffer's block referenced
    # by the buffer alone, as seen by sys.getrefcount in unshared_memory().
    arr = np.empty(8, np.uint8)[:4]
    block = arr.base
    return sys.getrefcount(block)


def _pending_refcount() -> int:
    # Calibrate: the reference count of a pending array that nobody else
    # holds, as seen by sys.getrefcount in BufferPool._take_pending().
    pending = [((None, None), np.empty(1))]
    _, arr = pending[0]
    return sys.getrefcount(arr)


def _calibrate() -> tuple[int, int, int]:
    """The three reference counts, measured with tracing and profiling off:
    a tracer that reads ``frame.f_locals`` (a debugger stepping through the
    import) adds a reference, and a count calibrated one too high would let
    the pool reuse a buffer that is still referenced."""
    trace, profile = sys.gettrace(), sys.getprofile()
    sys.settrace(None)
    sys.setprofile(None)
    try:
        return _sole_refcount(), _block_refcount(), _pending_refcount()
    finally:
        sys.settrace(trace)
        sys.setprofile(profile)


_SOLE, _SOLE_BLOCK, _SOLE_PENDING = _calibrate()


def empty(dtype: np.dtype, shape: tuple) -> np.ndarray:
    """``np.empty(shape, dtype)``, page-aligned from ``ALIGNED_MIN`` bytes on
    (a view of a private ``uint8`` block, see the module docstring)."""
    nbytes = dtype.itemsize * math.prod(shape)
    if nbytes < ALIGNED_MIN or dtype.hasobject or dtype.subdtype is not None:
        return np.empty(shape, dtype)
    block = np.empty(nbytes + PAGE, np.uint8)
    start = -block.ctypes.data % PAGE
    return block[start : start + nbytes].view(dtype).reshape(shape)


def _is_block(base) -> bool:
    return type(base) is np.ndarray and base.base is None and base.dtype == np.uint8


def unshared_memory(arr: np.ndarray) -> bool:
    """Whether the memory of `arr` belongs to `arr` alone: it owns it, or it
    is the only view of an owning ``uint8`` block (an aligned buffer of
    :func:`empty`).  References to `arr` itself are the caller's to count."""
    block = arr.base
    if block is None:
        return True
    return _is_block(block) and sys.getrefcount(block) == _SOLE_BLOCK


class BufferPool:
    """Free lists of numpy arrays that own their memory (or are the sole view
    of a page-aligned block), keyed by ``(dtype, shape)``.

    Thread-safe.  Holds at most `max_free_bytes` of free and pending
    buffers; buffers returned beyond that are dropped (freed by the garbage
    collector).

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
        self._pending: list[tuple[tuple, np.ndarray]] = []  # given back while referenced
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
            if self._pending:
                arr = self._take_pending(key)
                if arr is not None:
                    return arr
            self.allocated += 1
        return empty(*key)

    def _take_pending(self, key: tuple) -> np.ndarray | None:
        """Lock held: a pending buffer of `key` that nobody else holds any more."""
        pending = self._pending
        for i in range(len(pending)):
            if pending[i][0] != key:
                continue
            _, arr = pending[i]
            if sys.getrefcount(arr) > _SOLE_PENDING or not unshared_memory(arr):
                continue  # still referenced outside the pool
            del pending[i]
            self.free_bytes -= arr.nbytes
            self.reused += 1
            return arr
        return None

    def reserve(self, dtype: DTypeLike, shape: Sequence[int], count: int) -> None:
        """Allocate and touch `count` buffers ahead of time (moves the
        first-touch cost out of the time loop), within `max_free_bytes`."""
        key = (np.dtype(dtype), tuple(shape))
        for _ in range(count):
            holder = [empty(*key)]
            holder[0].fill(0)
            if not self.recycle(holder):
                break

    def recycle(self, arrays: list, key: tuple | None = None) -> int:
        """Take back the arrays in `arrays` (the list is emptied).

        Each array is kept for reuse only if nobody else references it (see
        the module docstring), its memory is its own, it is writeable and
        C-contiguous, and the pool has room.  A large one still referenced
        is set aside until it is not (pending).  The caller must drop its
        own other references first.

        **Arguments:**

        - `arrays`: a list of arrays.
        - `key`: for a list of one array, its ``(dtype, shape)`` as
          :meth:`take_key` takes it, if the caller has it.

        **Returns:** the number of arrays taken back.
        """
        if key is not None and len(arrays) == 1:
            arr = arrays.pop()
            if (
                sys.getrefcount(arr) > _SOLE
                or not arr.flags.writeable
                or not arr.flags.c_contiguous
                or (arr.base is not None and not unshared_memory(arr))
            ):
                if arr.nbytes >= ALIGNED_MIN:
                    self._set_aside([arr])
                else:
                    self.refused += 1
                return 0
            with self._lock:
                nbytes = arr.nbytes
                if self.free_bytes + nbytes > self.max_free_bytes and not self._make_room(nbytes):
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
        keep, held = [], []
        while arrays:
            arr = arrays.pop()
            if (
                sys.getrefcount(arr) > _SOLE
                or not arr.flags.writeable
                or not arr.flags.c_contiguous
                or (arr.base is not None and not unshared_memory(arr))
            ):
                held.append(arr)
                continue
            keep.append(arr)
        arr = None
        if held:
            self._set_aside(held)
        taken = 0
        if keep:
            with self._lock:  # once per call, not per array
                for arr in keep:
                    if self.free_bytes + arr.nbytes > self.max_free_bytes and not self._make_room(
                        arr.nbytes
                    ):
                        self.refused += 1
                        continue
                    self._free.setdefault((arr.dtype, arr.shape), []).append(arr)
                    self.free_bytes += arr.nbytes
                    self.recycled += 1
                    taken += 1
            keep.clear()
        return taken

    def _set_aside(self, arrays: list) -> None:
        """Keep the large arrays of `arrays` that are still referenced
        elsewhere but would be reusable once they are not (pending); refuse
        the rest."""
        with self._lock:
            for arr in arrays:
                if (
                    arr.nbytes >= ALIGNED_MIN
                    and arr.flags.writeable
                    and arr.flags.c_contiguous
                    and (arr.base is None or _is_block(arr.base))
                    and self._make_room(arr.nbytes, slots=1)
                ):
                    self._pending.append(((arr.dtype, arr.shape), arr))
                    self.free_bytes += arr.nbytes
                else:
                    self.refused += 1
        arrays.clear()

    def _make_room(self, nbytes: int, slots: int = 0) -> bool:
        """Lock held: drop pending buffers (oldest first) until `nbytes` fit
        (and `slots` more pending ones)."""
        pending = self._pending
        while pending and (
            self.free_bytes + nbytes > self.max_free_bytes or len(pending) + slots > _MAX_PENDING
        ):
            _, arr = pending.pop(0)
            self.free_bytes -= arr.nbytes
            self.refused += 1
        return self.free_bytes + nbytes <= self.max_free_bytes

    def clear(self) -> None:
        """Drop every free and pending buffer."""
        with self._lock:
            self._free.clear()
            self._pending.clear()
            self.free_bytes = 0
