"""A ``torch.distributed.checkpoint`` storage backend on a lineage :class:`~vlcc_adjoint.lineage.History`.

DCP's calls work unchanged; every save becomes one version of a branching
history (parents, branch, message, step and metadata), and any version
loads on any number of ranks (DCP reshards)::

    import torch.distributed.checkpoint as dcp
    from vlcc_adjoint.torch.dcp import VlccReader, VlccWriter

    dcp.save(state_dict, storage_writer=VlccWriter("run.vlcc", message="step 100"))
    fut = dcp.async_save(state_dict, storage_writer=writer)      # one reused staging area
    dcp.load(state_dict, storage_reader=VlccReader("run.vlcc", ref="main~3"))

How a save maps onto the history
--------------------------------

Every rank *stages* the tensor chunks DCP's planner gives it: it hashes
their 1 MiB chunks and writes the ones the repository lacks into its
content-addressed ``chunks/`` (unchanged chunks cost a hash; with
``deltas=True`` a changed chunk is stored as a compressed XOR against the
parent version's chunk at the same place).  Each rank's write results carry
the JSON leaf entries (chunk addresses), which DCP gathers on the
coordinator; the coordinator's ``finish`` then *commits once*: the version
(one leaf per tensor chunk, plus the metadata document as leaf 0) is
published atomically under the graph lock.  If any rank fails, DCP never
calls ``finish`` and no version appears (the staged chunks are unreferenced
and ``gc`` removes them); a version is never half-written.

A version written by :class:`VlccWriter` is an ordinary version: ``vlcc
log``, ``History.diff``/``compare``, ``gc``, ``export`` and ``History.load``
(a dict ``{"dcp_metadata": uint8 array, "items": {key: array}}``) all
work on it.

Nothing is unpickled
--------------------

DCP's file system backend pickles its metadata and ``torch.save``s
non-tensor items.  Here both are JSON (:mod:`._dcp_meta`), stored as the
version's first leaf under the same chunk checksums as the tensors; tensors
are raw bytes (bfloat16 and float8 as integers of their width).  Non-tensor
items must be JSON-like values (numbers, strings, bytes, lists, tuples,
dicts); the writer refuses other objects, naming the key.  On load, DCP's
planner receives such a value as a ``torch.save`` stream this process
builds from the checked JSON (the planner reads it with
``weights_only=True``).

Checks on read
--------------

:class:`VlccReader` opens the history read-only, resolves the ref and reads
the metadata when it is constructed, so a bad path, an unknown ref or a
version not written by this backend raise there, with what to do.  Every
leaf read is checked against the metadata (dtype, shape) and verified chunk
by chunk (:class:`~vlcc_adjoint.storage.CorruptCheckpointError` naming the
file); each allocation is bounded by the declared sizes and the memory the
process may use.  Inside ``dcp.load`` a read error reaches the caller
wrapped in DCP's ``CheckpointException`` (its ``failures`` hold ours).

Each rank opens the history itself, so the path must be shared by every
rank (a parallel or network file system, or one machine's disk).  Each rank
resolves the reader's ref itself: to load one fixed version while others
commit, name it by id or tag.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.futures import Future
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, SavePlan,
                                                  SavePlanner, WriteItemType)
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult

from ..lineage import History
from ..storage import CorruptCheckpointError
from ._dcp_meta import FORMAT, decode_metadata, encode_metadata, encode_value, storage_key
from ._dcp_stage import StagingArea
from ._state import _storage_dtype, numpy_to_tensor, tensor_to_numpy

__all__ = ["VlccReader", "VlccWriter"]

#: The key of the version metadata that marks a version written by VlccWriter.
META_KEY = "dcp"


def _spec(keys: Sequence[str], entries: Sequence[dict]) -> dict:
    """The state spec of a version: ``{"dcp_metadata": leaf 0, "items": {key: leaf i}}``."""
    return {"format": "vlcc-state/1",
            "tree": {"dict": ["dcp_metadata", "items"],
                     "items": [{"leaf": 0}, {"dict": list(keys),
                                            "items": [{"leaf": i + 1} for i in range(len(keys))]}]},
            "leaves": [{"dtype": e["dtype"], "shape": e["shape"]} for e in entries]}


def _check_path(path: str | os.PathLike) -> str:
    """`path` made absolute; ``NotADirectoryError`` when it exists and is no directory."""
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(f"{path} is not a directory; a VlccWriter saves into a history "
                                 "directory: give a new path (it is created) or a history's")
    return path


class VlccWriter(StorageWriter, AsyncStager):
    """A DCP ``StorageWriter`` that saves every checkpoint as a version of a History.

    **Arguments:**

    - `path`: the history's directory (created if missing; shared by all ranks).
    - `branch`: the branch each save appends to (created at the first save).
    - `message`: the version's one-line message (may be changed between saves:
      ``writer.message = ...``).
    - `tags`: tags to put on the version once it is committed (an existing tag
      is refused before anything is written).
    - `deltas`: ``True`` stores changed chunks as compressed XOR deltas against
      the parent version's (see :mod:`vlcc_adjoint.lineage`); ``None`` (default):
      as the history says.
    - `step`: stored in the version's metadata as ``"step"`` (``log`` shows it).
    - `meta`: more JSON metadata for the version.

    Use one writer for a series of saves: :meth:`stage` (the ``dcp.async_save``
    path) then reuses one host staging area (:mod:`._dcp_stage`).  After a save,
    :attr:`version` is the new version's id on the coordinator.
    """

    _synchronize_after_execute: bool = False  # stage() copies synchronously

    def __init__(self, path: str | os.PathLike, branch: str = "main", message: str = "",
                 tags: Sequence[str] = (), deltas: bool | None = None, *,
                 step: int | None = None, meta: dict | None = None):
        super().__init__()
        if not isinstance(branch, str):
            raise TypeError(f"branch must be a str, got {type(branch).__name__}")
        if isinstance(tags, str):
            tags = (tags,)
        self.path = _check_path(path)
        self.branch = branch
        self.message = message
        self.tags = tuple(tags)
        self.deltas = deltas
        self.step = step
        self.meta = dict(meta or {})
        self.version: str | None = None
        self.staging = StagingArea()
        self._history: History | None = None
        self._save_id = uuid.uuid4().hex
        self.rank = 0
        self.is_coordinator = True

    # -- the history ---------------------------------------------------------------

    def _open(self) -> History:
        if self._history is None or self._history.path != self.path:
            if self._history is not None:
                self._history.close()
            self._history = History(self.path, deltas=self.deltas)
        return self._history

    def close(self) -> None:
        """Close the history this writer opened (it opens it again on the next save)."""
        if self._history is not None:
            self._history.close()
            self._history = None

    # -- StorageWriter -------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        """Start a save (DCP calls it); a `checkpoint_id` replaces the path."""
        if checkpoint_id:
            self.path = _check_path(checkpoint_id)
        self._save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Record this process's role (DCP calls it)."""
        self.is_coordinator = bool(is_coordinator)
        self.rank = kwargs.get("rank") or 0

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Nothing to add to a rank's plan."""
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """On the coordinator: open (create) the history, check the branch and tags, and
        give every rank the parent version (the delta base)."""
        try:
            h = self._open()
            tags = h.tags
            taken = [t for t in self.tags if t in tags]
            if taken:
                raise ValueError(f"tag {taken[0]!r} already names version {tags[taken[0]]} in "
                                 f"{self.path}; choose another tag, or move it afterwards with "
                                 "History.tag(name, version, force=True)")
            parent = h.branches.get(self.branch)
        except BaseException:
            self.staging.release()
            raise
        return [dataclasses.replace(p, storage_data={"parent": parent}) for p in plans]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Stage this rank's items into the history (chunks only: no version yet)."""
        try:
            results = self._write(plan, planner)
        finally:
            self.staging.release()  # the staged copy has been read
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def _write(self, plan: SavePlan, planner: SavePlanner) -> list[WriteResult]:
        h = self._open()
        parent = (plan.storage_data or {}).get("parent")
        results: list[WriteResult] = []
        arrays, items = [], []
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:
                if hasattr(planner, "lookup_object"):
                    obj = planner.lookup_object(item.index)
                else:  # a planner of another kind: its stream, read back as plain data
                    stream = planner.resolve_data(item)
                    stream.seek(0)
                    obj = torch.load(stream, weights_only=True)
                value = encode_value(obj, f"state_dict[{item.index.fqn!r}]")
                results.append(WriteResult(index=item.index, size_in_bytes=0,
                                           storage_data={"value": value}))
                continue
            t = planner.resolve_data(item)
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"the planner resolved {item.index.fqn!r} to a "
                                f"{type(t).__name__}, not a tensor")
            t = t.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            arr = tensor_to_numpy(t.contiguous())
            arrays.append(arr.reshape(tuple(t.shape)))  # 0-d stays 0-d
            items.append(item)
        bases = None
        if parent is not None and h.deltas:
            bases = self._parent_leaves(h, parent, [storage_key(i.index) for i in items])
        entries = h.stage(arrays, base=parent if bases else None, base_leaves=bases)
        for item, arr, entry in zip(items, arrays, entries):
            results.append(WriteResult(index=item.index, size_in_bytes=arr.nbytes,
                                       storage_data={"key": storage_key(item.index),
                                                     "leaf": entry}))
        return results

    @staticmethod
    def _parent_leaves(h: History, parent: str, keys: list[str]) -> list[int | None] | None:
        """Per key, the index of the parent version's leaf holding it (delta bases)."""
        try:
            _md, storage = _read_document(h, parent)
        except (ValueError, KeyError, CorruptCheckpointError):
            return None  # not a DCP version, or unreadable: full chunks
        where = {}
        for index, info in storage.items():
            if info[0] == "leaf":
                where[storage_key(index)] = info[1]
        return [where.get(k) for k in keys]

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """On the coordinator: commit every rank's staged items as one version."""
        h = self._open()
        entries: dict[str, dict] = {}
        values: dict[str, Any] = {}
        for rank_results in results:
            for wr in rank_results:
                sd = wr.storage_data
                if not isinstance(sd, dict):
                    raise TypeError(f"write result for {wr.index.fqn!r} is not from a VlccWriter")
                if "value" in sd:
                    values[wr.index.fqn] = sd["value"]
                else:
                    entries[sd["key"]] = sd["leaf"]
        keys = sorted(entries)
        leaf_of = {k: i + 1 for i, k in enumerate(keys)}
        metadata.storage_meta = self.storage_meta()
        doc = encode_metadata(metadata, leaf_of, values)
        text = json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()
        first = h.stage([np.frombuffer(text, np.uint8)])[0]
        leaves = [first] + [entries[k] for k in keys]
        meta = {} if self.step is None else {"step": self.step}
        meta.update(self.meta)
        meta[META_KEY] = {"format": FORMAT, "items": len(doc["items"]), "leaves": len(keys),
                          "ranks": len(results)}
        self.version = h.commit_staged(_spec(keys, leaves), leaves,
                                       self.message, meta, branch=self.branch)
        for tag in self.tags:
            h.tag(tag, self.version)

    def storage_meta(self) -> StorageMeta | None:
        """The checkpoint id (the path) and this save's id."""
        return StorageMeta(checkpoint_id=self.path, save_id=self._save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        """Whether `checkpoint_id` is a local path (a history's directory)."""
        return isinstance(checkpoint_id, (str, os.PathLike)) and "://" not in os.fspath(checkpoint_id)

    # -- AsyncStager (dcp.async_save) -----------------------------------------------

    def stage(self, state_dict: dict) -> dict:
        """Copy `state_dict` into this writer's reusable staging area (``dcp.async_save``).

        **Arguments:**

        - `state_dict`: the state dict being saved.

        **Returns:** a state dict of the same structure over the staging area;
        training may change the original at once.  The area holds exactly the
        rank's shard (``writer.staging.nbytes``) and is reused by every save.
        """
        return self.staging.stage(state_dict)


# -- reading -----------------------------------------------------------------------


def _read_document(h: History, vid: str) -> tuple[Metadata, dict]:
    """The decoded metadata document of version `vid` (checked)."""
    v = h.version(vid)
    mark = v.meta.get(META_KEY)
    if not (isinstance(mark, dict) and mark.get("format") == FORMAT):
        raise ValueError(f"version {vid} of {h.path} was not written by VlccWriter (its "
                         f"metadata has no {META_KEY!r} entry of format {FORMAT}); read it with "
                         "History.load / History.checkout, or load a version that dcp.save wrote")
    n = h.leaf_count(vid)
    raw = h.read_leaf(vid, 0)
    manifest = os.path.join(h.path, "versions", vid, "0")
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise CorruptCheckpointError(f"version {vid} of {h.path}: its DCP metadata leaf is "
                                     f"{raw.dtype}{list(raw.shape)}, not bytes", key=vid,
                                     path=manifest)
    try:
        doc = json.loads(raw.tobytes())
        return decode_metadata(doc, n)
    except (ValueError, RecursionError) as err:
        raise CorruptCheckpointError(f"version {vid} of {h.path}: its DCP metadata is invalid "
                                     f"({err}); load another version", key=vid,
                                     path=manifest) from None


class VlccReader(StorageReader):
    """A DCP ``StorageReader`` that loads one version of a History (any world size).

    **Arguments:**

    - `path`: the history's directory.
    - `ref`: the version to load: a branch (its tip), a tag, a version id or
      ``"main~3"``.

    The history is opened read-only, the ref resolved and the metadata read
    and checked here, so errors surface at construction; :attr:`version` is
    the resolved id.
    """

    def __init__(self, path: str | os.PathLike, ref: str = "main"):
        super().__init__()
        self.path = os.path.abspath(os.fspath(path))
        self.ref = ref
        self.load_id = uuid.uuid4().hex
        self._open()

    def _open(self) -> None:
        if not os.path.isdir(self.path):
            raise FileNotFoundError(f"no history at {self.path}: the path is not a directory; "
                                    "give VlccReader the directory a VlccWriter saved to")
        h = History(self.path, mode="r")
        try:
            try:
                vid = h.resolve(self.ref)
            except KeyError as err:
                branches = ", ".join(sorted(h.branches)[:8]) or "none"
                raise KeyError(f"{self.ref!r} names no version of the history at {self.path} "
                               f"({err.args[0] if err.args else err}); branches: {branches}. "
                               "Give a branch, tag, version id or 'branch~n'") from None
            self._metadata, self._storage = _read_document(h, vid)
        except BaseException:
            h.close()
            raise
        self._history = h
        self.version = vid

    def close(self) -> None:
        """Close the history (reopened by the next ``reset`` with a checkpoint id)."""
        self._history.close()

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        """Start a load (DCP calls it); a `checkpoint_id` replaces the path."""
        if checkpoint_id and os.path.abspath(os.fspath(checkpoint_id)) != self.path:
            self._history.close()
            self.path = os.path.abspath(os.fspath(checkpoint_id))
            self._open()
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The version's DCP metadata (decoded from JSON, checked)."""
        md = self._metadata
        sm = md.storage_meta or StorageMeta()
        sm = dataclasses.replace(sm, load_id=self.load_id)
        return dataclasses.replace(md, storage_meta=sm, storage_data=self._storage)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        """Nothing to set up: the storage map was read with the metadata."""

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Nothing to add to a rank's plan."""
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """Nothing to add to the global plan."""
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read the items of this rank's plan (each stored leaf once, verified)."""
        h = self._history
        by_leaf: dict[int, list] = {}
        for req in plan.items:
            info = self._storage.get(req.storage_index)
            if info is None:
                raise KeyError(f"{req.storage_index.fqn!r} (offsets {req.storage_index.offset}) "
                               f"is not in version {self.version} of {self.path}")
            if req.type == LoadItemType.BYTE_IO:
                if info[0] != "value":
                    raise ValueError(f"{req.storage_index.fqn!r} is a tensor in version "
                                     f"{self.version}, the state dict expects an object")
                stream = io.BytesIO()
                torch.save(info[1], stream)
                stream.seek(0)
                planner.load_bytes(req, stream)
                continue
            if info[0] != "leaf":
                raise ValueError(f"{req.storage_index.fqn!r} is a non-tensor item in version "
                                 f"{self.version}, the state dict expects a tensor")
            by_leaf.setdefault(info[1], []).append((req, info))
        for leaf, reqs in sorted(by_leaf.items()):  # one leaf in memory at a time
            _, _, dtype, sizes = reqs[0][1]
            arr = h.read_leaf(self.version, leaf)
            where = os.path.join(self.path, "versions", self.version, str(leaf))
            if arr.shape != sizes or arr.dtype.newbyteorder("=") != \
                    _storage_dtype(dtype).newbyteorder("="):
                raise CorruptCheckpointError(
                    f"version {self.version} of {self.path}: leaf {leaf} is "
                    f"{arr.dtype}{list(arr.shape)}, its DCP metadata says {dtype}{list(sizes)}",
                    key=self.version, path=where)
            stored = numpy_to_tensor(arr, dtype)
            for req, _ in reqs:
                if any(o + n > s for o, n, s in zip(req.storage_offsets, req.lengths, sizes)):
                    raise ValueError(f"the load plan asks for {req.storage_index.fqn!r} "
                                     f"[{list(req.storage_offsets)} + {list(req.lengths)}] "
                                     f"beyond the stored chunk {list(sizes)}")
                src = stored
                for dim, (o, n) in enumerate(zip(req.storage_offsets, req.lengths)):
                    src = src.narrow(dim, o, n)
                target = planner.resolve_tensor(req).detach()
                if target.size() != src.size():
                    raise ValueError(f"{req.storage_index.fqn!r}: the state dict's tensor has "
                                     f"size {list(target.size())}, the plan reads "
                                     f"{list(src.size())}")
                target.copy_(src)
                planner.commit_tensor(req, target)
            del arr, stored
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        """Whether `checkpoint_id` is a local path (a history's directory)."""
        return isinstance(checkpoint_id, (str, os.PathLike)) and "://" not in os.fspath(checkpoint_id)

