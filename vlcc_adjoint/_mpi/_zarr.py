"""One zarr v3 hierarchy shared by all ranks: each rank writes its own chunks.

:class:`SharedZarrTier` is the per-rank persistent level of a distributed
run.  Every rank holds one; they all write into the same directory (a
parallel file system in production), and the result is one ordinary zarr
v3 hierarchy in which every distributed leaf is **one global array**::

    path/zarr.json                      root group   {"vlcc_adjoint": {"kind": "vlcc-distributed-hierarchy"}}
    path/<name>/zarr.json               a committed record (written by rank 0 at commit):
                                        {"vlcc_adjoint": {"kind": "vlcc-distributed-record",
                                         "key", "step", "nranks", "spec", "leaves": [...]}}
    path/<name>/<i>/zarr.json           leaf i: global shape, regular chunk grid (rank 0)
    path/<name>/<i>/c.<j>.<k>           a chunk, written by the one rank whose block holds it
    path/<name>/xxh3/<i>/zarr.json      uint64 array, one xxh3-64 per chunk of leaf i (rank 0,
    path/<name>/xxh3/<i>/c.0.0            at commit): what readers of other blocks verify
    path/.vlcc-pending/<name>/...       records being written, deleted or not yet committed

``<name>`` is the engine's record key plus a token of the run that wrote it
(``u40-L1-3.5f0c2a``), so runs never collide.  Leaves that are not
:class:`~vlcc_adjoint.mpi.DistributedArray` blocks are *replicated*: every
rank must hold the same value (checked at commit), rank 0 writes it as one
chunk, and each rank keeps its own copy in memory for its own reads (so
replicated leaves should be small: scalars, time, a step counter).

Rules that make concurrent writers safe
---------------------------------------

* **No two ranks write the same object.**  The chunk grid of a leaf is
  aligned to the decomposition the record is written in (its chunk length
  divides every interior block boundary, :mod:`._decomp`), so every chunk
  lies inside one rank's block and only that rank writes it.  Sharding is
  not used: with zarr 3.1, two processes writing inner chunks of one shard
  each rewrite the whole shard and one of them silently loses its data.
* **Only rank 0 writes metadata**: the leaf arrays' ``zarr.json`` while it
  writes its own part, the record's ``zarr.json`` and checksum arrays at
  commit.  Other ranks only ``mkdir -p`` the directories they write into.
* **Collective commit.**  Ranks write on their engine's worker threads,
  with no MPI there.  A record becomes visible only through
  :meth:`SharedZarrTier.commit`, collective, called by the store from the
  caller's thread after every rank flushed its writes: an agreement
  (reduction of status flags: a failure on any rank is the same
  :class:`~._comm.AgreedError` on all), a consistency check (a hash of
  every rank's record names, global specs and replicated-leaf checksums,
  compared by a min/max reduction), a gather of the chunk checksums to
  rank 0, which writes them and the record's ``zarr.json`` and renames
  the record from ``.vlcc-pending/`` into place (one atomic rename per
  record), and a second agreement so that every rank knows the outcome.
  A crash at any point leaves committed records intact and the rest under
  ``.vlcc-pending/``, which the next open removes.
* **Deletes of committed records are deferred** to the next commit (the
  engine deletes on a worker thread, where ranks cannot coordinate): rank 0
  un-commits the record (rename into ``.vlcc-pending/``), then every rank
  unlinks its own chunks.  Until then the record's bytes stay on disk but
  no longer count in ``used_bytes``.  A rank deletes its chunks of an
  uncommitted record at once; the directories, which several ranks share,
  are swept by rank 0 at the next commit, when no rank is writing.

Integrity and safety: a committed record's ``zarr.json`` is sealed with
a digest over its whole description, which covers the checksum arrays and
through them every chunk (:mod:`._zarr_read`); every file is written and
read through :mod:`vlcc_adjoint.storage.format` (no links, regular files
only, bounded reads).  Rank 0 holds the hierarchy's writer lock
(``.vlcc-lock/holder``) from open to :meth:`SharedZarrTier.close`, so a second
run on the same path is refused at open, naming the holder, before it
could remove the first one's pending records.

Readers: :func:`read_checkpoint` restores a committed record on any number
of ranks ``Q`` (each reads the chunks that overlap its block, verifying
their checksums), or serially; plain ``zarr.open_group(path)`` sees each
leaf as the global array.  Neither needs MPI.
"""

