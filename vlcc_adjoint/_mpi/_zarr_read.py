"""Reading a distributed hierarchy: any number of ranks, or serially, no MPI needed.

The layout is :mod:`._zarr`'s.  A committed record's ``zarr.json`` is sealed
with a digest (:func:`vlcc_adjoint.storage.format.sealed_group`) over its
whole description: the global spec (structure, names, scalars, the leaf
mapping), every leaf's dtype, global shape, decomposition and chunk shape,
the checksum of each replicated leaf and the xxh3-64 of each distributed
leaf's checksum array.  The checksum array in turn covers every chunk, so
one digest covers the whole record.  A reader reads only that file, the
checksum arrays and the chunks it needs, each through
:mod:`vlcc_adjoint.storage.format` (no links, regular files only, sizes
checked before anything is read); the leaf arrays' own ``zarr.json`` are
for plain zarr readers and never read here.  Records of format 1 (before
the digest) are still read, their chunk checksums as their protection.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import xxhash

from ..errors import VlccKeyError, VlccValueError
from ..state import byte_view, unflatten
from ..storage import CorruptCheckpointError, StorageError, leaf_checksum
from ..storage import format as F
from ._decomp import Decomposition, distributed_nodes, reader_decomposition

__all__ = ["FORMATS", "RECORD", "check_record", "list_checkpoints", "read_checkpoint"]

#: Record formats this version reads (it writes the last).
FORMATS = (1, 2)
HIERARCHY = "vlcc-distributed-hierarchy"
RECORD = "vlcc-distributed-record"
ATTRS = "vlcc_adjoint"
_RECORD_KEYS = {"format", "kind", "key", "step", "nranks", "spec", "leaves"}


def xxh(data) -> int:
    """xxh3-64 of a buffer's bytes, as an int (the checksum arrays' values)."""
    return xxhash.xxh3_64_intdigest(memoryview(data).cast("B"))


def check_record(record_dir: str) -> dict:
    """The description of the committed record in `record_dir`, checked
    against its digest (format 2) and validated before anything is
    allocated from it.

    Raises ``FileNotFoundError`` when there is no record, and
    :class:`CorruptCheckpointError` naming the file for anything else that
    is not an intact record.
    """
    F.check_dir(record_dir)
    path = os.path.join(record_dir, "zarr.json")
    doc = F.open_group(path, ATTRS, group=False)
    if type(doc) is not dict or doc.get("kind") != RECORD:
        raise F.corrupt_file(path, "is not a distributed vlcc_adjoint record")
    fmt = doc.get("format")
    if type(fmt) is not int or fmt not in FORMATS:
        raise F.corrupt_file(
            path,
            f"is a record of format {fmt!r}; this version reads formats "
            f"{', '.join(map(str, FORMATS))} (upgrade vlcc_adjoint to read newer ones)",
        )
    if fmt >= 2:
        doc = F.unseal(doc, path)
    if set(doc) != _RECORD_KEYS:
        raise F.corrupt_file(
            path, f"has attributes {sorted(doc)}, a format-{fmt} record has {sorted(_RECORD_KEYS)}"
        )
    if (
        type(doc["spec"]) is not dict
        or type(doc["leaves"]) is not list
        or type(doc["nranks"]) is not int
        or not (doc["step"] is None or type(doc["step"]) is int)
    ):
        raise F.corrupt_file(path, "has no spec object, leaves list, rank count or step")
    for i, leaf in enumerate(doc["leaves"]):
        if type(leaf) is not dict:
            raise F.corrupt_file(path, f"describes leaf {i} with something that is not an object")
        try:
            _check_leaf(leaf, fmt, path)
        except (KeyError, TypeError, ValueError) as err:
            raise F.corrupt_file(path, f"describes leaf {i} inconsistently ({err!r})") from None
    return doc


def _check_leaf(leaf: dict, fmt: int, path: str) -> None:
    dtype, shape, _ = F.check_leaf(leaf["dtype"], leaf["shape"], path)
    if not leaf["distributed"]:
        if leaf["chunk"] is not None and leaf["chunk"] != F.chunk_key(
            [0] * (len(shape) + (0 if F.zarr_data_type(dtype) else 1))
        ):
            raise VlccValueError(f"unexpected chunk key {leaf['chunk']!r}")
        if type(leaf["checksum"]) is not str:
            raise VlccValueError("no checksum")
        return
    if F.zarr_data_type(dtype) is None:
        raise VlccValueError(f"a distributed leaf of dtype {dtype}")
    chunks = leaf["chunk_shape"]
    if not (
        type(chunks) is list
        and len(chunks) == len(shape)
        and all(type(c) is int and c > 0 for c in chunks)
    ):
        raise VlccValueError(f"chunk shape {chunks!r}")
    F.check_allocation(int(np.prod(chunks, dtype=object)) * dtype.itemsize, path, "a chunk")
    grid = int(np.prod([-(-n // c) for n, c in zip(shape, chunks)], dtype=object))
    F.check_allocation(8 * grid, path, "chunk checksums")
    if Decomposition.from_json(leaf["decomposition"]).global_shape != shape:
        raise VlccValueError("a decomposition of another shape")
    if (
        leaf["checksums"] != f"xxh3/{leaf['checksums'].rsplit('/', 1)[-1]}"
        or not leaf["checksums"].rsplit("/", 1)[-1].isdigit()
    ):
        raise VlccValueError(f"checksum array {leaf['checksums']!r}")
    if fmt >= 2 and type(leaf["checksums_xxh3"]) is not str:
        raise VlccValueError("no checksum of the checksum array")


def read_chunk(path: str, dtype, chunk_shape, key, tier, step, leaf) -> np.ndarray:
    """Chunk file `path` of leaf `leaf`, whose size must be the declared one."""
    out = np.empty(chunk_shape, dtype)
    try:
        F.read_into(path, byte_view(out))
    except FileNotFoundError:
        raise CorruptCheckpointError.in_record(
            f"the chunk file {path} of leaf {leaf} is missing", key, tier, step, path
        ) from None
    except CorruptCheckpointError as err:
        raise CorruptCheckpointError.in_record(
            f"leaf {leaf}: {err}", key, tier, step, path
        ) from None
    except OSError as err:
        raise StorageError(f"could not read record {key!r} from {tier!r}: {err}") from err
    return out


def place(out, origin, chunk, idx, chunk_shape, global_shape) -> None:
    """Copy the part of `chunk` (grid index `idx`) inside `out`'s block."""
    src, dst = [], []
    for k, c, o, n, m in zip(idx, chunk_shape, origin, out.shape, global_shape):
        lo = max(k * c, o)
        hi = min((k + 1) * c, o + n, m)
        if hi <= lo:
            return
        src.append(slice(lo - k * c, hi - k * c))
        dst.append(slice(lo - o, hi - o))
    out[tuple(dst)] = chunk[tuple(src)]


