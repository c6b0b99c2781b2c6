"""What every codec shares: the blob header, the config registry, scratch buffers.

Blob layout (all integers little-endian; a blob is never pickled)::

    offset  size       field
    0       4          magic b"VLCZ"
    4       1          header format version (1)
    5       1          codec id (1 Lossless, 2 ErrorBounded, 3 FixedRate)
    6       1          codec format version (ErrorBounded: 1 or 2)
    7       1          ndim (0..32)
    8       8          dtype as numpy's ``dtype.str`` ("<f4", "|u1", ...), NUL padded
    16      8 * ndim   shape (uint64 each)
    ...                the codec's own parameters and payload

:func:`read_header` checks every field before anything is trusted: a blob
that is too short, carries another magic, an unknown version or codec, a
dtype outside the numeric kinds, or a shape whose size overflows is refused
with a ``ValueError`` saying which.  The codec then checks that its payload
has exactly the length its parameters imply, so the kernels never read or
write outside their arrays (numba does no bounds checks).

Scratch buffers: fresh memory is slow on the target VMs (first touch of a
page runs at 0.1-5 GB/s), so each codec instance keeps its work arrays and
reuses them.  The storage engine calls one codec from several threads, so
the buffers are per thread (:class:`Scratch` is a ``threading.local``); a
thread's buffers grow to the largest array it has seen and stay.  The
biggest is the lossy codecs' output stream, sized for the worst case (8
bytes per value); only the pages a blob actually fills are ever touched, so
resident memory grows with the compressed size, not with that bound.
"""

from __future__ import annotations

import abc
import struct
import sys
import threading
from typing import Any

import numpy as np

from ...errors import VlccRuntimeError, VlccTypeError, VlccValueError

MAGIC = b"VLCZ"
HEADER_VERSION = 1
MAX_NDIM = 32
_FIXED = struct.Struct("<4sBBBB8s")

LOSSLESS_ID = 1
ERROR_BOUNDED_ID = 2
FIXED_RATE_ID = 3

#: What ``decode`` reads: a blob's bytes, or a view of them (no copy).
Blob = bytes | bytearray | memoryview

_REGISTRY: dict[str, type[Codec]] = {}
_BY_ID: dict[int, type[Codec]] = {}
_DECODERS: dict[type[Codec], Codec] = {}  # one shared decoder per codec class


class Codec(abc.ABC):
    """An array -> bytes codec with a self-describing blob and a JSON config.

    Subclasses set ``name`` (the config name), ``codec_id``, ``version`` and
    ``lossless`` (whether every array round-trips exactly), and implement
    :meth:`encode`, :meth:`decode`, ``_parameters`` (the constructor's
    arguments, which :meth:`config` wraps) and ``_default_instance``.  Equal
    configs make equal codecs; ``pickle`` and ``copy`` go through the config.
    """

    name: str = ""
    codec_id: int = 0
    version: int = 1
    lossless: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:
            _REGISTRY[cls.name] = cls
            _BY_ID[cls.codec_id] = cls

    @abc.abstractmethod
    def encode(self, array: np.ndarray) -> bytes:
        """Encode ``array`` into a self-describing blob."""

    @abc.abstractmethod
    def decode(self, blob: Blob, out: np.ndarray | None = None) -> np.ndarray:
        """Decode a blob written by this codec (into ``out`` when given)."""

    @abc.abstractmethod
    def _parameters(self) -> dict[str, Any]:
        """The constructor's keyword arguments, JSON-serialisable."""

    def config(self) -> dict[str, Any]:
        """``{"name": ..., "configuration": {...}}``, JSON-serialisable (zarr style).

        :func:`codec_from_config` rebuilds an equal codec from it.
        """
        return {"name": self.name, "configuration": self._parameters()}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.config() == self.config()

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self._parameters().items()))))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._parameters().items())
        return f"{type(self).__name__}({args})"

    def __reduce__(self):
        return codec_from_config, (self.config(),)

    @classmethod
    def _decoder(cls) -> Codec:
        """A shared instance whose ``decode`` reads any blob of this codec
        (the parameters a decoder needs are in the blob)."""
        inst = _DECODERS.get(cls)
        if inst is None:
            inst = _DECODERS.setdefault(cls, cls._default_instance())
        return inst

    @classmethod
    @abc.abstractmethod
    def _default_instance(cls) -> Codec:
        """Any instance (used for decoding only)."""


