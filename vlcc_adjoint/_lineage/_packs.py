"""Packs: many chunks in one file, with a checksummed index.

A repository stores a chunk either *loose* (``chunks/<2 hex>/<30 hex>``, one
file per chunk, :mod:`._chunks`) or as an entry of a *pack*
(``packs/<32 hex>.pack``): one file holding many chunks' stored bytes
(exactly what a loose file of each would hold: raw, Blosc1-compressed or a
delta object) concatenated, followed by an index.  Packs exist so that a
version written by many processes costs the shared file system a few large
files instead of one file (and one metadata operation) per chunk: the
node-local tier's flush (:mod:`._local`) writes one pack per node per version.

Which writes use packs (the rule)
---------------------------------

Only the node-local tier's flush (``History(path, comm=comm, local=dir)``)
writes packs, and its versions are *packed versions*: their group in
``versions/`` holds the manifest only, with ``"zarr_view": false``, not the
per-leaf zarr arrays of hard-linked chunk files (a chunk inside a pack has no
file of its own to link).  Every other commit (serial, ``durable=True``
included, and ``comm=`` without ``local=``) keeps loose chunks and the zarr
view, so ``zarr.open_group``/tensorstore read those versions as before, and
existing repositories keep their format.  A serial ``durable=True`` commit
could write one pack instead of fsyncing every chunk file; it does not, because
its versions would lose the zarr view that plain-zarr readers of serial
repositories rely on.  ``History.export`` writes every packed chunk as a loose
chunk file into the archive and adds the zarr view of packed versions, so an
imported copy is a plain zarr hierarchy again.

File layout (little-endian)::

    header   "VLCPACK1" | u64 0                                    16 bytes
    entries  stored chunk bytes, concatenated
    index    per entry: 16-byte address | u64 offset | u64 length
             | 16-byte xxh3-128 of the entry's bytes                48 bytes each
    trailer  u64 entry count | u64 index offset
             | 16-byte xxh3-128 of header + index + count + offset
             | "VLCPEND1"                                          40 bytes

Reading checks, before anything is allocated from what the file says: the
magic words, that the index lies between the header and the trailer and has
exactly ``count`` records (so the count is bounded by the file's size), the
index digest, and that every entry lies inside the entries' region.  An
entry's bytes are checked against the index's digest when read, and the
chunk layer then checks what they decode to against the address.  Damage
raises :class:`~vlcc_adjoint.storage.CorruptCheckpointError` naming the pack
file.

A pack is written in ``scratch/`` and hard-linked into ``packs/`` whole (and
fsynced, file and directory, when the writer asks), so a pack in ``packs/``
is always complete; a pack no version references (a flush that failed, or a
crash before publication) is deleted by ``gc``, and a pack is kept while any
kept version references one of its entries.
"""

from __future__ import annotations

import dataclasses
import os
import re
import struct

import xxhash

from ..errors import VlccValueError
from ..storage import format as SF
from . import _format as F

__all__ = ["PackEntry", "PackWriter", "is_pack_name", "read_index"]

_MAGIC = b"VLCPACK1"
_END = b"VLCPEND1"
_HEADER = struct.Struct("<8sQ")
_RECORD = struct.Struct("<16sQQ16s")
_TRAILER = struct.Struct("<QQ16s8s")
_NAME = re.compile(r"[0-9a-f]{32}\.pack")


def is_pack_name(name: str) -> bool:
    """Whether `name` (a file name in ``packs/``) is the name of a pack."""
    return _NAME.fullmatch(name) is not None


@dataclasses.dataclass(frozen=True)
class PackEntry:
    """Where one chunk's stored bytes are: `path` (the pack file), `offset`,
    `length`, and `digest` (xxh3-128 of the bytes, from the index)."""

    path: str
    offset: int
    length: int
    digest: bytes

    def read(self, limit: int, out: memoryview | None = None) -> bytes | memoryview:
        """The entry's bytes (into `out`, of exactly `length` bytes, when given),
        checked against the index's digest; more than `limit` bytes is damage."""
        if self.length > limit:
            raise SF.corrupt_file(
                self.path,
                f"holds an entry of {self.length} bytes, more than the {limit} its chunk may have",
            )
        fd, size = SF.open_sized(self.path)
        try:
            data = SF.read_at(fd, self.path, size - _TRAILER.size, self.offset, self.length, out)
        finally:
            os.close(fd)
        if xxhash.xxh3_128_digest(data) != self.digest:
            raise SF.corrupt_file(
                self.path, f"has an entry (at byte {self.offset}) that fails its checksum"
            )
        return data


