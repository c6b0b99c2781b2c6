"""The on-disk format layer: how every persistent store reads and writes its files.

The zarr tier (:class:`~vlcc_adjoint.storage.ZarrTier`), the MPI tier
(``SharedZarrTier``) and the lineage repository
(:class:`~vlcc_adjoint.lineage.History`) all keep checkpoints as zarr v3
hierarchies that plain ``zarr.open_group(path, mode="r")`` reads.  This
module is the one place that writes and reads those hierarchies; each store
adds only its own layout (which groups, which attributes) on top:

* **zarr v3 documents.**  :func:`group_json` is a group's ``zarr.json``,
  :func:`array_metadata` an array's (data type, byte order, chunk grid,
  codecs), :func:`chunk_key` the name of a chunk file; :func:`open_group`
  reads a node and returns the attributes a store keeps in it.
* **Seals.**  :func:`seal` adds to a document's attributes the
  :func:`digest` of everything else in them, :func:`unseal` checks and
  removes it; :func:`sealed_group` writes a sealed group in one pass.
  :func:`sealed_text_group` seals a group attribute by the bytes of its
  JSON text instead (a document assembled from cached fragments, which is
  never re-encoded).
* **Strict, bounded JSON.**  :func:`read_json` / :func:`parse_json`: UTF-8,
  no ``NaN`` or ``Infinity``, no duplicate keys, at most
  :data:`MAX_METADATA_BYTES`; :func:`canonical_json` is the one encoding
  that digests are computed over.
* **Safe files.**  :func:`open_regular`, :func:`read_limited`,
  :func:`read_into`, :func:`check_dir`, :func:`check_leaf`,
  :func:`check_allocation`, :func:`remove_tree`; :func:`open_sized` and
  :func:`read_at` read ranges of a file (a pack's entries) whose offsets and
  lengths come from inside the file, each checked against its size first.
* **Atomic publication.**  :func:`write_file`, :func:`write_atomic`
  (scratch name, fsync when durable, rename), :func:`create_file` (a file
  that appears whole, once, however many processes create it),
  :func:`publish`, :func:`fsync_dir`, :func:`fsync_paths`.
* **One writer per store.**  :class:`WriterLock`, :func:`lock_store`.

The system-call loops beneath (whole-buffer ``write``/``readv`` on a
descriptor, direct I/O) are in :mod:`._files`.

Threat model
------------

A store directory may be damaged (a torn write, a flipped bit, a disk that
returns garbage) or crafted (copied from somebody else, unpacked from an
archive).  Reading it must never return wrong data silently, never hang,
never allocate without bound and never touch anything outside the store:

* **Only regular files, never through a link.**  :func:`open_regular` opens
  with ``O_NOFOLLOW`` (a symbolic link in the last component fails with
  ``ELOOP``) and ``O_NONBLOCK`` (opening a FIFO does not wait for a writer),
  then checks ``S_ISREG`` on the open descriptor (no race between check
  and use) and clears ``O_NONBLOCK``.  Directories are checked with
  :func:`check_dir` (``lstat``: a directory, not a link to one).  Writes
  create files with ``O_NOFOLLOW`` too, so a link planted in a store is
  never written through.
* **Bounded reads.**  Metadata is read by :func:`read_json`, which refuses a
  file larger than its limit *before* reading it (a sparse multi-GiB file
  costs nothing), and data by :func:`read_into`, which requires the file's
  real size to be the size the (verified) metadata declares.  Sizes that a
  reader would allocate are checked against :func:`allocation_limit`.
* **Digests over everything a read depends on.**  :func:`digest` is
  xxh3-128 of the canonical JSON (sorted keys, no whitespace) of a record's
  whole description: structure, names, scalars, strings, the leaf-to-name
  mapping, dtypes, shapes, codec parameters and the per-leaf checksums of
  the data.  Any change to any value is detected; a change that leaves the
  parsed JSON equal (whitespace, key order) is harmless, since the data
  returned is then bit-identical.  xxh3 detects accidents with probability
  1 - 2^-128; it is not a signature: a writer who can recompute it can
  forge a record, so a crafted store can return data its crafter chose,
  but never crash, hang or exhaust the reader (the bounds above).
* **Errors name the file.**  Damage raises
  :class:`~vlcc_adjoint.storage.CorruptCheckpointError` (built by
  :func:`corrupt_file`) whose message and ``path`` attribute name the
  file; I/O failures raise ``OSError`` subclasses for the caller to report
  as :class:`~vlcc_adjoint.storage.StorageError`.

Writes are atomic (write into a scratch name, ``rename`` into place: POSIX
rename replaces a directory entry atomically) and, when durable, fsynced
file first, then the directory that names it (the order ext4 and XFS
document for crash consistency; Pillai et al., OSDI 2014).  One process
writes to a store at a time: :class:`WriterLock` holds an ``flock`` on the
store's lock file, which the kernel releases when the holder dies, and
writes the holder's pid and host into it so that a refused writer learns
who holds it.

**References:** Y. Collet, *xxHash: extremely fast hash algorithm*, XXH3
specification (2019-2024).  T. S. Pillai et al., *All file systems are not
created equal: on the complexity of crafting crash-consistent
applications*, OSDI 2014.  zarr v3 core specification
(https://zarr-specs.readthedocs.io/en/latest/v3/core/).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import socket
import stat
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import xxhash

from ..errors import VlccValueError
from ..state import dtype_from_json
from ._files import DIRECT_MIN, O_CLOEXEC, O_NOFOLLOW, read_direct, read_exactly, write_all
from ._tier import CorruptCheckpointError, StorageError

__all__ = [
    "LOCK_DIR",
    "MAX_METADATA_BYTES",
    "MAX_NDIM",
    "MODES",
    "StoreLockedError",
    "WriterLock",
    "allocation_limit",
    "array_metadata",
    "canonical_json",
    "check_allocation",
    "check_dir",
    "check_leaf",
    "chunk_key",
    "corrupt_file",
    "create_file",
    "digest",
    "fsync_dir",
    "fsync_paths",
    "group_attribute",
    "group_json",
    "lock_store",
    "make_dir",
    "open_group",
    "open_regular",
    "open_sealed_text",
    "open_sized",
    "open_sealed_text_group",
    "parse_json",
    "parse_json_at",
    "parse_mode",
    "publish",
    "read_at",
    "read_into",
    "read_json",
    "read_limited",
    "remedy",
    "remove_tree",
    "seal",
    "sealed_group",
    "sealed_group_json",
    "sealed_text_group",
    "scratch_name",
    "tree_bytes",
    "unseal",
    "write_atomic",
    "write_file",
    "write_group",
    "zarr_data_type",
]

#: The largest metadata file any store reads (bytes).  A record's group
#: ``zarr.json`` holds its spec and one entry per leaf; a lineage graph one
#: entry per version.  Larger files are refused unread.
MAX_METADATA_BYTES = 64 << 20

#: zarr's open modes: ``r`` read only; ``r+`` read and write an existing
#: store; ``a`` read and write, creating it if absent; ``w`` create, or
#: empty an existing one; ``w-`` create, refusing an existing one.
MODES = ("r", "r+", "a", "w", "w-")

#: The most dimensions a stored array may declare (numpy's own limit is 64).
MAX_NDIM = 32

#: The directory of a store's writer lock: a zarr group of its own (plain zarr
#: lists it as an empty group, not as an unknown object), holding the lock file.
LOCK_DIR = ".vlcc-lock"

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIGEST = re.compile(r"[0-9a-f]{32}")


class StoreLockedError(StorageError):
    """Another writer holds the store; the message names it and the remedy."""


def corrupt_file(path: str, problem: str) -> CorruptCheckpointError:
    """The :class:`~vlcc_adjoint.storage.CorruptCheckpointError` of a damaged
    file: ``"<path>: <problem>"``, with ``path`` set."""
    return CorruptCheckpointError(f"{path}: {problem}", path=path)


def parse_mode(mode: str) -> str:
    """`mode` if it is one of :data:`MODES`, else a ``ValueError`` listing them."""
    if mode not in MODES:
        raise VlccValueError(
            f"mode must be one of {', '.join(map(repr, MODES))} (as in zarr), got {mode!r}"
        )
    return mode


# -- safe opens and bounded reads -------------------------------------------------------


def check_dir(path: str) -> None:
    """Check that `path` is a directory and not a symbolic link.

    Raises :class:`~vlcc_adjoint.storage.CorruptCheckpointError` naming it
    otherwise (``FileNotFoundError`` when it does not exist).
    """
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise corrupt_file(
            path,
            "is a symbolic link where the store has a directory; stores are "
            "never read or written through links (replace it with a real directory)",
        )
    if not stat.S_ISDIR(st.st_mode):
        raise corrupt_file(path, "is not a directory where the store has one")


def make_dir(path: str) -> None:
    """Make the directory `path` unless it exists; either way it must be a real
    directory (:func:`check_dir`), never a link to one."""
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    check_dir(path)


def open_regular(path: str, flags: int = os.O_RDONLY) -> int:
    """A file descriptor of the regular file `path`, opened without following links.

    Opening never blocks (``O_NONBLOCK``: a FIFO in place of a file does not
    wait for a writer); the descriptor is then checked to be a regular file
    and returned in blocking mode.  A link or any other kind of file raises
    :class:`~vlcc_adjoint.storage.CorruptCheckpointError` naming `path`;
    ``FileNotFoundError`` passes through.
    """
    fd, _ = _open_blocking(path, flags)
    return fd


def _open_checked(path: str, flags: int) -> tuple[int, os.stat_result]:
    """:func:`open_regular`'s descriptor (still ``O_NONBLOCK``, which reads of
    regular files ignore) and its ``fstat``."""
    try:
        fd = os.open(path, flags | O_NOFOLLOW | _NONBLOCK | O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise corrupt_file(path, "is a symbolic link; stores never follow links") from None
        if err.errno == errno.ENXIO:  # a FIFO opened for writing with no reader, a socket
            raise corrupt_file(path, "is not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise corrupt_file(
                path,
                "is not a regular file (a FIFO, device, socket or directory "
                "in place of a store file)",
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_limited(path: str, limit: int) -> bytes:
    """The bytes of the regular file `path`, refused unread if it has more than `limit`."""
    fd, st = _open_checked(path, os.O_RDONLY)
    try:
        size = st.st_size
        if size > limit:
            raise corrupt_file(
                path, f"has {size} bytes, more than the {limit} a file of its kind may have"
            )
        buf = bytearray(size)
        if not read_exactly(fd, memoryview(buf)):
            raise corrupt_file(path, "ended while it was read (truncated)")
        return bytes(buf)
    finally:
        os.close(fd)


def read_into(path: str, out: np.ndarray | bytearray | memoryview, *, direct: bool = False) -> None:
    """Fill the writable buffer `out` with the regular file `path`, which must
    have exactly ``out.nbytes`` bytes (else ``CorruptCheckpointError``).

    `direct`: read with direct I/O where possible (``DIRECT_MIN`` bytes or
    more into a buffer that starts on a page boundary, on a file system that
    accepts it; see :mod:`._files`): for files not in the page cache."""
    view = out.data.cast("B") if isinstance(out, np.ndarray) else memoryview(out).cast("B")
    fd, st = _open_checked(path, os.O_RDONLY)  # one fstat, no fcntl: every get's path
    try:
        size = st.st_size
        if size != len(view):
            raise corrupt_file(path, f"has {size} bytes, its metadata says {len(view)}")
        done = 0
        if direct and size >= DIRECT_MIN:
            done = read_direct(fd, view, np.frombuffer(view, np.uint8).ctypes.data)
        if not read_exactly(fd, view[done:] if done else view):
            raise corrupt_file(path, "ended while it was read (truncated)")
    finally:
        os.close(fd)


def open_sized(path: str) -> tuple[int, int]:
    """A blocking descriptor of the regular file `path` (never through a link,
    as :func:`open_regular`) and the file's size from the same ``fstat``: the
    bound every offset and length read from inside the file is checked
    against before anything is allocated (:func:`read_at`)."""
    fd, st = _open_blocking(path, os.O_RDONLY)
    return fd, st.st_size


def _open_blocking(path: str, flags: int) -> tuple[int, os.stat_result]:
    """:func:`_open_checked`'s descriptor, switched back to blocking mode, and its ``fstat``."""
    fd, st = _open_checked(path, flags)
    if _NONBLOCK:
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)
        except BaseException:
            os.close(fd)
            raise
    return fd, st


