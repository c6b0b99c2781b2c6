"""The reading half of :mod:`vlcc_adjoint.torch.dcp`: :class:`VlccReader`.

See :mod:`vlcc_adjoint.torch.dcp` for the checks a read makes.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import uuid
import zlib
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from ..errors import VlccFileNotFoundError, VlccKeyError, VlccValueError
from ..lineage import CorruptCheckpointError, History
from ..storage import format as SF
from ._dcp_meta import FORMAT, META_KEY, decode_metadata
from ._state import numpy_to_tensor, storage_dtype

__all__ = ["VlccReader", "read_document"]


#: The largest metadata document read (about 200 bytes per stored tensor chunk).
MAX_DOCUMENT_BYTES = 1 << 30


def _inflate(packed: bytes) -> bytes:
    """The JSON text of a zlib-compressed metadata document, of at most
    ``MAX_DOCUMENT_BYTES`` (``ValueError`` when longer, cut short or followed by more)."""
    d = zlib.decompressobj()
    text = d.decompress(packed, MAX_DOCUMENT_BYTES + 1)
    if len(text) > MAX_DOCUMENT_BYTES:
        raise VlccValueError(f"the document inflates to more than {MAX_DOCUMENT_BYTES} bytes")
    if not d.eof or d.unused_data:
        raise VlccValueError("the compressed document is cut short or followed by other bytes")
    return text


def read_document(h: History, vid: str) -> tuple[Metadata, dict, list[str]]:
    """The decoded metadata document of version `vid` (checked)."""
    v = h.version(vid)
    mark = v.meta.get(META_KEY)
    if not (isinstance(mark, dict) and mark.get("format") == FORMAT):
        raise VlccValueError(
            f"version {vid} of {h.path} was not written by VlccWriter (its "
            f"metadata has no {META_KEY!r} entry of format {FORMAT}); read it with "
            "History.load / History.checkout, or load a version that dcp.save wrote"
        )
    infos = h.leaves(vid)
    manifest = os.path.join(h.path, "versions", vid, "0")
    first = infos[0] if infos else None
    if (
        first is None
        or np.dtype(first.dtype) != np.uint8
        or len(first.shape) != 1
        or first.nbytes > MAX_DOCUMENT_BYTES
    ):
        what = "missing" if first is None else f"{first.dtype}{list(first.shape)}"
        raise CorruptCheckpointError(
            f"version {vid} of {h.path}: its DCP metadata leaf is "
            f"{what}, not a JSON text of at most {MAX_DOCUMENT_BYTES} "
            "bytes",
            key=vid,
            path=manifest,
        )
    raw = h.read_leaf(vid, 0)
    try:
        text = raw.tobytes()
        if mark.get("document") == "zlib":
            text = _inflate(text)
        doc = SF.parse_json(text, manifest)  # strict: no NaN, no duplicate keys
        md, storage, leaf_keys = decode_metadata(doc, len(infos))
        # Every chunk's leaf must hold what the metadata says (reads are sized by it).
        for index, info in storage.items():
            if info[0] != "leaf":
                continue
            _, i, dtype, sizes, offset = info
            leaf = infos[i]
            stored = np.dtype(leaf.dtype)
            want = storage_dtype(dtype)
            if offset is not None:  # a run of bytes in a pack leaf
                end = offset + math.prod(sizes) * want.itemsize
                if stored != np.uint8 or len(leaf.shape) != 1 or end > leaf.shape[0]:
                    raise VlccValueError(
                        f"leaf {i} is {leaf.dtype}{list(leaf.shape)}, the metadata "
                        f"says {index.fqn!r} lies in its bytes {offset}:{end}"
                    )
            elif tuple(leaf.shape) != sizes or stored.newbyteorder("=") != want.newbyteorder("="):
                raise VlccValueError(
                    f"leaf {i} is {leaf.dtype}{list(leaf.shape)}, the "
                    f"metadata says {index.fqn!r} is {dtype}{list(sizes)} there"
                )
        return md, storage, leaf_keys
    except (ValueError, TypeError, RecursionError, zlib.error, CorruptCheckpointError) as err:
        raise CorruptCheckpointError(
            f"version {vid} of {h.path}: its DCP metadata is invalid ({err}); load another version",
            key=vid,
            path=manifest,
        ) from None


def _check_request(req, sizes: tuple) -> None:
    """A load request must lie inside the stored chunk it reads."""
    if len(req.storage_offsets) != len(sizes) or any(
        o + n > s for o, n, s in zip(req.storage_offsets, req.lengths, sizes)
    ):
        raise VlccValueError(
            f"the load plan asks for {req.storage_index.fqn!r} "
            f"[{list(req.storage_offsets)} + {list(req.lengths)}] "
            f"beyond the stored chunk {list(sizes)}"
        )


def _copy_out(stored: torch.Tensor, req, row0: int, planner: LoadPlanner) -> None:
    """Copy a request's part of `stored` (whose first row is row `row0` of the stored
    chunk) into the planner's tensor."""
    src = stored
    for dim, (o, n) in enumerate(zip(req.storage_offsets, req.lengths)):
        src = src.narrow(dim, o - row0 if dim == 0 else o, n)
    target = planner.resolve_tensor(req).detach()
    if target.size() != src.size():
        raise VlccValueError(
            f"{req.storage_index.fqn!r}: the state dict's tensor has size "
            f"{list(target.size())}, the plan reads {list(src.size())}"
        )
    target.copy_(src)
    planner.commit_tensor(req, target)


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
            raise VlccFileNotFoundError(
                f"no history at {self.path}: the path is not a directory; "
                "give VlccReader the directory a VlccWriter saved to"
            )
        h = History(self.path, mode="r")
        try:
            try:
                vid = h.resolve(self.ref)
            except KeyError as err:
                branches = ", ".join(sorted(h.branches)[:8]) or "none"
                raise VlccKeyError(
                    f"{self.ref!r} names no version of the history at {self.path} "
                    f"({err.args[0] if err.args else err}); branches: {branches}. "
                    "Give a branch, tag, version id or 'branch~n'"
                ) from None
            self._metadata, self._storage, _ = read_document(h, vid)
        except BaseException:
            h.close()
            raise
        self._history = h
        self.version = vid

    def __enter__(self) -> VlccReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

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

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
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
                raise VlccKeyError(
                    f"{req.storage_index.fqn!r} (offsets {req.storage_index.offset}) "
                    f"is not in version {self.version} of {self.path}"
                )
            if req.type == LoadItemType.BYTE_IO:
                if info[0] != "value":
                    raise VlccValueError(
                        f"{req.storage_index.fqn!r} is a tensor in version "
                        f"{self.version}, the state dict expects an object"
                    )
                stream = io.BytesIO()
                torch.save(info[1], stream)
                stream.seek(0)
                planner.load_bytes(req, stream)
                continue
            if info[0] != "leaf":
                raise VlccValueError(
                    f"{req.storage_index.fqn!r} is a non-tensor item in version "
                    f"{self.version}, the state dict expects a tensor"
                )
            by_leaf.setdefault(info[1], []).append((req, info))
        for leaf, reqs in sorted(by_leaf.items()):  # one leaf in memory at a time
            if reqs[0][1][4] is not None:
                self._read_packed(leaf, reqs, planner)
                continue
            _, _, dtype, sizes, _ = reqs[0][1]
            for req, _ in reqs:
                _check_request(req, sizes)
            # Only the rows (first axis) some request needs: a rank of a larger world
            # reads its part of a stored shard, not all of it.
            lo = min(r.storage_offsets[0] for r, _ in reqs) if sizes else 0
            hi = max(r.storage_offsets[0] + r.lengths[0] for r, _ in reqs) if sizes else 0
            arr = h.read_leaf(self.version, leaf, rows=(lo, hi) if sizes else None)
            want = (hi - lo,) + tuple(sizes[1:]) if sizes else ()
            self._check_array(leaf, arr, dtype, want, sizes)
            stored = numpy_to_tensor(arr, dtype)
            for req, _ in reqs:
                _copy_out(stored, req, lo, planner)
            del arr, stored
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _read_packed(self, leaf: int, reqs: list, planner: LoadPlanner) -> None:
        """The requests of chunks packed into one leaf: the byte range they span is read."""
        spans = []
        for req, (_, _, dtype, sizes, offset) in reqs:
            _check_request(req, sizes)
            spans.append((offset, offset + math.prod(sizes) * storage_dtype(dtype).itemsize))
        lo = min(a for a, _ in spans)
        hi = max(b for _, b in spans)
        raw = self._history.read_leaf(self.version, leaf, rows=(lo, hi))
        self._check_array(leaf, raw, torch.uint8, (hi - lo,), (hi - lo,))
        for (req, (_, _, dtype, sizes, _)), (a, b) in zip(reqs, spans):
            arr = raw[a - lo : b - lo].view(storage_dtype(dtype)).reshape(sizes)
            _copy_out(numpy_to_tensor(arr, dtype), req, 0, planner)

    def _check_array(
        self, leaf: int, arr: np.ndarray, dtype: torch.dtype, want: tuple, sizes: tuple
    ) -> None:
        if arr.shape != want or arr.dtype.newbyteorder("=") != storage_dtype(dtype).newbyteorder(
            "="
        ):
            raise CorruptCheckpointError(
                f"version {self.version} of {self.path}: leaf {leaf} holds "
                f"{arr.dtype}{list(arr.shape)} there, its DCP metadata says "
                f"{dtype}{list(want)} (of a chunk {list(sizes)})",
                key=self.version,
                path=os.path.join(self.path, "versions", self.version, str(leaf)),
            )

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        """Whether `checkpoint_id` is a local path (**Arguments:** `checkpoint_id`)."""
        return isinstance(checkpoint_id, (str, os.PathLike)) and "://" not in os.fspath(
            checkpoint_id
        )
