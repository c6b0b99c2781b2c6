"""ZarrTier: records as zarr v3 groups in a local directory, written without zarr.

The persistent level of the hierarchy, and the on-disk checkpoint format:
a directory that plain ``zarr.open_group(path, mode="r")`` opens, with one
group per record and one array per leaf (the record layout and its digest:
:mod:`._zarr_record`)::

    path/zarr.json                 root group   {"vlcc_adjoint": {"format": 2, ...}}
    path/<key>/...                 one record (a group, an array per leaf)
    path/.vlcc-scratch/            in-flight writes and recycled directories
    path/.vlcc-lock/holder         the writer's lock file (pid and host of the holder)

Leaves are stored as :func:`~vlcc_adjoint.storage.format.array_metadata`
describes (core zarr types as themselves, others as raw bytes).  Every file
is opened, read, digested and published through
:mod:`vlcc_adjoint.storage.format`, the rules shared with the MPI tier and
the lineage repository.

Why not the zarr API
--------------------

A checkpoint store writes whole arrays, once, as one chunk each, so it
needs none of zarr's machinery (codec pipelines, partial chunk updates, an
async event loop), which costs milliseconds per small record
(``benchmarks/bench_tiers.py`` measures both; numbers in
``benchmarks/results/bench_tiers.json``).  This module writes the small,
documented v3 JSON metadata and the chunk bytes itself, with ``os.write``
at the key path zarr reads.  The result is an ordinary zarr v3 hierarchy;
``tests/storage/test_tiers.py`` reads it back with plain zarr.

One writer, modes
-----------------

``mode`` has zarr's vocabulary: ``"r"`` reads an existing store and
refuses ``put``/``delete``; ``"r+"`` writes an existing store; ``"a"``
(the default) writes, creating the store if absent; ``"w"`` empties an
existing store (only one: a directory that is not a store is refused, so a
mistyped path never loses data); ``"w-"`` creates one and refuses an
existing store.  A writing mode takes the store's
:class:`~vlcc_adjoint.storage.format.WriterLock` at open, so a second
writer gets :class:`~vlcc_adjoint.storage.format.StoreLockedError` naming
the holder, before anything changed; only the holder cleans the scratch.
:meth:`ZarrTier.close` releases it.

Resuming a store
----------------

Records found at open are listed by :meth:`~ZarrTier.keys`.  A ``put`` of
one of their keys replaces it: when the new record's digest equals the
stored one (a rerun recomputing the same state) and the stored data reads
back intact, the stored record is kept and nothing is written; otherwise the new record is written in the
scratch, the old one renamed away and the new one into place.  A run that
failed halfway can so be rerun on the same path.  Within one opening, a
key is written once (``KeyError`` on a second ``put``, the
:class:`~vlcc_adjoint.storage.Tier` contract).  Damaged records stay
listed: ``get`` raises their :class:`CorruptCheckpointError` (naming the
file) and :meth:`~ZarrTier.damaged` lists them with the reason; a ``put``
of their key is refused until they are deleted.

Atomicity and crash safety
--------------------------

A record is written into a directory under ``.vlcc-scratch`` and becomes
visible with one ``os.rename`` to ``path/<key>``, its last step.  A process
killed at any moment (``kill -9`` included) leaves complete records and
scratch; opening the directory again lists every record whose ``put``
returned and deletes the scratch.  ``delete`` renames the record away
first, so it too is all or nothing.  (A replacing ``put`` renames the old
record away, then the new one in: a crash between the two loses that key,
which the caller was overwriting.)  Failed writes (``ENOSPC``, ``EACCES``,
the directory removed) raise :class:`StorageError` naming the key and the
OS error, leave nothing visible and keep ``used_bytes`` exact.

fsync policy: by default nothing is fsynced.  Records survive the process
(the page cache outlives it), not a power cut or a kernel crash: after one,
a record may be listed with damaged data, which its checksum turns into a
:class:`CorruptCheckpointError` on ``get``.  ``durable=True`` fsyncs every
file and every directory it changed before the rename, and the parent
after it: records that were listed survive a power cut, at the price of a
device flush per record (milliseconds on most disks).  Synced chunks then
leave the page cache (``POSIX_FADV_DONTNEED``), so a burst reuses the same
pages, and ``get`` reads them with direct I/O (no copy through the cache).

Directory recycling
-------------------

Creating directories and files dominates small records (a ``mkdir`` or a
file creation costs several times an overwrite of an existing file).
Checkpointing deletes and saves records of the same layout over and over
(Revolve reuses its slots), so ``delete`` keeps up to `recycle` deleted
record directories in the scratch, and ``put`` rewrites one in place:
chunk files overwritten, leaf metadata kept when unchanged, the group's
``zarr.json`` rewritten (padded with JSON whitespace to a multiple of 64
bytes, so a slightly shorter one needs no truncation), then the rename:
two file rewrites and a rename per one-leaf record.  Recycled bytes count
against the capacity: ``used_bytes`` (live records and writes in flight)
plus the recycled bytes never exceed ``capacity_bytes``, and recycled
directories are dropped first when a ``put`` needs their room.

Reading never unpickles or executes anything, follows no link, opens only
regular files and bounds every read: ``get`` uses the metadata validated at
open (digest, allow-listed dtype, sizes within the machine's memory) and
requires each chunk file's declared size before it reads, its checksum after.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterator

import numpy as np

from ..errors import VlccKeyError, VlccValueError
from ..state import byte_view
from . import format as F
from ._checksum import check_capacity, check_record, leaf_checksum, step_of, verify_leaves
from ._tier import CorruptCheckpointError, Record, StorageError, Tier, TierFullError, check_key
from ._zarr_record import ATTRS, FORMAT, Kind, Layout, Stored, encode, load, read_root

__all__ = ["ZarrTier"]

SCRATCH = ".vlcc-scratch"
LOCK = F.LOCK_DIR


class ZarrTier(Tier):
    """Records as zarr v3 groups in a local directory (persistent, resumable).

    **Arguments:**

    - `path`: the store directory (not a symbolic link).  An existing
      store is reopened and lists its records (resume after a crash or a
      restart); an existing non-empty directory must be a zarr v3 group.
    - `capacity_bytes`: the most bytes of files (chunks and metadata) the
      tier may hold, recycled directories included (``None``: unbounded).
    - `mode`: ``"r"``, ``"r+"``, ``"a"`` (default), ``"w"`` or ``"w-"``, as
      in zarr (see the module docstring).  Writing modes hold the store's
      writer lock until :meth:`close`.
    - `durable`: fsync files and directories before a record is listed.
    - `recycle`: how many deleted record directories to keep for reuse
      (0 disables recycling).
    - `name`: the tier's name in messages (default ``"zarr:<path>"``).

    One process writes a store at a time (the engine's threads share the
    instance); any number may read it, with ``mode="r"`` or with zarr.
    """

    # records outlive the process; get reads into new or given arrays; I/O waits
    persistent = fresh_gets = reads_into = waits_on_io = True
    copies_on_put = True  # put writes the leaves to files and keeps no reference

    def __init__(
        self,
        path: str | os.PathLike,
        capacity_bytes: int | None = None,
        *,
        mode: str = "a",
        durable: bool = False,
        recycle: int = 8,
        name: str | None = None,
    ):
        self.path = os.path.abspath(os.fspath(path))
        self.capacity_bytes = check_capacity(capacity_bytes)
        self.mode = F.parse_mode(mode)
        # capabilities (zarr's Store vocabulary): a read-only opening declares it
        self.supports_writes = self.supports_deletes = self.mode != "r"
        self.durable = bool(durable)
        if not isinstance(recycle, int) or recycle < 0:
            raise VlccValueError(f"recycle must be an int >= 0, got {recycle!r}")
        self.recycle = recycle
        self.name = name or f"zarr:{self.path}"
        self._lock = threading.Lock()
        self._index: dict[str, Stored] = {}
        self._busy: set[str] = set()  # keys being written or deleted
        self._readers: dict[str, int] = {}
        self._pool: list[tuple[str, Layout, int]] = []  # recycled (dir, layout, bytes)
        self._pooled = 0
        self._used = 0
        self._names = itertools.count()
        self._kinds: dict[tuple, Kind] = {}
        self._scratch = os.path.join(self.path, SCRATCH)
        self._writer: F.WriterLock | None = None
        self._closed = False
        self.format: int | None = None  # the root's format (None: a plain zarr group)
        try:
            self._open()
        except BaseException:
            self._release()
            raise

    # -- opening ------------------------------------------------------------------

    def _open(self) -> None:
        mode, path = self.mode, self.path
        root_meta = os.path.join(path, "zarr.json")
        try:
            if mode in ("r", "r+"):
                try:
                    F.check_dir(path)
                except FileNotFoundError:
                    raise StorageError(
                        f"there is no zarr store at {path} (mode={mode!r} opens an "
                        "existing one); open it with mode='a' to create it"
                    ) from None
            else:
                os.makedirs(path, exist_ok=True)
                F.check_dir(path)
            if mode != "r":
                self._writer = F.lock_store(path, f"the zarr store {path}", self.durable)
            exists = os.path.lexists(root_meta)
            if exists:
                self.format = read_root(path, root_meta)
                if mode == "w-":
                    raise StorageError(
                        f"{path} already holds a zarr store and mode='w-' refuses "
                        "an existing one; open it with mode='a' to reuse it, or "
                        "mode='w' to empty it"
                    )
                if mode == "w":
                    self._empty()
                    exists = False
            elif any(e.name not in (SCRATCH, LOCK) for e in os.scandir(path)):
                raise StorageError(
                    f"{path} exists, is not empty and is not a zarr v3 group; give "
                    "ZarrTier a new or empty directory"
                )
            elif mode in ("r", "r+"):
                raise StorageError(
                    f"there is no zarr store at {path} (no zarr.json; mode={mode!r} "
                    "opens an existing one); open it with mode='a' to create it"
                )
            if not exists:
                self.format = FORMAT
                F.write_group(
                    root_meta,
                    {
                        ATTRS: {
                            "format": FORMAT,
                            "layout": "one group per checkpoint record; leaf i of record K is the array "
                            "K/i; records are written by vlcc_adjoint.storage.ZarrTier",
                        }
                    },
                    self.durable,
                )
            if mode != "r":
                # Whatever is in the scratch is an interrupted write or a recycled
                # directory of an earlier writer (dead: we hold the lock).
                F.remove_tree(self._scratch, path)
                os.mkdir(self._scratch)
                F.write_group(
                    os.path.join(self._scratch, "zarr.json"),
                    {
                        ATTRS: "scratch space of ZarrTier: interrupted writes and recycled "
                        "directories, never records"
                    },
                    self.durable,
                )
            for entry in os.scandir(path):
                if entry.name.startswith(".") or entry.name == "zarr.json":
                    continue
                try:
                    check_key(entry.name)
                except ValueError:
                    continue  # no key names it: not a record
                stored = self._load(entry.name, entry.path)
                self._index[entry.name] = stored
                self._used += stored.nbytes
        except OSError as err:
            raise StorageError(
                f"cannot open the zarr store at {path}: {err} ({F.remedy(err)})"
            ) from err
        if self.capacity_bytes is not None and self._used > self.capacity_bytes:
            raise StorageError(
                f"the zarr store at {path} holds {self._used} bytes of records, more than "
                f"capacity_bytes={self.capacity_bytes}; open it with a larger capacity (or None)"
            )

    def _empty(self) -> None:
        """mode 'w': remove everything in the store but its lock (we hold it)."""
        for entry in os.scandir(self.path):
            if entry.name != LOCK:
                F.remove_tree(entry.path, self.path)
        if self.durable:
            F.fsync_dir(self.path)

    def _load(self, key: str, record_dir: str) -> Stored:
        """The record `key` found on open; a damaged one is kept with its error."""
        try:
            return load(key, record_dir)
        except CorruptCheckpointError as err:
            try:
                nbytes = (
                    F.tree_bytes(record_dir)
                    if os.path.isdir(record_dir) and not os.path.islink(record_dir)
                    else 0
                )
            except OSError:
                nbytes = 0
            bad = CorruptCheckpointError.in_record(str(err), key, self.name, None, err.path)
            return Stored(nbytes, "", [], None, None, inherited=True, error=bad)

    def _kind(self, leaf: np.ndarray) -> Kind:
        """The cached metadata of leaves of `leaf`'s dtype and shape."""
        sig = (leaf.dtype, leaf.shape)
        kind = self._kinds.get(sig)
        if kind is None:
            if len(self._kinds) > 4096:
                self._kinds.clear()
            kind = self._kinds[sig] = Kind(leaf.dtype, leaf.shape)
        return kind

    def _check_writable(self, what: str) -> None:
        if self.mode == "r":
            raise StorageError(
                f"cannot {what}: tier {self.name!r} was opened with mode='r' (read "
                "only); open it with mode='a' (or 'r+') to write"
            )
        if self._closed:
            raise StorageError(
                f"cannot {what}: tier {self.name!r} is closed (its writer lock is "
                "released); open the store again to write"
            )

    # -- the Tier protocol ----------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def recycled_bytes(self) -> int:
        """Bytes held by recycled directories (counted against the capacity, not used)."""
        return self._pooled

    def damaged(self) -> dict[str, str]:
        """The listed records that cannot be read, each with what is wrong (and where)."""
        with self._lock:
            return {k: str(s.error) for k, s in self._index.items() if s.error is not None}

    def verify(self) -> list[CorruptCheckpointError]:
        """Read and check every record of the store, from disk, now (``vlcc verify``).

        The root ``zarr.json``; every record directory under the root (those
        written since this tier was opened by another opening too): its
        sealed group ``zarr.json`` (:func:`._zarr_record.load`), every leaf's
        chunk file (size, then its checksum: the checked read of
        :meth:`get`), and every leaf's array ``zarr.json``, which plain zarr
        reads (it must be the metadata the leaf's dtype and shape give).
        Nothing is changed, and :meth:`damaged` keeps what was found at open.

        **Returns:** one :class:`CorruptCheckpointError` per damaged file,
        each naming the file (``path``) and the record it breaks (``key``);
        an empty list when every record is intact.
        """
        found: list[CorruptCheckpointError] = []
        root_meta = os.path.join(self.path, "zarr.json")
        try:
            read_root(self.path, root_meta)
        except CorruptCheckpointError as err:
            found.append(CorruptCheckpointError(str(err), tier=self.name, path=err.path))
        except FileNotFoundError:
            found.append(F.corrupt_file(root_meta, "is missing: the store's root is gone"))
        for entry in sorted(os.scandir(self.path), key=lambda e: e.name):
            if entry.name.startswith(".") or entry.name == "zarr.json":
                continue
            try:
                check_key(entry.name)
            except ValueError:
                continue  # no key names it: not a record
            found.extend(self._verify_record(entry.name, entry.path))
        return found

    def _verify_record(self, key: str, record_dir: str) -> list[CorruptCheckpointError]:
        """The damaged files of the record `key` in `record_dir` (see :meth:`verify`)."""
        try:
            stored = load(key, record_dir)
        except CorruptCheckpointError as err:
            return [CorruptCheckpointError.in_record(str(err), key, self.name, None, err.path)]
        found = []
        step = step_of(stored.spec())

        def damaged(problem: str, path: str) -> None:
            found.append(CorruptCheckpointError.in_record(problem, key, self.name, step, path))

        missing = False
        for i, (shape, dtype, _, chunk, _) in enumerate(stored.leaves):
            meta = f"{record_dir}/{i}/zarr.json"
            try:
                expected = F.array_metadata(dtype, shape)[0]
                raw = F.read_limited(meta, F.MAX_METADATA_BYTES)
                # Byte-equal as written; a record of an older writer may format
                # it otherwise: then its content must be equal.
                if raw != expected and F.parse_json(raw, meta) != F.parse_json(expected, meta):
                    raise F.corrupt_file(
                        meta,
                        f"is not the zarr array metadata of leaf {i} ({dtype.str}"
                        f"{list(shape)}): plain zarr would read the leaf wrong",
                    )
            except FileNotFoundError:
                if chunk is not None:  # a leaf with data has its array
                    damaged(f"the zarr array metadata {meta} of leaf {i} is missing", meta)
            except CorruptCheckpointError as err:
                damaged(str(err), err.path or meta)
            if chunk is not None and not os.path.lexists(f"{record_dir}/{i}/{chunk}"):
                missing = True
                path = f"{record_dir}/{i}/{chunk}"
                damaged(f"the chunk file {path} of leaf {i} is missing", path)
        if not missing:
            try:
                self._read(key, stored, None)
            except CorruptCheckpointError as err:
                found.append(err)
            except VlccKeyError as err:  # a chunk file removed meanwhile
                damaged(str(err), record_dir)
        return found

    def put(self, key: str, record: Record) -> None:
        """Write `record` as the zarr group ``<path>/<key>``, visible only once complete.

        A record of an earlier opening under `key` is replaced (kept as is
        when identical).  Raises :class:`TierFullError` if it does not fit
        (nothing written), ``KeyError`` if the key was written since this
        opening, :class:`StorageError` if the file system refuses (nothing
        visible, ``used_bytes`` unchanged) or the key names a damaged record.
        """
        self._check_writable(f"store record {key!r}")
        check_record(key, record)
        if key == "zarr.json":
            raise VlccValueError("'zarr.json' is the store's own metadata file, not a record key")
        leaves = record.leaves
        kinds = [self._kind(leaf) for leaf in leaves]
        group, spec_json, digest = encode(key, record.spec, kinds, record.checksums)
        infos = [(k.shape, k.dtype, k.nbytes, k.chunk, c) for k, c in zip(kinds, record.checksums)]
        metas = [(k.meta, k.chunk) for k in kinds]
        # Pad to a multiple of 64 bytes (JSON allows trailing whitespace): a recycled
        # group file of a slightly longer record is overwritten without a truncation.
        group += b" " * (-len(group) % 64)
        need = len(group) + sum(leaf.nbytes + len(m) for leaf, (m, _) in zip(leaves, metas))

        # A record of an earlier opening with this digest is kept if its data
        # reads back intact (checked outside the lock: a read, not a write).
        with self._lock:
            same = self._index.get(key)
            if same is None or not same.inherited or same.digest != digest or key in self._busy:
                same = None
        if same is not None:
            try:
                self._read(key, same, None)
            except (StorageError, OSError, KeyError):
                same = None  # damaged data: written anew below
        drop: list[str] = []
        with self._lock:
            old = self._index.get(key)
            if key in self._busy or (old is not None and not old.inherited):
                raise VlccKeyError(
                    f"record {key!r} is already in tier {self.name!r}; delete it first"
                )
            if old is not None and old.error is not None:
                raise StorageError(
                    f"record {key!r} in tier {self.name!r} cannot be replaced: its directory is "
                    f"not a readable record ({old.error}); delete it first (tier.delete({key!r})) "
                    "or use another key"
                )
            if old is not None and old is same:
                old.inherited = False  # the same record is stored already, intact
                return
            freed = old.nbytes if old is not None else 0
            cap = self.capacity_bytes
            if cap is not None and self._used - freed + need > cap:
                raise TierFullError.no_room(key, self.name, need, self._used - freed, cap)
            reuse = None
            for j, (_, layout, _) in enumerate(self._pool):  # same number of leaves first
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
            self._discard(path)

        work = reuse[0] if reuse is not None else f"{self._scratch}/w{next(self._names)}"
        final = f"{self.path}/{key}"
        away: str | None = None
        renamed = False
        try:
            layout = self._write_record(work, reuse[1] if reuse else None, leaves, metas, group)
            if old is not None:
                away = f"{self._scratch}/d{next(self._names)}"
                try:
                    os.rename(final, away)
                except FileNotFoundError:
                    away = None  # removed behind our back: nothing to replace
            os.rename(work, final)
            renamed = True
            if self.durable:
                F.fsync_dir(self.path)
        except BaseException as err:
            self._discard(final if renamed else work)
            with self._lock:
                self._used -= need
                self._busy.discard(key)
                if away is not None:
                    self._index.pop(key, None)  # the old record was renamed away
                    self._used -= freed
            if away is not None:
                self._discard(away)
            if isinstance(err, OSError):
                raise StorageError(
                    f"could not write record {key!r}{_at(record.spec)} to tier {self.name!r}: "
                    f"{err}; nothing was stored ({F.remedy(err)})"
                ) from err
            raise
        with self._lock:
            self._index[key] = Stored(need, spec_json, infos, layout, digest)
            self._used -= freed
            self._busy.discard(key)
        if away is not None:
            self._discard(away)

    def _discard(self, path: str) -> None:
        """Remove a directory of ours inside the store; failures only leave scratch behind."""
        try:
            F.remove_tree(path, self.path)
        except OSError:
            pass  # the next opening's scratch cleanup removes it

    def _write_record(self, work: str, old: Layout | None, leaves, metas, group: bytes) -> Layout:
        """Write a record's files into the directory ``work`` (recycled when ``old``).

        Every file ends up exactly as long as its new content (so the bytes
        reserved are the bytes on disk): a recycled file is overwritten in
        place, and truncated only when its old content was longer.
        ``durable``: all written, then all fsynced (see the module docstring).
        """
        write_file = F.write_file
        chunks, rest = [], []  # durable: fsync the chunk files, then the rest
        if old is None:
            os.mkdir(work)
            old_leaves = []
        else:
            old_leaves = old.leaves
            for i in range(len(leaves), len(old_leaves)):
                F.remove_tree(os.path.join(work, str(i)), self.path)
        new_leaves = []
        for i, (leaf, (meta, chunk)) in enumerate(zip(leaves, metas)):
            leaf_dir = f"{work}/{i}"
            if i < len(old_leaves):
                old_chunk, old_size, old_meta = old_leaves[i]
            else:
                os.mkdir(leaf_dir)
                old_chunk, old_size, old_meta = None, 0, b""
            if old_meta != meta:
                write_file(
                    leaf_dir + "/zarr.json",
                    meta,
                    False,
                    truncate=old_meta is None or len(old_meta) > len(meta),
                )
                rest.append(leaf_dir + "/zarr.json")
            if old_chunk is not None and old_chunk != chunk:
                os.unlink(os.path.join(leaf_dir, old_chunk))
                old_size = 0
            if chunk is not None:
                write_file(
                    f"{leaf_dir}/{chunk}", byte_view(leaf), False, truncate=old_size > leaf.nbytes
                )
                chunks.append(f"{leaf_dir}/{chunk}")
            rest.append(leaf_dir)
            new_leaves.append((chunk, leaf.nbytes, meta))
        write_file(
            work + "/zarr.json",
            group,
            False,
            truncate=old is not None and (old.group_size is None or old.group_size > len(group)),
        )
        if self.durable:
            F.fsync_paths(chunks + rest + [work + "/zarr.json", work], uncache=len(chunks))
        return Layout(new_leaves, len(group))

    def get(
        self, key: str, *, take: Callable[[np.dtype, tuple], np.ndarray] | None = None
    ) -> Record:
        """Read and verify the record under `key`, each leaf into ``take(dtype,
        shape)`` (default ``np.empty``); with direct I/O when durable (see
        :func:`~vlcc_adjoint.storage.format.read_into`)."""
        with self._lock:
            stored = self._index.get(key)
            if stored is None:
                raise VlccKeyError(f"no record {key!r} in tier {self.name!r}")
            self._readers[key] = self._readers.get(key, 0) + 1
        try:
            return self._read(key, stored, take)
        finally:
            with self._lock:
                n = self._readers.pop(key) - 1
                if n:
                    self._readers[key] = n

    def _read(self, key: str, stored: Stored, take) -> Record:
        if stored.error is not None:
            err = stored.error
            raise CorruptCheckpointError(str(err), key=err.key, tier=err.tier, path=err.path)
        spec = stored.spec()
        step = step_of(spec)
        record_dir = f"{self.path}/{key}"
        leaves = []
        for i, (shape, dtype, nbytes, chunk, _) in enumerate(stored.leaves):
            out = np.empty(shape, dtype) if take is None or chunk is None else take(dtype, shape)
            if chunk is None:  # an empty leaf has no chunk
                leaves.append(out)
                continue
            path = f"{record_dir}/{i}/{chunk}"
            try:
                # read_into checks the file's size before it reads a byte.
                F.read_into(path, byte_view(out), direct=self.durable)
            except FileNotFoundError:
                if key not in self._index:
                    raise VlccKeyError(f"record {key!r} was deleted while being read") from None
                raise CorruptCheckpointError.in_record(
                    f"the chunk file {path} of leaf {i} is missing", key, self.name, step, path
                ) from None
            except CorruptCheckpointError as err:
                raise CorruptCheckpointError.in_record(
                    f"leaf {i}: {err}", key, self.name, step, path
                ) from None
            except OSError as err:
                raise StorageError(
                    f"could not read record {key!r} from tier {self.name!r}: {err}"
                ) from err
            leaves.append(out)
        checksums = tuple(info[4] for info in stored.leaves)
        try:
            verify_leaves(leaves, checksums, key, self.name, step)
        except CorruptCheckpointError:
            # Name the damaged file: the chunk of the first leaf that differs.
            for i, (leaf, want) in enumerate(zip(leaves, checksums)):
                got = leaf_checksum(leaf)
                if got != want:
                    path = f"{record_dir}/{i}/{stored.leaves[i][3]}"
                    raise CorruptCheckpointError.in_record(
                        f"leaf {i}: the chunk file {path} has checksum {got}, the record says "
                        f"{want}",
                        key,
                        self.name,
                        step,
                        path,
                    ) from None
            raise
        return Record(spec, tuple(leaves), checksums)

    def delete(self, key: str) -> None:
        """Remove the record under `key` (atomically: renamed away, then recycled or removed).

        A damaged record (:meth:`damaged`) is removed too.
        """
        self._check_writable(f"delete record {key!r}")
        with self._lock:
            if key in self._busy:
                raise VlccKeyError(
                    f"record {key!r} in tier {self.name!r} is being written or deleted"
                )
            stored = self._index.pop(key, None)
            if stored is None:
                raise VlccKeyError(f"no record {key!r} in tier {self.name!r}")
            self._busy.add(key)
            self._used -= stored.nbytes
            reading = key in self._readers
        target = os.path.join(self._scratch, f"d{next(self._names)}")
        away: str | None = target
        try:
            os.rename(os.path.join(self.path, key), target)
        except FileNotFoundError:
            away = None  # already gone from disk: nothing left to free
        except OSError as err:
            with self._lock:
                self._index[key] = stored
                self._used += stored.nbytes
                self._busy.discard(key)
            raise StorageError(
                f"could not delete record {key!r} from tier {self.name!r}: {err} ({F.remedy(err)})"
            ) from err
        keep = False
        with self._lock:
            self._busy.discard(key)
            cap = self.capacity_bytes
            if (
                away is not None
                and stored.layout is not None
                and not reading
                and len(self._pool) < self.recycle
                and (cap is None or self._used + self._pooled + stored.nbytes <= cap)
            ):
                self._pool.append((away, stored.layout, stored.nbytes))
                self._pooled += stored.nbytes
                keep = True
        if away is not None and not keep:
            self._discard(away)

    def keys(self) -> Iterator[str]:
        """Every record's key, the damaged ones (:meth:`damaged`) included."""
        with self._lock:
            return iter(list(self._index))

    def __contains__(self, key: str) -> bool:
        return key in self._index

    def __len__(self) -> int:
        return len(self._index)

    def _release(self) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer = None

    def close(self) -> None:
        """Remove the recycled directories and release the writer lock (the
        records stay; reads still work, writes need a new opening).  Idempotent."""
        with self._lock:
            pool, self._pool, self._pooled = self._pool, [], 0
            self._closed = True
        for path, _, _ in pool:
            self._discard(path)
        self._release()

    def __enter__(self) -> ZarrTier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        cap = "unbounded" if self.capacity_bytes is None else f"{self.capacity_bytes} B"
        return (
            f"ZarrTier({self.path!r}, mode={self.mode!r}, records={len(self._index)}, "
            f"used={self._used} B, capacity={cap})"
        )


def _at(spec) -> str:
    step = step_of(spec)
    return f" (step {step})" if step is not None else ""