def codec_from_config(config: dict[str, Any]) -> Codec:
    """Rebuild a codec from :meth:`Codec.config`'s dictionary.

    **Arguments:**

    - `config`: ``{"name": ..., "configuration": {...}}`` as written by
      ``codec.config()`` (for example read back from a zarr attribute).

    **Returns:** a new codec equal to the one that wrote ``config``.
    """
    if not isinstance(config, dict) or "name" not in config:
        raise VlccValueError(
            f"a codec config is a dict {{'name': ..., 'configuration': {{...}}}}, got {config!r}"
        )
    cls = _REGISTRY.get(config["name"])
    if cls is None:
        raise VlccValueError(f"unknown codec name {config['name']!r}; known: {sorted(_REGISTRY)}")
    params = config.get("configuration", {})
    if not isinstance(params, dict):
        raise VlccValueError(f"'configuration' must be a dict, got {params!r}")
    try:
        return cls(**params)
    except TypeError as err:
        raise VlccValueError(f"bad configuration for {config['name']!r}: {err}") from None


def decode(blob: Blob, out: np.ndarray | None = None) -> np.ndarray:
    """Decode any blob written by a codec of this package (it names its codec).

    **Arguments:**

    - `blob`: bytes-like, as returned by an ``encode``.
    - `out`: optional C-contiguous writeable array of the blob's dtype and
      shape to decode into.

    **Returns:** the decoded array (``out`` when given).
    """
    codec_id = _peek_codec_id(blob)
    return _BY_ID[codec_id]._decoder().decode(blob, out=out)


# -- header -----------------------------------------------------------------------


