"""The on-disk format's ground rules, shared by every persistent store.

The zarr tier (:class:`~vlcc_adjoint.storage.ZarrTier`), the MPI tier
(``SharedZarrTier``) and the lineage repository (:class:`~vlcc_adjoint.lineage.History`)
all keep checkpoints as zarr v3 hierarchies that plain ``zarr.open_group``
reads.  This module is the one place that says how such a hierarchy is read
and written safely: it opens files, reads and checks metadata, computes the
digests that make a record's whole description tamper-evident, publishes
writes atomically and serialises writers.  Each store adds its own layout on
top, and none of them opens a file any other way.  The zarr v3 documents
they share are made here too: :func:`array_metadata` (an array's
``zarr.json``), :func:`sealed_group` / :func:`unseal` (a group whose
attributes carry their digest), :func:`check_leaf` (a declared dtype and
shape, validated before any allocation).

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
  :func:`check_dir` (``lstat``: a directory, not a link to one).
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
  :class:`~vlcc_adjoint.storage.CorruptCheckpointError` whose message and
  ``path`` attribute name the file; I/O failures raise ``OSError`` subclasses
  for the caller to report as :class:`~vlcc_adjoint.storage.StorageError`.

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
applications*, OSDI 2014.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import stat
import time
from typing import Any

import numpy as np
import xxhash

from ..errors import VlccValueError
from ._checksum import (
    check_capacity,
    check_record,
    corrupt,
    encode_spec,
    full,
    leaf_checksum,
    step_of,
)
from ._files import (
    DIRECT_MIN,
    O_CLOEXEC,
    fsync_dir,
    fsync_paths,
    read_direct,
    read_exactly,
    write_all,
    write_file,
)
from ._tier import CorruptCheckpointError, StorageError
from ._zarr_meta import array_metadata, chunk_key, zarr_data_type

__all__ = [
    "LOCK_DIR",
    "MAX_METADATA_BYTES",
    "MODES",
    # the record checks every tier shares, from the checksum module:
    "check_capacity",
    "check_record",
    "corrupt",
    "encode_spec",
    "full",
    "leaf_checksum",
    "step_of",
    "StoreLockedError",
    "WriterLock",
    "allocation_limit",
    "array_metadata",
    "canonical_json",
    "check_allocation",
    "check_dir",
    "check_leaf",
    "chunk_key",
    "digest",
    "fsync_dir",
    "fsync_paths",
    "group_document",
    "lock_store",
    "open_regular",
    "open_group",
    "parse_mode",
    "publish",
    "read_into",
    "read_json",
    "read_limited",
    "remedy",
    "remove_tree",
    "sealed_group",
    "sealed_group_json",
    "tree_bytes",
    "unseal",
    "write_all",
    "write_file",
    "write_json",
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

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class StoreLockedError(StorageError):
    """Another writer holds the store; the message names it and the remedy."""


def parse_mode(mode: str) -> str:
    """`mode` if it is one of :data:`MODES`, else a ``ValueError`` listing them."""
    if mode not in MODES:
        raise VlccValueError(
            f"mode must be one of {', '.join(map(repr, MODES))} (as in zarr), got {mode!r}"
        )
    return mode


def _corrupt(path: str, problem: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"{path}: {problem}", path=path)


def check_dir(path: str) -> None:
    """Check that `path` is a directory and not a symbolic link.

    Raises :class:`~vlcc_adjoint.storage.CorruptCheckpointError` naming it
    otherwise (``FileNotFoundError`` when it does not exist).
    """
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise _corrupt(
            path,
            "is a symbolic link where the store has a directory; stores are "
            "never read or written through links (replace it with a real directory)",
        )
    if not stat.S_ISDIR(st.st_mode):
        raise _corrupt(path, "is not a directory where the store has one")


def open_regular(path: str, flags: int = os.O_RDONLY) -> int:
    """A file descriptor of the regular file `path`, opened without following links.

    Opening never blocks (``O_NONBLOCK``: a FIFO in place of a file does not
    wait for a writer); the descriptor is then checked to be a regular file
    and returned in blocking mode.  A link or any other kind of file raises
    :class:`~vlcc_adjoint.storage.CorruptCheckpointError` naming `path`;
    ``FileNotFoundError`` passes through.
    """
    fd, _ = _open_checked(path, flags)
    if _NONBLOCK:
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)
        except BaseException:
            os.close(fd)
            raise
    return fd


def _open_checked(path: str, flags: int) -> tuple[int, os.stat_result]:
    """:func:`open_regular`'s descriptor (still ``O_NONBLOCK``, which reads of
    regular files ignore) and its ``fstat``."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK | O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _corrupt(path, "is a symbolic link; stores never follow links") from None
        if err.errno == errno.ENXIO:  # a FIFO opened for writing with no reader, a socket
            raise _corrupt(path, "is not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _corrupt(
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
            raise _corrupt(
                path, f"has {size} bytes, more than the {limit} a file of its kind may have"
            )
        buf = bytearray(size)
        if not read_exactly(fd, memoryview(buf)):
            raise _corrupt(path, "ended while it was read (truncated)")
        return bytes(buf)
    finally:
        os.close(fd)


def read_into(path: str, out: np.ndarray | bytearray | memoryview, *, direct: bool = False) -> None:
    """Fill the writable buffer `out` with the regular file `path`, which must
    have exactly ``out.nbytes`` bytes (else ``CorruptCheckpointError``).

    `direct`: read with direct I/O where possible (``DIRECT_MIN`` bytes or
    more into a buffer that starts on a page boundary, on a file system that
    accepts it; see :mod:`._files`): for files not in the page cache."""
    view = memoryview(out).cast("B")
    fd, st = _open_checked(path, os.O_RDONLY)  # one fstat, no fcntl: every get's path
    try:
        size = st.st_size
        if size != len(view):
            raise _corrupt(path, f"has {size} bytes, its metadata says {len(view)}")
        done = 0
        if direct and size >= DIRECT_MIN:
            done = read_direct(fd, view, np.frombuffer(view, np.uint8).ctypes.data)
        if not read_exactly(fd, view[done:] if done else view):
            raise _corrupt(path, "ended while it was read (truncated)")
    finally:
        os.close(fd)


def _reject_constant(name: str):
    raise VlccValueError(f"{name} is not valid in checkpoint metadata")


def read_json(path: str, limit: int = MAX_METADATA_BYTES) -> Any:
    """The JSON document in `path` (at most `limit` bytes, strict JSON).

    Anything that is not a readable, well-formed JSON document (bad UTF-8,
    syntax, ``NaN``, duplicate keys) raises ``CorruptCheckpointError`` naming
    `path`.  The caller validates the document's structure.
    """
    data = read_limited(path, limit)
    try:
        return json.loads(
            data.decode("utf-8"), parse_constant=_reject_constant, object_pairs_hook=_unique_keys
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise _corrupt(path, f"is not valid JSON metadata ({err})") from None


def _unique_keys(pairs):
    out = dict(pairs)
    if len(out) != len(pairs):
        raise VlccValueError("duplicate key in an object")
    return out


def canonical_json(obj: Any) -> bytes:
    """The canonical encoding of a JSON value: sorted keys, no whitespace, ASCII.

    Two values encode to the same bytes exactly when they are equal as JSON
    (``NaN`` and infinities are refused: they are not JSON).
    """
    return _CANONICAL.encode(obj).encode("ascii")


_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
)


def digest(description: Any) -> str:
    """xxh3-128 (32 hexadecimal digits) of ``canonical_json(description)``.

    `description` is everything a read depends on besides the data bytes
    themselves, *including* the per-leaf checksums of those bytes, so one
    digest covers the whole record.
    """
    return xxhash.xxh3_128_hexdigest(canonical_json(description))


def publish(src: str, dst: str, durable: bool) -> None:
    """Rename `src` to `dst` atomically; when `durable`, fsync the parent after."""
    os.rename(src, dst)
    if durable:
        fsync_dir(os.path.dirname(dst) or ".")


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
        raise _corrupt(
            path,
            f"declares {nbytes!r} bytes of {what}, more than this machine's "
            f"{limit} bytes of memory",
        )
    return nbytes


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
            fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | O_CLOEXEC, 0o644)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise _corrupt(path, "is a symbolic link; stores never follow links") from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise _corrupt(path, "is not a regular file")
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
        try:
            info = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
            return f"process {int(info['pid'])} on host {str(info['host'])[:255]!r}"
        except (ValueError, KeyError, TypeError, OSError, UnicodeDecodeError):
            return "another process"

    def release(self) -> None:
        """Release the lock (idempotent)."""
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):  # a lock object dropped unreleased frees the store with it
        self.release()


