"""The writing half of :mod:`vlcc_adjoint.torch.dcp`: :class:`VlccWriter`.

See :mod:`vlcc_adjoint.torch.dcp` for how a save maps onto a History.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import uuid
import zlib
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch
import torch.futures
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult

from ..errors import VlccKeyError, VlccTypeError, VlccValueError
from ..lineage import CorruptCheckpointError, History
from ._dcp_meta import FORMAT, META_KEY, encode_metadata, encode_value, storage_key
from ._dcp_read import read_document
from ._dcp_stage import StagingArea
from ._state import tensor_to_numpy

__all__ = ["VlccWriter"]

#: Tensor chunks smaller than this are packed together into pack leaves ...
PACK_LIMIT = 64 << 10
#: ... of at most this many bytes (named ``PACK_PREFIX<rank>.<n>``).
PACK_BYTES = 1 << 20
PACK_PREFIX = "__pack__."
#: zlib level of the metadata document (leaf 0; nearly the same text at every save).
DOCUMENT_LEVEL = 6


def _spec(keys: Sequence[str], entries: Sequence[dict]) -> dict:
    """The state spec of a version: ``{"dcp_metadata": leaf 0, "items": {key: leaf i}}``."""
    return {
        "format": "vlcc-state/1",
        "tree": {
            "dict": ["dcp_metadata", "items"],
            "items": [
                {"leaf": 0},
                {"dict": list(keys), "items": [{"leaf": i + 1} for i in range(len(keys))]},
            ],
        },
        "leaves": [{"dtype": e["dtype"], "shape": e["shape"]} for e in entries],
    }


def _check_path(path: str | os.PathLike) -> str:
    """`path` made absolute; ``NotADirectoryError`` when it exists and is no directory."""
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(
            f"{path} is not a directory; a VlccWriter saves into a history "
            "directory: give a new path (it is created) or a history's"
        )
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
    - `at`: where `branch` starts if it does not exist yet: a ref (version id,
      tag, ``"main~3"``; e.g. ``VlccReader(...).version`` to branch from the
      version just loaded).  Default: the tip of the history's HEAD branch.
      Ignored once the branch exists.
    - `background`: ``dcp.async_save`` copies into the staging area on a thread:
      it returns an ``AsyncSaveResponse`` at once; wait for its
      ``staging_completion`` before changing the weights (the optimizer step)
      and for ``upload_completion`` for the version.  ``False`` (default): the
      copy happens in ``async_save``, which returns the upload future.
    - `durable`: open the history with ``History(path, durable=True)``: every
      chunk, directory and reference a save writes is fsynced before the
      version becomes visible (the format layer's fsync,
      :mod:`vlcc_adjoint.storage.format`), so a committed save survives a
      power cut, as DCP's ``FileSystemWriter(sync_files=True)`` (its default)
      promises for its files.  ``False`` (default): written to the page cache
      only; a version survives the process (``kill -9``), not the machine.

    Use one writer for a series of saves: :meth:`stage` (the ``dcp.async_save``
    path) then reuses one host staging area (:mod:`._dcp_stage`; its size is
    ``writer.staging.nbytes``).  After a save, :attr:`version` is the new
    version's id (on the coordinator) and :attr:`written_bytes` the chunk bytes
    this process wrote (unchanged chunks cost none); on every rank, the
    metadata ``dcp.save`` returns has ``storage_data["vlcc_version"]``.
    """

    _synchronize_after_execute: bool = False  # stage() copies synchronously

    def __init__(
        self,
        path: str | os.PathLike,
        branch: str = "main",
        message: str = "",
        tags: Sequence[str] = (),
        deltas: bool | None = None,
        *,
        step: int | None = None,
        meta: dict | None = None,
        background: bool = False,
        at: str | None = None,
        durable: bool = False,
    ):
        super().__init__()
        if not isinstance(branch, str):
            raise VlccTypeError(f"branch must be a str, got {type(branch).__name__}")
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
        self.written_bytes = 0
        self.staging = StagingArea()
        self.background = bool(background)
        self.at = at
        self.durable = bool(durable)
        self._base: str | None = None
        self._pack: np.ndarray | None = None
        self._digests: dict[str, bytes] = {}  # small chunk -> its digest at the last save
        self._history: History | None = None
        self._save_id = uuid.uuid4().hex
        self.rank = 0
        self.is_coordinator = True

    def __getstate__(self) -> dict:
        # A writer sent to another process (process-based async saves) opens the
        # history there and stages into its own area.
        state = dict(self.__dict__)
        state["_history"] = None
        state["staging"] = None
        state["_pack"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.staging = StagingArea()

    # -- the history ---------------------------------------------------------------

    def _open(self) -> History:
        if self._history is None or self._history.path != self.path:
            if self._history is not None:
                self._history.close()
            self._history = History(self.path, deltas=self.deltas, durable=self.durable)
        return self._history

    def __enter__(self) -> VlccWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the history this writer opened and free its staging area (both are
        made again by the next save)."""
        self.staging.close()
        if self._history is not None:
            self._history.close()
            self._history = None

    # -- StorageWriter -------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        """A new path (DCP calls it when ``dcp.save`` is given a `checkpoint_id`).

        **Arguments:**

        - `checkpoint_id`: the history directory to save into from now on.
        """
        if checkpoint_id:
            self.path = _check_path(checkpoint_id)
        self._save_id = uuid.uuid4().hex
        self.written_bytes = 0

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Start a save on this process (DCP calls it at every save).

        **Arguments:**

        - `is_coordinator`: whether this process commits the version.
        - `kwargs`: DCP's ``rank`` (and ``use_collectives``).
        """
        self.is_coordinator = bool(is_coordinator)
        self.rank = kwargs.get("rank") or 0
        self._save_id = uuid.uuid4().hex
        self.written_bytes = 0

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Nothing to add to a rank's plan.

        **Arguments:**

        - `plan`: this rank's save plan (returned as it is).
        """
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """On the coordinator: open (create) the history, check the branch and tags, and
        give every rank the parent version (the delta base).

        **Arguments:**

        - `plans`: every rank's plan.

        **Returns:** the plans, each carrying the parent version's id and the
        rank's slot (which names its pack leaves).
        """
        try:
            h = self._open()
            tags = h.tags
            taken = [t for t in self.tags if t in tags]
            if taken:
                raise VlccValueError(
                    f"tag {taken[0]!r} already names version {tags[taken[0]]} in "
                    f"{self.path}; choose another tag, or move it afterwards with "
                    "History.tag(name, version, force=True)"
                )
            parent = h.branches.get(self.branch)
            self._base = None
            if parent is None and self.at is not None:
                try:
                    parent = self._base = h.resolve(self.at)
                except KeyError as err:
                    raise VlccKeyError(
                        f"at={self.at!r} names no version of {self.path} ({err}); "
                        "give a version id, tag, branch or 'branch~n'"
                    ) from None
        except BaseException:
            self.staging.release()
            raise
        return [
            dataclasses.replace(p, storage_data={"parent": parent, "slot": i})
            for i, p in enumerate(plans)
        ]

    def write_data(
        self, plan: SavePlan, planner: SavePlanner
    ) -> torch.futures.Future[list[WriteResult]]:
        """Stage this rank's items into the history (chunks only: no version yet).

        **Arguments:**

        - `plan`: this rank's plan (its items and the parent version).
        - `planner`: DCP's planner, which resolves each item to a tensor or object.

        **Returns:** a completed future of the write results (JSON leaf entries
        for tensors, JSON values for other items), gathered by DCP for ``finish``.
        """
        try:
            results = self._write(plan, planner)
        finally:
            self.staging.release()  # the staged copy has been read
        fut: torch.futures.Future[list[WriteResult]] = torch.futures.Future()
        fut.set_result(results)
        return fut

    def _pack_buffer(self, nbytes: int) -> np.ndarray:
        """The buffer packs are assembled in, of at least `nbytes` (reused
        from one save to the next, grown when a save needs more)."""
        if self._pack is None or self._pack.nbytes < nbytes:
            self._pack = np.empty(nbytes, np.uint8)
        return self._pack

    def _write(self, plan: SavePlan, planner: SavePlanner) -> list[WriteResult]:
        h = self._open()
        parent = (plan.storage_data or {}).get("parent")
        slot = (plan.storage_data or {}).get("slot", self.rank)  # unique per rank
        results: list[WriteResult] = []
        own: list[tuple[Any, np.ndarray]] = []  # (item, array)
        small: list[tuple[Any, np.ndarray]] = []
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:
                if hasattr(planner, "lookup_object"):
                    obj = planner.lookup_object(item.index)
                else:  # a planner of another kind: its stream, read back as plain data
                    stream = planner.resolve_data(item)
                    if not isinstance(stream, io.BytesIO):
                        raise VlccTypeError(
                            f"the planner resolved the bytes item {item.index.fqn!r} to a "
                            f"{type(stream).__name__}, not a byte stream"
                        )
                    stream.seek(0)
                    obj = torch.load(stream, weights_only=True)
                value = encode_value(obj, f"state_dict[{item.index.fqn!r}]")
                results.append(
                    WriteResult(index=item.index, size_in_bytes=0, storage_data={"value": value})
                )
                continue
            t = planner.resolve_data(item)
            if not isinstance(t, torch.Tensor):
                raise VlccTypeError(
                    f"the planner resolved {item.index.fqn!r} to a {type(t).__name__}, not a tensor"
                )
            t = t.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            arr = tensor_to_numpy(t.contiguous()).reshape(tuple(t.shape))  # 0-d stays 0-d
            (small if arr.nbytes < PACK_LIMIT else own).append((item, arr))
        # Small chunks travel in pack leaves of about PACK_BYTES: one file for many
        # biases and norms instead of one each (file creation dominates their cost).
        packs = self._packs(small)
        keys = [storage_key(i.index) for i, _ in own]
        pack_keys = [f"{PACK_PREFIX}{slot}.{j}" for j in range(len(packs))]
        where = self._parent_leaves(h, parent) if parent is not None and h.deltas else None
        entries = h.stage(
            [a for _, a in own],
            base=parent if where else None,
            base_leaves=[where.get(k) for k in keys] if where else None,
        )
        for (item, arr), key, entry in zip(own, keys, entries):
            self.written_bytes += entry["written"]
            results.append(
                WriteResult(
                    index=item.index,
                    size_in_bytes=arr.nbytes,
                    storage_data={"key": key, "leaf": entry},
                )
            )
        buffer = self._pack_buffer(min(PACK_BYTES, sum(a.nbytes for _, a in small)))
        for pack, pack_key in zip(packs, pack_keys):
            _, last, end = pack[-1]
            view = buffer[: end + last.nbytes]  # the pack's bytes, at the buffer's start
            for item, arr, off in pack:
                view[off : off + arr.nbytes] = arr.reshape(-1).view(np.uint8)
            (entry,) = h.stage(
                [view],
                base=parent if where else None,
                base_leaves=[where.get(pack_key)] if where else None,
            )
            self.written_bytes += entry["written"]
            for k, (item, arr, off) in enumerate(pack):
                sd = {"key": storage_key(item.index), "pack": pack_key, "offset": off}
                if k == 0:
                    sd["pack_leaf"] = entry
                results.append(
                    WriteResult(index=item.index, size_in_bytes=arr.nbytes, storage_data=sd)
                )
        return results

    def _packs(self, small: list) -> list[list]:
        """Lay the small chunks out in packs, ``[[(item, array, offset), ...], ...]``.

        The chunks whose bytes are those of this writer's last save come first, in
        plan order, then the others: when the same chunks stay unchanged from save
        to save (a frozen base's norms and biases), their packs are the same bytes
        again and cost nothing (the chunks are content-addressed), and only the
        packs of the changing ones are written.
        """
        digests: dict[str, bytes] = {}
        same: list[Any] = []
        other: list[Any] = []
        for item, arr in small:
            key = storage_key(item.index)
            digests[key] = hashlib.blake2b(arr.reshape(-1).view(np.uint8), digest_size=16).digest()
            (same if self._digests.get(key) == digests[key] else other).append((item, arr))
        self._digests = digests
        packs: list[list] = []
        for group in (same, other):
            size = PACK_BYTES
            for item, arr in group:
                if size + arr.nbytes > PACK_BYTES:
                    packs.append([])
                    size = 0
                packs[-1].append((item, arr, size))
                size += arr.nbytes
        return packs

    @staticmethod
    def _parent_leaves(h: History, parent: str) -> dict[str, int] | None:
        """The parent version's leaves by name (delta bases), or ``None``."""
        try:
            _md, _storage, leaf_keys = read_document(h, parent)
        except (ValueError, KeyError, CorruptCheckpointError):
            return None  # not a DCP version, or unreadable: full chunks
        return {k: i for i, k in enumerate(leaf_keys)}

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """On the coordinator: commit every rank's staged items as one version.

        **Arguments:**

        - `metadata`: DCP's metadata of the save (stored as JSON, leaf 0).
        - `results`: every rank's write results.
        """
        h = self._open()
        entries: dict[str, dict] = {}  # leaf name -> staged leaf entry
        chunks: dict[str, tuple[str, int | None]] = {}  # storage key -> (leaf name, offset)
        values: dict[str, Any] = {}
        for rank_results in results:
            for wr in rank_results:
                sd = wr.storage_data
                if not isinstance(sd, dict):
                    raise VlccTypeError(
                        f"write result for {wr.index.fqn!r} is not from a VlccWriter"
                    )
                if "value" in sd:
                    values[wr.index.fqn] = sd["value"]
                elif "pack" in sd:
                    chunks[sd["key"]] = (sd["pack"], sd["offset"])
                    if "pack_leaf" in sd:
                        if sd["pack"] in entries:
                            raise VlccValueError(f"two ranks wrote the pack {sd['pack']!r}")
                        entries[sd["pack"]] = sd["pack_leaf"]
                else:
                    chunks[sd["key"]] = (sd["key"], None)
                    entries[sd["key"]] = sd["leaf"]
        keys = sorted(entries)
        index = {k: i + 1 for i, k in enumerate(keys)}
        leaf_of = {key: (index[name], off) for key, (name, off) in chunks.items()}
        metadata.storage_meta = self.storage_meta()
        doc = encode_metadata(metadata, leaf_of, values, ["dcp_metadata"] + keys)
        text = json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()
        packed = zlib.compress(text, DOCUMENT_LEVEL)
        first = h.stage([np.frombuffer(packed, np.uint8)])[0]
        self.written_bytes += first["written"]
        leaves = [first] + [entries[k] for k in keys]
        meta: dict[str, Any] = {} if self.step is None else {"step": self.step}
        meta.update(self.meta)
        meta[META_KEY] = {
            "format": FORMAT,
            "items": len(doc["items"]),
            "leaves": len(keys),
            "ranks": len(results),
            "document": "zlib",
        }
        self.version = h.commit_staged(
            _spec(keys, leaves), leaves, self.message, meta, branch=self.branch, at=self._base
        )
        for tag in self.tags:
            h.tag(tag, self.version)
        # dcp.save returns this metadata on every rank: each learns the version.
        metadata.storage_data = {
            "vlcc_version": self.version,
            "branch": self.branch,
            "path": self.path,
        }

    def storage_meta(self) -> StorageMeta | None:
        """The checkpoint id (the path) and this save's id."""
        return StorageMeta(checkpoint_id=self.path, save_id=self._save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        """Whether `checkpoint_id` is a local path (**Arguments:** `checkpoint_id`)."""
        return isinstance(checkpoint_id, (str, os.PathLike)) and "://" not in os.fspath(
            checkpoint_id
        )

    # -- AsyncStager (dcp.async_save) -----------------------------------------------

    def stage(self, state_dict: dict) -> dict | Future:
        """Copy `state_dict` into this writer's reusable staging area (``dcp.async_save``).

        **Arguments:**

        - `state_dict`: the state dict being saved.

        **Returns:** a state dict of the same structure over the staging area
        (training may change the original at once), or with `background`, a
        future of it.  The area holds exactly the rank's shard
        (``writer.staging.nbytes``) and is reused by every save.
        """
        if self.background:
            return self.staging.stage_in_background(state_dict)
        return self.staging.stage(state_dict)
