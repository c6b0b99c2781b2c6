"""ZarrTier: records as zarr v3 groups in a local directory, written without zarr.

The persistent level of the hierarchy, and the on-disk checkpoint format:
a directory that plain ``zarr.open_group(path, mode="r")`` opens, with one
group per record and one array per leaf::

    path/zarr.json                 root group   {"vlcc_adjoint": {"format": 1, ...}}
    path/<key>/zarr.json           record group {"vlcc_adjoint": {"spec", "leaves", ...}}
    path/<key>/<i>/zarr.json       leaf i: an array, one chunk = the whole leaf
    path/<key>/<i>/c.0.0           its bytes ("default" chunk keys, separator ".")
    path/.vlcc-scratch/            in-flight writes and recycled directories

Leaves of the zarr v3 core data types (bool, (u)int8-64, float16/32/64,
complex64/128) are stored as themselves, in their own byte order (``bytes``
codec, ``endian`` little or big), no compression; other dtypes (datetime,
strings, structured, ``bfloat16``) as their raw bytes, a ``uint8`` array of
shape ``shape + [itemsize]``, with the real dtype in the record attributes.

Why not the zarr API
--------------------

Measured on the 2-core VM (``benchmarks/bench_tiers.py``, table below):
writing a record through ``zarr.create_array`` + ``arr[...] = x`` costs 2-3
ms for small records, mostly metadata handling and the async event loop,
against 30-50 us for an ``open``/``write``/``close`` of the same 64 KiB, and
still 3x a plain write at 64 MiB.  A checkpoint store writes
whole arrays, once, as one chunk each, so it needs none of zarr's
machinery: this module writes the (small, documented) v3 JSON metadata and
the chunk bytes itself, with ``os.write`` at the key path zarr reads.  The
result is an ordinary zarr v3 hierarchy; ``tests/test_tiers.py`` reads it
back with plain zarr.

Atomicity and crash safety
--------------------------

A record is written into a directory under ``.vlcc-scratch`` and becomes
visible with one ``os.rename`` to ``path/<key>``, its last step.  A process
killed at any moment (``kill -9`` included) leaves complete records and
scratch; opening the directory again lists every record whose ``put``
returned and deletes the scratch.  ``delete`` renames the record away
first, so it too is all or nothing.  Failed writes (``ENOSPC``, ``EACCES``,
the directory removed) raise :class:`StorageError` naming the key and the
OS error, leave nothing visible and keep ``used_bytes`` exact.

fsync policy: by default nothing is fsynced.  Records survive the process
(the page cache outlives it), not a power cut or a kernel crash: after one,
a record may be listed with damaged data, which its checksum turns into a
:class:`CorruptCheckpointError` on ``get``.  ``durable=True`` fsyncs every
file and every directory it changed before the rename, and the parent
after it: records that were listed survive a power cut, at the price of a
device flush per record (milliseconds on most disks).

Directory recycling
-------------------

Creating directories and files dominates small records (measured ~30 us per
``mkdir`` and per file creation, 5-11 us to overwrite an existing file,
3-10 us per ``rename``).  A fresh record of one leaf needs 2 ``mkdir``, 3
file creations and a rename (~150 us, 5x a plain file write of 64 KiB).
Checkpointing deletes and saves records of the same layout over and over
(Revolve reuses its slots), so ``delete`` keeps up to `recycle` deleted
record directories in the scratch, and ``put`` rewrites one in place:
chunk files overwritten, leaf metadata kept when unchanged, the group's
``zarr.json`` rewritten (padded with JSON whitespace to a multiple of 64
bytes, so a slightly shorter one needs no truncation), then the rename:
two file rewrites and a rename per one-leaf record.  Recycled bytes count against the
capacity: ``used_bytes`` (live records and writes in flight) plus the
recycled bytes never exceed ``capacity_bytes``, and recycled directories
are dropped first when a ``put`` needs their room.

Reading never unpickles or executes anything: ``get`` uses the metadata
this tier wrote (parsed and validated on open: dtype from an allow-list,
shape and sizes consistent) and checks each chunk file's size before it
allocates, then its checksum after reading.

Numbers
-------

``python benchmarks/bench_tiers.py`` (shared 2-core VM, ext4 on virtio,
page cache, no fsync; medians of interleaved repeats; ratio: the median over
rounds of put time / plain-write time in the same round)::

    record   plain write   put (steady state)   put (fresh dirs)   zarr API
    64 KiB     135 us       106 us  0.80x        480 us  3.92x     2.8 ms  23x
     1 MiB     509 us       370 us  0.75x       1.03 ms  1.81x     4.6 ms  13x
    16 MiB    12.5 ms       8.3 ms  0.65x       12.4 ms  0.99x    29.4 ms 2.7x
    64 MiB    17.5 ms      13.2 ms  0.75x       19.1 ms  1.07x    51.1 ms 2.9x

"Steady state" is a checkpointing run (records deleted and saved, so puts
reuse recycled directories); "fresh" is every record in new directories
(the records of a run before its first delete).  Large records write at the
plain file's bandwidth or better (an overwrite in place allocates no
blocks).  The machine is shared and noisy (load 4 on 2 cores while this was
measured): over two full runs the steady-state ratio was 0.80-1.84x at
64 KiB, 0.75-1.31x at 1 MiB, 0.65-0.83x at 16 MiB and 0.75-0.77x at 64 MiB;
with fresh directories 3.5-3.9x, 1.8x, 1.0x and 1.0-1.1x.  In a quiet, isolated
loop a steady-state 64 KiB put took 48 us against 42 us for the plain write
(1.18x): about 10 us of it is Python (spec to JSON, checks), the rest is
seven system calls (two files opened, written and closed, one rename)
against three.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import shutil
import threading
from collections.abc import Iterator

import numpy as np

from .._files import O_CLOEXEC, fsync_dir, read_exactly, write_file
from ..state import byte_view, dtype_from_json, dtype_to_json
from ._checksum import (check_capacity, check_record, corrupt, encode_spec, full, step_of,
                        verify_leaves)
from ._tier import Record, StorageError, Tier, check_key

__all__ = ["ZarrTier"]

FORMAT = 1
SCRATCH = ".vlcc-scratch"
_MAX_NDIM = 32

# numpy dtype (kind, itemsize) -> zarr v3 core data type
_ZARR_TYPES = {
    ("b", 1): "bool",
    ("i", 1): "int8", ("i", 2): "int16", ("i", 4): "int32", ("i", 8): "int64",
    ("u", 1): "uint8", ("u", 2): "uint16", ("u", 4): "uint32", ("u", 8): "uint64",
    ("f", 2): "float16", ("f", 4): "float32", ("f", 8): "float64",
    ("c", 8): "complex64", ("c", 16): "complex128",
}


def _zarr_type(dtype: np.dtype) -> str | None:
    if dtype.names is not None or dtype.subdtype is not None:
        return None
    if dtype.kind == "V" or dtype.type.__module__.startswith("ml_dtypes"):
        return None
    return _ZARR_TYPES.get((dtype.kind, dtype.itemsize))


def _chunk_name(ndim: int) -> str:
    """zarr v3 "default" chunk key of chunk (0, ..., 0), separator ".": ``c.0.0``; ``c`` if 0-d."""
    return "c" + ".0" * ndim


def _array_meta(dtype: np.dtype, shape: tuple[int, ...]) -> tuple[bytes, str | None]:
    """The leaf array's ``zarr.json`` and its chunk file name (``None``: no chunk, empty)."""
    ztype = _zarr_type(dtype)
    if ztype is None:  # raw bytes of an exotic dtype
        ztype, shape, order = "uint8", tuple(shape) + (dtype.itemsize,), "|"
    else:
        order = dtype.byteorder
        if order == "=":
            order = "<" if np.little_endian else ">"
    if dtype.itemsize == 1 or order == "|":
        codec = {"name": "bytes"}
    else:
        codec = {"name": "bytes", "configuration": {"endian": "little" if order == "<" else "big"}}
    fill = False if ztype == "bool" else [0.0, 0.0] if ztype.startswith("complex") \
        else 0.0 if ztype.startswith("float") else 0
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(shape),
        "data_type": ztype,
        "chunk_grid": {"name": "regular",
                       "configuration": {"chunk_shape": [max(1, s) for s in shape]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}},
        "fill_value": fill,
        "codecs": [codec],
        "attributes": {},
        "storage_transformers": [],
    }
    chunk = None if 0 in shape else _chunk_name(len(shape))
    return json.dumps(meta, separators=(",", ":")).encode(), chunk