def read_at(
    fd: int,
    path: str,
    size: int,
    offset: int,
    length: int,
    out: memoryview | None = None,
) -> bytes | memoryview:
    """`length` bytes of the open file `fd` (the file `path` of `size` bytes,
    from :func:`open_sized`) at `offset`.

    The range is checked against `size` first, so a damaged or crafted
    offset or length never makes a reader allocate or read past the file:
    ``CorruptCheckpointError`` naming `path`.  With `out` (a writable byte
    view of exactly `length` bytes) the bytes are read into it and `out` is
    returned; else a new ``bytes``.  A file that ends before the range does
    (truncated since it was measured) raises the same error.
    """
    if (
        not (type(offset) is int and type(length) is int and 0 <= offset and 0 <= length)
        or offset + length > size
    ):
        raise corrupt_file(
            path, f"names bytes {offset}..{offset}+{length}, beyond its {size} bytes"
        )
    view = memoryview(bytearray(length)) if out is None else out
    if len(view) != length:
        raise VlccValueError(f"a buffer of {len(view)} bytes for a read of {length}")
    done = 0
    while done < length:
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise corrupt_file(path, "ended while it was read (truncated)")
        done += n
    return view if out is not None else bytes(view)


def allocation_limit() -> int:
    """The most bytes a reader allocates on a store's word: the machine's physical memory."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no better bound known
        return 1 << 40


def check_allocation(nbytes: int, path: str, what: str = "data") -> int:
    """`nbytes` if a reader may allocate it for `what` declared in `path`, else
    ``CorruptCheckpointError`` (a size no real checkpoint on this machine has)."""
    limit = allocation_limit()
    if not isinstance(nbytes, int) or nbytes < 0 or nbytes > limit:
        raise corrupt_file(
            path,
            f"declares {nbytes!r} bytes of {what}, more than this machine's "
            f"{limit} bytes of memory",
        )
    return nbytes


def check_leaf(
    dtype_json: object, shape: object, path: str
) -> tuple[np.dtype, tuple[int, ...], int]:
    """A stored array's dtype, shape and byte size, validated before anything is
    allocated from them.

    The dtype comes from an allow-list (:func:`vlcc_adjoint.state.dtype_from_json`:
    no objects, nothing imported), the shape is at most :data:`MAX_NDIM`
    non-negative ints, and the size passes :func:`check_allocation`.
    Anything else raises ``CorruptCheckpointError`` naming `path`.
    """
    try:
        dtype = dtype_from_json(dtype_json)
    except (ValueError, TypeError) as err:
        raise corrupt_file(path, f"declares an invalid dtype ({err})") from None
    if dtype.hasobject:
        raise corrupt_file(path, "declares an object dtype, which is never stored (no pickle)")
    if not (
        type(shape) is list
        and len(shape) <= MAX_NDIM
        and all(type(s) is int and 0 <= s < 2**62 for s in shape)
    ):
        raise corrupt_file(path, f"declares an invalid shape {shape!r}")
    nbytes = dtype.itemsize
    for s in shape:
        nbytes *= s
    check_allocation(nbytes, path, "array data")
    return dtype, tuple(shape), nbytes


def tree_bytes(path: str) -> int:
    """Bytes of the regular files under the directory `path` (links not followed)."""
    total = 0
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            total += tree_bytes(entry.path)
        elif entry.is_file(follow_symlinks=False):
            total += entry.stat(follow_symlinks=False).st_size
    return total


def remove_tree(path: str, root: str) -> None:
    """Remove `path`, which must lie inside the directory `root`, without following links.

    A link or a file is unlinked (its target is never touched); a
    directory is removed with everything in it (``shutil.rmtree``, which
    unlinks the links it meets).  A missing `path` is not an error.
    """
    root = os.path.abspath(root)
    full = os.path.abspath(path)
    if os.path.commonpath([root, full]) != root or full == root:
        raise VlccValueError(f"refusing to remove {full}: it is not inside the store {root}")
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(full)
    else:
        os.unlink(full)


def remedy(err: OSError) -> str:
    """What to do about an ``OSError`` of a store write, for messages."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free disk space or give the tier a smaller capacity_bytes"
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "check that the store directory is writable"
    if err.errno == errno.ENOENT:
        return "the store directory was removed or moved; open the store again"
    if err.errno in (errno.ENOTEMPTY, errno.EEXIST):
        return (
            "a directory of that name, not a record of this tier, is in the store; use another key"
        )
    return "check the file system"


