"""MemoryTier: records held by reference in host memory.

The fastest level of the hierarchy and the simplest :class:`Tier`.  The
engine has already copied the user's state into buffers it hands over, so
``put`` keeps the leaf arrays *by reference*: no second copy, O(number of
leaves) work.  What it does do:

* encode the spec to JSON once (so every tier accepts exactly the same specs,
  and ``get`` returns a fresh dict the caller may modify);
* account bytes per distinct array object.  An array object held by several
  records (a deduplicated leaf from the store's leaf table in ``storage/_dedup.py``,
  handed to several ``put`` calls) is counted once and kept until its last
  record is deleted;
* verify every leaf's checksum on ``get``, so a buffer that was modified
  after it was saved (a stray in-place update, a reused pool buffer) is
  reported as :class:`CorruptCheckpointError`, not returned.  (The
  :class:`~vlcc_adjoint.storage.TieredStore` reads its own records without
  ``get``: it verifies each leaf in the same pass that copies it out.)

``get`` returns read-only views of the stored arrays: restoring a state
twice (Revolve reloads the same checkpoint) must find it unchanged, so
whoever needs to write copies first (``unflatten(spec, leaves, copy=True)``).
The views show the record while it is stored: the arrays belong to whoever
``put`` them, and a :class:`~vlcc_adjoint.storage.TieredStore` reuses their
memory for later captures once it has deleted the record (ownership is
explicit, see :mod:`vlcc_adjoint.storage._pool`).

The tier declares ``retains_references``, ``serves_put_arrays`` and
``adopts_leaves`` (see :class:`~vlcc_adjoint.storage.Tier`): it stores a
record given in parts (:meth:`MemoryTier.adopt_leaves`) without building it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import numpy as np

from ..errors import VlccKeyError
from ._checksum import check_capacity, check_record, encode_spec, step_of, verify_leaves
from ._tier import Record, Tier, TierFullError

__all__ = ["MemoryTier"]


def _readonly(arr: np.ndarray) -> np.ndarray:
    view = arr.view()
    view.flags.writeable = False
    return view


class MemoryTier(Tier):
    """Records kept by reference in host memory, with a hard byte capacity.

    **Arguments:**

    - `capacity_bytes`: the most leaf bytes the tier may hold (``None``:
      unbounded).  A ``put`` that does not fit raises
      :class:`TierFullError` and changes nothing.
    - `name`: the tier's name in messages and statistics.
    """

    retains_references = True
    serves_put_arrays = True
    adopts_leaves = True

    def __init__(self, capacity_bytes: int | None = None, *, name: str = "memory"):
        self.capacity_bytes = check_capacity(capacity_bytes)
        self.name = name
        self._lock = threading.Lock()
        # key -> (spec as JSON text, or the engine's dict; leaves; checksums)
        self._records: dict[str, tuple[str | dict, tuple[np.ndarray, ...], tuple[str, ...]]] = {}
        self._objects: dict[int, list] = {}  # id(array) -> [array, number of holders]
        self._used = 0

    @property
    def used_bytes(self) -> int:
        return self._used

    def put(self, key: str, record: Record) -> None:
        """Store `record` under the new key `key`, keeping its leaves by reference.

        Raises :class:`TierFullError` if it does not fit, ``KeyError`` if the
        key is taken, ``ValueError`` if the spec is not pure JSON.
        """
        check_record(key, record)
        self._insert(
            key, encode_spec(key, record.spec), tuple(record.leaves), tuple(record.checksums)
        )

    def adopt(self, key: str, record: Record) -> None:
        """``put`` for a :class:`~vlcc_adjoint.storage.TieredStore`'s own
        captures, which are valid by construction (C-contiguous leaves,
        checksums from the capture copy, a spec from ``flatten`` that the
        engine never changes again): the checks and the JSON encoding are
        skipped, and the spec is encoded on its first ``get`` instead (the
        engine reads these records without ``get``)."""
        self._insert(key, record.spec, record.leaves, record.checksums)

    _adopt = adopt  # the name earlier versions used

    def adopt_leaves(
        self,
        key: str,
        spec: dict | str,
        leaves: tuple[np.ndarray, ...],
        checksums: tuple[str, ...],
    ) -> None:
        """:meth:`adopt` of the record ``Record(spec, leaves, checksums)``,
        given in parts (the engine's short path for small states, which
        spares building the record).  Every way in (``put``, which hands
        the spec as its JSON text, and ``adopt``) ends here: this is the
        insertion itself, in one frame for the engine's once-per-save call."""
        # acquire/release rather than `with`: this runs once per save.
        lock = self._lock
        lock.acquire()
        try:
            records, objects = self._records, self._objects
            if key in records:
                raise VlccKeyError(
                    f"record {key!r} is already in tier {self.name!r}; delete it first"
                )
            if len(leaves) == 1:  # one leaf (a small state's record): as below
                leaf = leaves[0]
                holder = objects.get(id(leaf))
                need = 0 if holder is not None else leaf.nbytes
                if self.capacity_bytes is not None and self._used + need > self.capacity_bytes:
                    raise TierFullError.no_room(
                        key, self.name, need, self._used, self.capacity_bytes
                    )
                if holder is None:
                    objects[id(leaf)] = [leaf, 1]
                else:
                    holder[1] += 1
                self._used += need
                records[key] = (spec, leaves, checksums)
                return
            need = 0
            seen: tuple[int, ...] = ()
            for leaf in leaves:  # bytes of the array objects not held yet, each once
                i = id(leaf)
                if i not in objects and i not in seen:
                    need += leaf.nbytes
                    seen = (*seen, i)
            if self.capacity_bytes is not None and self._used + need > self.capacity_bytes:
                raise TierFullError.no_room(key, self.name, need, self._used, self.capacity_bytes)
            for leaf in leaves:
                holder = objects.get(id(leaf))
                if holder is None:
                    objects[id(leaf)] = [leaf, 1]
                else:
                    holder[1] += 1
            self._used += need
            records[key] = (spec, leaves, checksums)
        finally:
            lock.release()

    # put and adopt insert through this name, so that a subclass that
    # overrides adopt_leaves does not change what they do.
    _insert = adopt_leaves

    def get(self, key: str) -> Record:
        """The record under `key`, checksums verified; leaves are read-only views."""
        with self._lock:
            entry = self._records.get(key)
        if entry is None:
            raise VlccKeyError(f"no record {key!r} in tier {self.name!r}")
        spec, leaves, checksums = entry
        spec = json.loads(spec if type(spec) is str else encode_spec(key, spec))  # a fresh dict
        verify_leaves(leaves, checksums, key, self.name, step_of(spec))
        return Record(spec, tuple(_readonly(leaf) for leaf in leaves), checksums)

    def delete(self, key: str) -> None:
        """Forget the record under `key` (its arrays are released with
        their last record: the tier keeps no reference to them)."""
        lock = self._lock
        lock.acquire()
        try:
            entry = self._records.pop(key, None)
            if entry is None:
                raise VlccKeyError(f"no record {key!r} in tier {self.name!r}")
            objects = self._objects
            for leaf in entry[1]:
                holder = objects[id(leaf)]
                if holder[1] == 1:
                    del objects[id(leaf)]
                    self._used -= leaf.nbytes
                else:
                    holder[1] -= 1
        finally:
            lock.release()

    def keys(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._records))

    def __contains__(self, key: str) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)
