"""Delta chunks: a changed chunk stored as the XOR with its parent's, compressed.

A repository opened with ``History(path, deltas=True)`` (recorded in its
root metadata as ``"deltas": true``, so every process agrees) may store a
new chunk ``c`` as a *delta object* against the chunk ``b`` at the same position
(leaf index, dtype, shape, chunk index) of the parent version:

.. math::  d = \\operatorname{compress}(\\operatorname{shuffle}(c \\oplus b)),
           \\qquad c = b \\oplus \\operatorname{decompress}(d).

Bytes a commit did not touch are equal in ``c`` and ``b`` and XOR to zero
runs, which Blosc's LZ4 stores in a few bytes per block; for floating-point
weights that changed a little, the byte shuffle groups the sign/exponent and
high-mantissa bytes (equal in ``b`` and ``c``) into zero runs too.  This is
the XOR delta of Gorilla (Pelkonen et al., VLDB 2015) applied blockwise, with
the shuffle of Blosc (Alted, 2010).

The object lives in ``chunks/`` under the address of ``c`` (xxh3-128 of its
raw bytes, as for a full chunk), so deduplication, manifests and version
groups are unchanged.  Its file::

    "VLCDELTA" | u8 header version | u8 typesize | u16 depth | u64 chain bytes
    | u64 raw size | u64 payload size | 32 ASCII hex: base address
    | payload (Blosc1) | xxh3-128 of everything before it (16 bytes)

``depth`` is the number of delta objects from here to a full chunk (1: the
base is full); ``chain bytes`` the sum of their sizes.  A delta is stored
only when it is at most :data:`MAX_FRACTION` (3/4) of a chunk, its depth at
most :data:`MAX_DEPTH` and its chain's bytes at most two chunks', else the
full chunk is (a rebase): a checkout reads at most ``MAX_DEPTH + 1`` objects
per chunk and at most three chunks' bytes.  (A chain bound of one chunk's
bytes rebases most chunks once in twenty versions at 5 % change; two keeps
the store at the minimum.)  Reading resolves the chain, checks every
object's digest, depth and size, and the resolved chunk's address, so damage
anywhere in a chain raises :class:`~vlcc_adjoint.storage.CorruptCheckpointError`
naming the file.

A delta file is told from a full chunk by its magic and size: a raw chunk
file has exactly the chunk's size, which a delta (at most 3/4 of it) never
has; a compressed chunk starts with the Blosc version byte, never ``V``.

The root keeps format 2: a reader that predates delta chunks reports a
delta file as a damaged chunk (``CorruptCheckpointError``), never returns
wrong bytes.

The trade: plain ``zarr.open_group`` reads a version whose chunks are all full
(every version of a repository without deltas); an array with a delta chunk
is readable only through :class:`~vlcc_adjoint.lineage.History`.
"""

from __future__ import annotations

import collections
import struct
import threading
from typing import Protocol

import numpy as np
import xxhash

from ..errors import VlccValueError
from ..storage import CorruptCheckpointError
from . import _format as F

__all__ = [
    "MAGIC",
    "MAX_DEPTH",
    "ChunkFiles",
    "Resolver",
    "base_of",
    "closure",
    "encode",
    "is_delta",
    "parse",
]

MAGIC = b"VLCDELTA"
#: Longest chain of delta objects a writer builds (a reader accepts up to READ_DEPTH).
MAX_DEPTH = 32
#: A delta is stored only when it is at most this fraction of a chunk's raw bytes.
MAX_FRACTION = 0.75
READ_DEPTH = 64
_HEAD = struct.Struct("<8sBBHQQQ32s")
_DIGEST = 16


def is_delta(blob, n: int, cfg) -> bool:
    """Whether the stored file `blob` (of a chunk of `n` raw bytes) is a delta object."""
    return bytes(blob[:8]) == MAGIC and (cfg is not None or len(blob) != n)


