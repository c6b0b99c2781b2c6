"""The on-disk format of a lineage repository: layout, chunk grid, metadata.

Everything here is pure data handling (paths, JSON, byte layout); the
history logic lives in :mod:`._history`.  See :mod:`vlcc_adjoint.lineage`
for the format described for users.

Chunk grid
----------

A leaf is split into chunks of about ``chunk_bytes`` along one axis, so that
every chunk is a *contiguous* run of the leaf's C-order bytes and, at the
same time, a block of a zarr v3 ``regular`` chunk grid: the chunk shape is
``[1, ..., 1, rows, *shape[k+1:]]``, where ``k`` is the first axis whose
trailing block (``shape[k+1:]``) fits in ``chunk_bytes``.  A 2-D field of
100 MB is cut into row bands; a (3, 10^7) array into pieces of each row.
``rows`` is balanced (``ceil(n / ceil(n / budget))``) so the last band is
nearly full: zarr v3 stores an edge chunk at the full chunk shape, padded
with the fill value (zero), and balancing keeps that padding below one row
per band.

Why contiguous runs: capture hashes and copies a chunk as one slice of the
leaf's bytes (no gather), and restore reads or decodes a chunk straight into
its slice of the output array.

Chunk addresses
---------------

A chunk's address is xxh3-128 of its raw (padded) bytes, and, for a
compressed chunk, of the zarr codec configuration too (so the same bytes
compressed differently never share a file).  Raw chunks: the address is the
hash of the stored file.  Compressed chunks: the address hashes what the
file *decodes to*.  We hash the raw bytes rather than the encoded ones so that
a chunk already stored is recognised before it is compressed: in a
checkpoint series most chunks are unchanged, and compressing them only to
find their hash would cost more than the write it saves.  Reading verifies
the address after decoding, which also catches damage the decoder did not.

Compression
-----------

Optional, per repository: ``codec=Lossless(...)`` (our byte-shuffle + LZ4
codec's parameters).  Chunks are written with zarr v3's standard ``blosc``
codec (numcodecs' C-Blosc1, the codec zarr itself uses), so that plain zarr
still reads every version.  Our :class:`~vlcc_adjoint.storage.codecs.Lossless`
blob (Blosc2 frames behind a ``VLCZ`` header) is not readable by zarr's blosc
codec: C-Blosc1 refuses Blosc2 chunks (checked with numcodecs 0.16), so
the lineage takes the codec's parameters (compressor, level, shuffle) and
writes Blosc1 chunks with them.  Lossy codecs are refused: a version must
check out bit-identical to what was committed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import secrets
import struct
from collections.abc import Iterator

import numpy as np
import xxhash

from ..errors import VlccValueError
from ..state import dtype_from_json, dtype_to_json
from ..storage import format as SF

#: The format this code writes: 2 seals every manifest, the graph and the root
#: with digests (:func:`vlcc_adjoint.storage.format.seal`; the graph:
#: :func:`._graph.graph_file_bytes`).  Format 1 (no digests) is still read.
FORMAT = 2
FORMATS = (1, 2)
ROOT_KEY = "vlcc_lineage"
GRAPH_KEY = "vlcc_lineage_graph"
DEFAULT_CHUNK_BYTES = 1 << 20

# Directory names inside a repository.
CHUNKS = "chunks"
VERSIONS = "versions"
GRAPH = "graph"
LOCKS = "locks"
SCRATCH = "scratch"
PACKS = "packs"  # packs of chunks (:mod:`._packs`), made by the first node-local flush

MAX_NDIM = 32
_HASH = re.compile(r"[0-9a-f]{32}")
VERSION_ID = re.compile(r"[0-9a-f]{12}")


def token() -> str:
    """A unique name part for scratch files: this process and 32 random bits."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def chunk_relpath(address: str) -> str:
    """``chunks/ab/cdef...``: the content-addressed file of a chunk (256-way fan-out)."""
    return f"{CHUNKS}/{address[:2]}/{address[2:]}"


def is_address(text) -> bool:
    return isinstance(text, str) and _HASH.fullmatch(text) is not None


# -- codecs -------------------------------------------------------------------------

_CNAMES = ("lz4", "lz4hc", "zstd", "blosclz")
_SHUFFLE_NAMES = {"none": "noshuffle", "byte": "shuffle", "bit": "bitshuffle"}
_SHUFFLE_IDS = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
# Blosc1 header: version, versionlz, flags, typesize, nbytes, blocksize, cbytes.
_BLOSC_HEADER = struct.Struct("<BBBBIII")