# -- strict JSON and digests --------------------------------------------------------------


def _reject_constant(name: str) -> None:
    raise VlccValueError(f"{name} is not valid in checkpoint metadata")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise VlccValueError("duplicate key in an object")
    return out


#: The strict decoder of metadata: no ``NaN``/``Infinity``, no duplicate keys.
_STRICT_JSON = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_unique_keys)


def parse_json(data: bytes, path: str) -> Any:
    """The strict JSON document in `data`, read from the file `path`.

    Anything that is not a well-formed document (bad UTF-8, syntax,
    ``NaN``/``Infinity``, duplicate keys, nesting beyond the interpreter's
    recursion limit) raises ``CorruptCheckpointError`` naming `path`.  The
    caller validates the document's structure.
    """
    try:
        return _STRICT_JSON.decode(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise corrupt_file(path, f"is not valid JSON metadata ({err})") from None


def parse_json_at(text: str, pos: int, path: str) -> tuple[Any, int]:
    """The strict JSON value (as :func:`parse_json` reads it) that begins at
    offset `pos` of `text`, read from the file `path`, and the offset where
    it ends: for a reader that walks a document it knows the layout of and
    keeps the text of its parts (``CorruptCheckpointError`` naming `path` if
    no valid value begins there)."""
    try:
        return _STRICT_JSON.raw_decode(text, pos)
    except (ValueError, RecursionError) as err:
        raise corrupt_file(path, f"is not valid JSON metadata ({err})") from None


def read_json(path: str, limit: int = MAX_METADATA_BYTES) -> Any:
    """The JSON document in the regular file `path` (at most `limit` bytes,
    :func:`parse_json`'s strict JSON)."""
    return parse_json(read_limited(path, limit), path)


_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
)