from __future__ import annotations

import copy
import json
import os
import secrets
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import xxhash

from ..errors import VlccKeyError, VlccTypeError, VlccValueError
from ..state import byte_view, dtype_to_json
from ..storage import (
    CorruptCheckpointError,
    Record,
    StorageError,
    Tier,
    TierFullError,
    check_capacity,
    check_record,
    encode_spec,
    leaf_checksum,
    step_of,
    verify_leaves,
)
from ..storage import format as F
from ._comm import AgreedError, Guard, ensure_initialized
from ._decomp import Decomposition, distributed_nodes
from ._zarr_read import (
    ATTRS,
    FORMATS,
    HIERARCHY,
    RECORD,
    list_checkpoints,
    place,
    read_checkpoint,
    read_chunk,
    xxh,
)

__all__ = ["SharedZarrTier", "list_checkpoints", "read_checkpoint"]

#: The format this version writes (records and hierarchy); it reads ``FORMATS``.
FORMAT = FORMATS[-1]
PENDING = ".vlcc-pending"
LOCK = F.LOCK_DIR


def _leaf_meta(dtype: np.dtype, shape, chunk_shape) -> bytes:
    """A global leaf array's ``zarr.json``: ZarrTier's, with a chunk grid."""
    if F.zarr_data_type(dtype) is None:
        raise VlccTypeError(
            f"a DistributedArray of dtype {dtype} cannot be stored as a zarr v3 array; use a "
            "numeric or bool dtype (zarr v3 core types) for distributed leaves"
        )
    return F.array_metadata(dtype, shape, chunk_shape)[0]


def _global_spec(spec: dict, dist: dict) -> dict:
    """The spec with every distributed leaf's shape made global and its
    DistributedArray node stripped of the rank."""
    out = copy.deepcopy(spec)
    for node in distributed_nodes(out.get("tree")):
        aux = node["aux"]
        node["aux"] = {"decomposition": aux["decomposition"]}
    for i, d in dist.items():
        out["leaves"][i]["shape"] = list(d.global_shape)
    return out


def _spec_distribution(spec: dict) -> dict[int, tuple[Decomposition, int]]:
    """Leaf index -> (decomposition, rank) of the DistributedArray blocks of a
    state spec (none in a spec that is not ``flatten``'s: every leaf replicated)."""
    out = {}
    for node in distributed_nodes(spec.get("tree")):
        i = node["items"][0]["leaf"]
        out[i] = (Decomposition.from_json(node["aux"]["decomposition"]), node["aux"]["rank"])
    return out


class _Leaf:
    __slots__ = ("dtype", "shape", "decomp", "chunk_shape", "chunks", "replica", "checksum", "meta")

    def __init__(
        self,
        dtype: np.dtype,
        shape: Sequence[int],
        decomp: Decomposition | None = None,
        chunk_shape: tuple[int, ...] | None = None,
    ) -> None:
        self.dtype = dtype
        self.shape = tuple(shape)  # the global shape (= local for a replicated leaf)
        self.decomp = decomp  # None: replicated
        self.chunk_shape = chunk_shape
        self.chunks: list[tuple[tuple[int, ...], int]] = []  # (chunk index, xxh3) this rank wrote
        self.replica: Any = None  # a replicated leaf's array
        self.checksum: Any = None  # a replicated leaf's checksum
        self.meta: Any = None  # zarr.json (rank 0); replicated: (zarr.json, chunk name)


class _Part:
    """This rank's part of one record."""

    __slots__ = (
        "key",
        "name",
        "spec_json",
        "global_json",
        "leaves",
        "checksums",
        "nbytes",
        "committed",
        "fingerprint",
    )

    def __init__(self, key, name, spec_json, global_json, leaves, checksums, nbytes):
        self.key = key
        self.name = name
        self.spec_json = spec_json  # the rank's spec as given to put (strict JSON text)
        self.global_json = global_json
        self.leaves = leaves
        self.checksums = checksums
        self.nbytes = nbytes
        self.committed = False


