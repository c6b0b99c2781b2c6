"""Protected regions: memory a C or Fortran program hands to the engine.

A region is named memory of the calling program, described by its address,
a numpy dtype name and a shape; the regions of a run (or of a history)
together are the state ``u``, a ``dict`` of arrays keyed by the regions'
names in the order they were protected (:mod:`vlcc_adjoint.state`: the
protected regions are the state's leaves, by name).

Each region is wrapped once, when it is protected, as a numpy array *over
the program's memory* (no copy, no owner: the memory is the program's, and
no Python reference keeps it alive).  The store never keeps these arrays:
a save copies them into the engine's own buffers, a restore writes into
them (``load(..., out=state)``).  Hence the lifetime rule of the C and
Fortran interface: **a region must stay valid, at the same address, from
its ``protect`` to the ``close`` of its run or history**; the engine reads
and writes it only inside the calls of that handle.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import VlccTypeError, VlccValueError
from ..state import Structure

__all__ = ["DTYPES", "MAX_NDIM", "Regions"]

#: The dtype names a region may have: numpy's names of its fixed-size
#: numeric types (``float64`` is C's ``double`` and Fortran's
#: ``real(real64)``, ``int32`` C's ``int32_t`` and Fortran's
#: ``integer(int32)``, ...), in native byte order.
DTYPES = (
    "float64",
    "float32",
    "float16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint64",
    "uint32",
    "uint16",
    "uint8",
    "complex128",
    "complex64",
    "bool",
)

#: The most dimensions a region may have (numpy allows 64).
MAX_NDIM = 32


class Regions:
    """The protected regions of one run or history, and the state they form.

    **Attributes:**

    - `state`: ``{name: array}``, each array a view of the program's
      memory, in the order of protection.  This dict is what the store
      saves and restores into, and what a history commits.
    """

    def __init__(self) -> None:
        self.state: dict[str, np.ndarray] = {}
        self._spans: list[tuple[int, int, str]] = []  # (start, stop, name) of each region's bytes

    def __len__(self) -> int:
        return len(self.state)

    def protect(self, name: str, address: int, dtype: str, shape: Sequence[int]) -> np.ndarray:
        """Wrap ``shape`` elements of ``dtype`` at ``address`` as the region `name`.

        **Arguments:**

        - `name`: the region's name, the state's key (not empty, not taken).
        - `address`: the address of the first element (``0`` only for a
          region of no elements).
        - `dtype`: a name in :data:`DTYPES`.
        - `shape`: the extent of each dimension, C order (last index
          fastest); ``()`` for a scalar.

        **Returns:** the array over the region's memory.

        Raises ``ValueError`` for an empty or taken name, an unknown dtype,
        a negative extent, a NULL address of a region with elements, or
        memory that overlaps a region protected before (the engine would
        restore one over the other).
        """
        if not isinstance(name, str) or not name:
            raise VlccValueError(f"a region needs a name that is not empty, got {name!r}")
        if name in self.state:
            raise VlccValueError(
                f"a region named {name!r} is already protected; protect each region once, "
                "under a name of its own"
            )
        if dtype not in DTYPES:
            raise VlccValueError(
                f"unknown dtype {dtype!r} for region {name!r}; use one of numpy's names: "
                + ", ".join(DTYPES)
            )
        if not isinstance(address, int) or address < 0:
            raise VlccTypeError(f"the address of region {name!r} must be an int >= 0")
        shape = tuple(shape)
        if len(shape) > MAX_NDIM:
            raise VlccValueError(
                f"region {name!r} has {len(shape)} dimensions; at most {MAX_NDIM} are supported"
            )
        if any(not isinstance(s, int) or s < 0 for s in shape):
            raise VlccValueError(
                f"region {name!r} has shape {shape}; every extent must be an integer >= 0"
            )
        dt = np.dtype(dtype)
        nbytes = dt.itemsize * math.prod(shape)
        if nbytes > np.iinfo(np.intp).max:
            raise VlccValueError(f"region {name!r} of shape {shape} is larger than memory")
        if nbytes == 0:
            array = np.empty(shape, dt)  # no memory to wrap
        elif address == 0:
            raise VlccValueError(
                f"region {name!r} has {nbytes} bytes at address NULL; pass the address of "
                "its first element"
            )
        else:
            for start, stop, other in self._spans:
                if address < stop and start < address + nbytes:
                    raise VlccValueError(
                        f"region {name!r} overlaps region {other!r} (bytes "
                        f"{max(start, address):#x}..{min(stop, address + nbytes):#x}); "
                        "protect memory once, each byte in one region"
                    )
            raw = (ctypes.c_char * nbytes).from_address(address)
            array = np.frombuffer(memoryview(raw).cast("B"), dtype=dt).reshape(shape)
            self._spans.append((address, address + nbytes, name))
        self.state[name] = array
        return array

    def copy(self) -> dict[str, np.ndarray]:
        """A copy of the regions' contents, in arrays of its own."""
        return {name: array.copy() for name, array in self.state.items()}

    def fill(self, state: Any, what: str) -> None:
        """Copy `state`, a mapping of the regions' names to arrays of their
        dtypes and shapes, into the regions.

        **Arguments:**

        - `state`: the values (a state checked out of a history, a copy from
          :meth:`copy`); numpy scalars count as 0-d arrays.
        - `what`: the state's name in an error message (``"version 1a2b..."``).

        Raises ``ValueError`` naming the first difference (a name missing or
        extra, a shape or a dtype) before anything is written.
        """
        if not isinstance(state, Mapping):
            raise VlccValueError(
                f"{what} holds a {type(state).__name__}, not a dict of named arrays; the "
                "C and Fortran interface reads states that are dicts of arrays"
            )
        missing = [n for n in self.state if n not in state]
        extra = [n for n in state if n not in self.state]
        if missing or extra:
            raise VlccValueError(
                f"{what} holds the arrays {list(state)}, the protected regions are "
                f"{list(self.state)}"
                + (f"; missing: {missing}" if missing else "")
                + (f"; not protected: {extra}" if extra else "")
                + ": protect one region per array, under its name"
            )
        values = {n: np.asarray(state[n]) for n in self.state}
        text = Structure.of(self.state).mismatch(values, what)
        if text:
            raise VlccValueError(
                f"{text} (the protected region); protect regions of the dtypes and shapes "
                "the state was stored with"
            )
        for name, array in self.state.items():
            np.copyto(array, values[name])

    def clear(self) -> None:
        """Forget every region (the program's memory is not touched)."""
        self.state = {}
        self._spans = []