def canonical_json(obj: Any) -> bytes:
    """The canonical encoding of a JSON value: sorted keys, no whitespace, ASCII.

    Two values encode to the same bytes exactly when they are equal as JSON
    (``NaN`` and infinities are refused: they are not JSON).
    """
    return _CANONICAL.encode(obj).encode("ascii")


def digest(description: Any) -> str:
    """xxh3-128 (32 hexadecimal digits) of ``canonical_json(description)``.

    `description` is everything a read depends on besides the data bytes
    themselves, *including* the per-leaf checksums of those bytes, so one
    digest covers the whole record.
    """
    return xxhash.xxh3_128_hexdigest(canonical_json(description))


# -- seals -------------------------------------------------------------------------------


def seal(attrs: dict) -> dict:
    """`attrs` with ``"digest"``: the :func:`digest` of every other attribute
    (an old ``"digest"`` is replaced)."""
    body = {k: v for k, v in attrs.items() if k != "digest"}
    return {**body, "digest": digest(body)}


def unseal(attrs: object, path: str, what: str = "it", expected: str | None = None) -> dict:
    """`attrs` (as :func:`seal` or :func:`sealed_group` made them) without their
    digest, after checking it.

    **Arguments:** `attrs`, the parsed attributes; `path`, the file they were
    read from; `what`, the document in messages (``"the manifest of version
    3f2a..."``); `expected`, the digest another sealed document records for
    this one (a document replaced by another well-sealed one is caught too).

    Raises ``CorruptCheckpointError`` naming `path` if the digest is missing
    or malformed, or any value changed.
    """
    if type(attrs) is not dict:
        raise corrupt_file(path, f"{what} has no digest of its content (not an object)")
    want = attrs.get("digest")
    if type(want) is not str or _DIGEST.fullmatch(want) is None:
        raise corrupt_file(path, f"{what} has no valid digest of its content")
    out = dict(attrs)
    del out["digest"]
    try:
        got = digest(out)
    except (TypeError, ValueError) as err:  # e.g. an int where JSON allows none
        raise corrupt_file(path, f"{what} has content that is not canonical JSON ({err})") from None
    if got != want:
        raise corrupt_file(
            path,
            f"{what} has content whose digest {got} is not the {want} it was written "
            "with (the file was damaged or modified after it was written)",
        )
    if expected is not None and got != expected:
        raise corrupt_file(
            path,
            f"{what} has digest {got}, but {expected} was recorded for it elsewhere "
            "(the file was replaced after it was written)",
        )
    return out


