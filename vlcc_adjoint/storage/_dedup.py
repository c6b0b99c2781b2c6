"""Content-addressed leaf table: store a leaf once, reference it from many records.

Many states carry arrays that never change between checkpoints: the velocity
model of a seismic adjoint, the mesh of a CFD run, frozen layers of a
network.  Storing them in every checkpoint multiplies their bytes by the
number of checkpoints.  The table keys leaves by
:func:`vlcc_adjoint.state.leaf_digest` (xxh3-128 of bytes, dtype and shape)
and counts references::

    table = LeafTable()
    digest = leaf_digest(model)
    shared = table.acquire(digest)          # hit: refcount + 1, no copy
    if shared is None:
        shared = table.put(digest, copy_of(model))   # miss: stored, refcount 1
    ... record = make_record(spec, [u_copy, shared])  # the same array object
    ...
    table.release(digest)                   # when a record holding it goes

How the store uses it: the engine hashes a leaf before copying it (as fast
as copying a cached leaf, faster than copying a large one), and on a hit
hands the *same* array object to the tier instead of a fresh copy.
:class:`~vlcc_adjoint.storage.MemoryTier` counts an array object held by
several records once, so its ``used_bytes`` and this table's
:attr:`LeafTable.nbytes` agree that a shared leaf costs its bytes once.
(:class:`~vlcc_adjoint.storage.CompressedMemoryTier` and
:class:`~vlcc_adjoint.storage.ZarrTier` store each record's leaves
separately: there a shared leaf costs its bytes per record.)  The table frees a leaf (drops its reference)
when its last user releases it.

Thread-safe: one lock around the bookkeeping; no I/O and no hashing under it.
"""

from __future__ import annotations

import threading

import numpy as np

from ..errors import VlccKeyError, VlccTypeError, VlccValueError
from ..state import leaf_digest

__all__ = ["LeafTable"]


class LeafTable:
    """A thread-safe, reference-counted, content-addressed table of arrays.

    **Attributes:**

    - `nbytes`: bytes of the distinct leaves held (a shared leaf counted once).
    - `referenced_bytes`: bytes the references would cost without
      deduplication (each reference counted).  ``referenced_bytes / nbytes``
      is the dedup ratio.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, list] = {}  # digest -> [array, refcount]
        self._nbytes = 0
        self._referenced = 0

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def referenced_bytes(self) -> int:
        return self._referenced

    def put(self, digest: str, array: np.ndarray) -> np.ndarray:
        """Add a reference to the leaf `digest`, storing `array` if it is new.

        **Arguments:**

        - `digest`: :func:`~vlcc_adjoint.state.leaf_digest` of `array`.
        - `array`: the leaf, kept by reference when new (the caller hands it
          over and must not modify it afterwards).

        **Returns:** the stored array: `array` itself if the digest was new,
        else the array stored earlier (reference count + 1).

        Raises ``ValueError`` if the digest is already stored for an array
        of another dtype or shape (a digest computed for a different array).
        """
        if not isinstance(array, np.ndarray):
            raise VlccTypeError(f"LeafTable stores numpy arrays, got {type(array).__name__}")
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                self._entries[digest] = [array, 1]
                self._nbytes += array.nbytes
                self._referenced += array.nbytes
                return array
            stored = entry[0]
            if stored.dtype != array.dtype or stored.shape != array.shape:
                raise VlccValueError(
                    f"digest {digest} is stored for a {stored.dtype.str}{list(stored.shape)} leaf, "
                    f"not {array.dtype.str}{list(array.shape)}; compute digests with leaf_digest"
                )
            entry[1] += 1
            self._referenced += stored.nbytes
            return stored

    def put_leaf(self, array: np.ndarray) -> tuple[str, np.ndarray]:
        """Hash `array` and :meth:`put` it: ``(digest, stored array)``."""
        digest = leaf_digest(array)
        return digest, self.put(digest, array)

    def acquire(self, digest: str) -> np.ndarray | None:
        """The stored leaf with one more reference, or ``None`` if `digest` is absent."""
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
            entry[1] += 1
            self._referenced += entry[0].nbytes
            return entry[0]

    def release(self, digest: str) -> bool:
        """Drop one reference to `digest`.

        **Returns:** ``True`` if that was the last reference and the leaf was
        freed.  ``KeyError`` if the digest is not in the table.
        """
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                raise VlccKeyError(
                    f"leaf {digest} is not in the table (released more often than put?)"
                )
            entry[1] -= 1
            self._referenced -= entry[0].nbytes
            if entry[1] == 0:
                del self._entries[digest]
                self._nbytes -= entry[0].nbytes
                return True
            return False

    def get(self, digest: str) -> np.ndarray:
        """The stored leaf (no reference taken); ``KeyError`` if absent."""
        with self._lock:
            entry = self._entries.get(digest)
        if entry is None:
            raise VlccKeyError(f"leaf {digest} is not in the table")
        return entry[0]

    def refcount(self, digest: str) -> int:
        """References to `digest` (0 when absent)."""
        with self._lock:
            entry = self._entries.get(digest)
            return 0 if entry is None else entry[1]

    def __contains__(self, digest: str) -> bool:
        with self._lock:
            return digest in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __repr__(self) -> str:
        return (
            f"LeafTable(leaves={len(self)}, nbytes={self._nbytes}, "
            f"referenced_bytes={self._referenced})"
        )
