"""One ZarrTier record as a zarr v3 group: its files, its sealed metadata, its validation.

A record ``K`` of a :class:`~vlcc_adjoint.storage.ZarrTier` at ``path`` is::

    path/K/zarr.json     group; attributes {"vlcc_adjoint": {"format": 2, "key": K,
                         "spec": ..., "leaves": [...], "digest": ...}}
    path/K/<i>/zarr.json leaf i: an array, one chunk = the whole leaf
    path/K/<i>/c.0.0     its bytes ("default" chunk keys, separator ".")

Each entry of ``leaves`` gives the leaf's dtype (numpy's string, with its
byte order), shape, size, chunk key and xxh3-64 checksum.  The ``digest``
(:func:`~vlcc_adjoint.storage.format.sealed_group`) is xxh3-128 of the
canonical JSON of everything else: the spec (structure, names, scalars,
strings, which leaf is which name), every leaf's dtype, shape, size, chunk
key and checksum, the key and the format.  The chunk bytes are covered by
the checksums, the checksums by the digest, so one value covers the whole
record: a changed scalar (``0.25`` -> ``0.35``), a swapped leaf index, a
changed dtype or byte order, a flipped chunk byte, each is a
:class:`~vlcc_adjoint.storage.CorruptCheckpointError` naming the file.

The leaf arrays' own ``zarr.json`` are written for plain zarr readers and
never read by the tier: they are derived from the dtype and shape the
digest covers (codec and byte order follow from the dtype), so damage to
them cannot change what ``get`` returns.

Format 1 (written before the digest existed) has the same layout without
``digest``; such records are still read, with their leaf checksums as their
only protection.  A format-2 document altered to say format 1 is refused:
format 1 documents have exactly four attributes, format 2 five.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence

import numpy as np

from ..errors import VlccValueError
from ..state import dtype_to_json
from . import format as F
from ._checksum import encode_spec
from ._tier import CorruptCheckpointError

__all__ = ["ATTRS", "FORMAT", "FORMATS", "Kind", "Layout", "Stored", "encode", "load", "read_root"]

#: The format this version writes; it reads every format in ``FORMATS``.
FORMAT = 2
FORMATS = (1, 2)
#: The group attribute holding a record's description.
ATTRS = "vlcc_adjoint"
_RECORD_KEYS = {1: {"format", "key", "spec", "leaves"}, 2: {"format", "key", "spec", "leaves"}}
_LEAF_KEYS = {"dtype", "shape", "nbytes", "chunk", "checksum"}
_HEX16 = re.compile(r"[0-9a-f]{16}")


class Kind:
    """Everything about a leaf that depends only on its dtype and shape, computed once."""

    __slots__ = ("dtype", "shape", "nbytes", "meta", "chunk", "tail")

    def __init__(self, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.dtype = dtype
        self.shape = shape
        self.nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        self.meta, self.chunk = F.array_metadata(dtype, shape)
        if self.nbytes == 0:
            self.chunk = None
        # the leaf's entry in the record attributes (canonical JSON) after its
        # checksum, which sorts first: '{"checksum":"...",' + tail
        self.tail = F.canonical_json(
            {
                "dtype": dtype_to_json(dtype),
                "shape": list(shape),
                "nbytes": self.nbytes,
                "chunk": self.chunk,
            }
        )[1:]


class Layout:
    """What a record directory holds, so that a later ``put`` can rewrite it in place."""

    __slots__ = ("leaves", "group_size")

    def __init__(self, leaves: list, group_size: int | None):
        # per leaf: (chunk name | None, chunk file size, zarr.json content | None: unknown)
        self.leaves = leaves
        self.group_size = group_size


class Stored:
    """A record of the store: its bytes on disk, its description, its directory layout.

    A damaged record has ``error`` set (and an empty description): it stays
    listed, and reading it raises that error.  ``inherited`` marks a record
    found when the store was opened (a ``put`` of its key replaces it).
    """

    __slots__ = ("nbytes", "spec_json", "leaves", "layout", "digest", "inherited", "error")

    def __init__(
        self,
        nbytes: int,
        spec_json: str,
        leaves: list,
        layout: Layout | None,
        digest: str | None,
        *,
        inherited: bool = False,
        error: CorruptCheckpointError | None = None,
    ):
        self.nbytes = nbytes
        self.spec_json = spec_json  # the record's spec, canonical JSON
        self.leaves = leaves  # per leaf (shape, dtype, nbytes, chunk name, checksum)
        self.layout = layout
        self.digest = digest
        self.inherited = inherited
        self.error = error

    def spec(self) -> dict:
        """A fresh copy of the record's spec (parsed from its canonical JSON, which
        was validated when the record was written or opened)."""
        out: dict = json.loads(self.spec_json)
        return out


def encode(
    key: str, spec: dict, kinds: list[Kind], checksums: Sequence[str]
) -> tuple[bytes, str, str]:
    """A record's group ``zarr.json`` (format 2, sealed with its digest).

    The document is ``sealed_group(ATTRS, {"format", "key", "leaves",
    "spec"})`` (`key` is a checked key: its JSON is itself in quotes), assembled from the spec's canonical JSON and each leaf kind's
    cached encoding (:func:`~vlcc_adjoint.storage.format.sealed_group_json`).

    **Returns:** the file's bytes, the spec's canonical JSON (what ``get``
    reads the spec from) and the digest.
    """
    try:
        spec_json = F.canonical_json(spec)
    except (TypeError, ValueError):
        encode_spec(key, spec)  # raises the error that names what is not JSON
        raise VlccValueError(
            f"the spec of record {key!r} has dict keys that are not all strings; "
            "specs are JSON, whose object keys are strings"
        ) from None
    leaves = (
        b"["
        + b",".join(b'{"checksum":"%s",%s' % (c.encode(), k.tail) for k, c in zip(kinds, checksums))
        + b"]"
    )
    group, digest = F.sealed_group_json(
        ATTRS,
        {
            "format": b"%d" % FORMAT,
            "key": b'"%s"' % key.encode(),
            "leaves": leaves,
            "spec": spec_json,
        },
    )
    return group, spec_json.decode("ascii"), digest


def load(key: str, record_dir: str) -> Stored:
    """The record in `record_dir` (the store's entry `key`), validated and
    checked against its digest before anything is allocated from it.

    Raises :class:`CorruptCheckpointError` naming the damaged file (or
    directory) for anything that is not an intact record.
    """
    F.check_dir(record_dir)
    path = os.path.join(record_dir, "zarr.json")
    try:
        attrs = F.open_group(path, ATTRS, group=False)
    except FileNotFoundError:
        raise F.corrupt_file(
            path,
            "is missing: the directory is not a record (a damaged record or a "
            "foreign zarr node; delete it or move it out of the store)",
        ) from None
    if attrs is None:
        raise F.corrupt_file(
            path,
            f"has no {ATTRS!r} attributes: not a record of this store (a damaged "
            "record or a foreign zarr node; delete it or move it out of the store)",
        )
    fmt = attrs.get("format") if type(attrs) is dict else None
    if fmt not in FORMATS or type(fmt) is not int:
        raise F.corrupt_file(
            path,
            f"is a record of format {fmt!r}; this version reads formats "
            f"{', '.join(map(str, FORMATS))} (upgrade vlcc_adjoint to read newer ones)",
        )
    digest = None
    if fmt >= 2:
        digest = attrs.get("digest")
        attrs = F.unseal(attrs, path)
    if set(attrs) != _RECORD_KEYS[fmt]:
        raise F.corrupt_file(
            path,
            f"has attributes {sorted(attrs)}, a format-{fmt} record has "
            f"{sorted(_RECORD_KEYS[fmt])}",
        )
    if attrs["key"] != key:
        raise F.corrupt_file(
            path, f"says it is record {attrs['key']!r}, but it is stored as {key!r}"
        )
    if type(attrs["spec"]) is not dict or type(attrs["leaves"]) is not list:
        raise F.corrupt_file(path, "has no spec object or no leaves list")
    leaves = []
    for i, leaf in enumerate(attrs["leaves"]):
        if type(leaf) is not dict or set(leaf) != _LEAF_KEYS:
            raise F.corrupt_file(
                path, f"describes leaf {i} with fields other than {sorted(_LEAF_KEYS)}"
            )
        dtype, shape, nbytes = F.check_leaf(leaf["dtype"], leaf["shape"], path)
        if leaf["nbytes"] != nbytes:
            raise F.corrupt_file(
                path, f"gives leaf {i} {leaf['nbytes']!r} bytes, its dtype and shape {nbytes}"
            )
        expected = (
            None
            if nbytes == 0
            else F.chunk_key([0] * (len(shape) + (0 if F.zarr_data_type(dtype) else 1)))
        )
        if leaf["chunk"] != expected:
            raise F.corrupt_file(
                path, f"names chunk {leaf['chunk']!r} for leaf {i}, expected {expected!r}"
            )
        if not (type(leaf["checksum"]) is str and _HEX16.fullmatch(leaf["checksum"])):
            raise F.corrupt_file(path, f"has an invalid checksum for leaf {i}")
        if expected is not None:
            F.check_dir(os.path.join(record_dir, str(i)))
        leaves.append((shape, dtype, nbytes, expected, leaf["checksum"]))
    layout = Layout([(chunk, nbytes, None) for _, _, nbytes, chunk, _ in leaves], None)
    spec_json = F.canonical_json(attrs["spec"]).decode("ascii")
    return Stored(F.tree_bytes(record_dir), spec_json, leaves, layout, digest, inherited=True)


def read_root(store: str, root_meta: str) -> int | None:
    """The format the root group ``root_meta`` of the store `store` declares
    (``None``: a plain zarr group, adopted as a store)."""
    try:
        attrs = F.open_group(root_meta, ATTRS)
    except CorruptCheckpointError as err:
        raise F.corrupt_file(
            root_meta,
            f"{store} is not a zarr v3 group of checkpoint records ({err}); "
            "give ZarrTier a new or empty directory",
        ) from None
    if attrs is None:
        return None
    fmt = attrs.get("format") if type(attrs) is dict else None
    if type(fmt) is not int or fmt not in FORMATS:
        raise F.corrupt_file(
            root_meta,
            f"the store says it is of format {fmt!r}; this version reads "
            f"formats {', '.join(map(str, FORMATS))} (upgrade vlcc_adjoint to read newer "
            "ones)",
        )
    return fmt
