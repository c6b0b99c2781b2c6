"""zarr v3 array metadata, as every store writes it (re-exported by :mod:`.format`).

Leaves of the zarr v3 core data types (bool, (u)int8-64, float16/32/64,
complex64/128) are stored as themselves, in their own byte order (``bytes``
codec, ``endian`` little or big), uncompressed; other dtypes (datetime,
strings, structured, ``bfloat16``) as their raw bytes, a ``uint8`` array of
shape ``shape + [itemsize]``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["array_metadata", "chunk_key", "zarr_data_type"]

_ZARR_TYPES = {
    ("b", 1): "bool",
    ("i", 1): "int8",
    ("i", 2): "int16",
    ("i", 4): "int32",
    ("i", 8): "int64",
    ("u", 1): "uint8",
    ("u", 2): "uint16",
    ("u", 4): "uint32",
    ("u", 8): "uint64",
    ("f", 2): "float16",
    ("f", 4): "float32",
    ("f", 8): "float64",
    ("c", 8): "complex64",
    ("c", 16): "complex128",
}


def zarr_data_type(dtype: np.dtype) -> str | None:
    """The zarr v3 core data type of `dtype`, or ``None`` when it has none
    (structured, datetime, strings, ``bfloat16``: stored as raw bytes)."""
    if dtype.names is not None or dtype.subdtype is not None:
        return None
    if dtype.kind == "V" or dtype.type.__module__.startswith("ml_dtypes"):
        return None
    return _ZARR_TYPES.get((dtype.kind, dtype.itemsize))


def chunk_key(index: Iterable[int]) -> str:
    """zarr v3 "default" chunk key with separator ``.``: ``c.0.1`` for chunk
    (0, 1); ``c`` for the one chunk of a 0-d array."""
    return "c" + "".join(f".{int(i)}" for i in index)


def array_metadata(
    dtype: np.dtype, shape: Sequence[int], chunk_shape: Sequence[int] | None = None
) -> tuple[bytes, str | None]:
    """A zarr v3 array's ``zarr.json`` for `dtype` and `shape`, and the key of its
    first chunk (``None`` when the array is empty: it has no chunk).

    Leaves of zarr v3 core data types are stored as themselves, in their own
    byte order (``bytes`` codec, ``endian`` little or big), uncompressed;
    other dtypes (:func:`zarr_data_type` is ``None``) as their raw bytes, a
    ``uint8`` array of shape ``shape + [itemsize]``.  The regular chunk grid
    has `chunk_shape` (default: the whole array, one chunk).
    """
    ztype = zarr_data_type(dtype)
    shape = tuple(int(s) for s in shape)
    if ztype is None:  # raw bytes of an exotic dtype
        ztype, shape, order = "uint8", shape + (dtype.itemsize,), "|"
    else:
        order = dtype.byteorder
        if order == "=":
            order = "<" if np.little_endian else ">"
    if dtype.itemsize == 1 or order == "|":
        codec = {"name": "bytes"}
    else:
        codec = {"name": "bytes", "configuration": {"endian": "little" if order == "<" else "big"}}
    fill = (
        False
        if ztype == "bool"
        else [0.0, 0.0]
        if ztype.startswith("complex")
        else 0.0
        if ztype.startswith("float")
        else 0
    )
    chunks = [max(1, s) for s in shape] if chunk_shape is None else [int(c) for c in chunk_shape]
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(shape),
        "data_type": ztype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}},
        "fill_value": fill,
        "codecs": [codec],
        "attributes": {},
        "storage_transformers": [],
    }
    chunk = None if 0 in shape else chunk_key([0] * len(shape))
    return json.dumps(meta, separators=(",", ":")).encode(), chunk
