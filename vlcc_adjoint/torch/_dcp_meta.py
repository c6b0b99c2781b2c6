"""JSON forms of what ``torch.distributed.checkpoint`` keeps beside the tensors.

DCP's own file system backend pickles its ``Metadata`` (and ``torch.save``s
every non-tensor item).  A checkpoint read back through pickle executes
whatever the file says, so the backend in :mod:`vlcc_adjoint.torch.dcp`
never unpickles anything from a store; this module encodes and decodes, as
strict JSON, with every field checked on the way back:

- the ``Metadata``: per state-dict key, a tensor (dtype from an allow-list,
  global size, ``requires_grad``, and its stored chunks: offsets, sizes and
  the version leaf that holds each, with a byte offset when that leaf packs
  several small chunks) or a non-tensor item with its value;
  the planner's data (the default planner's flatten mapping: key paths of
  strings and integers) and the storage meta;
- non-tensor values (``BytesStorageMetadata`` items: an optimizer's
  ``param_groups``, step counters, scheduler states...): ``None``, bools,
  integers, floats (non-finite ones too), strings, bytes, lists, tuples and
  dicts (keys of those scalar types, order kept), as tagged JSON.  DCP hands
  a loaded item to its planner as a ``torch.save`` stream, which the planner
  reads with ``torch.load(weights_only=True)``; the reader builds that
  stream in memory from the decoded value, so the only pickle ever read is
  one this process wrote a moment before from checked JSON.  Other objects
  cannot be saved: the writer names the key and asks for a conversion.

Integrity: the encoded document is stored as the first leaf of the version
(``uint8``), so its chunks carry checksums like every tensor's; decoding
then validates its structure (``ValueError`` saying what is wrong, turned
into a :class:`~vlcc_adjoint.storage.CorruptCheckpointError` naming the
file by the reader).
"""

from __future__ import annotations

import base64
import math
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from ..errors import VlccTypeError, VlccValueError
from ._state import DTYPES, dtype_name

__all__ = [
    "FORMAT",
    "META_KEY",
    "decode_metadata",
    "decode_value",
    "encode_metadata",
    "encode_value",
    "storage_key",
]

#: The format name written into every document; others are refused on read.
FORMAT = "vlcc-dcp/1"
#: The key of the version metadata that marks a version written by VlccWriter.
META_KEY = "dcp"
MAX_DEPTH = 64


def storage_key(index: MetadataIndex) -> str:
    """The name of a stored tensor chunk: its key, and its offsets for a chunk."""
    if index.offset is None:
        return index.fqn
    return f"{index.fqn}@{','.join(str(int(o)) for o in index.offset)}"


# -- non-tensor values -----------------------------------------------------------------


