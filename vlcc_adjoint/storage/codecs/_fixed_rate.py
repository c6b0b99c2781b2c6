"""FixedRate: block floating point with a known output size.

Every block of 64 consecutive values (C order) shares one power-of-two
quantum ``D = 2^k``; each value is stored as the ``bits``-bit two's-complement
integer ``q = rint(x / D)``, and decoded as ``x' = q D``.  This is the
block-floating-point format of DSP hardware (Oppenheim, "Realization of
digital filters using block-floating-point arithmetic", IEEE Trans. Audio
Electroacoust. 18(2), 1970), the "fixed-rate mode" idea of ZFP (Lindstrom,
IEEE TVCG 2014) without its decorrelating transform: the size is exact and
known up front, the accuracy is relative to each block's largest value.

The quantum.  With ``b = min(bits, 54)`` and ``Q = 2^(b-1) - 1``, ``k`` is the
smallest integer (not below the dtype's smallest subnormal exponent, -149 or
-1074) with ``max|x over the block| <= Q 2^k``.  Then ``|q| <= Q`` always
fits in ``bits`` bits, and

    |x - x'| <= D / 2 <= max|x over the block| / Q = M / (2^(b-1) - 1)

for every finite value: ``x / D`` is exact (power-of-two scaling) and so is
``q D``: values of magnitude ``>= 2^24 D`` (float32) or ``>= 2^53 D``
(float64) are multiples of ``D`` already and come back exactly, and below
that ``|q| <= 2^24`` (``2^53``) is representable, so ``q D`` is too.  A
block of zeros decodes to zeros; ``-0.0`` decodes to ``+0.0``.  8 bits give
about 2 decimal digits relative to the block maximum, 16 bits about 4.5;
with 25 bits (float32) or 54 bits (float64) every value of at least half
the block maximum comes back exactly.

The encoder checks value by value, as the decoder will reconstruct it,
only in blocks where that argument does not hold: blocks with a non-finite
value or a maximum of ``2^127`` (float32) or ``2^1023`` (float64) or more.
What fails there, non-finite values (NaN, +-inf: they are left out of the block
maximum) and the one overflow corner (a block maximum within ``D / 2`` of
the dtype's largest value, where ``q D`` would round to infinity) is stored
verbatim as an exception, so NaN and infinities round-trip bit for bit.

Size: for finite input, with ``B = ceil(n / 64)`` blocks, exactly

    (40 + 8 ndim)           header and parameters
    + 2 B + (0..7)          one int16 exponent per block, aligned to 8 bytes
    + 8 (bits B + 1)        the codes (the last block padded) and a pad word

bytes, i.e. ``n bits / 8`` plus 2 bytes per 64 values plus ~60 bytes
(:meth:`FixedRate.encoded_nbytes`), and a compressed table of exceptions
when there are any.  float32 and float64 (native byte order) only; other
numeric dtypes are stored exactly with :class:`Lossless` (no fixed size then).

Its speed is measured by ``benchmarks/bench_codecs.py``.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numba
import numpy as np
from numpy.typing import DTypeLike

from ...errors import VlccValueError
from ._bitpack import bits_float, finish, float_bits, pack_blocks, unpack_blocks, words_for_bits
from ._codec import (
    FIXED_RATE_ID,
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
from ._lossless import Lossless
from ._lossy import compresses, decode_fallback, pack_exceptions, patch_exceptions

__all__ = ["FixedRate"]

_BLOCK = 64  # values per block (one exponent each)
_CH = 2048  # values per pass of the kernels (a multiple of _BLOCK)
_KMAX = 1023
_ABS = np.uint64(0x7FFF_FFFF_FFFF_FFFF)  # float64 bits without the sign
_INF = np.int64(0x7FF0_0000_0000_0000)  # bits of inf; above: NaN
# pack_blocks/unpack_blocks take a uint8 widths array; with a fixed width they
# never read it.  One array type keeps them at one compiled specialisation.
_NO_WIDTHS = np.zeros(1, np.uint8)
_NO_WIDTHS_RO = readonly(_NO_WIDTHS)  # the decoder's widths are read-only views


@numba.njit(cache=True, nogil=True)
def _pow2(k):
    """``2.0 ** k`` exactly, for any ``-1074 <= k <= 1023``: a bit cast when
    ``2^k`` is a normal number, ``math.ldexp`` (a libm call) otherwise."""
    if k >= -1022:
        return bits_float(np.uint64(k + 1023) << np.uint64(52))
    return math.ldexp(1.0, k)


@numba.njit(cache=True, nogil=True)
def _encode(x, bits, kmin, big, exps, words, tmp, codes, exc, no_widths, bmax, bpar):
    """Quantise ``x`` (flat) block by block and pack the codes at ``bits`` bits.

    ``tmp`` (x's dtype, ``_CH``), ``codes`` (uint64, ``_CH``), ``bmax``
    (float64, ``_CH // _BLOCK``) and ``bpar`` (float64, ``(_CH // _BLOCK, 4)``)
    are scratch.  Blocks whose maximum reaches ``big`` (``2^127`` for
    float32, ``2^1023`` for float64) are checked value by value: ``q D`` may
    overflow there.  Writes one exponent per block into ``exps`` and the flat
    indices of the exceptions into ``exc`` (as many as fit).  Returns
    ``(words, exceptions)``.

    A chunk of 32 blocks goes through three loops: block maxima, block
    exponents (scalar, 32 per chunk), quantisation.  Per-block function calls
    and array slices cost more than the arithmetic (measured 2x), so the
    inner loops index ``x`` directly and the exponent code is written in place.
    """
    n = x.size
    b = min(bits, 54)  # |q| <= 2^53 - 1: exact as a float64
    qmax = float(2 ** (b - 1) - 1)
    mask = ((np.uint64(1) << np.uint64(bits - 1)) << np.uint64(1)) - np.uint64(1)
    pos = np.int64(0)
    acc = np.uint64(0)
    shift = np.int64(0)
    n_exc = np.int64(0)
    cap = exc.size
    blk = np.int64(0)
    for c0 in range(0, n, _CH):
        m_chunk = min(_CH, n - c0)
        nblk = (m_chunk + _BLOCK - 1) // _BLOCK
        # 1. Block maxima over the finite values.  The IEEE bits of |x| order
        # like |x|, and a *signed* integer max vectorises (a float max with NaN
        # semantics does not, nor, in numba 0.68, an unsigned compare-and-select:
        # 0.8 vs 2.3 ns per value for the whole encoder); non-finite values
        # (bits >= those of inf) count 0.
        for bi in range(nblk):
            b0 = c0 + bi * _BLOCK
            cnt = min(_BLOCK, n - b0)
            mb = np.int64(0)
            nonfinite = 0
            for j in range(cnt):
                a = np.int64(float_bits(np.float64(x[np.uint64(b0 + j)])) & _ABS)
                nonfinite += 0 if a < _INF else 1
                mb = max(mb, a if a < _INF else 0)
            bmax[bi] = bits_float(np.uint64(mb))
            bpar[bi, 3] = nonfinite
        # 2. Block exponents: the least k >= kmin with max <= qmax 2^k.
        for bi in range(nblk):
            mx = bmax[bi]
            if mx == 0.0:
                k = kmin
            else:
                biased = np.int64(float_bits(mx) >> np.uint64(52))
                if biased > 0:
                    e = biased - 1022  # 2^(e-1) <= mx < 2^e
                else:
                    _, e = math.frexp(mx)  # subnormal
                k = e - b + 1  # qmax 2^k = 2^e - 2^(e-b+1): enough unless mx is above it
                if k >= -1022:
                    k += 1 if mx > qmax * _pow2(k) else 0
                else:  # compare at 2^600 times the scale, where both sides are exact
                    k += 1 if mx * _pow2(np.int64(600)) > qmax * _pow2(k + 600) else 0
                k = min(max(k, kmin), _KMAX)  # above _KMAX: exceptions
            exps[blk + bi] = k
            bpar[bi, 0] = _pow2(k)  # the quantum D
            # x / D as (x * s1) * s2, exact: one factor unless 2^-k overflows.
            if -k <= 1000:
                bpar[bi, 1] = _pow2(-k)
                bpar[bi, 2] = 1.0
            else:
                bpar[bi, 1] = _pow2(np.int64(1000))  # (np.int64: no literal specialisation)
                bpar[bi, 2] = _pow2(-k - 1000)
        # 3. Quantise.  In a block of finite values below `big` the module
        # docstring's argument holds (x' = q D is exact and finite), so the
        # codes are all; otherwise reconstruct as the decoder will (rounded to
        # x's dtype by the store into tmp) and count the values that miss D / 2.
        for bi in range(nblk):
            b0 = c0 + bi * _BLOCK
            cnt = min(_BLOCK, n - b0)
            quantum = bpar[bi, 0]
            s1 = bpar[bi, 1]
            s2 = bpar[bi, 2]
            half = 0.5 * quantum
            o = bi * _BLOCK
            for j in range(cnt, _BLOCK):
                codes[np.uint64(o + j)] = 0
            if bpar[bi, 3] == 0.0 and bmax[bi] < big:
                for j in range(cnt):
                    t = (np.float64(x[np.uint64(b0 + j)]) * s1) * s2
                    codes[np.uint64(o + j)] = np.uint64(np.int64(np.rint(t))) & mask
                continue
            bad = 0
            for j in range(cnt):
                v = np.float64(x[np.uint64(b0 + j)])
                t = (v * s1) * s2
                q = np.rint(t)
                q = q if abs(q) <= qmax else 0.0  # only non-finite values get here
                tmp[np.uint64(o + j)] = q * quantum
                bad += 0 if abs(v - np.float64(tmp[np.uint64(o + j)])) <= half else 1
                codes[np.uint64(o + j)] = np.uint64(np.int64(q)) & mask
            if bad:
                for j in range(cnt):
                    if not abs(np.float64(x[b0 + j]) - np.float64(tmp[o + j])) <= half:
                        if n_exc < cap:
                            exc[n_exc] = b0 + j
                        n_exc += 1
                        codes[o + j] = 0
        blk += nblk
        _, pos, acc, shift = pack_blocks(
            codes,
            nblk * _BLOCK,
            np.int64(_BLOCK),
            bits,
            no_widths,
            np.int64(0),
            words,
            pos,
            acc,
            shift,
        )
    return finish(words, pos, acc, shift), n_exc


@numba.njit(cache=True, nogil=True)
def _decode(exps, words, bits, out, codes, no_widths):
    """Inverse of :func:`_encode` (without the exceptions), into ``out`` (flat)."""
    n = out.size
    up = np.uint64(64 - bits)
    bit = np.int64(0)
    blk = np.int64(0)
    for c0 in range(0, n, _CH):
        m_chunk = min(_CH, n - c0)
        nblk = (m_chunk + _BLOCK - 1) // _BLOCK
        bit = unpack_blocks(
            words, bit, nblk, np.int64(_BLOCK), bits, no_widths, np.int64(0), codes, np.int64(0)
        )
        for b0 in range(0, m_chunk, _BLOCK):
            cnt = min(_BLOCK, m_chunk - b0)
            quantum = _pow2(np.int64(exps[blk]))
            blk += 1
            cs = codes[b0 : b0 + _BLOCK]
            outs = out[c0 + b0 : c0 + b0 + cnt]
            for j in range(cnt):
                q = np.int64(cs[j] << up) >> np.int64(up)  # sign-extend from `bits` bits
                outs[j] = np.float64(q) * quantum


_PARAMS = struct.Struct("<BBHIQQ")  # mode, bits, reserved, reserved, n_exc, exceptions bytes
_MODE_BFP = 0
_MODE_LOSSLESS = 1


class FixedRate(Codec):
    """Fixed-size lossy compression: ``bits`` bits per value, block floating point.

    Blocks of 64 values share a power-of-two scale; see the module docstring
    for the format and the guarantee ``|x - x'| <= M / (2^(min(bits, 54) - 1)
    - 1)`` with ``M`` the largest finite magnitude in the value's block.

    **Arguments:**

    - `bits`: bits per value, 2..64 (e.g. 8 or 16; more than 25 for float32
      or 54 for float64 add size, not accuracy).

    ``encode(array) -> bytes``, ``decode(blob, out=None) -> ndarray``.
    NaN and +-inf round-trip exactly (as exceptions, outside the fixed
    size); non-float dtypes are stored exactly with :class:`Lossless`.
    """

    name = "vlcc_fixed_rate"
    codec_id = FIXED_RATE_ID
    version = 1
    lossless = False  # decode(encode(x)) == x for every input

    def __init__(self, bits: int):
        if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 2 <= bits <= 64:
            raise VlccValueError(f"bits must be an integer in 2..64, got {bits!r}")
        self.bits = int(bits)
        self._scratch = Scratch()
        self._lossless = Lossless()

    def _parameters(self) -> dict[str, Any]:
        return {"bits": self.bits}

    @classmethod
    def _default_instance(cls) -> FixedRate:
        return cls(16)

    def error_bound(self, block_max: float) -> float:
        """The guaranteed ``max |x - x'|`` in a block whose largest magnitude is ``block_max``."""
        return block_max / (2.0 ** (min(self.bits, 54) - 1) - 1)

    def encoded_nbytes(self, shape: tuple[int, ...], dtype: DTypeLike = np.float32) -> int:
        """The exact blob size for a finite float32/float64 array of ``shape``."""
        n = math.prod(shape)
        header = 16 + 8 * len(shape) + _PARAMS.size
        if n == 0:
            return header
        nblocks = -(-n // _BLOCK)
        return (
            header
            + 2 * nblocks
            + (-(header + 2 * nblocks) % 8)
            + 8 * words_for_bits(self.bits * _BLOCK * nblocks)
        )

    def encode(self, array: np.ndarray) -> bytes:
        """Compress ``array`` at ``bits`` bits per value.

        **Arguments:**

        - `array`: a numeric ndarray; float32/float64 are compressed, other
          dtypes stored exactly.

        **Returns:** a self-describing blob (bytes).
        """
        array = check_numeric(array)
        header = write_header(self.codec_id, self.version, array.dtype, array.shape)
        if not compresses(array.dtype):
            inner = self._lossless.encode(array)
            return b"".join(
                (header, _PARAMS.pack(_MODE_LOSSLESS, self.bits, 0, 0, 0, len(inner)), inner)
            )
        little_endian_host()
        x = readonly(array).reshape(-1)
        n = x.size
        if n == 0:
            return header + _PARAMS.pack(_MODE_BFP, self.bits, 0, 0, 0, 0)
        nblocks = -(-n // _BLOCK)
        kmin = -149 if x.dtype == np.float32 else -1074
        sc = self._scratch
        exps = sc.get("exps", np.int16, nblocks)
        words = sc.get("words", np.uint64, words_for_bits(self.bits * _BLOCK * nblocks))
        tmp = sc.get("tmp" + x.dtype.char, x.dtype, _CH)
        bmax = sc.get("bmax", np.float64, _CH // _BLOCK)
        bpar = sc.get("bpar", np.float64, 4 * _CH // _BLOCK).reshape(-1, 4)
        big = 2.0**127 if x.dtype == np.float32 else 2.0**1023
        codes = sc.get("codes", np.uint64, _CH)
        exc = sc.get("exc", np.int64, 64 + n // 1024)
        nwords, n_exc = _encode(
            x, self.bits, kmin, big, exps, words, tmp, codes, exc, _NO_WIDTHS, bmax, bpar
        )
        if n_exc > exc.size:
            exc = sc.get("exc", np.int64, n_exc)
            nwords, n_exc = _encode(
                x, self.bits, kmin, big, exps, words, tmp, codes, exc, _NO_WIDTHS, bmax, bpar
            )
        exc_part = pack_exceptions(self._lossless, exc[:n_exc], x)
        pad = -(len(header) + _PARAMS.size + 2 * nblocks) % 8
        params = _PARAMS.pack(_MODE_BFP, self.bits, 0, 0, n_exc, len(exc_part))
        return b"".join(
            (header, params, exps.data, b"\0" * pad, words[:nwords].view(np.uint8).data, exc_part)
        )

    def decode(self, blob: Blob, out: np.ndarray | None = None) -> np.ndarray:
        """Decompress a blob written by :meth:`encode` (any ``bits``: the blob
        carries its own).

        **Arguments:**

        - `blob`: bytes-like.
        - `out`: optional writeable C-contiguous array of the blob's dtype and
          shape to decode into.

        **Returns:** the array (``out`` when given).
        """
        view, dtype, shape, offset = read_header(blob, self.codec_id, self.version)
        need(view, offset + _PARAMS.size, "the FixedRate parameters")
        mode, bits, _, _, n_exc, nbytes_exc = _PARAMS.unpack_from(view, offset)
        offset += _PARAMS.size
        if mode == _MODE_LOSSLESS:
            return decode_fallback(view, offset, nbytes_exc, out, dtype, shape, "FixedRate")
        if mode != _MODE_BFP or not 2 <= bits <= 64:
            raise VlccValueError(f"corrupt FixedRate blob: mode {mode}, bits {bits}")
        if not compresses(dtype):
            raise VlccValueError(f"corrupt FixedRate blob: a lossy payload for dtype {dtype}")
        n = math.prod(shape)
        nblocks = -(-n // _BLOCK)
        nwords = words_for_bits(bits * _BLOCK * nblocks) if n else 0
        pad = -(offset + 2 * nblocks) % 8 if n else 0
        end = offset + 2 * nblocks + pad + 8 * nwords + nbytes_exc
        need(view, end, "the FixedRate payload")
        if len(view) != end:
            raise VlccValueError("corrupt FixedRate blob: trailing bytes after the payload")
        result = output(out, dtype, shape)  # only now: the sizes agree with the shape
        if n == 0:
            return result
        little_endian_host()
        exps = from_bytes(view, np.int16, nblocks, offset)
        kmin = -149 if dtype == np.float32 else -1074
        if exps.min() < kmin or exps.max() > _KMAX:
            raise VlccValueError("corrupt FixedRate blob: block exponent out of range")
        offset += 2 * nblocks + pad
        words = from_bytes(view, np.uint64, nwords, offset)
        offset += 8 * nwords
        codes = self._scratch.get("codes", np.uint64, _CH)
        flat = result.reshape(-1)
        _decode(exps, words, bits, flat, codes, _NO_WIDTHS_RO)
        if n_exc:
            patch_exceptions(view, offset, nbytes_exc, n_exc, flat, "FixedRate")
        return result
