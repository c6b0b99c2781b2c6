"""Bit packing of byte codes in blocks of eight, one 64-bit group per block.

The codes of :mod:`._interp` are bytes, mostly 0, 1 and 2.  Blocks of 8
codes are packed at the bit width ``w`` (0..8) of their largest code, the
layout of frame-of-reference packers (Goldstein, Ramakrishnan and Shaft,
ICDE 1998; Lemire and Boytsov, "Decoding billions of integers per second
through vectorization", SPE 2015), and the widths, a byte each, go through an
entropy stage of their own (Zstd in :mod:`._error_bounded`): on the benchmark
wavefield that is 1.15 bits per value for the codes and 0.21 for the widths,
against 2.2 bits for blocks of 32 with 4-bit widths (the format-1 packer).

Why eight: a block of eight byte codes is one little-endian 64-bit word, and
eight codes of at most 8 bits pack into one group of ``8 w <= 64`` bits, so
packing a block is a few shifts and one branch-free append
(:func:`._bitpack` ``_put``'s accumulator scheme), and unpacking a block is
one unaligned 64-bit read at a position known from the widths' prefix sum.
Blocks of width 0 cost nothing but their width.  Streams end with a zero pad
word, so every read of a non-empty block stays inside the stream; the read
position is clamped for empty blocks at the very end.
"""

from __future__ import annotations

import numba
import numpy as np

from ._bitpack import bit_length, finish

_U = np.uint64
_FF = np.uint64(0xFF)


@numba.njit(cache=True, nogil=True)
def pack8(cw, nblocks, widths, words):
    """Pack the byte codes held in the uint64 words ``cw[:nblocks]`` (8 codes
    a word, little-endian) into ``words``; block widths into ``widths``.
    **Returns** the number of words written (the pad word included)."""
    pos = np.int64(0)
    acc = _U(0)
    shift = np.int64(0)
    for b in range(nblocks):
        v = cw[b]
        o = v | (v >> _U(32))
        o |= o >> _U(16)
        o |= o >> _U(8)
        w = bit_length(o & _FF)
        widths[b] = w
        uw = _U(w)
        g = (
            (v & _FF)
            | (((v >> _U(8)) & _FF) << uw)
            | (((v >> _U(16)) & _FF) << _U(2) * uw)
            | (((v >> _U(24)) & _FF) << _U(3) * uw)
            | (((v >> _U(32)) & _FF) << _U(4) * uw)
            | (((v >> _U(40)) & _FF) << _U(5) * uw)
            | (((v >> _U(48)) & _FF) << _U(6) * uw)
            | ((v >> _U(56)) << _U(7) * uw)
        )
        # append the 8w-bit group (branch-free; w = 0 appends nothing)
        s = _U(shift)
        acc |= g << s
        spill = (g >> (_U(63) - s)) >> _U(1)
        words[pos] = acc
        ns = s + _U(8) * uw
        full = ns >> _U(6)
        pos += np.int64(full)
        acc = spill if full else acc
        shift = np.int64(ns & _U(63))
    return finish(words, pos, acc, shift)


@numba.njit(cache=True, nogil=True)
def unpack8(words, widths, nblocks, cw):
    """Inverse of :func:`pack8`: blocks into the uint64 words ``cw[:nblocks]``.
    ``words`` must hold exactly the stream the widths imply (the caller checks
    ``len(words) == words_for_bits(8 * sum(widths))``)."""
    if words.size < 2:  # every width is 0
        cw[:nblocks] = 0
        return
    bit = _U(0)
    last = _U(words.size - 2)
    for b in range(nblocks):
        uw = _U(widths[b])
        q = min(bit >> _U(6), last)
        s = bit & _U(63)
        g = (words[q] >> s) | ((words[q + _U(1)] << (_U(63) - s)) << _U(1))
        m = (_U(1) << uw) - _U(1)
        cw[b] = (
            (g & m)
            | (((g >> uw) & m) << _U(8))
            | (((g >> _U(2) * uw) & m) << _U(16))
            | (((g >> _U(3) * uw) & m) << _U(24))
            | (((g >> _U(4) * uw) & m) << _U(32))
            | (((g >> _U(5) * uw) & m) << _U(40))
            | (((g >> _U(6) * uw) & m) << _U(48))
            | (((g >> _U(7) * uw) & m) << _U(56))
        )
        bit += _U(8) * uw
