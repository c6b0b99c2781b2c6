"""What the two lossy codecs share: which dtypes they compress, the exact
fallback for the others, and the table of values stored verbatim.

Both :class:`ErrorBounded` and :class:`FixedRate` compress float32 and
float64 in native byte order and store every other numeric dtype (and a
float array that does not compress) *exactly*, as a :class:`Lossless` blob
inside their own; :func:`decode_fallback` reads that inner blob back.

Both also store the values they cannot represent within their guarantee
(NaN, +-inf, out-of-range magnitudes, rounding failures) as a table
appended to the blob::

    uint64  length of part A
    A       Lossless blob of the index deltas (int64; the first is the index)
    B       Lossless blob of the values (the array's dtype, bit for bit)

Indices are ascending, so their deltas are small and compress well;
:func:`patch_exceptions` checks the table against the array before writing.
"""

from __future__ import annotations

import struct

import numpy as np

from ...errors import VlccValueError
from ._codec import need
from ._lossless import Lossless


def compresses(dtype: np.dtype) -> bool:
    """Whether the lossy codecs compress `dtype` (float32/float64, native
    byte order); they store any other dtype exactly."""
    return dtype in (np.float32, np.float64) and dtype.byteorder != ">"


def decode_fallback(
    view: memoryview,
    offset: int,
    nbytes: int,
    out: np.ndarray | None,
    dtype: np.dtype,
    shape: tuple[int, ...],
    who: str,
) -> np.ndarray:
    """The array of the inner :class:`Lossless` blob at ``view[offset:offset+nbytes]``
    (into `out` when given), which must have the outer blob's `dtype` and
    `shape`; a ``ValueError`` naming `who` if not."""
    need(view, offset + nbytes, "the lossless payload")
    inner = Lossless._decoder().decode(view[offset : offset + nbytes], out=out)
    if inner.dtype != dtype or inner.shape != shape:
        raise VlccValueError(f"corrupt {who} blob: the inner array does not match the header")
    return inner


def pack_exceptions(lossless: Lossless, idx: np.ndarray, flat: np.ndarray) -> bytes:
    """The table for the ascending flat indices `idx` into `flat`; empty
    bytes when there are none."""
    if not idx.size:
        return b""
    a = lossless.encode(np.diff(idx, prepend=np.int64(0)))
    return struct.pack("<Q", len(a)) + a + lossless.encode(flat[idx])


def patch_exceptions(
    view: memoryview, offset: int, nbytes: int, n_exc: int, flat: np.ndarray, who: str
) -> None:
    """Write the ``n_exc`` values of the table at ``view[offset:offset+nbytes]``
    into ``flat``; a ``ValueError`` naming ``who`` if the table is corrupt."""
    need(view, offset + nbytes, "the exception table")
    if nbytes < 8:
        raise VlccValueError(f"corrupt {who} blob: bad exception table")
    (la,) = struct.unpack_from("<Q", view, offset)
    if 8 + la > nbytes:
        raise VlccValueError(f"corrupt {who} blob: bad exception table")
    if not 0 < n_exc <= flat.size:
        raise VlccValueError(f"corrupt {who} blob: {n_exc} exceptions in {flat.size} values")
    lossless = Lossless._decoder()
    # decoded into arrays of the declared size: a table claiming more is refused
    # before anything is allocated for it
    deltas = np.empty(n_exc, np.int64)
    values = np.empty(n_exc, flat.dtype)
    try:
        lossless.decode(view[offset + 8 : offset + 8 + la], out=deltas)
        lossless.decode(view[offset + 8 + la : offset + nbytes], out=values)
    except ValueError as err:
        raise VlccValueError(f"corrupt {who} blob: bad exception table ({err})") from None
    idx = np.cumsum(deltas)
    if idx[0] < 0 or idx[-1] >= flat.size or np.any(deltas[1:] <= 0):
        raise VlccValueError(f"corrupt {who} blob: exception indices out of range")
    flat[idx] = values