def read_index(path: str) -> dict[str, PackEntry]:
    """``{address: entry}`` of the pack file `path`, checked (see the module
    docstring); damage raises ``CorruptCheckpointError`` naming `path`."""
    fd, size = SF.open_sized(path)
    try:
        if size < _HEADER.size + _TRAILER.size:
            raise SF.corrupt_file(path, f"has {size} bytes, less than a pack's header and trailer")
        head = bytes(SF.read_at(fd, path, size, 0, _HEADER.size))
        trailer = bytes(SF.read_at(fd, path, size, size - _TRAILER.size, _TRAILER.size))
        magic, _ = _HEADER.unpack(head)
        count, at, digest, end = _TRAILER.unpack(trailer)
        if magic != _MAGIC or end != _END:
            raise SF.corrupt_file(path, "is not a pack (its magic words are wrong)")
        limit = size - _TRAILER.size
        if (
            not (_HEADER.size <= at <= limit and count == (limit - at) // _RECORD.size)
            or (limit - at) % _RECORD.size
        ):
            raise SF.corrupt_file(
                path, f"has an index of {count} entries at byte {at} that does not fit the file"
            )
        index = bytes(SF.read_at(fd, path, size, at, limit - at))
    finally:
        os.close(fd)
    if xxhash.xxh3_128_digest(head + index + trailer[:16]) != digest:
        raise SF.corrupt_file(path, "has an index that fails its checksum")
    out: dict[str, PackEntry] = {}
    for k in range(count):
        raw, offset, length, blob_digest = _RECORD.unpack_from(index, k * _RECORD.size)
        if not (_HEADER.size <= offset and offset + length <= at):
            raise SF.corrupt_file(path, f"has entry {k} outside its entries (byte {offset})")
        out[raw.hex()] = PackEntry(path, offset, length, blob_digest)
    return out


class PackWriter:
    """Writes one pack file at `path` (a new file: a scratch name), entry by entry.

    :meth:`add` appends a chunk's stored bytes; :meth:`finish` writes the index
    and trailer (and fsyncs when `durable`).  A writer that fails or is
    :meth:`abort`-ed removes its file.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        # O_EXCL: a new file, never an existing one nor through a link planted at `path`.
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self._records: list[bytes] = []
        self._seen: set[str] = set()
        self._at = 0
        self._head = _HEADER.pack(_MAGIC, 0)
        self._write(self._head)

    def _write(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        try:
            while view:
                view = view[os.write(self._fd, view[: 1 << 30]) :]
        except BaseException:
            self.abort()
            raise
        self._at += len(data)

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, addr: str) -> bool:
        return addr in self._seen

    def add(self, addr: str, blob: bytes | memoryview) -> None:
        """Append the stored bytes `blob` of chunk `addr` (once per address)."""
        if not F.is_address(addr):
            raise VlccValueError(f"{addr!r} is not a chunk address")
        if addr in self._seen:
            return
        self._records.append(
            _RECORD.pack(bytes.fromhex(addr), self._at, len(blob), xxhash.xxh3_128_digest(blob))
        )
        self._seen.add(addr)
        self._write(blob)

    def finish(self, durable: bool) -> int:
        """Write the index and trailer, fsync when `durable`, close; the file's size."""
        index = b"".join(self._records)
        at = self._at
        self._write(index)
        tail = struct.pack("<QQ", len(self._records), at)
        digest = xxhash.xxh3_128_digest(self._head + index + tail)
        self._write(_TRAILER.pack(len(self._records), at, digest, _END))
        try:
            if durable:
                os.fsync(self._fd)
        except BaseException:
            self.abort()
            raise
        os.close(self._fd)
        self._fd = -1
        return self._at

    def abort(self) -> None:
        """Close and remove the file (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            try:
                os.unlink(self.path)
            except OSError:
                pass
