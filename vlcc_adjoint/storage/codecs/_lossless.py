"""Lossless: byte (or bit) shuffle + LZ4 through C-Blosc2.

We do not write a lossless compressor: C-Blosc2 (Alted et al.; python-blosc2)
already does the right thing for arrays of numbers.  Its shuffle filter
transposes the array's bytes so that byte ``i`` of every element sits next
to byte ``i`` of its neighbours (``typesize`` = the element size); for
smooth or small-magnitude data the high bytes then form long runs that LZ4
(or LZ4HC, Zstd) removes at several GB/s.  Bit shuffle does the same per
bit, better for data with few significant bits, somewhat slower.

Layout after the common header (see ``_codec.py``)::

    uint8  compressor (0 lz4, 1 lz4hc, 2 zstd, 3 blosclz)
    uint8  clevel
    uint8  shuffle (0 none, 1 byte, 2 bit)
    uint8  reserved
    uint32 reserved
    uint64 chunk_nbytes   raw bytes per chunk (the last may be shorter)
    uint64 nchunks
    uint64 * nchunks      compressed length of each chunk
    ...                   the Blosc2 chunks, back to back

One Blosc2 chunk holds less than 2 GiB (``blosc2.MAX_BUFFERSIZE``), so larger
arrays are split into chunks of ``chunk_nbytes`` (1 GiB, a multiple of the
item size) and each is decompressed straight into its slice of the output.

Threads and the GIL: Blosc2 releases the GIL during (de)compression only
after ``blosc2.set_releasegil(True)``, which importing this module calls (a
process-wide Blosc2 setting; it only matters for callers on several
threads, where it is what they want).  Each call uses ``nthreads`` Blosc2
worker threads (default 1: the storage engine already runs codecs on its own
threads, and the target machines have few cores).
"""

from __future__ import annotations

import struct
from typing import Any

import blosc2
import numpy as np

from ...errors import VlccValueError
from ._codec import LOSSLESS_ID, Blob, Codec, check_numeric, need, output, read_header, write_header

__all__ = ["Lossless"]

blosc2.set_releasegil(True)

_COMPRESSORS = {
    "lz4": blosc2.Codec.LZ4,
    "lz4hc": blosc2.Codec.LZ4HC,
    "zstd": blosc2.Codec.ZSTD,
    "blosclz": blosc2.Codec.BLOSCLZ,
}
_COMPRESSOR_NAMES = list(_COMPRESSORS)
_SHUFFLES = {
    "none": blosc2.Filter.NOFILTER,
    "byte": blosc2.Filter.SHUFFLE,
    "bit": blosc2.Filter.BITSHUFFLE,
}
_SHUFFLE_NAMES = list(_SHUFFLES)
_PARAMS = struct.Struct("<BBBBIQQ")

# Raw bytes per Blosc2 chunk: below blosc2.MAX_BUFFERSIZE (2 GiB - 33).  Private
# and module-level so that tests can shrink it to exercise the chunking.
_CHUNK_BYTES = 1 << 30


