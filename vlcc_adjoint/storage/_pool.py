"""A pool of reusable capture buffers, owned explicitly.

Why: writing into freshly allocated memory pays a page fault for every page
on first touch, while copying into memory that was touched before runs at
memory bandwidth (``benchmarks/bench_store_calls.py`` measures both).  A
checkpointing run captures states of the same few shapes over and over, so
the store copies each state into a buffer that an earlier, now deleted,
checkpoint used.

Buffers are plain owning numpy arrays, pooled by exact ``(dtype, shape)``
(a time loop saves the same shapes every time, and an exact key keeps every
buffer an owning, C-contiguous array whose views all point back to it).

**Ownership is explicit.**  The pool never asks the interpreter whether a
buffer is still in use: reference counts change meaning across CPython
versions (borrowed references in 3.14, the free-threaded build), under a
debugger that reads frame locals, and a pointer handed to C code holds no
reference at all.  Instead:

* :meth:`BufferPool.take` hands a buffer to one owner.
* :meth:`BufferPool.recycle` is that owner's word that it is done with the
  buffer *and that nothing it handed the buffer to still uses it*.  The pool
  checks what it can without reference counts (the array is writeable,
  C-contiguous, and its memory is its own: see :func:`owns_memory`) and puts
  it on a free list.
* :meth:`BufferPool.lend` opens a :class:`Lease` on buffers whose memory is
  shown to someone else (read-only views handed to a caller).  While a lease
  is open, a buffer recycled by its owner is *deferred*: it reaches a free
  list only when the last lease on it ends (:meth:`Lease.release`), so no
  later :meth:`~BufferPool.take` hands out memory that a leased view still
  shows.

So a buffer goes back into circulation only when every holder the owner
knows of has said so: the owner by recycling it, every borrower by ending
its lease.  The :class:`~vlcc_adjoint.storage.TieredStore` is such an owner
(its records, read-ahead slots and moves hold its buffers; its
``load(copy=False)`` and ``lend`` open leases); so is a
:class:`~vlcc_adjoint.lineage.History` (its in-flight commits).

Large buffers (``ALIGNED_MIN`` bytes and more) start on a page boundary, so
that a file can be read into them with direct I/O (``O_DIRECT``: the device
writes into the buffer, no copy through the page cache; see
:func:`vlcc_adjoint.storage.format.read_into`).  Such a buffer is a view of
a private byte block one page larger than it (:func:`empty`), and the
blocks :func:`empty` made are remembered (weakly), so :func:`owns_memory`
never mistakes a view of somebody else's array for a buffer of ours.

Small buffers (below a pool's `min_bytes`; the store's pool uses
:data:`SMALL_BYTES`) are not pooled at all: numpy serves an allocation of
under 1 KiB from its own cache of freed small blocks, with no page fault
and for less than the pool's book-keeping, so :meth:`BufferPool.take`
allocates them and :meth:`BufferPool.recycle` drops them (to the garbage
collector, once their owner lets go), and neither counts them.  A caller
that knows a buffer is that small may allocate it and drop it itself.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import DTypeLike

__all__ = ["ALIGNED_MIN", "SMALL_BYTES", "BufferPool", "Lease", "PAGE", "empty", "owns_memory"]

#: Buffers smaller than this many bytes are not worth pooling (see the
#: module docstring): numpy's cache of small data blocks holds blocks of
#: under 1 KiB.
SMALL_BYTES = 1024

#: The alignment of large buffers (a page; a multiple of every disk's block size).
PAGE = 4096

#: Buffers of at least this many bytes start on a ``PAGE`` boundary.
ALIGNED_MIN = 1 << 20

# The blocks behind the aligned buffers empty() made, by id (weakly: a block
# leaves with its last buffer, so an id is never mistaken for a new array's).
_BLOCKS: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()


def empty(dtype: np.dtype, shape: tuple) -> np.ndarray:
    """``np.empty(shape, dtype)``, page-aligned from ``ALIGNED_MIN`` bytes on:
    then a view of a private ``uint8`` block of exactly one ``PAGE`` more
    bytes than the array (see :func:`owns_memory`)."""
    nbytes = dtype.itemsize * math.prod(shape)
    if nbytes < ALIGNED_MIN or dtype.hasobject or dtype.subdtype is not None:
        return np.empty(shape, dtype)
    block = np.empty(nbytes + PAGE, np.uint8)
    _BLOCKS[id(block)] = block
    start = -block.ctypes.data % PAGE
    return block[start : start + nbytes].view(dtype).reshape(shape)


def owns_memory(arr: np.ndarray) -> bool:
    """Whether the memory of `arr` is its own: it owns its data, or it is an
    aligned buffer of :func:`empty` (a view starting within the first page
    of a block :func:`empty` made, exactly one page larger than it).

    A structural test, made without reference counts: it says that no
    *other* array's memory is involved.  Whether views of `arr` itself are
    still in use is for its owner to know (see the module docstring)."""
    block = arr.base
    if block is None:
        return True
    if _BLOCKS.get(id(block)) is not block or block.nbytes != arr.nbytes + PAGE:
        return False
    offset = arr.ctypes.data - block.ctypes.data
    return 0 <= offset < PAGE


class Lease:
    """Buffers of a :class:`BufferPool` lent out: none of them is reused
    while the lease is open.

    Made by :meth:`BufferPool.lend`.  :meth:`release` (idempotent; also the
    end of a ``with`` block) ends it; a buffer its owner recycled meanwhile
    then goes to the pool's free lists.
    """

    __slots__ = ("_pool", "_arrays")

    def __init__(self, pool: BufferPool, arrays: tuple):
        self._pool: BufferPool | None = pool
        self._arrays = arrays

    @property
    def open(self) -> bool:
        """Whether the lease still holds its buffers."""
        return self._pool is not None

    def release(self) -> None:
        """End the lease (idempotent, also from several threads at once)."""
        pool = self._pool
        if pool is not None:
            pool._end_lease(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "open" if self.open else "released"
        return f"<Lease of {len(self._arrays)} buffer(s), {state}>"


class BufferPool:
    """Free lists of buffers, keyed by ``(dtype, shape)``, with explicit
    ownership (see the module docstring).

    Holds at most `max_free_bytes` of free buffers; a buffer given back
    beyond that is dropped (freed by the garbage collector once its owner
    lets go of it).

    **Arguments:**

    - `max_free_bytes`: the most bytes kept in the free lists.
    - `min_bytes`: buffers smaller than this are not pooled (default 0:
      every size is; a store's pool passes :data:`SMALL_BYTES`): ``take``
      allocates them, ``recycle`` drops them, and no counter counts them.
    - `threadsafe`: ``True`` (default): every method may be called from any
      thread at any time (one lock around the free lists).  ``False``: no
      lock is taken; the owner calls the pool from one thread at a time (a
      single-threaded :class:`~vlcc_adjoint.storage.TieredStore`).

    **Attributes** (counters, of buffers of at least `min_bytes`): `reused`
    (buffers handed out from the free lists), `allocated` (freshly allocated), `recycled` (taken back onto a
    free list), `refused` (given back but not kept: not the pool's kind of
    buffer, or no room), `deferred` (given back while a lease held them;
    they follow when it ends), `free_bytes` (bytes on the free lists).
    """

    def __init__(self, max_free_bytes: int, *, min_bytes: int = 0, threadsafe: bool = True):
        self.max_free_bytes = int(max_free_bytes)
        self.min_bytes = int(min_bytes)
        self.free_bytes = 0
        self.reused = 0
        self.allocated = 0
        self.recycled = 0
        self.refused = 0
        self.deferred = 0
        self._free: dict[tuple, list[np.ndarray]] = {}
        self._free_ids: set[int] = set()  # id() of every buffer on a free list
        # id(buffer) -> [buffer, open leases, recycled by its owner meanwhile]
        self._leased: dict[int, list] = {}
        self._lock = threading.Lock() if threadsafe else None

    @property
    def threadsafe(self) -> bool:
        """Whether the pool takes a lock (see the class docstring)."""
        return self._lock is not None

    # -- handing out --------------------------------------------------------------------

    def take(self, dtype: DTypeLike, shape: Sequence[int]) -> np.ndarray:
        """A C-contiguous, writeable array of `dtype` and `shape` (contents
        undefined), owned by the caller until it recycles it."""
        return self.take_key((np.dtype(dtype), tuple(shape)))  # equal dtypes: the same layout

    def take_key(self, key: tuple) -> np.ndarray:
        """:meth:`take` for a key ``(dtype, shape)`` made once by the caller
        (a ``np.dtype`` and a tuple of ints)."""
        lock = self._lock
        if lock is not None:
            lock.acquire()
        try:
            free = self._free.get(key)
            if free:
                arr = free.pop()
                self._free_ids.discard(id(arr))
                self.free_bytes -= arr.nbytes
                self.reused += 1
                return arr
            if key[0].itemsize * math.prod(key[1]) >= self.min_bytes:
                self.allocated += 1
        finally:
            if lock is not None:
                lock.release()
        return empty(*key)

    def reserve(self, dtype: DTypeLike, shape: Sequence[int], count: int) -> None:
        """Allocate and touch `count` buffers ahead of time (moves the
        first-touch cost out of the time loop), within `max_free_bytes`."""
        key = (np.dtype(dtype), tuple(shape))
        for _ in range(count):
            buf = empty(*key)
            buf.fill(0)
            if not self.recycle([buf], key):
                break

    # -- taking back --------------------------------------------------------------------

    def recycle(self, arrays: Sequence[np.ndarray], key: tuple | None = None) -> int:
        """Take back the buffers in `arrays`.

        The caller owns them and is done with them: nothing it gave them to
        still reads or writes them, except the holders of a :class:`Lease`
        on them (their turn ends with the lease: the buffer is deferred
        until then).  A buffer is kept for reuse if it is writeable,
        C-contiguous, its memory is its own (:func:`owns_memory`) and the
        pool has room; otherwise it is dropped.

        **Arguments:**

        - `arrays`: a sequence of arrays.
        - `key`: for a sequence of one array, its ``(dtype, shape)`` as
          :meth:`take_key` takes it, if the caller has it.

        **Returns:** the number of buffers put on a free list now.
        """
        if not arrays:
            return 0
        lock = self._lock
        if lock is not None:
            lock.acquire()
        try:
            taken = 0
            for arr in arrays:
                taken += self._give(arr, key if key is not None else (arr.dtype, arr.shape))
            return taken
        finally:
            if lock is not None:
                lock.release()

    def _give(self, arr: np.ndarray, key: tuple) -> int:
        """Lock held: `arr` back from its owner; 1 if it went onto a free list."""
        nbytes = arr.nbytes
        if nbytes < self.min_bytes:  # not pooled: dropped, uncounted
            return 0
        i = id(arr)
        if self._leased:
            held = self._leased.get(i)
            if held is not None:
                if not held[2]:
                    held[2] = True
                    self.deferred += 1
                return 0
        flags = arr.flags
        if (
            i in self._free_ids  # given back twice: keep one copy on the list
            or not flags.writeable
            or not flags.c_contiguous
            or self.free_bytes + nbytes > self.max_free_bytes
            or (arr.base is not None and not owns_memory(arr))
        ):
            self.refused += 1
            return 0
        free = self._free.get(key)
        if free is None:
            self._free[key] = [arr]
        else:
            free.append(arr)
        self._free_ids.add(i)
        self.free_bytes += nbytes
        self.recycled += 1
        return 1

    # -- leases -------------------------------------------------------------------------

    def lend(self, arrays: Iterable[np.ndarray]) -> Lease:
        """Open a :class:`Lease` on `arrays` (buffers of this pool's owner
        whose memory is shown to a borrower): none of them goes back onto a
        free list before the lease is released, even if its owner recycles
        it meanwhile."""
        arrays = tuple(arrays)
        lock = self._lock
        if lock is not None:
            lock.acquire()
        try:
            leased = self._leased
            for arr in arrays:
                held = leased.get(id(arr))
                if held is None:
                    leased[id(arr)] = [arr, 1, False]
                else:
                    held[1] += 1
        finally:
            if lock is not None:
                lock.release()
        return Lease(self, arrays)

    def leased(self, arr: np.ndarray) -> bool:
        """Whether an open :class:`Lease` holds `arr`."""
        held = self._leased.get(id(arr))
        return held is not None and held[0] is arr

    def _end_lease(self, lease: Lease) -> None:
        """`lease` ends (if it has not yet): a buffer no lease holds any
        more, and that its owner recycled meanwhile, goes to the free lists."""
        lock = self._lock
        if lock is not None:
            lock.acquire()
        try:
            if lease._pool is None:
                return
            arrays, lease._arrays, lease._pool = lease._arrays, (), None
            leased = self._leased
            for arr in arrays:
                held = leased[id(arr)]
                held[1] -= 1
                if held[1] == 0:
                    del leased[id(arr)]
                    if held[2]:
                        self._give(arr, (arr.dtype, arr.shape))
        finally:
            if lock is not None:
                lock.release()

    def close(self) -> None:
        """Drop every free buffer and keep none given back later (the
        owner is done with the pool; open leases end as they will)."""
        self.max_free_bytes = 0
        self.clear()

    def clear(self) -> None:
        """Drop every free buffer (leases stay open; a buffer deferred by
        one comes to the free lists when it ends)."""
        lock = self._lock
        if lock is not None:
            lock.acquire()
        try:
            self._free.clear()
            self._free_ids.clear()
            self.free_bytes = 0
        finally:
            if lock is not None:
                lock.release()