def codec_config(codec, typesize: int) -> dict | None:
    """The zarr v3 ``blosc`` codec configuration for `codec` (``None``: raw chunks).

    `codec` is ``None`` or a lossless codec of ours
    (:class:`vlcc_adjoint.storage.codecs.Lossless`, or its config dict).
    """
    if codec is None:
        return None
    cfg = codec.config() if hasattr(codec, "config") else codec
    if not (isinstance(cfg, dict) and cfg.get("name") == "vlcc_lossless"):
        name = cfg.get("name") if isinstance(cfg, dict) else type(codec).__name__
        raise VlccValueError(
            f"History stores chunks losslessly; codec {name!r} is not supported. Pass "
            "codec=None (raw chunks) or codec=vlcc_adjoint.storage.codecs.Lossless(...) "
            "(a lossy codec would make a version check out different from what was committed)"
        )
    conf = cfg.get("configuration", {})
    return {
        "name": "blosc",
        "configuration": {
            "typesize": int(min(max(typesize, 1), 255)),
            "cname": conf.get("compressor", "lz4"),
            "clevel": int(conf.get("clevel", 5)),
            "shuffle": _SHUFFLE_NAMES[conf.get("shuffle", "byte")],
            "blocksize": 0,
        },
    }


def check_codec_config(cfg) -> dict | None:
    """A codec configuration read from a manifest, validated (never trusted)."""
    if cfg is None:
        return None
    ok = (
        isinstance(cfg, dict)
        and cfg.get("name") == "blosc"
        and isinstance(cfg.get("configuration"), dict)
    )
    if ok:
        c = cfg["configuration"]
        ok = (
            c.get("cname") in _CNAMES
            and type(c.get("clevel")) is int
            and 0 <= c["clevel"] <= 9
            and c.get("shuffle") in _SHUFFLE_IDS
            and type(c.get("typesize")) is int
            and 1 <= c["typesize"] <= 255
            and c.get("blocksize") == 0
        )
    if not ok:
        raise VlccValueError(f"unsupported chunk codec {cfg!r}")
    return cfg


def codec_tag(cfg: dict | None) -> bytes:
    """The bytes hashed after a chunk's raw bytes to form its address."""
    if cfg is None:
        return b""
    return b"\x00vlcc-lineage-codec:" + json.dumps(cfg, sort_keys=True).encode()


def address_of(data, tag: bytes) -> str:
    """A chunk's content address: xxh3-128 of its raw bytes (and codec tag)."""
    if not tag:
        return xxhash.xxh3_128_hexdigest(data)
    h = xxhash.xxh3_128(data)
    h.update(tag)
    return h.hexdigest()


def encode_chunk(data, cfg: dict | None):
    """The bytes to store for a raw chunk (itself, or Blosc1-compressed)."""
    if cfg is None:
        return data
    from numcodecs import blosc

    c = cfg["configuration"]
    return blosc.compress(
        data, c["cname"].encode(), c["clevel"], _SHUFFLE_IDS[c["shuffle"]], 0, c["typesize"]
    )


def decode_chunk(blob, cfg: dict, nbytes: int, out=None):
    """Decompress a stored chunk of `nbytes` raw bytes (into `out`, a writable buffer).

    The Blosc header is checked before anything is allocated or decoded:
    a damaged or foreign file raises ``ValueError``.
    """
    from numcodecs import blosc

    if len(blob) < _BLOSC_HEADER.size:
        raise VlccValueError(f"compressed chunk of {len(blob)} bytes is shorter than its header")
    _, _, _, _, raw, _, cbytes = _BLOSC_HEADER.unpack_from(blob, 0)
    if raw != nbytes or cbytes != len(blob):
        raise VlccValueError(
            f"compressed chunk header says {raw} raw / {cbytes} stored bytes, "
            f"expected {nbytes} / {len(blob)}"
        )
    try:
        if out is not None:
            blosc.decompress(blob, out)
            return out
        return blosc.decompress(blob)
    except (RuntimeError, ValueError) as err:
        raise VlccValueError(f"compressed chunk does not decode ({err})") from None