class _Kind:
    """Everything about a leaf that depends only on its dtype and shape, computed once."""

    __slots__ = ("dtype", "shape", "nbytes", "meta", "chunk", "info")

    def __init__(self, dtype: np.dtype, shape: tuple[int, ...]):
        self.dtype = dtype
        self.shape = shape
        self.nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        self.meta, self.chunk = _array_meta(dtype, shape)
        if self.nbytes == 0:
            self.chunk = None
        # the leaf's entry in the record attributes, up to its checksum
        self.info = '{"dtype":%s,"shape":%s,"nbytes":%d,"chunk":%s,"checksum":' % (
            json.dumps(dtype_to_json(dtype)), json.dumps(list(shape)), self.nbytes,
            json.dumps(self.chunk))


class _Layout:
    """What a record directory holds, so that a later ``put`` can rewrite it in place."""

    __slots__ = ("leaves", "group_size")

    def __init__(self, leaves: list, group_size: int | None):
        # per leaf: (chunk name | None, chunk file size, zarr.json content | None: unknown)
        self.leaves = leaves
        self.group_size = group_size


class _Stored:
    """A complete record: its bytes on disk, its metadata, its directory layout."""

    __slots__ = ("nbytes", "spec_json", "leaves", "layout")

    def __init__(self, nbytes: int, spec_json: str | None, leaves: list | None,
                 layout: _Layout | None):
        self.nbytes = nbytes
        self.spec_json = spec_json  # None: the record's metadata is unreadable
        self.leaves = leaves  # per leaf (shape, dtype, nbytes, chunk name, checksum)
        self.layout = layout


