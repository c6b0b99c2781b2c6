"""ErrorBounded: SZ3-style lossy compression with a guaranteed absolute error.

The stages (format 2; the format-1 Lorenzo codec of earlier releases is
still decoded, :mod:`._lorenzo`):

1. *Predict and quantise* (:mod:`._interp`): multilevel cubic-spline
   interpolation on the array's own shape, coarse to fine, each value
   predicted from already reconstructed neighbours and quantised on the
   lattice of step ``s = 2 eb (1 - 2^-8)`` around its prediction (Zhao et al.,
   ICDE 2021; Liang et al., IEEE TBD 2022: SZ3's interpolation predictor with
   its linear-scaling quantisation).  The encoder reconstructs every value
   exactly as the decoder will and checks ``|x - x'| <= eb`` in float64.
2. *Codes*: one byte per value, ``zigzag(q)`` below 255, else 255 and ``q`` in
   an escape list.
3. *Entropy stage*: the bytes are packed in blocks of 8 at the bit width of
   their largest code (:mod:`._bytepack`), and the block widths, a byte per 8
   values, are compressed with Zstd through C-Blosc2.  SZ3 Huffman-codes its
   quantisation codes and runs Zstd over the result; here Zstd (whose
   literals are Huffman-coded) sees only the widths, an eighth of the bytes,
   which is what makes the stage fast.  On the benchmark wavefield at 1e-4 of
   its range the codes cost 1.15 bits per value and the widths 0.21.
4. *Exceptions*: the values that fail the check (NaN, +-inf, ``|x - p| / s >
   2^50``, a rounding failure at the bound) take the code 0, so that the
   values predicted from them see the same ``x' = dtype(p)`` in the encoder
   and the decoder, and are stored verbatim (index and value, compressed with
   :class:`Lossless`) and patched in after decoding.  NaN payloads and
   infinities come back bit for bit.

Guarantee: ``|x - x'| <= abs_error`` for every finite element, computed in
float64 from the stored dtype (the tests check it on adversarial data);
non-finite values round-trip exactly.

Dtypes: float32 and float64 (native byte order) are compressed as above.
Every other numeric dtype (bool, integers, float16, complex, big-endian
floats) is stored *exactly* with :class:`Lossless` inside an ErrorBounded
blob (trivially within the bound); so is a float array whose exceptions
exceed a quarter of its values, or whose lossy encoding would not be smaller
than its raw bytes.  When more than an eighth of the codes escape (data with
little to predict, such as noise), the encoder also tries format 1 and keeps
the smaller blob.

Shapes: length-1 axes are dropped first; the predictor runs on a 1-, 2- or
3-D view, more dimensions merged into the leading axis of a 3-D view; 0-d
arrays are 1 value; empty arrays have no payload.  Non-contiguous input is
copied to C order first.

Layout after the common header (``_codec.py``), format 2::

    _PARAMS    mode (0 interpolation, 1 lossless), flags (0), reserved,
               abs_error, step, nz, ny, nx, escapes, exceptions, and the
               byte lengths of the four parts below
    widths     Lossless (Zstd) blob of the block widths, uint8 (ceil(n/8),)
    padding    to a multiple of 8 bytes from the blob's start
    words      the packed codes (uint64 words, the pad word included)
    escapes    Lossless (Zstd) blob of the escaped codes, zigzagged, uint64
               (escapes,); or empty
    table      the exception table (``_lossy.py``); or empty

The decoder checks every length against the shape before it allocates or
reads: the parts must add up to the blob's length, each inner blob must
declare exactly the dtype and shape the header implies, the widths must be
<= 8 and imply the words' length, and the codes must use every escape.

Ratios and speeds against zfp and SZ3, at equal measured error, are measured
by ``benchmarks/bench_codecs.py`` (results in ``benchmarks/results/``).
First use compiles the kernels; numba caches them on disk.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from ...errors import VlccValueError
from ._bitpack import words_for_bits
from ._bytepack import pack8, unpack8
from ._codec import (
    ERROR_BOUNDED_ID,
    Blob,
    Codec,
    Scratch,
    check_numeric,
    from_bytes,
    little_endian_host,
    need,
    output,
    read_header,
    readonly,
    write_header,
)
from ._interp import sweep
from ._lorenzo import decode_v1, encode_v1, lorenzo_shape
from ._lossless import Lossless
from ._lossy import compresses, decode_fallback, pack_exceptions, patch_exceptions

__all__ = ["ErrorBounded"]

_MARGIN = 1.0 - 2.0**-8  # s = 2 eb * _MARGIN
_MAX_STEP = 2.0**1000

# mode, flags, reserved, reserved, abs_error, step, nz, ny, nx, escapes, exceptions,
# bytes of: widths, words, escapes, exception table
_PARAMS = struct.Struct("<BBHIddQQQQQQQQQ")
_MODE_INTERP = 0
_MODE_LOSSLESS = 1
_V1, _V2 = 1, 2


def _zigzag(q: np.ndarray) -> np.ndarray:
    """``2q`` for ``q >= 0``, ``-2q - 1`` otherwise, as uint64 (small magnitudes
    of either sign become small numbers, whose high bytes compress away)."""
    return ((q << 1) ^ (q >> 63)).view(np.uint64)


class ErrorBounded(Codec):
    """Lossy compression with ``|x - x'| <= abs_error`` for every finite value.

    SZ3-style: multilevel cubic-spline interpolation on the array's shape,
    linear quantisation around each prediction, byte codes packed in blocks of
    8 with Zstd-coded block widths; numba kernels without the GIL.  See the
    module docstring for the algorithm, the guarantee, the dtypes and the
    format (blobs of the earlier Lorenzo format 1 still decode).

    **Arguments:**

    - `abs_error`: the absolute error bound, a finite number > 0.

    ``encode(array) -> bytes`` and ``decode(blob, out=None) -> ndarray``
    (same dtype and shape).  NaN and +-inf round-trip exactly; non-float
    dtypes are stored exactly (losslessly).  Safe to call from several
    threads: each thread gets its own scratch buffers.
    """

    name = "vlcc_error_bounded"
    codec_id = ERROR_BOUNDED_ID
    version = _V2  # writes format 2; decodes 1 and 2
    lossless = False  # within abs_error, not bit for bit

    def __init__(self, abs_error: float):
        try:
            eb = float(abs_error)
        except (TypeError, ValueError):
            raise VlccValueError(
                f"abs_error must be a finite number > 0, got {abs_error!r}"
            ) from None
        if not (math.isfinite(eb) and eb > 0):
            raise VlccValueError(f"abs_error must be a finite number > 0, got {abs_error!r}")
        self.abs_error = eb
        self._scratch = Scratch()
        self._lossless = Lossless()
        self._zstd = Lossless(clevel=1, compressor="zstd", shuffle="none")
        self._zstd_bytes = Lossless(clevel=1, compressor="zstd", shuffle="byte")

    def _parameters(self) -> dict[str, Any]:
        return {"abs_error": self.abs_error}

    @classmethod
    def _default_instance(cls) -> ErrorBounded:
        return cls(1.0)

    @property
    def step(self) -> float:
        """The quantisation step ``s = 2 abs_error (1 - 2^-8)`` (capped at ``2^1000``)."""
        return min(2.0 * self.abs_error * _MARGIN, _MAX_STEP)

    def encode(self, array: np.ndarray) -> bytes:
        """Compress ``array`` within the bound.

        **Arguments:**

        - `array`: a numeric ndarray; float32/float64 are compressed lossily,
          other dtypes exactly.

        **Returns:** a self-describing blob (bytes, format 2).
        """
        array = check_numeric(array)
        header = write_header(self.codec_id, _V2, array.dtype, array.shape)
        if not compresses(array.dtype):
            return self._encode_lossless(header, array)
        little_endian_host()
        x = readonly(array).reshape(-1)
        n = x.size
        nz, ny, nx = lorenzo_shape(array.shape)
        if n == 0:
            return header + _PARAMS.pack(
                _MODE_INTERP, 0, 0, 0, self.abs_error, self.step, nz, ny, nx, 0, 0, 0, 0, 0, 0
            )
        nb = -(-n // 8)
        sc = self._scratch
        codes = sc.get("codes", np.uint8, 8 * nb)
        codes[n:] = 0
        esc = sc.get("esc", np.int64, n)
        exc = sc.get("exc", np.int64, n)
        bufa, bufb, pb, xs, rs = self._buffers(x.dtype, nz, ny, nx)
        _, n_esc, n_exc = sweep(
            x,
            bufb,
            nz,
            ny,
            nx,
            self.step,
            self.abs_error,
            codes,
            esc,
            exc,
            bufa,
            bufb,
            pb,
            xs,
            rs,
            True,
        )
        if n_exc > n // 4:
            return self._encode_lossless(header, array)
        widths = sc.get("widths", np.uint8, nb)
        words = sc.get("words", np.uint64, words_for_bits(64 * nb))
        nwords = pack8(codes.view(np.uint64), nb, widths, words)
        wpart = self._zstd.encode(widths)
        epart = self._zstd_bytes.encode(_zigzag(esc[:n_esc])) if n_esc else b""
        xpart = pack_exceptions(self._lossless, np.sort(exc[:n_exc]), x)
        pad = -(len(header) + _PARAMS.size + len(wpart)) % 8
        size = len(header) + _PARAMS.size + len(wpart) + pad + 8 * nwords + len(epart) + len(xpart)
        if n_esc > n // 8:
            # Codes too large for bytes (noise-like data at a tight bound): the
            # format-1 coder, whose bit widths follow the codes, may do better.
            v1 = self._encode_v1(array)
            if len(v1) < size:
                return v1
        if size >= array.nbytes:
            return self._encode_lossless(header, array)
        params = _PARAMS.pack(
            _MODE_INTERP,
            0,
            0,
            0,
            self.abs_error,
            self.step,
            nz,
            ny,
            nx,
            n_esc,
            n_exc,
            len(wpart),
            8 * nwords,
            len(epart),
            len(xpart),
        )
        return b"".join(
            (header, params, wpart, b"\0" * pad, words[:nwords].view(np.uint8).data, epart, xpart)
        )

    def _buffers(self, dtype: np.dtype, nz: int, ny: int, nx: int):
        """This thread's work arrays for :func:`sweep` on an ``(nz, ny, nx)`` view:
        the two level buffers (``nz ny ceil(nx / 2)`` values of ``dtype``) and
        the three row buffers (``ceil(nx / 2) + 1`` values)."""
        sc = self._scratch
        half = nz * ny * ((nx + 1) // 2)
        row = (nx + 1) // 2 + 1
        c = dtype.char
        return (
            sc.get("a" + c, dtype, half),
            sc.get("b" + c, dtype, half),
            sc.get("pb", np.float64, row),
            sc.get("xs" + c, dtype, row),
            sc.get("rs" + c, dtype, row),
        )

    def _encode_lossless(self, header: bytes, array: np.ndarray) -> bytes:
        inner = self._lossless.encode(array)
        return b"".join(
            (
                header,
                _PARAMS.pack(
                    _MODE_LOSSLESS,
                    0,
                    0,
                    0,
                    self.abs_error,
                    self.step,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    len(inner),
                ),
                inner,
            )
        )

    def decode(self, blob: Blob, out: np.ndarray | None = None) -> np.ndarray:
        """Decompress a blob written by :meth:`encode` (any ``abs_error``: the
        blob carries its own; format 1 and 2).

        **Arguments:**

        - `blob`: bytes-like.
        - `out`: optional writeable C-contiguous array of the blob's dtype and
          shape to decode into.

        **Returns:** the array (``out`` when given).
        """
        view, dtype, shape, offset = read_header(blob, self.codec_id, (_V1, _V2))
        if view[6] == _V1:
            return decode_v1(view, offset, dtype, shape, out, self._scratch)
        need(view, offset + _PARAMS.size, "the ErrorBounded parameters")
        (
            mode,
            flags,
            _,
            _,
            _,
            step,
            nz,
            ny,
            nx,
            n_esc,
            n_exc,
            nb_widths,
            nb_words,
            nb_esc,
            nb_exc,
        ) = _PARAMS.unpack_from(view, offset)
        offset += _PARAMS.size
        if mode == _MODE_LOSSLESS:
            return decode_fallback(view, offset, nb_exc, out, dtype, shape, "ErrorBounded")
        if mode != _MODE_INTERP or flags:
            raise VlccValueError(f"corrupt ErrorBounded blob: unknown mode {mode} or flags {flags}")
        if not compresses(dtype):
            raise VlccValueError(f"corrupt ErrorBounded blob: a lossy payload for dtype {dtype}")
        if not (math.isfinite(step) and step > 0):
            raise VlccValueError(f"corrupt ErrorBounded blob: quantisation step {step}")
        if (nz, ny, nx) != lorenzo_shape(shape):
            raise VlccValueError("corrupt ErrorBounded blob: its 3-D view does not match its shape")
        n = math.prod(shape)
        if n_esc > n or n_exc > n or (n_esc == 0) != (nb_esc == 0) or (n_exc == 0) != (nb_exc == 0):
            raise VlccValueError(
                f"corrupt ErrorBounded blob: {n_esc} escapes and {n_exc} "
                f"exceptions ({nb_esc} and {nb_exc} bytes) in {n} values"
            )
        pad = -(offset + nb_widths) % 8 if n else 0
        end = offset + nb_widths + pad + nb_words + nb_esc + nb_exc
        need(view, end, "the ErrorBounded payload")
        if len(view) != end:
            raise VlccValueError("corrupt ErrorBounded blob: trailing bytes after the payload")
        if n == 0:
            if end != offset:
                raise VlccValueError("corrupt ErrorBounded blob: a payload for an empty array")
            return output(out, dtype, shape)
        nb = -(-n // 8)
        sc = self._scratch
        widths = sc.get("widths", np.uint8, nb)
        try:  # decoded into a buffer of the size the shape implies, or refused
            self._zstd.decode(view[offset : offset + nb_widths], out=widths)
        except ValueError as err:
            raise VlccValueError(f"corrupt ErrorBounded blob: block widths: {err}") from None
        offset += nb_widths + pad
        if widths.max() > 8 or 8 * words_for_bits(8 * int(widths.sum(dtype=np.int64))) != nb_words:
            raise VlccValueError(
                "corrupt ErrorBounded blob: block widths do not match the payload size"
            )
        little_endian_host()
        result = output(out, dtype, shape)  # only now: the sizes agree with the shape
        words = from_bytes(view, np.uint64, nb_words // 8, offset)
        offset += nb_words
        codes = sc.get("codes", np.uint8, 8 * nb)
        unpack8(words, widths, nb, codes.view(np.uint64))
        esc = sc.get("esc", np.int64, n_esc)
        if n_esc:
            zz = esc[:n_esc].view(np.uint64)
            try:
                self._zstd_bytes.decode(view[offset : offset + nb_esc], out=zz)
            except ValueError as err:
                raise VlccValueError(f"corrupt ErrorBounded blob: escapes: {err}") from None
            esc[:n_esc] = (zz >> np.uint64(1)).view(np.int64) ^ -(zz & np.uint64(1)).view(np.int64)
        offset += nb_esc
        flat = result.reshape(-1)
        bufa, bufb, pb, xs, rs = self._buffers(dtype, nz, ny, nx)
        _, used, _ = sweep(
            readonly(flat),
            flat,
            nz,
            ny,
            nx,
            step,
            0.0,
            codes,
            esc[:n_esc],
            sc.get("exc", np.int64, 1),
            bufa,
            bufb,
            pb,
            xs,
            rs,
            False,
        )
        if used != n_esc:
            raise VlccValueError(
                f"corrupt ErrorBounded blob: the codes use {used} of {n_esc} escapes"
            )
        if n_exc:
            patch_exceptions(view, offset, nb_exc, n_exc, flat, "ErrorBounded")
        return result

    def _encode_v1(self, array: np.ndarray) -> bytes:
        """A format-1 (Lorenzo) blob of ``array``: what earlier releases wrote."""
        array = check_numeric(array)
        header = write_header(self.codec_id, _V1, array.dtype, array.shape)
        return encode_v1(array, header, self.abs_error, self.step, self._scratch, self._lossless)