def encode_value(obj: Any, where: str, depth: int = 0) -> Any:
    """`obj` as tagged JSON (see the module docstring); ``TypeError`` naming `where`."""
    if depth > MAX_DEPTH:
        raise VlccTypeError(f"{where} is nested more than {MAX_DEPTH} levels deep")
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) else {"$f": repr(float(obj))}
    if isinstance(obj, (bytes, bytearray)):
        return {"$b": base64.b64encode(bytes(obj)).decode("ascii")}
    if isinstance(obj, list):
        return [encode_value(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {"$t": [encode_value(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(obj)]}
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not (k is None or isinstance(k, (bool, int, float, str))):
                raise VlccTypeError(
                    f"{where} has a key of type {type(k).__name__}; VlccWriter "
                    "stores dict keys that are str, int, float, bool or None"
                )
            items.append(
                [
                    encode_value(k, f"{where} key", depth + 1),
                    encode_value(v, f"{where}[{k!r}]", depth + 1),
                ]
            )
        return {"$d": items}
    if isinstance(obj, torch.Tensor):
        raise VlccTypeError(
            f"{where} is a tensor inside a non-tensor item; DCP saves tensors only "
            "as state-dict values or inside dicts: move it out of the list/object"
        )
    raise VlccTypeError(
        f"{where} is a {type(obj).__name__}, which VlccWriter does not store: it "
        "keeps non-tensor items as JSON (None, bool, int, float, str, bytes, list, "
        "tuple, dict), never pickled; convert it (e.g. to a dict or a tensor)"
    )


def decode_value(doc: Any, depth: int = 0) -> Any:
    """The inverse of :func:`encode_value` (``ValueError`` on anything it never writes)."""
    if depth > MAX_DEPTH:
        raise VlccValueError("a stored value is nested too deeply")
    if doc is None or isinstance(doc, (bool, int, float, str)):
        return doc
    if isinstance(doc, list):
        return [decode_value(v, depth + 1) for v in doc]
    if isinstance(doc, dict) and len(doc) == 1:
        ((tag, body),) = doc.items()
        if tag == "$f" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "$b" and isinstance(body, str):
            return base64.b64decode(body.encode("ascii"), validate=True)
        if tag == "$t" and isinstance(body, list):
            return tuple(decode_value(v, depth + 1) for v in body)
        if tag == "$d" and isinstance(body, list):
            out = {}
            for pair in body:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise VlccValueError("a stored dict entry is not a [key, value] pair")
                key = decode_value(pair[0], depth + 1)
                if not (key is None or isinstance(key, (bool, int, float, str))):
                    raise VlccValueError("a stored dict key is not a scalar")
                out[key] = decode_value(pair[1], depth + 1)
            return out
    raise VlccValueError(f"unknown stored value {str(doc)[:60]!r}")


# -- Metadata ----------------------------------------------------------------------------


def _ints(x, what: str, n: int | None = None) -> list[int]:
    if not (
        isinstance(x, list)
        and all(type(v) is int and v >= 0 for v in x)
        and (n is None or len(x) == n)
        and len(x) <= 64
    ):
        raise VlccValueError(
            f"{what} is not a list of non-negative integers"
            + (f" of length {n}" if n is not None else "")
        )
    return x


def _check_cover(fqn: str, size: list[int], chunks: list) -> None:
    """The chunks of a tensor must tile it: inside it (checked before), not overlapping,
    and together as many elements as it has."""
    total = math.prod(size)
    got = sum(math.prod(c.sizes) for c in chunks)
    if got != total:
        raise VlccValueError(f"the chunks of {fqn!r} cover {got} of its {total} elements")
    if len(chunks) <= 1024:
        boxes = [(list(c.offsets), list(c.sizes)) for c in chunks if math.prod(c.sizes)]
        for i, (oa, sa) in enumerate(boxes):
            for ob, sb in boxes[i + 1 :]:
                if all(a < b + m and b < a + n for a, n, b, m in zip(oa, sa, ob, sb)):
                    raise VlccValueError(f"two chunks of {fqn!r} overlap")


def encode_metadata(
    md: Metadata,
    leaves: dict[str, tuple[int, int | None]],
    values: dict[str, Any],
    leaf_keys: list[str],
) -> dict:
    """The JSON document of a save.

    **Arguments:**

    - `md`: DCP's metadata (from ``finish``).
    - `leaves`: storage key (:func:`storage_key`) -> (index of the version leaf
      that holds that tensor chunk, its byte offset in a pack leaf or ``None``
      for a leaf of its own).
    - `values`: key -> the encoded value of each non-tensor item.
    - `leaf_keys`: the name of every leaf, in order (a later save finds its
      delta bases by name).
    """
    items = []
    for fqn, entry in md.state_dict_metadata.items():
        if isinstance(entry, BytesStorageMetadata):
            if fqn not in values:
                raise VlccValueError(f"no value was written for the non-tensor item {fqn!r}")
            items.append({"fqn": fqn, "kind": "bytes", "value": values[fqn]})
            continue
        if not isinstance(entry, TensorStorageMetadata):
            raise VlccTypeError(f"unknown DCP storage metadata {type(entry).__name__} for {fqn!r}")
        name = dtype_name(entry.properties.dtype)
        if name is None:
            raise VlccTypeError(
                f"{fqn!r} has dtype {entry.properties.dtype}, which VlccWriter does "
                "not store; convert it to a standard dtype"
            )
        chunks = []
        for c in entry.chunks:
            key = storage_key(MetadataIndex(fqn, c.offsets))
            if key not in leaves:
                raise VlccValueError(f"no data was written for {key!r}")
            leaf, offset = leaves[key]
            chunk = {
                "offsets": [int(o) for o in c.offsets],
                "sizes": [int(s) for s in c.sizes],
                "leaf": leaf,
            }
            if offset is not None:
                chunk["offset"] = offset
            chunks.append(chunk)
        items.append(
            {
                "fqn": fqn,
                "kind": "tensor",
                "dtype": name,
                "size": [int(s) for s in entry.size],
                "requires_grad": bool(entry.properties.requires_grad),
                "chunks": chunks,
            }
        )
    sm = md.storage_meta
    return {
        "format": FORMAT,
        "version": md.version if isinstance(md.version, str) else None,
        "leaf_keys": list(leaf_keys),
        "items": items,
        "planner_data": encode_value(md.planner_data, "the planner's data"),
        "storage_meta": None
        if sm is None
        else {
            "checkpoint_id": None if sm.checkpoint_id is None else str(sm.checkpoint_id),
            "save_id": sm.save_id,
            "modules": list(sm.modules or []),
        },
    }


def decode_metadata(
    doc: Any, nleaves: int
) -> tuple[Metadata, dict[MetadataIndex, tuple], list[str]]:
    """DCP's ``Metadata`` from a stored document, validated.

    **Arguments:**

    - `doc`: the parsed JSON document.
    - `nleaves`: the number of leaves of the version (leaf references are
      checked against it).

    **Returns:** the metadata, the storage map: ``MetadataIndex`` ->
    ``("leaf", index, dtype, sizes, offset)`` for a tensor chunk (`offset`:
    its byte offset in a pack leaf, ``None`` for a leaf of its own) or
    ``("value", obj)`` for a non-tensor item, and the name of every leaf.
    ``ValueError`` saying what is wrong.
    """
    if not (isinstance(doc, dict) and doc.get("format") == FORMAT):
        raise VlccValueError(f"not a {FORMAT} document")
    items = doc.get("items")
    if not isinstance(items, list):
        raise VlccValueError("'items' is not a list")
    sd_md: dict[str, Any] = {}
    storage: dict[MetadataIndex, tuple] = {}
    own: set[int] = set()
    packed: set[int] = set()
    for it in items:
        if not (isinstance(it, dict) and isinstance(it.get("fqn"), str)):
            raise VlccValueError("an item lacks its key")
        fqn = it["fqn"]
        if fqn in sd_md:
            raise VlccValueError(f"item {fqn!r} appears twice")
        if it.get("kind") == "bytes":
            sd_md[fqn] = BytesStorageMetadata()
            storage[MetadataIndex(fqn)] = ("value", decode_value(it.get("value")))
            continue
        if it.get("kind") != "tensor":
            raise VlccValueError(f"item {fqn!r} has an unknown kind")
        name = it.get("dtype")
        dtype = DTYPES.get(name) if isinstance(name, str) else None
        if dtype is None:
            raise VlccValueError(f"item {fqn!r} has an unknown dtype {it.get('dtype')!r:.40}")
        size = _ints(it.get("size"), f"the size of {fqn!r}")
        if not isinstance(it.get("requires_grad", False), bool):
            raise VlccValueError(f"requires_grad of {fqn!r} is not a bool")
        chunks = []
        if not isinstance(it.get("chunks"), list):
            raise VlccValueError(f"the chunks of {fqn!r} are not a list")
        for c in it["chunks"]:
            if not isinstance(c, dict):
                raise VlccValueError(f"a chunk of {fqn!r} is not an object")
            off = _ints(c.get("offsets"), f"a chunk offset of {fqn!r}", len(size))
            sizes = _ints(c.get("sizes"), f"a chunk size of {fqn!r}", len(size))
            if any(o + s > n for o, s, n in zip(off, sizes, size)):
                raise VlccValueError(f"a chunk of {fqn!r} lies outside its size {size}")
            leaf = c.get("leaf")
            offset = c.get("offset")
            if not (offset is None or (type(offset) is int and offset >= 0)):
                raise VlccValueError(f"a chunk of {fqn!r} has a bad offset {offset!r:.40}")
            if (
                not (type(leaf) is int and 1 <= leaf < nleaves)
                or leaf in own
                or (offset is None and leaf in packed)
            ):
                raise VlccValueError(
                    f"a chunk of {fqn!r} names leaf {leaf!r} (the version has "
                    f"{nleaves}; a chunk's own leaf holds nothing else)"
                )
            (packed if offset is not None else own).add(leaf)
            chunks.append(ChunkStorageMetadata(torch.Size(off), torch.Size(sizes)))
            storage[MetadataIndex(fqn, off)] = ("leaf", leaf, dtype, tuple(sizes), offset)
        _check_cover(fqn, size, chunks)
        sd_md[fqn] = TensorStorageMetadata(
            TensorProperties(dtype=dtype, requires_grad=it.get("requires_grad", False)),
            torch.Size(size),
            chunks,
        )
    sm = doc.get("storage_meta")
    storage_meta = None
    if sm is not None:
        if not (
            isinstance(sm, dict)
            and all(
                v is None or isinstance(v, str)
                for v in (sm.get("checkpoint_id"), sm.get("save_id"))
            )
            and isinstance(sm.get("modules", []), list)
            and all(isinstance(m, str) for m in sm.get("modules", []))
        ):
            raise VlccValueError("'storage_meta' is malformed")
        storage_meta = StorageMeta(
            checkpoint_id=sm.get("checkpoint_id"),
            save_id=sm.get("save_id"),
            modules=list(sm.get("modules", [])),
        )
    version = doc.get("version")
    if not (version is None or isinstance(version, str)):
        raise VlccValueError("'version' is not a string")
    leaf_keys = doc.get("leaf_keys")
    if not (
        isinstance(leaf_keys, list)
        and len(leaf_keys) == nleaves
        and all(isinstance(k, str) for k in leaf_keys)
    ):
        raise VlccValueError("'leaf_keys' does not name every leaf")
    md = Metadata(
        state_dict_metadata=sd_md,
        planner_data=decode_value(doc.get("planner_data")),
        storage_data=storage,
        storage_meta=storage_meta,
        version=version,
    )
    return md, storage, leaf_keys