def sealed_group(name: str, attrs: dict) -> tuple[bytes, str]:
    """A group ``zarr.json`` whose attribute `name` is `attrs` sealed with its digest.

    The file is the canonical JSON of ``{name: seal(attrs)}`` as a group
    (:func:`group_json`): the digest covers every value of `attrs` (for a
    record: its spec, names, scalars, leaf dtypes, shapes and checksums),
    and :func:`unseal` recomputes it from what it parses.

    **Returns:** the file's bytes and the digest.
    """
    body = canonical_json(attrs)
    d = xxhash.xxh3_128_hexdigest(body)
    if attrs and min(attrs) > "digest" and name.isidentifier():
        # canonical_json of the sealed document without encoding attrs twice:
        # "digest" sorts before every other key of attrs.
        doc = b'{"attributes":{"%s":{"digest":"%s",%s}},"node_type":"group","zarr_format":3}' % (
            name.encode(),
            d.encode(),
            body[1:-1],
        )
    else:
        doc = group_json({name: {**attrs, "digest": d}})
    return doc, d


_PLAIN_NAMES: set[tuple[str, ...]] = set()  # attribute name lists sealed_group_json has checked


def sealed_group_json(name: str, parts: dict[str, bytes]) -> tuple[bytes, str]:
    """:func:`sealed_group` for attributes given as their encodings: `parts` maps
    each attribute name (a plain identifier sorting after ``"digest"``) to
    ``canonical_json`` of its value, which a writer may have cached.  The
    bytes and the digest are exactly :func:`sealed_group`'s.
    """
    keys = sorted(parts)
    sig = (name, *keys)
    if sig not in _PLAIN_NAMES:
        if not keys or keys[0] <= "digest" or not all(k.isidentifier() for k in sig):
            raise VlccValueError(
                f"attribute names {keys} and group attribute {name!r} must be "
                "plain identifiers sorting after 'digest'"
            )
        _PLAIN_NAMES.add(sig)
    body = b"{" + b",".join([b'"%s":%s' % (k.encode(), parts[k]) for k in keys]) + b"}"
    d = xxhash.xxh3_128_hexdigest(body)
    doc = b'{"attributes":{"%s":{"digest":"%s",%s}},"node_type":"group","zarr_format":3}' % (
        name.encode(),
        d.encode(),
        body[1:-1],
    )
    return doc, d


def _text_seal_parts(name: str) -> tuple[bytes, re.Pattern[bytes]]:
    head = b'{"zarr_format":3,"node_type":"group","attributes":{"' + name.encode() + b'":'
    tail = re.compile(rb',"' + re.escape(name.encode()) + rb'_digest":"([0-9a-f]{32})"\}\}\Z')
    return head, tail


def sealed_text_group(name: str, text: bytes) -> bytes:
    """A group ``zarr.json`` whose attribute `name` is the JSON text `text`,
    sealed by the digest of those bytes.

    The file is exactly ``{"zarr_format":3,"node_type":"group","attributes":
    {"<name>":<text>,"<name>_digest":"<hex>"}}`` with ``<hex>`` the xxh3-128
    of `text` as written.  Hashing the bytes (not a canonical re-encoding)
    lets a writer assemble `text` from cached fragments: a lineage graph of
    thousands of versions is never encoded whole.  :func:`open_sealed_text_group`
    reads it.
    """
    head, _ = _text_seal_parts(name)
    return (
        head
        + text
        + b',"'
        + name.encode()
        + b'_digest":"'
        + xxhash.xxh3_128_hexdigest(text).encode()
        + b'"}}'
    )