class Lossless(Codec):
    """Exact compression: shuffle + LZ4 (C-Blosc2), GIL released.

    **Arguments:**

    - `clevel`: compression level 0-9 (default 5; for LZ4 higher levels
      mostly cost compression time, for ``"lz4hc"``/``"zstd"`` they buy ratio).
    - `compressor`: ``"lz4"`` (default), ``"lz4hc"``, ``"zstd"`` or ``"blosclz"``.
    - `shuffle`: ``"byte"`` (default, typesize = the item size), ``"bit"`` or
      ``"none"``.
    - `nthreads`: Blosc2 threads per call (default 1).

    Encodes any numeric dtype (bool, integers, floats, complex, either byte
    order) and any shape, 0-d and empty included; non-contiguous input is
    copied to C order first.  ``decode`` returns the same dtype and shape.
    """

    name = "vlcc_lossless"
    codec_id = LOSSLESS_ID
    version = 1
    lossless = True  # decode(encode(x)) == x for every input

    def __init__(
        self, clevel: int = 5, compressor: str = "lz4", shuffle: str = "byte", nthreads: int = 1
    ):
        if not isinstance(clevel, (int, np.integer)) or not 0 <= clevel <= 9:
            raise VlccValueError(f"clevel must be an integer in 0..9, got {clevel!r}")
        if compressor not in _COMPRESSORS:
            raise VlccValueError(
                f"compressor must be one of {_COMPRESSOR_NAMES}, got {compressor!r}"
            )
        if shuffle not in _SHUFFLES:
            raise VlccValueError(f"shuffle must be one of {_SHUFFLE_NAMES}, got {shuffle!r}")
        if not isinstance(nthreads, (int, np.integer)) or nthreads < 1:
            raise VlccValueError(f"nthreads must be a positive integer, got {nthreads!r}")
        self.clevel = int(clevel)
        self.compressor = compressor
        self.shuffle = shuffle
        self.nthreads = int(nthreads)

    def _parameters(self) -> dict[str, Any]:
        return {
            "clevel": self.clevel,
            "compressor": self.compressor,
            "shuffle": self.shuffle,
            "nthreads": self.nthreads,
        }

    @classmethod
    def _default_instance(cls) -> Lossless:
        return cls()

    def encode(self, array: np.ndarray) -> bytes:
        """Compress ``array`` exactly.

        **Arguments:**

        - `array`: a numeric ndarray (or anything ``np.asarray`` accepts).

        **Returns:** a self-describing blob (bytes).
        """
        array = check_numeric(array)
        parts = [write_header(self.codec_id, self.version, array.dtype, array.shape)]
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        itemsize = max(array.dtype.itemsize, 1)
        chunk = max(itemsize, _CHUNK_BYTES - _CHUNK_BYTES % itemsize)
        chunks = []
        # Shuffle needs typesize <= 255 in Blosc2's header; complex256 etc. fall back to 1
        # (still exact, just less effective).
        typesize = itemsize if itemsize <= 255 else 1
        for start in range(0, data.size, chunk):
            chunks.append(
                blosc2.compress2(
                    data[start : start + chunk],
                    codec=_COMPRESSORS[self.compressor],
                    clevel=self.clevel,
                    typesize=typesize,
                    filters=[_SHUFFLES[self.shuffle]],
                    filters_meta=[0],
                    nthreads=self.nthreads,
                )
            )
        parts.append(
            _PARAMS.pack(
                _COMPRESSOR_NAMES.index(self.compressor),
                self.clevel,
                _SHUFFLE_NAMES.index(self.shuffle),
                0,
                0,
                chunk,
                len(chunks),
            )
        )
        parts.append(struct.pack(f"<{len(chunks)}Q", *(len(c) for c in chunks)))
        parts.extend(chunks)
        return b"".join(parts)

    def decode(self, blob: Blob, out: np.ndarray | None = None) -> np.ndarray:
        """Decompress a blob written by :meth:`encode`.

        **Arguments:**

        - `blob`: bytes-like.
        - `out`: optional writeable C-contiguous array of the blob's dtype and
          shape; the data is decompressed straight into it.

        **Returns:** the array (``out`` when given).
        """
        view, dtype, shape, offset = read_header(blob, self.codec_id, self.version)
        return decode_payload(view, offset, dtype, shape, out, self.nthreads)


def decode_payload(
    view: memoryview,
    offset: int,
    dtype: np.dtype,
    shape: tuple[int, ...],
    out: np.ndarray | None,
    nthreads: int = 1,
) -> np.ndarray:
    """Decode the Lossless part of a blob that starts at ``offset``."""
    need(view, offset + _PARAMS.size, "the Lossless parameters")
    comp, clevel, shuf, _, _, chunk, nchunks = _PARAMS.unpack_from(view, offset)
    if comp >= len(_COMPRESSOR_NAMES) or shuf >= len(_SHUFFLE_NAMES) or clevel > 9:
        raise VlccValueError("corrupt Lossless parameters in blob")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if chunk <= 0 or nchunks != -(-nbytes // chunk):
        raise VlccValueError(
            f"corrupt Lossless blob: {nchunks} chunks of {chunk} bytes cannot hold {nbytes} bytes"
        )
    offset += _PARAMS.size
    need(view, offset + 8 * nchunks, "the Lossless chunk table")
    lengths = struct.unpack_from(f"<{nchunks}Q", view, offset)
    offset += 8 * nchunks
    if offset + sum(lengths) != len(view):
        raise VlccValueError(
            f"truncated or padded Lossless blob: the chunks need {offset + sum(lengths)} bytes, "
            f"the blob has {len(view)}"
        )
    chunks = []
    for i, length in enumerate(lengths):
        src = view[offset : offset + length]
        offset += length
        expect = min(chunk, nbytes - i * chunk)
        try:
            raw, cbytes, _ = blosc2.get_cbuffer_sizes(src)
        except Exception:
            raw, cbytes = -1, -1
        if raw != expect or cbytes != length:
            raise VlccValueError(
                f"corrupt Lossless chunk {i}: it says {raw} raw / {cbytes} compressed "
                f"bytes, expected {expect} / {length}"
            )
        chunks.append(src)
    result = output(out, dtype, shape)  # only now: the chunks agree with the shape
    dst = result.reshape(-1).view(np.uint8).data  # a memoryview of the result's bytes
    for i, src in enumerate(chunks):
        start = i * chunk
        try:
            blosc2.decompress2(
                src, dst=dst[start : start + min(chunk, nbytes - start)], nthreads=nthreads
            )
        except (RuntimeError, ValueError) as err:
            raise VlccValueError(f"corrupt Lossless chunk {i}: {err}") from None
    return result
