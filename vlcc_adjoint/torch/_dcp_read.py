"""The reading half of :mod:`vlcc_adjoint.torch.dcp`: :class:`VlccReader`.

See :mod:`vlcc_adjoint.torch.dcp` for the checks a read makes.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import uuid
from typing import Any

import numpy as np
import torch
from torch.futures import Future
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader

from ..lineage import CorruptCheckpointError, History
from ._dcp_meta import FORMAT, META_KEY, decode_metadata
from ._state import _storage_dtype, numpy_to_tensor

__all__ = ["VlccReader", "read_document"]


def read_document(h: History, vid: str) -> tuple[Metadata, dict]:
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
        md, storage = decode_metadata(doc, n)
        # Every chunk's leaf must hold what the metadata says (reads are sized by it).
        infos = h.leaves(vid)
        for index, info in storage.items():
            if info[0] != "leaf":
                continue
            leaf = infos[info[1]]
            stored = np.dtype(leaf.dtype)
            if tuple(leaf.shape) != info[3] or \
                    stored.newbyteorder("=") != _storage_dtype(info[2]).newbyteorder("="):
                raise ValueError(f"leaf {info[1]} is {leaf.dtype}{list(leaf.shape)}, the "
                                 f"metadata says {index.fqn!r} is {info[2]}{list(info[3])} there")
        return md, storage
    except (ValueError, TypeError, RecursionError) as err:
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
            self._metadata, self._storage = read_document(h, vid)
        except BaseException:
            h.close()
            raise
        self._history = h
        self.version = vid

    def close(self) -> None:
        """Close the history (reopened by the next ``reset`` with a checkpoint id)."""
        self._history.close()

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        """Start a load (DCP calls it); a `checkpoint_id` replaces the path.

        **Arguments:**

        - `checkpoint_id`: another history directory (opened and checked at once).
        """
        if checkpoint_id and os.path.abspath(os.fspath(checkpoint_id)) != self.path:
            self._history.close()
            self.path = os.path.abspath(os.fspath(checkpoint_id))
            self._open()
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The version's DCP metadata (decoded from JSON, checked at construction).

        **Arguments:**

        - `args`, `kwargs`: ignored (DCP may pass ``rank``; the metadata is global).
        """
        md = self._metadata
        sm = md.storage_meta or StorageMeta()
        sm = dataclasses.replace(sm, load_id=self.load_id)
        return dataclasses.replace(md, storage_meta=sm, storage_data=self._storage)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        """Nothing to set up: the storage map was read with the metadata.

        **Arguments:**

        - `metadata`: as returned by :meth:`read_metadata`.
        - `is_coordinator`: unused.
        """

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Nothing to add to a rank's plan (**Arguments:** `plan`, returned as it is)."""
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """Nothing to add to the global plan (**Arguments:** `plans`, returned as they are)."""
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read the items of this rank's plan: per stored leaf, once, only the rows
        the plan needs, every chunk verified.

        **Arguments:**

        - `plan`: this rank's load plan.
        - `planner`: DCP's planner, which receives each tensor and object.

        **Returns:** a completed future.
        """
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
            for req, _ in reqs:
                if len(req.storage_offsets) != len(sizes) or any(
                        o + n > s for o, n, s in zip(req.storage_offsets, req.lengths, sizes)):
                    raise ValueError(f"the load plan asks for {req.storage_index.fqn!r} "
                                     f"[{list(req.storage_offsets)} + {list(req.lengths)}] "
                                     f"beyond the stored chunk {list(sizes)}")
            # Only the rows (first axis) some request needs: a rank of a larger world
            # reads its part of a stored shard, not all of it.
            lo = min((r.storage_offsets[0] for r, _ in reqs), default=0) if sizes else 0
            hi = max((r.storage_offsets[0] + r.lengths[0] for r, _ in reqs), default=0) \
                if sizes else 0
            arr = h.read_leaf(self.version, leaf, rows=(lo, hi) if sizes else None)
            where = os.path.join(self.path, "versions", self.version, str(leaf))
            want = (hi - lo,) + tuple(sizes[1:]) if sizes else ()
            if arr.shape != want or arr.dtype.newbyteorder("=") != \
                    _storage_dtype(dtype).newbyteorder("="):
                raise CorruptCheckpointError(
                    f"version {self.version} of {self.path}: leaf {leaf} holds "
                    f"{arr.dtype}{list(arr.shape)} there, its DCP metadata says "
                    f"{dtype}{list(want)} (of a chunk {list(sizes)})",
                    key=self.version, path=where)
            stored = numpy_to_tensor(arr, dtype)
            for req, _ in reqs:
                src = stored
                for dim, (o, n) in enumerate(zip(req.storage_offsets, req.lengths)):
                    src = src.narrow(dim, o - lo if dim == 0 else o, n)
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
        """Whether `checkpoint_id` is a local path (**Arguments:** `checkpoint_id`)."""
        return isinstance(checkpoint_id, (str, os.PathLike)) and "://" not in os.fspath(checkpoint_id)