def write_header(codec_id: int, version: int, dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The common header for an array of ``dtype`` and ``shape``."""
    dstr = dtype.str.encode("ascii")
    return _FIXED.pack(MAGIC, HEADER_VERSION, codec_id, version, len(shape), dstr) + struct.pack(
        f"<{len(shape)}Q", *shape
    )


def _as_view(blob) -> memoryview:
    try:
        view = memoryview(blob)
    except TypeError:
        raise VlccTypeError(f"a blob must be bytes-like, got {type(blob).__name__}") from None
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


def _peek_codec_id(blob) -> int:
    view = _as_view(blob)
    if len(view) < _FIXED.size:
        raise VlccValueError(
            f"truncated blob: {len(view)} bytes, a header needs at least {_FIXED.size}"
        )
    magic, hver, codec_id, _, _, _ = _FIXED.unpack_from(view, 0)
    if magic != MAGIC:
        raise VlccValueError(
            f"not a vlcc_adjoint codec blob (magic {bytes(magic)!r}, expected {MAGIC!r})"
        )
    if hver != HEADER_VERSION:
        raise VlccValueError(
            f"unsupported blob header version {hver} (this build reads {HEADER_VERSION})"
        )
    if codec_id not in _BY_ID:
        raise VlccValueError(f"unknown codec id {codec_id} in blob header")
    return codec_id


_NUMERIC_KINDS = "biufc"


def read_header(blob, codec_id: int, version: int | tuple[int, ...]):
    """Parse and validate the common header.

    **Arguments:**

    - `blob`: bytes-like.
    - `codec_id`: the codec that must have written it.
    - `version`: the codec format version this build reads, or a tuple of
      them (the codec then reads the version from byte 6 of the blob).

    **Returns:** ``(view, dtype, shape, offset)``: the blob as a byte
    memoryview, the dtype, the shape and the offset of the codec's part.
    """
    view = _as_view(blob)
    got = _peek_codec_id(view)
    if got != codec_id:
        raise VlccValueError(
            f"blob was written by {_BY_ID[got].__name__} (codec id {got}), not "
            f"{_BY_ID[codec_id].__name__}; decode it with that codec or with codecs.decode(blob)"
        )
    _, _, _, cver, ndim, dstr = _FIXED.unpack_from(view, 0)
    versions = version if isinstance(version, tuple) else (version,)
    if cver not in versions:
        raise VlccValueError(
            f"unsupported {_BY_ID[codec_id].__name__} format version {cver} "
            f"(this build reads {', '.join(map(str, versions))})"
        )
    if ndim > MAX_NDIM:
        raise VlccValueError(f"corrupt blob header: ndim {ndim} > {MAX_NDIM}")
    offset = _FIXED.size + 8 * ndim
    if len(view) < offset:
        raise VlccValueError(f"truncated blob: {len(view)} bytes, the header alone needs {offset}")
    try:
        text = dstr.rstrip(b"\0").decode("ascii")
        if len(text) < 3 or text[0] not in "<>|=" or text[1] not in _NUMERIC_KINDS:
            raise ValueError
        dtype = np.dtype(text)
    except (ValueError, TypeError, UnicodeDecodeError):
        raise VlccValueError(
            f"corrupt blob header: dtype {bytes(dstr)!r} is not a numeric dtype"
        ) from None
    shape = struct.unpack_from(f"<{ndim}Q", view, _FIXED.size)
    size = 1
    for s in shape:
        size *= s
    if size * dtype.itemsize >= 2**62:
        raise VlccValueError(f"corrupt blob header: shape {shape} is too large")
    return view, dtype, tuple(int(s) for s in shape), offset


def need(view: memoryview, end: int, what: str) -> None:
    """Raise a clear ``ValueError`` if ``view`` is shorter than ``end`` bytes."""
    if len(view) < end:
        raise VlccValueError(f"truncated blob: {what} needs {end} bytes, the blob has {len(view)}")


# -- arrays -----------------------------------------------------------------------


def check_numeric(array) -> np.ndarray:
    """``array`` as an ndarray of a numeric dtype (bool, int, uint, float, complex)."""
    if not isinstance(array, np.ndarray):
        array = np.asarray(array)
    if array.dtype.kind not in _NUMERIC_KINDS:
        raise VlccTypeError(
            "codecs encode numeric arrays (bool, int, uint, float, complex), got dtype "
            f"{array.dtype}; "
            "convert it first (e.g. strings to bytes with np.frombuffer)"
        )
    if array.ndim > MAX_NDIM:
        raise VlccValueError(
            f"codecs encode arrays of at most {MAX_NDIM} dimensions, got {array.ndim}"
        )
    return array


def readonly(array: np.ndarray) -> np.ndarray:
    """A read-only, aligned, C-contiguous view (or copy) of ``array``.

    Numba compiles one specialisation per array *type*, and writeability,
    alignment and layout are part of the type; handing every kernel the same
    kind of array keeps it at one compilation per dtype.
    """
    if not (array.flags.c_contiguous and array.flags.aligned):
        array = np.ascontiguousarray(array)
        if not array.flags.aligned:
            array = array.copy()
    view = array.view()
    view.flags.writeable = False
    return view


def output(out: np.ndarray | None, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """``out`` checked against ``dtype`` and ``shape``, or a new array."""
    if out is None:
        return np.empty(shape, dtype)
    if not isinstance(out, np.ndarray):
        raise VlccTypeError(f"out must be a numpy array, got {type(out).__name__}")
    if out.dtype != dtype or out.shape != shape:
        raise VlccValueError(
            f"out has dtype {out.dtype} and shape {out.shape}; the blob holds dtype {dtype} "
            f"and shape {shape}"
        )
    if not (out.flags.c_contiguous and out.flags.writeable and out.flags.aligned):
        raise VlccValueError("out must be a writeable, aligned, C-contiguous array")
    return out


def from_bytes(view: memoryview, dtype, count: int, offset: int) -> np.ndarray:
    """``count`` items of ``dtype`` at ``offset`` of ``view``, read-only and aligned."""
    arr = np.frombuffer(view, dtype=dtype, count=count, offset=offset)
    return readonly(arr)


def little_endian_host() -> None:
    if sys.byteorder != "little":  # pragma: no cover - no big-endian CI
        raise VlccRuntimeError(
            "the numba codecs write little-endian words; big-endian hosts are unsupported"
        )


class Scratch(threading.local):
    """Per-thread work arrays of one codec instance, grown on demand, reused."""

    def get(self, name: str, dtype, size: int) -> np.ndarray:
        """An array of at least ``size`` items (its first ``size`` returned)."""
        buf = self.__dict__.get(name)
        if buf is None or buf.size < size or buf.dtype != dtype:
            buf = np.empty(max(int(size), 1) + (int(size) >> 3), dtype)
            self.__dict__[name] = buf
        return buf[:size] if size else buf[:1]
