"""ErrorBounded format 1: Lorenzo prediction on the quantisation lattice and
per-block bit packing.

Blobs of this format (codec version 1) were written before format 2
(:mod:`._interp`); this module decodes them, and can still write them
(:func:`encode_v1`, for tests of the decoder).  The layout after the common
header is the parameter struct ``_PARAMS``, the block widths (a byte or a
nibble each), padding to 8 bytes, the packed words and the exception table.

References:

- S. Di and F. Cappello, "Fast error-bounded lossy HPC data compression
  with SZ", IPDPS 2016 (prediction + linear quantisation, the SZ scheme).
- D. Tao, S. Di, Z. Chen and F. Cappello, "Significantly improving lossy
  compression for scientific data sets based on multidimensional prediction
  and error-controlled quantization", IPDPS 2017 (SZ-1.4: the Lorenzo
  predictor on reconstructed values, in 1, 2 and 3 dimensions).
- X. Liang, S. Di, D. Tao, S. Li, S. Li, H. Guo, Z. Chen and F. Cappello,
  "Error-controlled lossy compression optimized for high compression ratios
  of scientific datasets", IEEE BigData 2018 (SZ2).
- J. Tian, S. Di, K. Zhao, C. Rivera, M. H. Fulp, R. Underwood, S. Jin,
  X. Liang, J. Calhoun, D. Tao and F. Cappello, "cuSZ: an efficient GPU-based
  error-bounded lossy compression framework", PACT 2020 (dual quantisation,
  used here to take the serial dependency out of the encoder).

The scheme.  With the bound ``eb`` and the lattice step ``s = 2 eb (1 - mu)``,
``mu = 2^-8``:

1. *Quantise every value to the lattice*: ``p = rint(x * fl(1/s))`` (an
   integer, ``|p| <= 2^50``).  The reconstruction is ``x' = cast(p * s)``,
   the product computed in float64 and rounded once to the array's dtype,
   by the encoder and the decoder alike.  ``|x - p s| <= s / 2`` up to the
   rounding of ``x / s``, and the margin ``eb mu`` absorbs every rounding:

       |x - x'| <= s/2 + |x| 2^-51.4 + (|x| + s) (2^-53 + 2^-24 [float32 only])

   which is ``<= eb`` whenever ``|x| <= T``, ``T = 2^15 eb`` for float32
   (the float32 term is then at most ``eb 2^-9``) and ``T = 2^40 eb`` for
   float64 (provided ``eb`` is far above the subnormals: ``eb >= 2^-100``,
   resp. ``2^-1000``; otherwise ``T = 0``).  The encoder tracks ``max |x|``
   over each chunk of 2048 values; only in a chunk whose maximum exceeds
   ``T`` (or holding a non-finite value) does it reconstruct each value as
   the decoder will and test ``|x - x'| <= eb`` one by one.  The margin
   costs ``log2(1 / (1 - mu)) = 0.006`` bits per value.

2. *Predict with Lorenzo on the lattice*: the code of ``p[z, y, x]`` is the
   Lorenzo residual

       r = p - p[x-1] - p[y-1] - p[z-1] + p[x-1,y-1] + p[x-1,z-1] + p[y-1,z-1]
             - p[x-1,y-1,z-1]

   (neighbours outside the array count as 0; 2-D and 1-D drop the terms of
   the missing axes).  Because the prediction ``p - r`` is itself a lattice
   point, this is exactly SZ-1.4's "predict from the *reconstructed*
   neighbours, quantise the prediction error with step ``s``":
   ``rint((x - s (p - r)) / s) = p - (p - r) = r``.  Quantising first and
   predicting on integers (cuSZ's dual quantisation) gives the same codes
   without SZ's value-by-value feedback loop, so every pass over the data is
   a vectorisable loop, and the decoder inverts it exactly with integer
   prefix sums.  The residual is separable: ``r = D_z D_y D_x p`` with
   backward differences ``D``, which is how the kernel computes it, one row
   at a time, keeping the previous row's ``D_x p`` (2-D) and the previous
   plane's ``D_y D_x p`` (3-D).

3. *Pack the codes*: zigzag (``2r`` for ``r >= 0``, ``-2r - 1`` otherwise),
   blocks of 32 codes in C order, each block packed at the bit width of its
   largest code (see ``_bitpack.py``); the widths are stored apart, 4 bits
   each when all are below 16 (the usual case), else a byte each.  Smooth
   data gives codes of a few bits; quiet regions give width-0 blocks that
   cost 4 bits per 32 values.  Blocks of 32 rather than 128: on the
   benchmark wavefield the per-block widths follow the local amplitude
   closely enough to save a quarter of the payload (4.3 -> 3.3 bits per
   value).  An LZ stage (LZ4 or Zstd through Blosc2) on the packed codes
   was measured and does not pay: LZ4 gains nothing, Zstd 12% at three
   times the encoding time.

4. *Exceptions*: every value whose reconstruction, computed exactly as the
   decoder will, is not within ``eb`` of it (NaN, +-inf, ``|x / s| > 2^50``,
   or a rounding failure at the bound) is stored verbatim (index and value,
   compressed with :class:`Lossless`) and patched in after decoding.  NaN
   payloads and infinities come back bit for bit.  Non-finite and
   out-of-range values take ``p = 0`` in the prediction.

Guarantee: ``|x - x'| <= abs_error`` for every finite element, computed in
float64 from the stored dtype (the tests check it on adversarial data);
non-finite values round-trip exactly.

Dtypes: float32 and float64 (native byte order) are compressed as above.
Every other numeric dtype (bool, integers, float16, complex, big-endian
floats) is stored *exactly* with
:class:`Lossless` inside an ErrorBounded blob (trivially within the bound);
so is a float array whose exceptions exceed a quarter of its values, or
whose lossy encoding would not be smaller than its raw bytes.

Ratios and speeds against zfp and SZ3 are measured by
``benchmarks/bench_codecs.py`` (results in ``benchmarks/results/``).  First
use compiles the kernels; numba caches them on disk (next to the sources,
or in ``NUMBA_CACHE_DIR`` / the user cache when that is read-only), so later
processes only load them.

Shapes: length-1 axes are dropped first; 1-, 2- and 3-D arrays use the
Lorenzo predictor of their dimension; more dimensions are merged into the
leading axis of a 3-D view; 0-d arrays are 1 value; empty arrays have no
payload.
"""