# -- the chunk grid -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one leaf is cut into chunks, and how zarr sees it."""

    dtype: np.dtype
    shape: tuple[int, ...]
    zshape: tuple[int, ...]  # the zarr array's shape (+ [itemsize] for raw-byte dtypes)
    ztype: str  # the zarr data type
    chunk_shape: tuple[int, ...]  # the zarr chunk shape
    axis: int  # the split axis k (-1 for a 0-d array)
    rows: int  # chunk extent along the split axis
    inner: int  # bytes of one index along the split axis
    nchunks: int
    nbytes: int  # raw bytes of the leaf

    @property
    def chunk_nbytes(self) -> int:
        """Raw bytes of every chunk (edge chunks are padded to this)."""
        return self.rows * self.inner

    def spans(self) -> Iterator[tuple[int, int, str]]:
        """Per chunk, in order: (byte offset in the leaf, valid bytes, zarr chunk key)."""
        if self.nchunks == 0:
            return
        if self.axis < 0:
            yield 0, self.nbytes, "c"
            return
        k, zs, rows = self.axis, self.zshape, self.rows
        nr = -(-zs[k] // rows)
        outer_shape = zs[:k]
        tail = ".0" * (len(zs) - k - 1)
        for o in range(math.prod(outer_shape)):
            coords = np.unravel_index(o, outer_shape) if outer_shape else ()
            head = "".join(f".{int(c)}" for c in coords)
            base = o * zs[k]
            for r in range(nr):
                start = r * rows
                yield (
                    (base + start) * self.inner,
                    (min(rows, zs[k] - start)) * self.inner,
                    f"c{head}.{r}{tail}",
                )


def _zarr_view(dtype: np.dtype, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...], int]:
    """(zarr data type, zarr shape, zarr item size) of a leaf."""
    ztype = SF.zarr_data_type(dtype)
    if ztype is None:  # datetime, strings, structured, ml_dtypes: their raw bytes
        return "uint8", tuple(shape) + (dtype.itemsize,), 1
    return ztype, tuple(shape), dtype.itemsize