def open_sealed_text(raw: bytes, name: str, path: str) -> bytes | None:
    """The JSON text of the attribute `name` of a file `raw` (read from
    `path`) written by :func:`sealed_text_group`, after checking its digest,
    as bytes, unparsed; ``None`` when `raw` does not have that exact shape (a
    document without this seal, which the caller may accept or refuse).

    A file of that shape whose digest does not match raises
    ``CorruptCheckpointError`` naming `path`.  A reader that keeps parts of
    the text as they are (the lineage graph keeps each version's text) parses
    it itself; :func:`open_sealed_text_group` parses it whole.
    """
    head, tail = _text_seal_parts(name)
    m = tail.search(raw) if raw.startswith(head) else None
    if m is None:
        return None
    body = raw[len(head) : m.start()]
    got = xxhash.xxh3_128_hexdigest(body)
    if got != m.group(1).decode():
        raise corrupt_file(
            path,
            f"its {name!r} attributes have digest {got}, their seal says "
            f"{m.group(1).decode()}: the file was changed after it was written",
        )
    return body


def open_sealed_text_group(raw: bytes, name: str, path: str) -> Any:
    """The attribute `name` of a file `raw` (read from `path`) written by
    :func:`sealed_text_group`, parsed, after checking its digest
    (:func:`open_sealed_text`); ``None`` when `raw` does not have that shape.
    """
    body = open_sealed_text(raw, name, path)
    return None if body is None else parse_json(body, path)


# -- zarr v3 documents --------------------------------------------------------------------

_ZARR_TYPES = {
    ("b", 1): "bool",
    ("i", 1): "int8",
    ("i", 2): "int16",
    ("i", 4): "int32",
    ("i", 8): "int64",
    ("u", 1): "uint8",
    ("u", 2): "uint16",
    ("u", 4): "uint32",
    ("u", 8): "uint64",
    ("f", 2): "float16",
    ("f", 4): "float32",
    ("f", 8): "float64",
    ("c", 8): "complex64",
    ("c", 16): "complex128",
}


def zarr_data_type(dtype: np.dtype) -> str | None:
    """The zarr v3 core data type of `dtype`, or ``None`` when it has none
    (structured, datetime, strings, ``bfloat16``: stored as raw bytes)."""
    if dtype.names is not None or dtype.subdtype is not None:
        return None
    if dtype.kind == "V" or dtype.type.__module__.startswith("ml_dtypes"):
        return None
    return _ZARR_TYPES.get((dtype.kind, dtype.itemsize))


def chunk_key(index: Iterable[int]) -> str:
    """zarr v3 "default" chunk key with separator ``.``: ``c.0.1`` for chunk
    (0, 1); ``c`` for the one chunk of a 0-d array."""
    return "c" + "".join(f".{int(i)}" for i in index)


def array_metadata(
    dtype: np.dtype,
    shape: Sequence[int],
    chunk_shape: Sequence[int] | None = None,
    *,
    codecs: Sequence[dict] = (),
    attributes: dict | None = None,
) -> tuple[bytes, str | None]:
    """A zarr v3 array's ``zarr.json`` for leaves of `dtype` and `shape`, and the
    key of its first chunk (``None`` when the array is empty: it has no chunk).

    Leaves of zarr v3 core data types are stored as themselves, in their own
    byte order (the ``bytes`` codec's ``endian``); other dtypes
    (:func:`zarr_data_type` is ``None``: datetime, strings, structured,
    ``bfloat16``) as their raw bytes, a ``uint8`` array of shape
    ``shape + [itemsize]``.  The fill value is zero (``false``) of the data
    type, which zarr also pads edge chunks with.

    **Arguments:**

    - `dtype`, `shape`: the leaves' (numpy) dtype and shape.
    - `chunk_shape`: the regular chunk grid's chunk shape, in the array's
      zarr shape (with the trailing item axis of a raw-bytes array); default:
      the whole array, one chunk.
    - `codecs`: bytes-to-bytes codecs after the ``bytes`` codec (zarr's
      ``blosc`` configuration, for compressed chunks).
    - `attributes`: the array's attributes (default none).
    """
    ztype = zarr_data_type(dtype)
    shape = tuple(int(s) for s in shape)
    if ztype is None:  # raw bytes of an exotic dtype
        ztype, shape, order = "uint8", shape + (dtype.itemsize,), "|"
    else:
        order = dtype.byteorder
        if order == "=":
            order = "<" if np.little_endian else ">"
    if dtype.itemsize == 1 or order == "|":
        codec: dict = {"name": "bytes"}
    else:
        codec = {"name": "bytes", "configuration": {"endian": "little" if order == "<" else "big"}}
    fill: object = (
        False
        if ztype == "bool"
        else [0.0, 0.0]
        if ztype.startswith("complex")
        else 0.0
        if ztype.startswith("float")
        else 0
    )
    chunks = [max(1, s) for s in shape] if chunk_shape is None else [int(c) for c in chunk_shape]
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(shape),
        "data_type": ztype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}},
        "fill_value": fill,
        "codecs": [codec, *codecs],
        "attributes": {} if attributes is None else attributes,
        "storage_transformers": [],
    }
    chunk = None if 0 in shape else chunk_key([0] * len(shape))
    return json.dumps(meta, separators=(",", ":"), allow_nan=False).encode(), chunk