from __future__ import annotations

import math
import struct

import numba
import numpy as np

from ...errors import VlccValueError
from ._bitpack import finish, float_bits, pack_blocks, unpack_blocks, words_for_bits
from ._codec import from_bytes, little_endian_host, need, output, readonly
from ._lossy import compresses, decode_fallback, pack_exceptions, patch_exceptions

_B = 32  # codes per packed block (one width each)
_CH = 2048  # values per pass of the row loop: its buffers stay in L1
_LIMIT = 2.0**50  # |x / s| beyond this is an exception (codes stay < 2^55)
_MARGIN = 1.0 - 2.0**-8  # s = 2 eb * _MARGIN
_ABS = np.uint64(0x7FFF_FFFF_FFFF_FFFF)  # float64 bits without the sign
_MAX_STEP = 2.0**1000


# -- kernels -----------------------------------------------------------------------
# Inner loops index slices from 0 (``xs[j]``, not ``x[base + j]``): numba
# wraps negative indices, and only when LLVM can prove an index >= 0 does the
# loop vectorise with plain loads instead of gathers.  Constants passed to
# other kernels are wrapped (``np.int64(_B)``): numba would otherwise compile
# the callee once per literal value it is called with.


@numba.njit(cache=True, nogil=True)
def _flush_blocks(rbuf, fill, final, widths, nb, words, pos, acc, shift):
    """Pack the complete blocks of ``rbuf[:fill]`` (and, if ``final``, the
    zero-padded rest) and move what is left to the front.
    Returns ``(fill, nb, pos, acc, shift)``."""
    if final and fill % _B:
        for i in range(fill, fill + _B - fill % _B):
            rbuf[i] = 0
        fill += _B - fill % _B
    done = fill - fill % _B
    nb, pos, acc, shift = pack_blocks(
        rbuf, done, np.int64(_B), np.int64(-1), widths, nb, words, pos, acc, shift
    )
    for i in range(fill - done):
        rbuf[i] = rbuf[done + i]
    return fill - done, nb, pos, acc, shift