def list_checkpoints(path: str | os.PathLike) -> list[dict]:
    """The committed records of a distributed hierarchy, oldest first.

    **Returns:** one dict per record: ``name`` (the directory), ``key``,
    ``step``, ``nranks`` (how many ranks wrote it), ``leaves`` (dtype,
    global shape, whether distributed) and ``damaged``: ``None``, or what
    is wrong with a record that cannot be read (it is listed, never
    dropped; its other fields are then ``None``).  Needs no MPI.
    """
    path = os.path.abspath(os.fspath(path))
    F.check_dir(path)
    out: list[dict[str, Any]] = []
    for entry in os.scandir(path):
        if entry.name.startswith(".") or entry.name == "zarr.json":
            continue
        damaged = None
        try:
            doc = check_record(entry.path)
        except FileNotFoundError:
            damaged = "it has no zarr.json"
        except CorruptCheckpointError as err:
            damaged = str(err)
        mtime = entry.stat(follow_symlinks=False).st_mtime
        if damaged is not None:
            out.append(
                {
                    "name": entry.name,
                    "key": None,
                    "step": None,
                    "nranks": None,
                    "mtime": mtime,
                    "leaves": None,
                    "damaged": damaged,
                }
            )
            continue
        out.append(
            {
                "name": entry.name,
                "key": doc["key"],
                "step": doc["step"],
                "nranks": doc["nranks"],
                "mtime": mtime,
                "damaged": None,
                "leaves": [
                    {k: leaf.get(k) for k in ("dtype", "shape", "distributed")}
                    for leaf in doc["leaves"]
                ],
            }
        )
    out.sort(key=lambda r: (r["mtime"], r["name"]))
    return out