def group_json(attributes: dict) -> bytes:
    """The ``zarr.json`` of a zarr v3 group with `attributes` (canonical JSON)."""
    return canonical_json({"zarr_format": 3, "node_type": "group", "attributes": attributes})


def open_group(path: str, name: str, *, group: bool = True) -> Any:
    """The attribute `name` of the zarr v3 node whose ``zarr.json`` is `path`
    (read bounded and strict, :func:`read_json`), or ``None`` when the node has
    no such attribute (a foreign node: plain zarr's, another store's).

    Anything that is not a zarr v3 node (or, with `group`, not a zarr v3
    group) raises ``CorruptCheckpointError`` naming `path`, as does a node
    holding `name` that is not a plain group (a store's documents are
    groups, and nothing else in them).  ``FileNotFoundError`` passes through.
    """
    return group_attribute(read_json(path), name, path, group=group)


def group_attribute(doc: Any, name: str, path: str, *, group: bool = True) -> Any:
    """:func:`open_group` of the document `doc`, already parsed from the file `path`."""
    kinds = ("group",) if group else ("group", "array")
    if not (type(doc) is dict and doc.get("zarr_format") == 3 and doc.get("node_type") in kinds):
        kind = "group" if group else "node"
        raise corrupt_file(path, f"is not the zarr.json of a zarr v3 {kind}")
    attrs = doc.get("attributes", {})
    if type(attrs) is not dict:
        raise corrupt_file(path, "has attributes that are not a JSON object")
    if name not in attrs:
        return None
    if doc["node_type"] != "group" or set(doc) != {"zarr_format", "node_type", "attributes"}:
        raise corrupt_file(path, f"has {name!r} attributes but is not a plain zarr v3 group")
    return attrs[name]


def write_group(path: str, attributes: dict, durable: bool) -> None:
    """Write (or replace) the group ``zarr.json`` at `path` with `attributes`,
    atomically (:func:`write_atomic`)."""
    write_atomic(path, group_json(attributes), durable)


# -- writes and their publication --------------------------------------------------------


def write_file(
    path: str,
    data: bytes | bytearray | memoryview | np.ndarray,
    durable: bool,
    *,
    truncate: bool = False,
    exclusive: bool = False,
) -> None:
    """Write `data` at `path`; fsync it when `durable`.

    By default the file is created or written over from its start, not
    truncated: the caller knows it is new or not longer than `data` (the
    zarr tier pads its metadata), which saves the truncation's block
    freeing.  `truncate` cuts what is left beyond `data`; `exclusive`
    refuses an existing file (``FileExistsError``), and removes what it
    wrote when the write fails (``ENOSPC``...): a partial file never
    survives its writer.  A symbolic link at `path` is never followed
    (``OSError`` with ``ELOOP``): a store never writes outside itself
    through a link planted in it.
    """
    flags = (
        os.O_WRONLY
        | os.O_CREAT
        | O_CLOEXEC
        | O_NOFOLLOW
        | (os.O_TRUNC if truncate else 0)
        | (os.O_EXCL if exclusive else 0)
    )
    fd = os.open(path, flags, 0o644)
    try:
        try:
            write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        if exclusive:  # ours: a partial file never survives its writer
            try:
                os.unlink(path)
            except OSError:
                pass
        raise