@numba.njit(cache=True, nogil=True)
def _encode(x, nz, ny, nx, step, eb, safe, widths, words, tmp, pbuf, rbuf, d1, d2, exc):
    """Quantise, predict and pack ``x`` (flat, C order, shape ``(nz, ny, nx)``).

    ``tmp`` (x's dtype, ``_CH``), ``pbuf`` (int64, ``_CH + 1``), ``rbuf``
    (uint64, ``_CH + _B``), ``d1`` (int64, ``nx`` if ``ny > 1``), ``d2``
    (int64, ``ny * nx`` if ``nz > 1``) are scratch.  Writes the block widths
    and the packed stream, and the flat indices of exceptions into ``exc`` (as
    many as fit).  ``safe`` holds the IEEE bits of the largest ``|x|`` whose
    reconstruction provably meets the bound (:func:`_safe_magnitude`).
    Returns ``(words used, number of exceptions)``.
    """
    inv = 1.0 / step
    nb = np.int64(0)
    pos = np.int64(0)
    acc = np.uint64(0)
    shift = np.int64(0)
    fill = np.int64(0)
    n_exc = np.int64(0)
    cap = exc.size
    if nz > 1:
        d2[:] = 0
    k = np.int64(0)
    for z in range(nz):
        if ny > 1:
            d1[:] = 0
        for y in range(ny):
            pbuf[0] = 0  # p left of the row
            for j0 in range(0, nx, _CH):
                m = min(_CH, nx - j0)
                xs = x[k + j0 : k + j0 + m]
                # Pass 1 (vectorised): the lattice index; count what is out of
                # range and track max |x| (as IEEE bits: an integer max vectorises).
                bad = 0
                mb = np.int64(0)
                for j in range(m):
                    v = np.float64(xs[j])
                    t = v * inv
                    ok = abs(t) <= _LIMIT  # NaN fails the test too
                    q = np.rint(t if ok else 0.0)
                    pbuf[j + 1] = np.int64(q)
                    bad += 0 if ok else 1
                    mb = max(mb, np.int64(float_bits(v) & _ABS))  # signed: vectorises
                # Pass 1b, only if some |x| exceeds `safe`: reconstruct every value
                # exactly as the decoder will (the store into tmp rounds to x's
                # dtype) and record those that miss the bound.
                if bad or mb > safe:  # (an int64 holding IEEE bits)
                    bad = 0
                    for j in range(m):
                        tmp[j] = np.float64(pbuf[j + 1]) * step
                        e = abs(np.float64(xs[j]) - np.float64(tmp[j]))
                        bad += 0 if e <= eb else 1
                    if bad:
                        for j in range(m):
                            if not abs(np.float64(xs[j]) - np.float64(tmp[j])) <= eb:
                                if n_exc < cap:
                                    exc[n_exc] = k + j0 + j
                                n_exc += 1
                # Pass 2 (vectorised): Lorenzo residual D_z D_y D_x p, zigzagged.
                rb = rbuf[fill : fill + m]
                if nz > 1:
                    d1s = d1[j0 : j0 + m]
                    d2s = d2[y * nx + j0 : y * nx + j0 + m]
                    for j in range(m):
                        r1 = pbuf[j + 1] - pbuf[j]
                        r2 = r1 - d1s[j]
                        d1s[j] = r1
                        r = r2 - d2s[j]
                        d2s[j] = r2
                        rb[j] = np.uint64((r << 1) ^ (r >> 63))
                elif ny > 1:
                    d1s = d1[j0 : j0 + m]
                    for j in range(m):
                        r1 = pbuf[j + 1] - pbuf[j]
                        r = r1 - d1s[j]
                        d1s[j] = r1
                        rb[j] = np.uint64((r << 1) ^ (r >> 63))
                else:
                    for j in range(m):
                        r = pbuf[j + 1] - pbuf[j]
                        rb[j] = np.uint64((r << 1) ^ (r >> 63))
                pbuf[0] = pbuf[m]
                fill, nb, pos, acc, shift = _flush_blocks(
                    rbuf, fill + m, np.bool_(False), widths, nb, words, pos, acc, shift
                )
            k += nx
    fill, nb, pos, acc, shift = _flush_blocks(
        rbuf, fill, np.bool_(True), widths, nb, words, pos, acc, shift
    )
    return finish(words, pos, acc, shift), n_exc