class SharedZarrTier(Tier):
    """A rank's view of one zarr v3 hierarchy shared by all ranks.

    **Arguments:**

    - `path`: the hierarchy's directory, the same on every rank (a shared
      file system across nodes).  Created if missing; committed records of
      earlier runs stay, uncommitted leftovers are removed.
    - `comm`: the mpi4py communicator of the run.  Opening is collective
      (rank 0 creates the hierarchy, then everyone proceeds).
    - `capacity_bytes`: the most bytes this rank may write (its chunks, and
      for rank 0 the metadata); ``None``: unbounded.
    - `durable`: fsync every chunk and directory before a record counts as
      written (a committed record then survives a power cut).
    - `timeout`: seconds the opening handshake may wait for the other ranks.
    - `name`: the tier's name in messages.

    Use it as a level of a :class:`~vlcc_adjoint.mpi.DistributedStore`,
    which redistributes states to a chunk-aligned layout and commits
    collectively.  ``put``/``get``/``delete`` are rank-local and run on the
    engine's worker threads.
    """

    persistent = True  # committed records survive the run
    copies_on_put = True  # put writes the leaves to files and keeps no reference

    def __init__(
        self,
        path: str | os.PathLike,
        comm: Any,
        capacity_bytes: int | None = None,
        *,
        durable: bool = False,
        timeout: float | None = 600.0,
        name: str | None = None,
    ):
        ensure_initialized()
        self.path = os.path.abspath(os.fspath(path))
        self.capacity_bytes = check_capacity(capacity_bytes)
        self.durable = bool(durable)
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.name = name or f"shared-zarr:{self.path}"
        self._pending = os.path.join(self.path, PENDING)
        self._lock = threading.Lock()
        self._index: dict[str, _Part] = {}
        self._used = 0
        self._doomed: list[_Part] = []  # committed, then deleted: removed at the next commit
        self._writing = 0  # puts in flight
        self.doomed_bytes = 0
        self._writer: F.WriterLock | None = None  # rank 0 holds the hierarchy's writer lock
        guard = Guard(comm, timeout)
        try:
            error, token = None, None
            if self.rank == 0:
                try:
                    self._create()
                    token = secrets.token_hex(3)
                except Exception as exc:  # reported to every rank below
                    error = exc
            guard.agree(error, f"opening the shared zarr hierarchy {self.path}")
            self.run = guard.bcast_text(token, 0, "opening the shared zarr hierarchy")
        finally:
            guard.close()

    def _create(self) -> None:
        """Rank 0: take the writer lock, check or create the root, empty the pending area."""
        root = os.path.join(self.path, "zarr.json")
        os.makedirs(self.path, exist_ok=True)
        F.check_dir(self.path)
        try:
            self._writer = F.lock_store(
                self.path, f"the shared zarr hierarchy {self.path}", self.durable
            )
        except F.StoreLockedError as err:
            raise F.StoreLockedError(
                f"{str(err).split(';')[0]}; close it there first (a run's DistributedStore "
                "closes it), or read its records with vlcc_adjoint.mpi.read_checkpoint, which "
                "takes no lock"
            ) from None
        if os.path.lexists(root):
            attrs = F.open_group(root, ATTRS)
            if not (isinstance(attrs, dict) and attrs.get("kind") == HIERARCHY):
                raise StorageError(
                    f"{self.path} is a zarr hierarchy but not a distributed "
                    "vlcc_adjoint one; give SharedZarrTier a new or empty directory"
                )
            if attrs.get("format") not in FORMATS:
                raise StorageError(
                    f"{root}: the hierarchy is of format {attrs.get('format')!r}; "
                    f"this version writes formats up to {FORMAT} (upgrade "
                    "vlcc_adjoint, or use a new directory)"
                )
        else:
            if any(e.name != LOCK for e in os.scandir(self.path)):
                raise StorageError(
                    f"{self.path} exists, is not empty and is not a zarr v3 group; "
                    "give SharedZarrTier a new or empty directory"
                )
            F.write_group(
                root,
                {
                    ATTRS: {
                        "format": FORMAT,
                        "kind": HIERARCHY,
                        "layout": "one group per committed checkpoint record; leaf i of record K is "
                        "the global array K/i, each chunk written by the rank owning it; "
                        "K/xxh3/i holds the chunks' xxh3-64 checksums",
                    }
                },
                self.durable,
            )
        F.remove_tree(self._pending, self.path)  # an interrupted run's leftovers (we hold the lock)
        os.mkdir(self._pending)
        F.write_group(
            os.path.join(self._pending, "zarr.json"),
            {ATTRS: "records being written or deleted; never read these"},
            self.durable,
        )
        if self.durable:
            F.fsync_dir(self.path)

    # -- the Tier protocol ----------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return self._used

    def _dir(self, part: _Part) -> str:
        if part.committed:
            return os.path.join(self.path, part.name)
        return os.path.join(self._pending, part.name)

    def put(self, key: str, record: Record) -> None:
        """Write this rank's part of `record` (its chunks; rank 0 also the
        metadata and the replicated leaves) under ``.vlcc-pending/``.

        The record is visible to readers after the next :meth:`commit`.
        """
        check_record(key, record)
        spec = record.spec
        spec_json = encode_spec(key, spec)  # refused now if it cannot be stored as JSON
        dist = _spec_distribution(spec)
        leaves, need = [], 0
        for i, leaf in enumerate(record.leaves):
            if i in dist:
                d, r = dist[i]
                if r != self.rank or d.nranks != self.size:
                    raise VlccValueError(
                        f"leaf {i} of record {key!r} is rank {r}'s block of a {d.nranks}-rank "
                        f"decomposition, but this tier is rank {self.rank} of {self.size}; save "
                        "each rank's own DistributedArray, decomposed over the tier's communicator"
                    )
                if F.zarr_data_type(leaf.dtype) is None:
                    raise VlccTypeError(
                        f"leaf {i} of record {key!r} is a DistributedArray of dtype {leaf.dtype}, "
                        "which is not a zarr v3 core type; use a numeric or bool dtype for "
                        "distributed leaves"
                    )
                chunk_shape = d.chunk_shape
                info = _Leaf(leaf.dtype, d.global_shape, d, chunk_shape)
                n_chunks = sum(1 for _ in d.chunks_of(self.rank, chunk_shape))
                need += n_chunks * int(np.prod(chunk_shape)) * leaf.dtype.itemsize
                if self.rank == 0:
                    info.meta = _leaf_meta(leaf.dtype, d.global_shape, info.chunk_shape)
                    need += len(info.meta)
            else:
                info = _Leaf(leaf.dtype, leaf.shape)
                info.replica = leaf
                info.checksum = record.checksums[i]
                if self.rank == 0:
                    info.meta = F.array_metadata(leaf.dtype, leaf.shape)
                    need += leaf.nbytes + len(info.meta[0])
            leaves.append(info)
        global_json = F.canonical_json(
            _global_spec(spec, {i: d for i, (d, _) in dist.items()})
        ).decode("ascii")
        name = f"{key}.{self.run}"
        part = _Part(key, name, spec_json, global_json, leaves, record.checksums, need)
        with self._lock:
            if key in self._index:
                raise VlccKeyError(
                    f"record {key!r} is already in tier {self.name!r}; delete it first"
                )
            if self.capacity_bytes is not None and self._used + need > self.capacity_bytes:
                raise TierFullError.no_room(key, self.name, need, self._used, self.capacity_bytes)
            self._used += need
            self._index[key] = part  # reserved; get() is only called after put returns
            self._writing += 1
        try:
            self._write_part(part, record)
        except BaseException as err:
            self._remove_files(part)
            with self._lock:
                self._index.pop(key, None)
                self._used -= need
                self._writing -= 1
            if isinstance(err, OSError):
                raise StorageError(
                    f"rank {self.rank} could not write its part of record {key!r} to "
                    f"{self.name!r}: {err}; nothing was stored ({F.remedy(err)})"
                ) from err
            raise
        with self._lock:
            self._writing -= 1

    def _write_part(self, part: _Part, record: Record) -> None:
        base = os.path.join(self._pending, part.name)
        durable = self.durable
        for i, (info, leaf) in enumerate(zip(part.leaves, record.leaves)):
            leaf_dir = os.path.join(base, str(i))
            if info.decomp is not None:
                chunks = list(info.decomp.chunks_of(self.rank, info.chunk_shape))
                if not chunks and self.rank != 0:
                    continue
                os.makedirs(leaf_dir, exist_ok=True)
                if info.meta is not None:
                    F.write_file(
                        os.path.join(leaf_dir, "zarr.json"), info.meta, durable, truncate=True
                    )
                origin = info.decomp.offsets(self.rank)
                c = info.chunk_shape
                for idx in chunks:
                    lo = [k * ck for k, ck in zip(idx, c)]
                    hi = [min(l + ck, n) for l, ck, n in zip(lo, c, info.shape)]
                    part_view = leaf[tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, origin))]
                    if tuple(b - a for a, b in zip(lo, hi)) != tuple(c):
                        # An edge chunk: zarr stores every chunk at the full chunk
                        # shape, the part outside the array holding the fill value.
                        padded = np.zeros(c, leaf.dtype)
                        padded[tuple(slice(0, b - a) for a, b in zip(lo, hi))] = part_view
                        part_view = padded
                    data = np.ascontiguousarray(part_view)
                    F.write_file(
                        os.path.join(leaf_dir, F.chunk_key(idx)),
                        byte_view(data),
                        durable,
                        truncate=True,
                    )
                    info.chunks.append((idx, int(leaf_checksum(data), 16)))
                if durable:
                    F.fsync_dir(leaf_dir)
            elif self.rank == 0:
                os.makedirs(leaf_dir, exist_ok=True)
                meta, chunk = info.meta
                F.write_file(os.path.join(leaf_dir, "zarr.json"), meta, durable, truncate=True)
                if chunk is not None:
                    F.write_file(
                        os.path.join(leaf_dir, chunk), byte_view(leaf), durable, truncate=True
                    )
                if durable:
                    F.fsync_dir(leaf_dir)

    def _remove_files(self, part: _Part, base: str | None = None) -> None:
        """Unlink this rank's files of `part` (directories are rank 0's, at commit)."""
        base = base or self._dir(part)
        for i, info in enumerate(part.leaves):
            leaf_dir = os.path.join(base, str(i))
            names = [F.chunk_key(idx) for idx, _ in info.chunks]
            if self.rank == 0:
                names.append("zarr.json")
                if info.meta is not None and info.decomp is None and info.meta[1] is not None:
                    names.append(info.meta[1])
            for n in names:
                try:
                    os.unlink(os.path.join(leaf_dir, n))
                except FileNotFoundError:
                    pass

    def get(self, key: str) -> Record:
        """This rank's part of `key`: distributed leaves read back and verified chunk
        by chunk, replicated leaves from this rank's copy, verified against their
        checksums (a copy changed since ``put`` raises ``CorruptCheckpointError``)."""
        with self._lock:
            part = self._index.get(key)
            if part is None:
                raise VlccKeyError(f"no record {key!r} in tier {self.name!r}")
            base = self._dir(part)
        spec = json.loads(part.spec_json)  # the caller's copy, from this rank's own text
        step = step_of(spec)
        leaves = []
        for i, info in enumerate(part.leaves):
            if info.decomp is None:
                view = info.replica.view()
                view.flags.writeable = False
                verify_leaves([view], [info.checksum], key, self.name, step)
                leaves.append(view)
                continue
            out = np.empty(info.decomp.local_shape(self.rank), info.dtype)
            origin = info.decomp.offsets(self.rank)
            for idx, want in info.chunks:
                path = os.path.join(base, str(i), F.chunk_key(idx))
                data = read_chunk(path, info.dtype, info.chunk_shape, key, self.name, step, i)
                if xxh(byte_view(data)) != want:
                    raise CorruptCheckpointError.in_record(
                        f"chunk {F.chunk_key(idx)} of leaf {i} failed its checksum",
                        key,
                        self.name,
                        step,
                        path,
                    )
                place(out, origin, data, idx, info.chunk_shape, info.shape)
            leaves.append(out)
        return Record(spec, tuple(leaves), part.checksums)

    def delete(self, key: str) -> None:
        """Remove this rank's part of `key` (a committed record: at the next commit)."""
        with self._lock:
            part = self._index.pop(key, None)
            if part is None:
                raise VlccKeyError(f"no record {key!r} in tier {self.name!r}")
            self._used -= part.nbytes
            if part.committed:
                self._doomed.append(part)
                self.doomed_bytes += part.nbytes
                return
        self._remove_files(part)  # its directories: rank 0's sweep at the next commit

    def keys(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._index))

    def __contains__(self, key: str) -> bool:
        return key in self._index

    def __len__(self) -> int:
        return len(self._index)

    def committed(self) -> list[str]:
        """Names (directories) of the committed records this rank holds."""
        with self._lock:
            return sorted(p.name for p in self._index.values() if p.committed)

    # -- the collective commit --------------------------------------------------------

    def commit(self, guard: Guard, final: bool = False) -> list[str]:
        """Publish every record all ranks have written.  Collective.

        Call on every rank after the ranks' writes are flushed (the store's
        ``wait``).  Raises the same :class:`~._comm.AgreedError` on every
        rank when any rank failed or the ranks' records differ.

        **Arguments:** `guard`, the run's :class:`~._comm.Guard`; `final`, also
        remove the directories of deleted records (one more agreement).

        **Returns:** the names of the records committed now.
        """
        error, batch, doomed, mine, fp = None, [], [], np.zeros(0, np.uint64), 0
        try:
            with self._lock:
                if self._writing:
                    raise StorageError(
                        f"{self._writing} writes to {self.path} are still in "
                        "flight; flush them (the store's wait) before a commit"
                    )
                batch = sorted(
                    (p for p in self._index.values() if not p.committed), key=lambda p: p.name
                )
                doomed, self._doomed = sorted(self._doomed, key=lambda p: p.name), []
                self.doomed_bytes = 0
            h = xxhash.xxh3_64()
            sums: list[int] = []
            for part in batch:
                h.update(part.name.encode() + b"\0" + part.global_json.encode() + b"\0")
                for info in part.leaves:
                    if info.decomp is None:
                        h.update(info.checksum.encode())
                    else:
                        sums.extend(s for _, s in info.chunks)
            for part in doomed:
                h.update(b"delete:" + part.name.encode() + b"\0")
            fp = h.intdigest()
            mine = np.array(sums, np.uint64)
        except Exception as exc:
            error = exc
        what = f"committing {len(batch)} checkpoint records to {self.path}"
        guard.agree(error, what)
        v = np.array([fp & 0xFFFFFFFF, fp >> 32, len(batch), len(doomed)], np.int64)
        lo = guard.allreduce(v, "min", what)
        hi = guard.allreduce(v, "max", what)
        if not np.array_equal(lo, hi):
            raise AgreedError(
                f"the ranks hold different checkpoint records to commit to {self.path} (names, "
                "decompositions or replicated leaves differ); every rank must save the same "
                "steps in the same order, and leaves that are not DistributedArray blocks must "
                "be equal on all ranks (wrap rank-local arrays in DistributedArray)"
            )
        gathered = guard.gatherv(mine, 0, what)
        error = None
        if self.rank == 0:
            try:
                self._publish(batch, doomed, gathered)
            except Exception as exc:
                error = exc
        guard.agree(error, f"publishing checkpoint records in {self.path}")
        with self._lock:
            for part in batch:
                part.committed = True
        for part in doomed:  # every rank removes its own chunks of un-committed records
            self._remove_files(part, os.path.join(self._pending, "trash-" + part.name))
        if final:
            guard.barrier(f"removing deleted records from {self.path}")
            if self.rank == 0:
                self._sweep(keep=())
        return [p.name for p in batch]

    def _sweep(self, keep) -> None:
        """Rank 0, inside a commit (every rank's writes and deletes done):
        remove every directory under ``.vlcc-pending`` but the records in
        `keep`: deleted records (their chunks already unlinked by their
        writers), records whose write the engine cancelled on rank 0 while
        another rank had written its part, un-committed records of the last
        commit."""
        keep = set(keep)
        for entry in os.scandir(self._pending):
            if entry.is_dir(follow_symlinks=False) and entry.name not in keep:
                try:
                    F.remove_tree(entry.path, self.path)
                except OSError:
                    pass  # left for the next sweep or open

    def _publish(self, batch, doomed, gathered) -> None:
        """Rank 0: checksum arrays and record metadata, then the renames."""
        self._sweep(keep={p.name for p in batch})
        offsets = [0] * self.size
        for part in batch:
            base = os.path.join(self._pending, part.name)
            spec = F.parse_json(part.global_json.encode("ascii"), base)
            leaves_doc = []
            for i, info in enumerate(part.leaves):
                if info.decomp is None:
                    meta, chunk = info.meta
                    leaves_doc.append(
                        {
                            "dtype": dtype_to_json(info.dtype),
                            "shape": list(info.shape),
                            "distributed": False,
                            "chunk": chunk,
                            "checksum": info.checksum,
                        }
                    )
                    continue
                d, c = info.decomp, info.chunk_shape
                grid_shape = tuple(-(-n // ck) for n, ck in zip(info.shape, c))
                grid = np.zeros(grid_shape, np.uint64)
                for r in range(self.size):
                    for idx in d.chunks_of(r, c):
                        grid[idx] = gathered[r][offsets[r]]
                        offsets[r] += 1
                sums_dir = os.path.join(base, "xxh3", str(i))
                os.makedirs(sums_dir, exist_ok=True)
                meta, chunk = F.array_metadata(grid.dtype, grid.shape)
                F.write_file(os.path.join(sums_dir, "zarr.json"), meta, self.durable, truncate=True)
                if chunk is not None:
                    F.write_file(
                        os.path.join(sums_dir, chunk), byte_view(grid), self.durable, truncate=True
                    )
                # The checksum array's own checksum: the record's digest covers it,
                # and through it every chunk.
                leaves_doc.append(
                    {
                        "dtype": dtype_to_json(info.dtype),
                        "shape": list(info.shape),
                        "distributed": True,
                        "decomposition": d.to_json(),
                        "chunk_shape": list(c),
                        "checksums": f"xxh3/{i}",
                        "checksums_xxh3": leaf_checksum(grid),
                    }
                )
            if any(info.decomp is not None for info in part.leaves):
                F.write_group(os.path.join(base, "xxh3", "zarr.json"), {}, self.durable)
            attrs = {
                "format": FORMAT,
                "kind": RECORD,
                "key": part.key,
                "step": step_of(json.loads(part.spec_json)),
                "nranks": self.size,
                "spec": spec,
                "leaves": leaves_doc,
            }
            group, _ = F.sealed_group(ATTRS, attrs)
            F.write_atomic(os.path.join(base, "zarr.json"), group, self.durable)
            F.publish(base, os.path.join(self.path, part.name), False)
        for part in doomed:
            os.rename(
                os.path.join(self.path, part.name),
                os.path.join(self._pending, "trash-" + part.name),
            )
        if self.durable:
            F.fsync_dir(self.path)

    def close(self) -> None:
        """Release the writer lock (rank 0).  Records stay; uncommitted ones are
        removed by the next open.  Idempotent."""
        if self._writer is not None:
            self._writer.release()
            self._writer = None

    def __repr__(self) -> str:
        cap = "unbounded" if self.capacity_bytes is None else f"{self.capacity_bytes} B"
        return (
            f"SharedZarrTier({self.path!r}, rank={self.rank}/{self.size}, "
            f"records={len(self._index)}, used={self._used} B, capacity={cap})"
        )