def read_checkpoint(
    path: str | os.PathLike,
    name: str | None = None,
    *,
    step: int | None = None,
    comm: Any = None,
    rank: int | None = None,
    decomposition: Decomposition | Callable | None = None,
) -> Any:
    """Restore a committed record on this rank: any number of ranks, or serially.

    Each rank reads only the chunks that overlap its block, verifies their
    checksums, and assembles its block.  Collective in nothing: ranks read
    independently (no MPI is needed, `comm` only supplies rank and size).

    **Arguments:**

    - `path`: the hierarchy (written by a :class:`SharedZarrTier`).
    - `name`: the record's directory (:func:`list_checkpoints`); or `step`:
      the most recent committed record of that step.
    - `comm`: the reader's communicator (rank and size); ``None``: serial,
      each distributed leaf is read whole (one block).
    - `rank`: this reader's rank (default ``comm.Get_rank()`` or 0).
    - `decomposition`: the reader's :class:`Decomposition`, for leaves of
      its global shape; or a callable ``global_shape -> Decomposition``;
      default: slabs along axis 0 over ``comm.Get_size()`` ranks
      (:meth:`Decomposition.split`), or one block when serial.

    **Returns:** the state, with every distributed leaf as a
    :class:`~vlcc_adjoint.mpi.DistributedArray` of the reader's
    decomposition.

    Raises ``KeyError`` when no record matches, and
    :class:`~vlcc_adjoint.storage.CorruptCheckpointError` naming the file
    for a missing or damaged record, chunk or checksum array.
    """
    path = os.path.abspath(os.fspath(path))
    if name is None:
        if step is None:
            raise VlccValueError("pass the record's name (see list_checkpoints) or its step")
        found = [r for r in list_checkpoints(path) if r["step"] == step]
        if not found:
            raise VlccKeyError(
                f"no committed record of step {step} in {path}; list them with "
                "vlcc_adjoint.mpi.list_checkpoints"
            )
        name = found[-1]["name"]
    if name.startswith(".") or os.sep in name or name in ("", "zarr.json"):
        raise VlccKeyError(f"no committed record {name!r} in {path}")
    record_dir = os.path.join(path, name)
    try:
        doc = check_record(record_dir)
    except FileNotFoundError:
        raise VlccKeyError(f"no committed record {name!r} in {path}") from None
    except CorruptCheckpointError as err:
        raise CorruptCheckpointError(
            f"record {name!r} in {path} is corrupt: {err}", key=name, tier=path, path=err.path
        ) from None
    size = 1 if comm is None else comm.Get_size()
    if rank is None:
        rank = 0 if comm is None else comm.Get_rank()
    spec = doc["spec"]
    step_no = doc["step"]
    targets: dict[int, Decomposition] = {}
    leaves = []
    for i, info in enumerate(doc["leaves"]):
        dtype, shape, _ = F.check_leaf(info["dtype"], info["shape"], record_dir)
        if not info["distributed"]:
            if info["chunk"] is None:
                leaves.append(np.empty(shape, dtype))
                continue
            raw = F.zarr_data_type(dtype) is None
            data = read_chunk(
                os.path.join(record_dir, str(i), info["chunk"]),
                np.dtype(np.uint8) if raw else dtype,
                shape + (dtype.itemsize,) if raw else shape,
                name,
                path,
                step_no,
                i,
            )
            arr = data.reshape(-1).view(dtype).reshape(shape)
            if leaf_checksum(arr) != info["checksum"]:
                raise CorruptCheckpointError.in_record(
                    f"replicated leaf {i} failed its checksum", name, path, step_no
                )
            leaves.append(arr)
            continue
        target = reader_decomposition(decomposition, shape, size)
        targets[i] = target
        chunk_shape = tuple(info["chunk_shape"])
        grid = _read_sums(record_dir, info, shape, chunk_shape, name, path, step_no, i)
        out = np.empty(target.local_shape(rank), dtype)
        box = target.block(rank)
        origin = target.offsets(rank)
        ranges = [
            range(lo // c, -(-hi // c)) if hi > lo else range(0)
            for (lo, hi), c in zip(box, chunk_shape)
        ]
        for idx in np.ndindex(*(len(r) for r in ranges)):
            idx = tuple(r[k] for r, k in zip(ranges, idx))
            data = read_chunk(
                os.path.join(record_dir, str(i), F.chunk_key(idx)),
                dtype,
                chunk_shape,
                name,
                path,
                step_no,
                i,
            )
            if xxh(byte_view(data)) != int(grid[idx]):
                raise CorruptCheckpointError.in_record(
                    f"chunk {F.chunk_key(idx)} of leaf {i} failed its checksum",
                    name,
                    path,
                    step_no,
                    os.path.join(record_dir, str(i), F.chunk_key(idx)),
                )
            place(out, origin, data, idx, chunk_shape, shape)
        leaves.append(out)
    return unflatten(local_spec(spec, targets, rank), leaves)


def local_spec(global_spec: dict, targets: dict, rank: int) -> dict:
    """A reader's spec: distributed leaves get its decomposition and block."""
    out = copy.deepcopy(global_spec)
    for node in distributed_nodes(out["tree"]):
        i = node["items"][0]["leaf"]
        d = targets[i]
        node["aux"] = {"decomposition": d.to_json(), "rank": rank}
        out["leaves"][i]["shape"] = list(d.local_shape(rank))
    return out


def _read_sums(record_dir, info, shape, chunk_shape, key, tier, step, leaf) -> np.ndarray:
    """The chunk checksums of a distributed leaf, checked against the record's
    checksum of them (format 2)."""
    grid_shape = tuple(-(-n // c) for n, c in zip(shape, chunk_shape))
    if 0 in grid_shape:
        return np.zeros(grid_shape, np.uint64)
    sums_path = os.path.join(record_dir, info["checksums"], F.chunk_key([0] * len(grid_shape)))
    grid = read_chunk(sums_path, np.dtype("<u8"), grid_shape, key, tier, step, leaf)
    want = info.get("checksums_xxh3")
    if want is not None and leaf_checksum(grid) != want:
        raise CorruptCheckpointError.in_record(
            f"the chunk checksums of leaf {leaf} failed their checksum", key, tier, step, sums_path
        )
    return grid