def _tree_bytes(path: str) -> int:
    total = 0
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            total += _tree_bytes(entry.path)
        elif entry.is_file(follow_symlinks=False):
            total += entry.stat(follow_symlinks=False).st_size
    return total


def _remedy(err: OSError) -> str:
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free disk space or give the tier a smaller capacity_bytes"
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "check that the store directory is writable"
    if err.errno == errno.ENOENT:
        return "the store directory was removed or moved; open a new ZarrTier"
    if err.errno in (errno.ENOTEMPTY, errno.EEXIST):
        return "a directory of that name, not a record of this tier, is in the store; use another key"
    return "check the file system"


class ZarrTier(Tier):
    """Records as zarr v3 groups in a local directory (persistent, resumable).

    **Arguments:**

    - `path`: the store directory.  Created if missing; an existing store
      is reopened and lists its complete records (resume after a crash or a
      restart).  An existing non-empty directory must be a zarr v3 group.
    - `capacity_bytes`: the most bytes of files (chunks and metadata) the
      tier may hold, recycled directories included (``None``: unbounded).
    - `durable`: fsync files and directories before a record is listed (see
      the module docstring).
    - `recycle`: how many deleted record directories to keep for reuse
      (0 disables recycling).
    - `name`: the tier's name in messages (default ``"zarr:<path>"``).

    One process writes a store at a time (the engine's threads share the
    instance); any number may read it with zarr.
    """

    def __init__(self, path, capacity_bytes: int | None = None, *, durable: bool = False,
                 recycle: int = 8, name: str | None = None):
        self.path = os.path.abspath(os.fspath(path))
        self.capacity_bytes = check_capacity(capacity_bytes)
        self.durable = bool(durable)
        if not isinstance(recycle, int) or recycle < 0:
            raise ValueError(f"recycle must be an int >= 0, got {recycle!r}")
        self.recycle = recycle
        self.name = name or f"zarr:{self.path}"
        self._lock = threading.Lock()
        self._index: dict[str, _Stored] = {}
        self._busy: set[str] = set()  # keys being written or deleted
        self._readers: dict[str, int] = {}
        self._pool: list[tuple[str, _Layout, int]] = []  # recycled (dir, layout, bytes)
        self._pooled = 0
        self._used = 0
        self._names = itertools.count()
        self._kinds: dict[tuple, _Kind] = {}
        self._scratch = os.path.join(self.path, SCRATCH)
        self._open()

    # -- opening ------------------------------------------------------------------

    def _open(self) -> None:
        root_meta = os.path.join(self.path, "zarr.json")
        try:
            os.makedirs(self.path, exist_ok=True)
            if os.path.exists(root_meta):
                with open(root_meta, "rb") as f:
                    meta = json.loads(f.read())
                if not (isinstance(meta, dict) and meta.get("zarr_format") == 3
                        and meta.get("node_type") == "group"):
                    raise StorageError(f"{self.path} is not a zarr v3 group (its zarr.json says "
                                       f"otherwise); give ZarrTier a new or empty directory")
            else:
                if any(e.name != SCRATCH for e in os.scandir(self.path)):
                    raise StorageError(f"{self.path} exists, is not empty and is not a zarr v3 "
                                       "group; give ZarrTier a new or empty directory")
                attrs = {"vlcc_adjoint": {
                    "format": FORMAT,
                    "layout": "one group per checkpoint record; leaf i of record K is the array "
                              "K/i; records are written by vlcc_adjoint.storage.ZarrTier",
                }}
                self._write_json(root_meta, {"zarr_format": 3, "node_type": "group",
                                             "attributes": attrs})
            # Whatever is in the scratch is an interrupted write or a recycled
            # directory of an earlier session: never a listed record.
            shutil.rmtree(self._scratch, ignore_errors=True)
            os.mkdir(self._scratch)
            self._write_json(os.path.join(self._scratch, "zarr.json"), {
                "zarr_format": 3, "node_type": "group",
                "attributes": {"vlcc_adjoint": "scratch space of ZarrTier: interrupted writes and "
                                               "recycled directories, never records"}})
            for entry in os.scandir(self.path):
                if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                    continue
                try:
                    check_key(entry.name)
                except ValueError:
                    continue
                stored = self._load_stored(entry.name, entry.path)
                if stored is not None:
                    self._index[entry.name] = stored
                    self._used += stored.nbytes
        except OSError as err:
            raise StorageError(f"cannot open the zarr store at {self.path}: {err}") from err
        if self.capacity_bytes is not None and self._used > self.capacity_bytes:
            raise StorageError(
                f"the zarr store at {self.path} holds {self._used} bytes of records, more than "
                f"capacity_bytes={self.capacity_bytes}; open it with a larger capacity (or None)"
            )

    def _write_json(self, path: str, obj) -> None:
        tmp = path + ".tmp"
        write_file(tmp, json.dumps(obj, indent=2).encode(), self.durable)
        os.replace(tmp, path)

    def _load_stored(self, key: str, path: str) -> _Stored | None:
        """A record directory found on open; ``None`` if it is not ours."""
        try:
            with open(os.path.join(path, "zarr.json"), "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None  # not a zarr node: not ours
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and "vlcc_adjoint" not in (doc.get("attributes") or {}):
            return None  # someone else's zarr node
        try:
            attrs = doc["attributes"]["vlcc_adjoint"]
            leaves = self._validate(key, attrs)
        except (ValueError, KeyError, TypeError):
            # Ours but unreadable.  We write it atomically, so it was damaged
            # afterwards: list the record, and get() reports it.
            return _Stored(_tree_bytes(path), None, None, None)
        layout = _Layout([(chunk, nbytes, None) for _, _, nbytes, chunk, _ in leaves], len(raw))
        return _Stored(_tree_bytes(path), json.dumps(attrs["spec"]), leaves, layout)

    @staticmethod
    def _validate(key: str, attrs) -> list:
        """Check a record's attributes before anything is allocated from them.

        **Returns:** per leaf ``(shape, dtype, nbytes, chunk name, checksum)``.
        """
        if not isinstance(attrs, dict) or attrs.get("format") != FORMAT:
            raise ValueError("unknown record format")
        if attrs.get("key") != key:
            raise ValueError(f"the record says it is {attrs.get('key')!r}")
        leaves = attrs.get("leaves")
        if not isinstance(leaves, list) or not isinstance(attrs.get("spec"), dict):
            raise ValueError("no leaves or spec")
        out = []
        for leaf in leaves:
            dtype = dtype_from_json(leaf["dtype"])
            shape = leaf["shape"]
            if not (isinstance(shape, list) and len(shape) <= _MAX_NDIM
                    and all(type(s) is int and 0 <= s < 2**48 for s in shape)):
                raise ValueError(f"bad shape {shape!r}")
            nbytes = dtype.itemsize
            for s in shape:
                nbytes *= s
            if nbytes != leaf["nbytes"] or nbytes >= 2**50:
                raise ValueError("inconsistent sizes")
            expected = None if 0 in shape or nbytes == 0 else _chunk_name(len(shape) + (
                0 if _zarr_type(dtype) else 1))
            if leaf["chunk"] != expected:
                raise ValueError("unexpected chunk name")
            if not (isinstance(leaf["checksum"], str) and len(leaf["checksum"]) == 16):
                raise ValueError("bad checksum")
            out.append((tuple(shape), dtype, nbytes, expected, leaf["checksum"]))
        return out

    def _kind(self, leaf: np.ndarray) -> _Kind:
        """The cached metadata of leaves of `leaf`'s dtype and shape."""
        sig = (leaf.dtype, leaf.shape)
        kind = self._kinds.get(sig)
        if kind is None:
            if len(self._kinds) > 4096:
                self._kinds.clear()
            kind = self._kinds[sig] = _Kind(leaf.dtype, leaf.shape)
        return kind

    # -- the Tier protocol ----------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def recycled_bytes(self) -> int:
        """Bytes held by recycled directories (counted against the capacity, not used)."""
        return self._pooled

    def put(self, key: str, record: Record) -> None:
        """Write `record` as the zarr group ``<path>/<key>``, visible only once complete.

        Raises :class:`TierFullError` if it does not fit (nothing written),
        ``KeyError`` if the key is taken, :class:`StorageError` if the file
        system refuses (nothing visible, ``used_bytes`` unchanged).
        """
        check_record(key, record)
        spec_json = encode_spec(key, record.spec)
        leaves = record.leaves
        kinds = [self._kind(leaf) for leaf in leaves]
        infos = [(k.shape, k.dtype, k.nbytes, k.chunk, c) for k, c in zip(kinds, record.checksums)]
        group = (
            '{"zarr_format":3,"node_type":"group","attributes":{"vlcc_adjoint":'
            '{"format":%d,"key":"%s","spec":%s,"leaves":[%s]}}}'
            % (FORMAT, key, spec_json,  # keys are [A-Za-z0-9_.-]: no JSON escaping needed
               ",".join(k.info + '"%s"}' % c for k, c in zip(kinds, record.checksums)))
        ).encode()
        metas = [(k.meta, k.chunk) for k in kinds]
        # Pad to a multiple of 64 bytes (JSON allows trailing whitespace): a
        # recycled group file of a slightly longer record (key "s10" after
        # "s9") is then overwritten without a truncation.
        group += b" " * (-len(group) % 64)
        need = len(group) + sum(leaf.nbytes + len(m) for leaf, (m, _) in zip(leaves, metas))

        drop: list[str] = []
        with self._lock:
            if key in self._index or key in self._busy:
                raise KeyError(f"record {key!r} is already in tier {self.name!r}; delete it first")
            cap = self.capacity_bytes
            if cap is not None and self._used + need > cap:
                raise full(key, self.name, need, self._used, cap)
            # Reuse a recycled directory (same number of leaves first).
            reuse = None
            for j, (_, layout, _) in enumerate(self._pool):
                if len(layout.leaves) == len(leaves):
                    reuse = self._pool.pop(j)
                    break
            else:
                if self._pool:
                    reuse = self._pool.pop()
            if reuse is not None:
                self._pooled -= reuse[2]
            # Make room on disk: recycled directories go before a put fails.
            while cap is not None and self._pool and self._used + self._pooled + need > cap:
                dropped = self._pool.pop()
                self._pooled -= dropped[2]
                drop.append(dropped[0])
            self._used += need
            self._busy.add(key)
        for path in drop:
            shutil.rmtree(path, ignore_errors=True)

        work = reuse[0] if reuse is not None else f"{self._scratch}/w{next(self._names)}"
        final = f"{self.path}/{key}"
        renamed = False
        try:
            layout = self._write_record(work, reuse[1] if reuse else None, leaves, metas, group)
            os.rename(work, final)
            renamed = True
            if self.durable:
                fsync_dir(self.path)
        except BaseException as err:
            shutil.rmtree(final if renamed else work, ignore_errors=True)
            with self._lock:
                self._used -= need
                self._busy.discard(key)
            if isinstance(err, OSError):
                raise StorageError(
                    f"could not write record {key!r}{_at(record.spec)} to tier {self.name!r}: "
                    f"{err}; nothing was stored ({_remedy(err)})"
                ) from err
            raise
        with self._lock:
            self._index[key] = _Stored(need, spec_json, infos, layout)
            self._busy.discard(key)

    def _write_record(self, work: str, old: _Layout | None, leaves, metas, group: bytes) -> _Layout:
        """Write a record's files into the directory ``work`` (recycled when ``old``).

        Every file ends up exactly as long as its new content (so the bytes
        reserved are the bytes on disk): a recycled file is overwritten in
        place, and truncated only when its old content was longer.
        """
        durable = self.durable
        if old is None:
            os.mkdir(work)
            old_leaves = []
        else:
            old_leaves = old.leaves
            for i in range(len(leaves), len(old_leaves)):
                shutil.rmtree(os.path.join(work, str(i)))
        new_leaves = []
        for i, (leaf, (meta, chunk)) in enumerate(zip(leaves, metas)):
            leaf_dir = f"{work}/{i}"
            if i < len(old_leaves):
                old_chunk, old_size, old_meta = old_leaves[i]
            else:
                os.mkdir(leaf_dir)
                old_chunk, old_size, old_meta = None, 0, b""
            if old_meta != meta:
                write_file(leaf_dir + "/zarr.json", meta, durable,
                           truncate=old_meta is None or len(old_meta) > len(meta))
            if old_chunk is not None and old_chunk != chunk:
                os.unlink(os.path.join(leaf_dir, old_chunk))
                old_size = 0
            if chunk is not None:
                write_file(f"{leaf_dir}/{chunk}", byte_view(leaf), durable,
                           truncate=old_size > leaf.nbytes)
            if durable:
                fsync_dir(leaf_dir)
            new_leaves.append((chunk, leaf.nbytes, meta))
        write_file(work + "/zarr.json", group, durable,
                   truncate=old is not None and (old.group_size is None or old.group_size > len(group)))
        if durable:
            fsync_dir(work)
        return _Layout(new_leaves, len(group))

    def get(self, key: str) -> Record:
        """Read and verify the record under `key`."""
        with self._lock:
            stored = self._index.get(key)
            if stored is None:
                raise KeyError(f"no record {key!r} in tier {self.name!r}")
            self._readers[key] = self._readers.get(key, 0) + 1
        try:
            return self._read(key, stored)
        finally:
            with self._lock:
                n = self._readers.pop(key) - 1
                if n:
                    self._readers[key] = n

    def _read(self, key: str, stored: _Stored) -> Record:
        if stored.spec_json is None:
            raise corrupt("its zarr.json is unreadable or inconsistent", key, self.name, None)
        spec = json.loads(stored.spec_json)
        step = step_of(spec)
        record_dir = f"{self.path}/{key}"
        leaves = []
        for i, (shape, dtype, nbytes, chunk, _) in enumerate(stored.leaves):
            if chunk is None:  # an empty leaf has no chunk
                leaves.append(np.empty(shape, dtype))
                continue
            try:
                fd = os.open(f"{record_dir}/{i}/{chunk}", os.O_RDONLY | O_CLOEXEC)
            except FileNotFoundError:
                if key not in self._index:
                    raise KeyError(f"record {key!r} was deleted while being read") from None
                raise corrupt(f"the chunk file of leaf {i} is missing", key, self.name,
                              step) from None
            except OSError as err:
                raise StorageError(f"could not read record {key!r} from tier {self.name!r}: "
                                   f"{err}") from err
            try:
                # The size is checked before anything is allocated from it.
                size = os.fstat(fd).st_size
                if size != nbytes:
                    raise corrupt(f"the chunk file of leaf {i} has {size} bytes, expected "
                                  f"{nbytes}", key, self.name, step)
                out = np.empty(shape, dtype)
                if not read_exactly(fd, byte_view(out)):
                    raise corrupt(f"the chunk file of leaf {i} is truncated", key,
                                  self.name, step)
            except OSError as err:
                raise StorageError(f"could not read record {key!r} from tier {self.name!r}: "
                                   f"{err}") from err
            finally:
                os.close(fd)
            leaves.append(out)
        checksums = tuple(info[4] for info in stored.leaves)
        verify_leaves(leaves, checksums, key, self.name, step)
        return Record(spec, tuple(leaves), checksums)

    def delete(self, key: str) -> None:
        """Remove the record under `key` (atomically: renamed away, then recycled or removed)."""
        with self._lock:
            if key in self._busy:
                raise KeyError(f"record {key!r} in tier {self.name!r} is being written or deleted")
            stored = self._index.pop(key, None)
            if stored is None:
                raise KeyError(f"no record {key!r} in tier {self.name!r}")
            self._busy.add(key)
            self._used -= stored.nbytes
            reading = key in self._readers
        away = os.path.join(self._scratch, f"d{next(self._names)}")
        try:
            os.rename(os.path.join(self.path, key), away)
        except FileNotFoundError:
            away = None  # already gone from disk: nothing left to free
        except OSError as err:
            with self._lock:
                self._index[key] = stored
                self._used += stored.nbytes
                self._busy.discard(key)
            raise StorageError(f"could not delete record {key!r} from tier {self.name!r}: {err} "
                               f"({_remedy(err)})") from err
        keep = False
        with self._lock:
            self._busy.discard(key)
            cap = self.capacity_bytes
            if (away is not None and stored.layout is not None and not reading
                    and len(self._pool) < self.recycle
                    and (cap is None or self._used + self._pooled + stored.nbytes <= cap)):
                self._pool.append((away, stored.layout, stored.nbytes))
                self._pooled += stored.nbytes
                keep = True
        if away is not None and not keep:
            shutil.rmtree(away, ignore_errors=True)

    def keys(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._index))

    def __contains__(self, key: str) -> bool:
        return key in self._index

    def __len__(self) -> int:
        return len(self._index)

    def close(self) -> None:
        """Remove the recycled directories (the records stay).  Idempotent."""
        with self._lock:
            pool, self._pool, self._pooled = self._pool, [], 0
        for path, _, _ in pool:
            shutil.rmtree(path, ignore_errors=True)

    def __enter__(self) -> "ZarrTier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        cap = "unbounded" if self.capacity_bytes is None else f"{self.capacity_bytes} B"
        return f"ZarrTier({self.path!r}, records={len(self._index)}, used={self._used} B, capacity={cap})"


def _pad(data: bytes, old: bytes | None) -> bytes:
    """``data`` padded with spaces to the length of the file it overwrites."""
    if old is not None and len(old) > len(data):
        return data + b" " * (len(old) - len(data))
    return data


def _at(spec) -> str:
    step = step_of(spec)
    return f" (step {step})" if step is not None else ""