#: The directory of a store's writer lock: a zarr group of its own (plain zarr
#: lists it as an empty group, not as an unknown object), holding the lock file.
LOCK_DIR = ".vlcc-lock"


def lock_store(path: str, what: str, durable: bool = False) -> WriterLock:
    """Take the writer lock of the store directory `path` (``LOCK_DIR/holder``).

    **Arguments:** `path`, the store (a checked directory); `what`, the store
    in messages (``"the zarr store /x"``); `durable`, fsync what is created.

    **Returns:** the held :class:`WriterLock`; raises :class:`StoreLockedError`
    naming the holder when another writer has it.
    """
    lock_dir = os.path.join(path, LOCK_DIR)
    try:
        os.mkdir(lock_dir)
    except FileExistsError:
        pass
    check_dir(lock_dir)
    lock = WriterLock(os.path.join(lock_dir, "holder"), what)
    try:
        if not os.path.lexists(os.path.join(lock_dir, "zarr.json")):  # held: no race
            write_json(
                os.path.join(lock_dir, "zarr.json"),
                group_document(
                    {"vlcc_adjoint": "the writer lock of the store (pid and host of its holder)"}
                ),
                durable,
            )
    except BaseException:
        lock.release()
        raise
    return lock


# -- zarr v3 metadata ------------------------------------------------------------------