@numba.njit(cache=True, nogil=True)
def _decode(widths, words, out, nz, ny, nx, step, rbuf, pbuf, d1, d2):
    """Inverse of :func:`_encode` (without the exceptions): unpack, undo the
    differences with prefix sums, scale by ``step`` into ``out`` (flat).

    The serial part (the running sum along a row) is a loop of its own, one
    integer add per value; undoing ``D_z`` and ``D_y`` and the scaling are
    vectorised loops around it.
    """
    nb = np.int64(0)
    bit = np.int64(0)
    avail = np.int64(0)
    if nz > 1:
        d2[:] = 0
    k = np.int64(0)
    for z in range(nz):
        if ny > 1:
            d1[:] = 0
        for y in range(ny):
            p = np.int64(0)
            for j0 in range(0, nx, _CH):
                m = min(_CH, nx - j0)
                if avail < m:
                    more = (m - avail + _B - 1) // _B
                    bit = unpack_blocks(
                        words, bit, more, np.int64(_B), np.int64(-1), widths, nb, rbuf, avail
                    )
                    nb += more
                    avail += more * _B
                # Undo the zigzag, then D_z and D_y (vectorised, one loop).
                if nz > 1:
                    d1s = d1[j0 : j0 + m]
                    d2s = d2[y * nx + j0 : y * nx + j0 + m]
                    for j in range(m):
                        c = rbuf[j]
                        r = (np.int64(c >> np.uint64(1)) ^ -np.int64(c & np.uint64(1))) + d2s[j]
                        d2s[j] = r
                        r += d1s[j]
                        d1s[j] = r
                        pbuf[j] = r
                elif ny > 1:
                    d1s = d1[j0 : j0 + m]
                    for j in range(m):
                        c = rbuf[j]
                        r = (np.int64(c >> np.uint64(1)) ^ -np.int64(c & np.uint64(1))) + d1s[j]
                        d1s[j] = r
                        pbuf[j] = r
                else:
                    for j in range(m):
                        c = rbuf[j]
                        pbuf[j] = np.int64(c >> np.uint64(1)) ^ -np.int64(c & np.uint64(1))
                # Undo D_x: the running sum, the one serial loop (an add per value).
                for j in range(m):
                    p += pbuf[j]
                    pbuf[j] = p
                outs = out[k + j0 : k + j0 + m]
                for j in range(m):
                    outs[j] = np.float64(pbuf[j]) * step
                for i in range(avail - m):
                    rbuf[i] = rbuf[m + i]
                avail -= m
            k += nx


# -- codec -------------------------------------------------------------------------

# mode, flags, reserved, abs_error, step, nz, ny, nx, n_exc, words bytes, exceptions bytes
_PARAMS = struct.Struct("<BBHIddQQQQQQ")
_NIBBLES = 1  # flag: the block widths are 4-bit (two per byte, low nibble first)
_MODE_LORENZO = 0
_MODE_LOSSLESS = 1