def scratch_name(path: str) -> str:
    """A name beside `path` that no other writer uses: ``.<name>.<pid>-<random>.tmp``
    (hidden, so no store lists it as a record)."""
    head, name = os.path.split(path)
    return os.path.join(head, f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")


_SCRATCH = re.compile(r"\.(?P<name>.+)\.[0-9]+-[0-9a-f]{8}\.tmp")


def scratch_target(entry: str) -> str | None:
    """The file name a scratch file named `entry` (a name made by
    :func:`scratch_name`, without its directory) is written for, or ``None``
    when `entry` is no scratch name.  A directory being created by another
    process holds such files for a moment (``create_file``, ``write_atomic``)."""
    m = _SCRATCH.fullmatch(entry)
    return None if m is None else m.group("name")


def write_atomic(
    path: str, data: bytes | bytearray | memoryview, durable: bool, *, scratch: str | None = None
) -> os.stat_result:
    """Replace (or create) the file `path` with `data`, atomically: readers see
    the old file or the new one, never a part.

    `data` is written to a fresh scratch file (beside `path`, or in the
    directory `scratch`, which must be on the same file system), fsynced
    when `durable`, and renamed over `path` (then the directory is fsynced
    too).  A failure leaves `path` as it was and removes the scratch file.

    **Returns:** the new file's ``fstat``.
    """
    tmp = scratch_name(path)
    if scratch is not None:
        tmp = os.path.join(scratch, os.path.basename(tmp))
    write_file(tmp, data, durable, exclusive=True)
    try:
        st = os.lstat(tmp)  # rename keeps its inode, size and modification time
        publish(tmp, path, durable)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return st


def create_file(path: str, data: bytes, durable: bool) -> None:
    """Create the file `path` with `data` unless it exists, so that it appears
    whole and once, however many processes create it at the same time.

    The content is written to a scratch file and hard-linked to `path`
    (``link`` fails on an existing name: the first creator wins, the others
    keep its file); where hard links are refused, the scratch file is
    renamed into place if `path` is still absent.
    """
    if os.path.lexists(path):
        return
    tmp = scratch_name(path)
    write_file(tmp, data, durable, exclusive=True)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    except OSError:
        if not os.path.lexists(path):
            os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    if durable:
        fsync_dir(os.path.dirname(path) or ".")


def publish(src: str, dst: str, durable: bool) -> None:
    """Rename `src` to `dst` atomically; when `durable`, fsync the parent after."""
    os.rename(src, dst)
    if durable:
        fsync_dir(os.path.dirname(dst) or ".")


def fsync_dir(path: str) -> None:
    """fsync the directory `path`, so that the entries just made in it are durable."""
    fd = os.open(path, os.O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_paths(paths: list[str], uncache: int = 0) -> None:
    """fsync each file or directory in `paths` (never through a symbolic link).

    Writing a set of files first and syncing them after lets one device
    flush (and, on journalling file systems, one journal commit) cover them
    all: the first ``fsync`` waits for the data and metadata, the others
    find them already on the device.  The first `uncache` paths (files)
    then leave the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)`` of
    their pages, clean once synced; nothing where the platform lacks it).
    """
    for k, path in enumerate(paths):
        fd = os.open(path, os.O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        try:
            os.fsync(fd)
            if k < uncache and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# -- one writer per store ---------------------------------------------------------------


class WriterLock:
    """The one-writer lock of a store: ``flock`` on `path`, with the holder named in it.

    ``flock`` belongs to an open file description, so two lock objects in
    one process exclude each other like two processes, and the kernel
    releases the lock when its holder dies (``kill -9`` included): a lock
    file left behind by a dead process never blocks anyone.
    """

    def __init__(self, path: str, store: str):
        self.path = path
        self._fd: int | None = None
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o644)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise corrupt_file(path, "is a symbolic link; stores never follow links") from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise corrupt_file(path, "is not a regular file")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreLockedError(
                    f"{store} is open for writing by {self._holder(fd)}; close it there first, "
                    "or open this store with mode='r' to read it"
                ) from None
            os.ftruncate(fd, 0)
            info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
            write_all(fd, canonical_json(info))
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    @staticmethod
    def _holder(fd: int) -> str:
        """Who holds the lock, from the (bounded, untrusted) note its holder wrote."""
        try:
            info = parse_json(os.pread(fd, 4096, 0), "the lock file")
            return f"process {int(info['pid'])} on host {str(info['host'])[:255]!r}"
        except (ValueError, KeyError, TypeError, OSError, CorruptCheckpointError):
            return "another process"

    def release(self) -> None:
        """Release the lock (idempotent)."""
        fd = getattr(self, "_fd", None)
        if fd is not None:
            self._fd = None
            os.close(fd)

    def __del__(self) -> None:  # a lock object dropped unreleased frees the store with it
        self.release()


def lock_store(path: str, what: str, durable: bool = False) -> WriterLock:
    """Take the writer lock of the store directory `path` (``LOCK_DIR/holder``).

    **Arguments:** `path`, the store (a checked directory); `what`, the store
    in messages (``"the zarr store /x"``); `durable`, fsync what is created.

    **Returns:** the held :class:`WriterLock`; raises :class:`StoreLockedError`
    naming the holder when another writer has it.
    """
    lock_dir = os.path.join(path, LOCK_DIR)
    make_dir(lock_dir)
    lock = WriterLock(os.path.join(lock_dir, "holder"), what)
    try:
        if not os.path.lexists(os.path.join(lock_dir, "zarr.json")):  # held: no race
            write_group(
                os.path.join(lock_dir, "zarr.json"),
                {"vlcc_adjoint": "the writer lock of the store (pid and host of its holder)"},
                durable,
            )
    except BaseException:
        lock.release()
        raise
    return lock