#: The most dimensions a stored array may declare (numpy's own limit is 64).
MAX_NDIM = 32


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
    from ..state import dtype_from_json

    try:
        dtype = dtype_from_json(dtype_json)
    except (ValueError, TypeError) as err:
        raise _corrupt(path, f"declares an invalid dtype ({err})") from None
    if dtype.hasobject:
        raise _corrupt(path, "declares an object dtype, which is never stored (no pickle)")
    if not (
        type(shape) is list
        and len(shape) <= MAX_NDIM
        and all(type(s) is int and 0 <= s < 2**62 for s in shape)
    ):
        raise _corrupt(path, f"declares an invalid shape {shape!r}")
    nbytes = dtype.itemsize
    for s in shape:
        nbytes *= s
    check_allocation(nbytes, path, "array data")
    return dtype, tuple(shape), nbytes


# -- group documents and the record digest -------------------------------------------------


def group_document(attributes: dict) -> dict:
    """The ``zarr.json`` of a zarr v3 group with `attributes`."""
    return {"zarr_format": 3, "node_type": "group", "attributes": attributes}


def write_json(path: str, obj: Any, durable: bool) -> None:
    """Write the JSON document `obj` at `path` atomically (scratch name, rename)."""
    tmp = path + ".tmp"
    try:
        os.unlink(tmp)  # a leftover of an interrupted write, or a planted link: never followed
    except FileNotFoundError:
        pass
    write_file(tmp, json.dumps(obj, indent=1, sort_keys=True).encode(), durable, exclusive=True)
    publish(tmp, path, durable)


def sealed_group(name: str, attrs: dict) -> tuple[bytes, str]:
    """A group ``zarr.json`` whose attribute `name` is `attrs` with its digest.

    The file is the canonical JSON of ``group_document({name: {**attrs,
    "digest": d}})`` with ``d = digest(attrs)``: the digest covers every
    value of `attrs` (for a record: its spec, names, scalars, leaf dtypes,
    shapes and checksums), and :func:`unseal` recomputes it from what it
    parses.

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
        doc = canonical_json(group_document({name: {**attrs, "digest": d}}))
    return doc, d


_PLAIN_NAMES: set = set()  # attribute name lists sealed_group_json has checked


def sealed_group_json(name: str, parts: dict) -> tuple[bytes, str]:
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


def open_group(path: str, name: str) -> Any:
    """The attribute `name` of the group ``zarr.json`` at `path` (bounded, strict), or
    ``None`` when the file is a zarr v3 node without it (a foreign node).

    Anything that is not a zarr v3 node raises ``CorruptCheckpointError``
    naming `path`.
    """
    doc = read_json(path)
    if not (
        type(doc) is dict
        and doc.get("zarr_format") == 3
        and doc.get("node_type") in ("group", "array")
    ):
        raise _corrupt(path, "is not the zarr.json of a zarr v3 node")
    attrs = doc.get("attributes", {})
    if type(attrs) is not dict:
        raise _corrupt(path, "has attributes that are not a JSON object")
    if name not in attrs:
        return None
    if doc["node_type"] != "group" or set(doc) != {"zarr_format", "node_type", "attributes"}:
        raise _corrupt(path, f"has {name!r} attributes but is not a plain zarr v3 group")
    return attrs[name]


def unseal(attrs: object, path: str) -> dict:
    """`attrs` (as :func:`sealed_group` wrote them) without their digest, after
    checking it: ``CorruptCheckpointError`` naming `path` if any value changed."""
    if type(attrs) is not dict or type(attrs.get("digest")) is not str:
        raise _corrupt(path, "has no digest of its content")
    out = dict(attrs)
    want = out.pop("digest")
    try:
        got = digest(out)
    except (TypeError, ValueError) as err:  # e.g. an int where JSON allows none
        raise _corrupt(path, f"has content that is not canonical JSON ({err})") from None
    if got != want:
        raise _corrupt(
            path,
            f"has content whose digest {got} is not the {want} it was written "
            "with (the file was damaged or modified after it was written)",
        )
    return out


# -- the store directory -------------------------------------------------------------


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