def encode(new, base, base_addr: str, depth: int, chain: int, typesize: int) -> bytes:
    """The delta object turning `base` into `new` (equal-sized byte buffers).

    **Arguments:**

    - `new`, `base`: the chunk's raw bytes and its base's.
    - `base_addr`: the base chunk's address.
    - `depth`, `chain`: the base's depth (0: a full chunk) and chain bytes.
    - `typesize`: the leaf's item size (the shuffle's element size).

    **Returns:** the file's bytes.
    """
    from numcodecs import blosc

    x = np.bitwise_xor(np.frombuffer(new, np.uint8), np.frombuffer(base, np.uint8))
    payload = blosc.compress(x, b"lz4", 5, 1, 0, int(min(max(typesize, 1), 255)))
    size = _HEAD.size + len(payload) + _DIGEST
    head = _HEAD.pack(
        MAGIC,
        1,
        int(min(max(typesize, 1), 255)),
        depth + 1,
        chain + size,
        len(x),
        len(payload),
        base_addr.encode(),
    )
    body = head + payload
    return body + xxhash.xxh3_128_digest(body)


def parse(blob, n: int) -> tuple[str, int, int, bytes]:
    """(base address, depth, chain bytes, payload) of a delta object, checked.

    Raises ``ValueError`` naming the problem when the object is damaged.
    """
    if len(blob) < _HEAD.size + _DIGEST:
        raise VlccValueError(f"delta object of {len(blob)} bytes is shorter than its header")
    body, dig = blob[:-_DIGEST], blob[-_DIGEST:]
    if xxhash.xxh3_128_digest(body) != bytes(dig):
        raise VlccValueError("delta object fails its checksum")
    magic, ver, _ts, depth, chain, raw, plen, base = _HEAD.unpack_from(body, 0)
    base = base.decode("ascii", "replace")
    if magic != MAGIC or ver != 1:
        raise VlccValueError(f"unknown delta object version {ver}")
    if raw != n or plen != len(body) - _HEAD.size or not F.is_address(base):
        raise VlccValueError(f"delta object header is inconsistent (raw {raw}, expected {n})")
    if not 1 <= depth <= READ_DEPTH or chain > READ_DEPTH * (n + n // 8 + 4096):
        raise VlccValueError(f"delta chain depth {depth} / {chain} bytes out of bounds")
    return base, depth, chain, bytes(body[_HEAD.size :])


class ChunkFiles(Protocol):
    """Where a repository's stored chunks are (:class:`._chunks.ChunkStore`:
    loose files or pack entries)."""

    def read_blob(self, addr: str, limit: int) -> tuple[bytes, str]:
        """The stored bytes of chunk `addr` (at most `limit`) and their file."""
        ...

    def read_head(self, addr: str, n: int) -> tuple[bytes, str]:
        """The first (at most) `n` stored bytes of chunk `addr` and their file."""
        ...


class Resolver:
    """Reads chunks of a delta repository: full chunks and delta chains, verified,
    with a small cache of resolved chunks (`cache_bytes`) that commits and checkouts share.
    """

    def __init__(self, files: ChunkFiles, cache_bytes: int = 64 << 20) -> None:
        self.files = files
        self.cache: collections.OrderedDict[str, tuple[bytes, int, int]] = collections.OrderedDict()
        self.cache_bytes = cache_bytes
        self.held = 0
        self.lock = threading.Lock()

    def remember(self, addr: str, raw, depth: int, chain: int) -> None:
        """Cache the verified raw bytes of chunk `addr` (its depth and chain bytes)."""
        raw = bytes(raw)
        if len(raw) > self.cache_bytes // 4:
            return
        with self.lock:
            if addr in self.cache:
                return
            self.cache[addr] = (raw, depth, chain)
            self.held += len(raw)
            while self.held > self.cache_bytes:
                _, (old, _, _) = self.cache.popitem(last=False)
                self.held -= len(old)

    def get(
        self, addr: str, n: int, cfg: dict | None, depth_left: int = READ_DEPTH
    ) -> tuple[bytes | np.ndarray, int, int]:
        """(raw bytes, depth, chain bytes) of chunk `addr`, verified.

        The chain is walked down to a full (or cached) chunk, then the XORs
        are applied upwards into one buffer, each level's address checked.
        Raises :class:`CorruptCheckpointError` naming the damaged file, or
        ``FileNotFoundError`` naming the missing one.
        """
        tag = F.codec_tag(cfg)
        chain: list[tuple[str, str, bytes, int, int]] = []  # (addr, path, payload, depth, bytes)
        cur, limit = addr, depth_left
        while True:
            with self.lock:
                hit = self.cache.get(cur)
                if hit is not None:
                    self.cache.move_to_end(cur)
            if hit is not None:
                raw, depth, total = hit
                break
            blob, path = self.files.read_blob(cur, n + n // 8 + 4096)
            try:
                if is_delta(blob, n, cfg):
                    base, depth, total, payload = parse(blob, n)
                    if depth > limit or base == cur or any(base == c[0] for c in chain):
                        raise VlccValueError(f"delta chain of depth {depth} is too long or cyclic")
                    chain.append((cur, path, payload, depth, total))
                    cur, limit = base, depth - 1
                    continue
                depth, total = 0, 0
                if cfg is None:
                    if len(blob) != n:
                        raise VlccValueError(f"{len(blob)} bytes, its metadata says {n}")
                    raw = blob
                else:
                    raw = bytes(F.decode_chunk(blob, cfg, n))
            except ValueError as err:
                raise CorruptCheckpointError(f"{path} is damaged: {err}", path=path) from None
            _check(raw, cur, tag, path)
            if not chain:
                self.remember(cur, raw, 0, 0)
            break
        if not chain:
            return raw, depth, total
        if chain[-1][3] != depth + 1:
            path = chain[-1][1]
            raise CorruptCheckpointError(
                f"{path} is damaged: it says its base has depth "
                f"{chain[-1][3] - 1}, the base has {depth}",
                path=path,
            )
        # Only the result's address is checked; when it fails, every level is, to
        # name the damaged file (a delta's payload is covered by its own digest too).
        for each in (False, True):
            acc = np.frombuffer(bytearray(raw), np.uint8)
            for cur, path, payload, depth, total in reversed(chain):
                try:
                    x = F.decode_chunk(payload, {"name": "blosc", "configuration": {}}, n)
                except ValueError as err:
                    raise CorruptCheckpointError(f"{path} is damaged: {err}", path=path) from None
                np.bitwise_xor(acc, np.frombuffer(x, np.uint8), out=acc)
                if each:
                    _check(acc, cur, tag, path)
            if each or F.address_of(acc, tag) == addr:
                break
        self.remember(addr, acc, chain[0][3], chain[0][4])
        return acc, chain[0][3], chain[0][4]


def _check(raw, addr: str, tag: bytes, path: str) -> None:
    got = F.address_of(raw, tag)
    if got != addr:
        raise CorruptCheckpointError(
            f"{path} resolves to bytes with checksum {got}, its address says {addr}", path=path
        )


def base_of(files: ChunkFiles, addr: str) -> str | None:
    """The base address a stored delta object names (``None`` for a full chunk)."""
    head, path = files.read_head(addr, _HEAD.size)  # never through a link
    if len(head) < _HEAD.size or head[:8] != MAGIC:
        return None
    base = _HEAD.unpack(head)[7].decode("ascii", "replace")
    if not F.is_address(base):
        raise CorruptCheckpointError(f"{path} is damaged: its base address is invalid", path=path)
    return base


def closure(files: ChunkFiles, addrs: set[str]) -> set[str]:
    """`addrs` and every base their delta objects need (transitively)."""
    out = set(addrs)
    todo = list(addrs)
    while todo:
        try:
            base = base_of(files, todo.pop())
        except FileNotFoundError:
            continue
        if base is not None and base not in out:
            out.add(base)
            todo.append(base)
    return out