def plan_layout(dtype: np.dtype, shape: tuple[int, ...], chunk_bytes: int) -> Layout:
    """The chunking of a new leaf (see the module docstring)."""
    ztype, zs, zi = _zarr_view(dtype, shape)
    nbytes = dtype.itemsize * math.prod(shape)
    if len(zs) == 0:
        return Layout(dtype, tuple(shape), zs, ztype, (), -1, 1, zi, 1, nbytes)
    k = 0
    while k < len(zs) - 1 and math.prod(zs[k + 1 :]) * zi > chunk_bytes:
        k += 1
    inner = math.prod(zs[k + 1 :]) * zi
    if 0 in zs:
        rows = max(1, zs[k])
    else:
        budget = max(1, chunk_bytes // max(inner, 1))
        rows = -(-zs[k] // -(-zs[k] // budget))
    return _layout(dtype, tuple(shape), ztype, zs, k, rows, inner, nbytes)


def _layout(dtype, shape, ztype, zs, k, rows, inner, nbytes) -> Layout:
    chunk_shape = (1,) * k + (rows,) + tuple(max(1, s) for s in zs[k + 1 :])
    nchunks = 0 if 0 in zs else math.prod(zs[:k]) * -(-zs[k] // rows)
    return Layout(dtype, shape, zs, ztype, chunk_shape, k, rows, inner, nchunks, nbytes)


def layout_from_json(entry) -> Layout:
    """The layout of a leaf recorded in a manifest, validated before anything is allocated."""
    dtype = dtype_from_json(entry["dtype"])
    shape = entry["shape"]
    if not (
        isinstance(shape, list)
        and len(shape) <= MAX_NDIM
        and all(type(s) is int and 0 <= s < 2**48 for s in shape)
    ):
        raise VlccValueError(f"bad shape {shape!r}")
    shape = tuple(shape)
    ztype, zs, zi = _zarr_view(dtype, shape)
    nbytes = dtype.itemsize * math.prod(shape)
    if nbytes >= 2**50:
        raise VlccValueError("leaf too large")
    cs = entry["chunk_shape"]
    if not (
        isinstance(cs, list) and len(cs) == len(zs) and all(type(c) is int and c >= 1 for c in cs)
    ):
        raise VlccValueError(f"bad chunk shape {cs!r}")
    if len(zs) == 0:
        return Layout(dtype, shape, zs, ztype, (), -1, 1, zi, 1, nbytes)
    full = [max(1, s) for s in zs]
    for k in range(len(zs)):
        if all(c == 1 for c in cs[:k]) and cs[k + 1 :] == full[k + 1 :]:
            break
    else:
        raise VlccValueError(f"chunk shape {cs} is not a band of shape {list(zs)}")
    if cs[k] > full[k]:
        raise VlccValueError(f"chunk shape {cs} exceeds shape {list(zs)}")
    inner = math.prod(zs[k + 1 :]) * zi
    if cs[k] * inner >= 2**34:
        raise VlccValueError("chunk too large")
    return _layout(dtype, shape, ztype, zs, k, cs[k], inner, nbytes)


def leaf_entry(layout: Layout, cfg: dict | None, addresses: list[str]) -> dict:
    """A leaf's entry in a version manifest."""
    return {
        "dtype": dtype_to_json(layout.dtype),
        "shape": list(layout.shape),
        "chunk_shape": list(layout.chunk_shape),
        "codec": cfg,
        "nbytes": layout.nbytes,
        "chunks": addresses,
    }


def array_meta(layout: Layout, cfg: dict | None) -> bytes:
    """The ``zarr.json`` of a leaf's zarr v3 array inside a version group
    (:func:`vlcc_adjoint.storage.format.array_metadata` with the leaf's chunk
    grid, its ``blosc`` codec, and its real dtype and shape in the attributes,
    for the raw-bytes arrays of dtypes zarr lacks)."""
    meta, _ = SF.array_metadata(
        layout.dtype,
        layout.shape,
        layout.chunk_shape,
        codecs=() if cfg is None else (cfg,),
        attributes={ROOT_KEY: {"dtype": dtype_to_json(layout.dtype), "shape": list(layout.shape)}},
    )
    return meta


def root_document(attrs: dict) -> bytes:
    """The repository's root ``zarr.json``: a group whose ``vlcc_lineage``
    attributes are `attrs`, sealed (a stale digest in `attrs` is replaced)."""
    return SF.group_json({ROOT_KEY: SF.seal(attrs)})


# -- manifests ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A version's manifest, parsed and validated."""

    id: str
    parents: tuple[str, ...]
    branch: str
    message: str
    meta: dict
    created: float
    spec: dict
    leaves: tuple[tuple[Layout, dict | None, tuple[str, ...]], ...]  # (layout, codec, addresses)
    #: Whether the version's group holds a zarr view (per-leaf arrays of linked
    #: chunk files); ``False`` for packed versions (:mod:`._packs`).
    zarr_view: bool = True

    @property
    def nbytes(self) -> int:
        return sum(layout.nbytes for layout, _, _ in self.leaves)

    def addresses(self) -> set[str]:
        return {a for _, _, addrs in self.leaves for a in addrs}


def parse_manifest(vid: str, attrs) -> Manifest:
    """Validate a manifest read from disk (``ValueError`` saying what is wrong)."""
    if not (
        isinstance(attrs, dict)
        and attrs.get("format") in FORMATS
        and attrs.get("kind") == "version"
    ):
        raise VlccValueError("unknown manifest format")
    if attrs.get("id") != vid:
        raise VlccValueError(f"the manifest says it is version {attrs.get('id')!r}")
    parents = attrs.get("parents")
    if not (
        isinstance(parents, list)
        and all(isinstance(p, str) and VERSION_ID.fullmatch(p) for p in parents)
    ):
        raise VlccValueError("bad parents")
    spec = attrs.get("spec")
    leaves = attrs.get("leaves")
    if not (
        isinstance(spec, dict)
        and isinstance(leaves, list)
        and isinstance(spec.get("leaves"), list)
        and len(spec["leaves"]) == len(leaves)
    ):
        raise VlccValueError("spec and leaves disagree")
    out = []
    for entry in leaves:
        layout = layout_from_json(entry)
        cfg = check_codec_config(entry.get("codec"))
        addrs = entry.get("chunks")
        if not (
            isinstance(addrs, list)
            and len(addrs) == layout.nchunks
            and all(is_address(a) for a in addrs)
        ):
            raise VlccValueError("chunk list does not match the leaf's chunk grid")
        out.append((layout, cfg, tuple(addrs)))
    meta = attrs.get("meta")
    created = attrs.get("created")
    if not isinstance(meta, dict) or not isinstance(created, (int, float)):
        raise VlccValueError("bad meta or created time")
    return Manifest(
        vid,
        tuple(parents),
        str(attrs.get("branch", "")),
        str(attrs.get("message", "")),
        meta,
        float(created),
        spec,
        tuple(out),
        attrs.get("zarr_view", True) is not False,
    )