def _safe_magnitude(eb: float, dtype: np.dtype) -> np.int64:
    """IEEE bits of ``T``: every ``|x| <= T`` reconstructs within ``eb`` (module
    docstring, step 1), so the encoder checks values one by one only in
    chunks holding a larger (or a non-finite) value.  0 turns the shortcut off."""
    if dtype == np.float32:
        t = eb * 2.0**15 if eb >= 2.0**-100 else 0.0
    else:
        t = eb * 2.0**40 if eb >= 2.0**-1000 else 0.0
    return np.int64(np.array(min(t, 1e300)).view(np.int64)[()])


def lorenzo_shape(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """The ``(nz, ny, nx)`` view the predictor runs on (see the module docstring)."""
    dims = [s for s in shape if s != 1]
    if len(dims) > 3:
        dims = [math.prod(dims[:-2]), dims[-2], dims[-1]]
    dims = [1] * (3 - len(dims)) + dims
    return dims[0], dims[1], dims[2]


def _lossless_v1(lossless, header: bytes, array: np.ndarray, eb: float, step: float) -> bytes:
    inner = lossless.encode(array)
    return b"".join(
        (header, _PARAMS.pack(_MODE_LOSSLESS, 0, 0, 0, eb, step, 0, 0, 0, 0, 0, len(inner)), inner)
    )


def encode_v1(array: np.ndarray, header: bytes, eb: float, step: float, sc, lossless) -> bytes:
    """A format-1 blob of ``array`` (a checked numeric array) after ``header``
    (the common header, codec version 1), with the scratch ``sc`` and the
    ``lossless`` codec of the caller."""
    if not compresses(array.dtype):
        return _lossless_v1(lossless, header, array, eb, step)
    little_endian_host()
    x = readonly(array).reshape(-1)
    n = x.size
    nz, ny, nx = lorenzo_shape(array.shape)
    if n == 0:
        return header + _PARAMS.pack(_MODE_LORENZO, 0, 0, 0, eb, step, nz, ny, nx, 0, 0, 0)
    nblocks = -(-n // _B)
    widths = sc.get("v1widths", np.uint8, nblocks)
    words = sc.get("v1words", np.uint64, words_for_bits(64 * _B * nblocks))
    tmp = sc.get("v1tmp" + x.dtype.char, x.dtype, _CH)
    pbuf = sc.get("v1pbuf", np.int64, _CH + 1)
    rbuf = sc.get("v1rbuf", np.uint64, _CH + _B)
    d1 = sc.get("v1d1", np.int64, nx if ny > 1 else 1)
    d2 = sc.get("v1d2", np.int64, ny * nx if nz > 1 else 1)
    exc = sc.get("v1exc", np.int64, n)
    safe = _safe_magnitude(eb, x.dtype)
    nwords, n_exc = _encode(
        x, nz, ny, nx, step, eb, safe, widths, words, tmp, pbuf, rbuf, d1, d2, exc
    )
    if n_exc > n // 4:
        return _lossless_v1(lossless, header, array, eb, step)
    exc_part = pack_exceptions(lossless, exc[:n_exc], x)
    flags = 0
    if widths.max() < 16:
        flags |= _NIBBLES
        nib = sc.get("v1nibbles", np.uint8, (nblocks + 1) // 2)
        nib[: nblocks // 2] = widths[0 : nblocks - 1 : 2] | (widths[1::2] << 4)
        if nblocks % 2:
            nib[-1] = widths[-1]
        widths = nib
    pad = -(len(header) + _PARAMS.size + widths.size) % 8
    size = len(header) + _PARAMS.size + widths.size + pad + 8 * nwords + len(exc_part)
    if size >= array.nbytes:
        return _lossless_v1(lossless, header, array, eb, step)
    params = _PARAMS.pack(
        _MODE_LORENZO, flags, 0, 0, eb, step, nz, ny, nx, n_exc, 8 * nwords, len(exc_part)
    )
    return b"".join(
        (header, params, widths.data, b"\0" * pad, words[:nwords].view(np.uint8).data, exc_part)
    )


def decode_v1(
    view: memoryview,
    offset: int,
    dtype: np.dtype,
    shape: tuple[int, ...],
    out: np.ndarray | None,
    sc,
) -> np.ndarray:
    """Decode the format-1 payload at ``view[offset:]`` of a blob whose header
    holds ``dtype`` and ``shape`` (into ``out`` when given), with the scratch
    ``sc``; a ``ValueError`` when the payload does not add up."""
    need(view, offset + _PARAMS.size, "the ErrorBounded parameters")
    (mode, flags, _, _, eb, step, nz, ny, nx, n_exc, nbytes_words, nbytes_exc) = (
        _PARAMS.unpack_from(view, offset)
    )
    offset += _PARAMS.size
    if mode == _MODE_LOSSLESS:
        return decode_fallback(view, offset, nbytes_exc, out, dtype, shape, "ErrorBounded")
    if mode != _MODE_LORENZO:
        raise VlccValueError(f"corrupt ErrorBounded blob: unknown mode {mode}")
    if not compresses(dtype):
        raise VlccValueError(f"corrupt ErrorBounded blob: a lossy payload for dtype {dtype}")
    if not (math.isfinite(step) and step > 0):
        raise VlccValueError(f"corrupt ErrorBounded blob: quantisation step {step}")
    n = math.prod(shape)
    if (nz, ny, nx) != lorenzo_shape(shape):
        raise VlccValueError(
            "corrupt ErrorBounded blob: its Lorenzo shape does not match its shape"
        )
    if flags & ~_NIBBLES:
        raise VlccValueError(f"corrupt ErrorBounded blob: unknown flags {flags}")
    nblocks = -(-n // _B)
    nwb = (nblocks + 1) // 2 if flags & _NIBBLES else nblocks
    pad = -(offset + nwb) % 8 if n else 0
    end = offset + (nwb + pad + nbytes_words + nbytes_exc if n else 0)
    need(view, end, "the ErrorBounded payload")
    if len(view) != end:
        raise VlccValueError("corrupt ErrorBounded blob: trailing bytes after the payload")
    if n_exc > n:
        raise VlccValueError(f"corrupt ErrorBounded blob: {n_exc} exceptions in {n} values")
    result = output(out, dtype, shape)  # only now: the sizes agree with the shape
    if n == 0:
        return result
    little_endian_host()
    widths = from_bytes(view, np.uint8, nwb, offset)
    if flags & _NIBBLES:
        full = sc.get("v1widths", np.uint8, 2 * nwb)
        full[0::2] = widths & 15
        full[1::2] = widths >> 4
        widths = readonly(full[:nblocks])
    offset += nwb + pad
    if (
        widths.max() > 64
        or 8 * words_for_bits(_B * int(widths.sum(dtype=np.int64))) != nbytes_words
    ):
        raise VlccValueError(
            "corrupt ErrorBounded blob: block widths do not match the payload size"
        )
    words = from_bytes(view, np.uint64, nbytes_words // 8, offset)
    offset += nbytes_words
    rbuf = sc.get("v1rbuf", np.uint64, _CH + _B)
    pbuf = sc.get("v1pbuf", np.int64, _CH + 1)
    d1 = sc.get("v1d1", np.int64, nx if ny > 1 else 1)
    d2 = sc.get("v1d2", np.int64, ny * nx if nz > 1 else 1)
    flat = result.reshape(-1)
    _decode(widths, words, flat, nz, ny, nx, step, rbuf, pbuf, d1, d2)
    if n_exc:
        patch_exceptions(view, offset, nbytes_exc, n_exc, flat, "ErrorBounded")
    return result
