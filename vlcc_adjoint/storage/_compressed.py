"""CompressedMemoryTier: records encoded with a codec, held in host memory.

Each leaf is encoded on ``put`` with the tier's codec
(:mod:`vlcc_adjoint.storage.codecs`; default ``Lossless()``) and kept as
one blob; ``used_bytes`` counts the encoded bytes, so a 4x compressible
state takes a quarter of the capacity.  Encoding and decoding run outside
the tier's lock (the codecs release the GIL), so the engine's workers
compress several records at once; only the bookkeeping is serialised.

Self-describing records: every leaf keeps the ``config()`` of the codec that
wrote it, and ``get`` rebuilds the decoder with ``codec_from_config``.
Records written before a tier's codec changed, or moved here from another
tier, decode correctly.  Leaves of dtypes the codecs do not encode
(``datetime64``, strings, structured, ``bfloat16``) are stored exactly as
their raw bytes through ``Lossless()``.

Integrity, lossless and lossy:

* Every blob gets an xxh3-64 checksum of the *encoded* bytes when it is
  stored, verified on every ``get`` before decoding: damage to the stored
  blob is a :class:`CorruptCheckpointError`, never a decoder crash or a
  silently wrong state.
* Lossless codecs: the decoded leaf must also match the record's original
  checksum (an end-to-end check of the codec); the returned record carries
  the original checksums.
* Lossy codecs (``ErrorBounded``, ``FixedRate``): ``get`` returns the decoded
  *approximation*; the original data is gone, so its checksum cannot be
  checked.  The returned record carries checksums of the decoded leaves, so
  it is self-consistent and can be put into any other tier.

Error bounds set from outside.  An error-budget controller (``run_adjoint(...,
gradient_rtol=...)``) sets the bound of an ``ErrorBounded`` tier between
runs with :meth:`CompressedMemoryTier.set_error_bound`: an absolute bound, or
a bound *relative to each leaf's largest magnitude*, ``eb = tau max|x|``
(the value-range-relative mode of SZ, Di & Cappello, IPDPS 2016), so that
one number serves leaves of different scales.  A relative bound is rounded
*down* to the grid ``2^(k/16)`` and then *dithered* down by ``2^(-h/16)``,
``h`` in ``0..15`` a hash of the record's key and the leaf's index: never
looser than asked, at most a factor 2 tighter.  The dither gives each
checkpoint its own quantisation lattice.  Without it, the error of a
nearly constant region, ``rint(v / s) s - v``, is a deterministic function
of the step ``s``, the same sign in every checkpoint, and those biases add
up coherently in a gradient: on the Burgers example the gradient error per
unit bound then jumped by 20x between neighbouring bounds, against 3x with
the dither (the subtractive-dither argument of Schuchman, IEEE Trans.
Commun. 12:162, 1964, applied across checkpoints rather than samples).
The grid keeps the number of distinct codec configurations, and so of
cached decoders, small.  The tier counts the raw and encoded bytes of every
``put`` (:attr:`CompressedMemoryTier.bytes_put`), from which the achieved
compression ratio of a run follows.
"""

from __future__ import annotations

import json
import math
import threading
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from ..errors import VlccKeyError, VlccTypeError, VlccValueError
from ._checksum import (
    bytes_checksum,
    check_capacity,
    check_record,
    encode_spec,
    leaf_checksum,
    step_of,
)
from ._tier import CorruptCheckpointError, Record, Tier, TierFullError

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["CompressedMemoryTier"]

#: Relative error bounds are rounded down to powers of ``2^(1/BOUND_GRID)``
#: and dithered down by up to a factor 2 on that grid.
BOUND_GRID = 16


class _Blob:
    """One encoded leaf."""

    __slots__ = ("data", "checksum", "codec", "raw", "dtype", "shape")

    def __init__(
        self,
        data: bytes,
        checksum: str,
        codec: str,
        raw: bool,
        dtype: np.dtype,
        shape: tuple[int, ...],
    ):
        self.data = data  # the codec's blob
        self.checksum = checksum  # xxh3-64 of data
        self.codec = codec  # the codec's config, as JSON text
        self.raw = raw  # data encodes the leaf's bytes (as uint8), not its values
        self.dtype = dtype
        self.shape = shape


class _Entry:
    __slots__ = ("spec", "blobs", "checksums", "lossless")

    def __init__(self, spec: str, blobs: list[_Blob], checksums: tuple[str, ...], lossless: bool):
        self.spec = spec
        self.blobs = blobs
        self.checksums = checksums
        self.lossless = lossless


def _is_lossless(codec) -> bool:
    flag = getattr(codec, "lossless", None)
    if isinstance(flag, bool):
        return flag
    from .codecs import Lossless

    return isinstance(codec, Lossless)


class CompressedMemoryTier(Tier):
    """Records compressed leaf by leaf with a codec, held in host memory.

    **Arguments:**

    - `codec`: a codec from :mod:`vlcc_adjoint.storage.codecs` (anything with
      ``encode(array) -> bytes``, ``decode(blob, out=None)`` and ``config()``
      that ``codec_from_config`` rebuilds); default ``Lossless()``.  With a
      lossy codec ``get`` returns the decoded approximation (see the module
      docstring).
    - `capacity_bytes`: the most *encoded* bytes the tier may hold (``None``:
      unbounded).
    - `name`: the tier's name in messages and statistics.
    """

    copies_on_put = True  # put encodes each leaf into a blob of its own
    fresh_gets = True  # get decodes into new arrays

    def __init__(
        self,
        codec: Codec | None = None,
        capacity_bytes: int | None = None,
        *,
        name: str = "compressed-memory",
    ):
        from .codecs import Lossless

        self.codec = Lossless() if codec is None else codec
        for method in ("encode", "decode", "config"):
            if not callable(getattr(self.codec, method, None)):
                raise VlccTypeError(
                    f"codec {self.codec!r} has no {method}(); use a codec from "
                    "vlcc_adjoint.storage.codecs"
                )
        self.capacity_bytes = check_capacity(capacity_bytes)
        self.name = name
        self._config = json.dumps(self.codec.config(), sort_keys=True)
        self._lossless = _is_lossless(self.codec)
        self._raw_codec = Lossless()
        self._raw_config = json.dumps(self._raw_codec.config(), sort_keys=True)
        self._decoders = {self._config: self.codec, self._raw_config: self._raw_codec}
        self._lock = threading.Lock()
        self._records: dict[str, _Entry] = {}
        self._used = 0
        self._relative: float | None = None  # tau of a relative bound, else None
        self._raw_put = 0  # bytes of the leaves put, before and after encoding
        self._encoded_put = 0

    @property
    def lossy(self) -> bool:
        """Whether the codec may change values (``ErrorBounded``, ``FixedRate``)."""
        return not self._lossless

    @property
    def error_bound(self) -> tuple[str, float] | None:
        """``("absolute", eb)`` or ``("relative", tau)`` for an ``ErrorBounded``
        codec (see :meth:`set_error_bound`), ``None`` for any other codec."""
        from .codecs import ErrorBounded

        if not isinstance(self.codec, ErrorBounded):
            return None
        if self._relative is not None:
            return ("relative", self._relative)
        return ("absolute", self.codec.abs_error)

    def set_error_bound(
        self, abs_error: float | None = None, *, relative: float | None = None
    ) -> None:
        """Set the error bound of the tier's ``ErrorBounded`` codec for later puts.

        Records already stored keep the bound they were written with (each
        blob describes its own codec).

        **Arguments:**

        - `abs_error`: an absolute bound, ``|x - x'| <= abs_error``; or
        - `relative`: ``tau``: each leaf ``x`` is encoded with the bound
          ``tau max|x|`` rounded down to a power of ``2^(1/16)`` and
          dithered by up to a factor 2 (module docstring), so
          ``|x - x'| <= tau max|x|``.  A leaf of zeros is stored exactly, a
          leaf holding nan or inf through ``Lossless``.

        **Raises:** ``TypeError`` if the codec is not ``ErrorBounded``;
        ``ValueError`` unless exactly one bound, finite and > 0, is given.
        """
        from .codecs import ErrorBounded

        if not isinstance(self.codec, ErrorBounded):
            raise VlccTypeError(
                f"tier {self.name!r} encodes with {self.codec!r}, which has no absolute error "
                "bound to set; build it with CompressedMemoryTier(ErrorBounded(bound))"
            )
        if (abs_error is None) == (relative is None):
            raise VlccValueError("set_error_bound takes exactly one of abs_error= and relative=")
        value = abs_error if relative is None else relative
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float, np.floating, np.integer))
            or not math.isfinite(value)
            or value <= 0
        ):
            name = "abs_error" if relative is None else "relative"
            raise VlccValueError(f"{name} must be a finite number > 0, got {value!r}")
        with self._lock:
            if relative is None:
                self._set_codec(ErrorBounded(float(value)))
                self._relative = None
            else:
                self._relative = float(value)

    def _set_codec(self, codec) -> None:
        """Lock held: `codec` encodes the next puts."""
        self.codec = codec
        self._config = json.dumps(codec.config(), sort_keys=True)
        self._decoders.setdefault(self._config, codec)

    @property
    def bytes_put(self) -> tuple[int, int]:
        """``(raw, encoded)``: bytes of every leaf ever put, before and after
        encoding (``raw / encoded``: the compression ratio achieved)."""
        with self._lock:
            return self._raw_put, self._encoded_put

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def raw_bytes(self) -> int:
        """Uncompressed bytes of the leaves held (``raw_bytes / used_bytes``: the ratio)."""
        with self._lock:
            return sum(
                int(np.prod(b.shape, dtype=np.int64)) * b.dtype.itemsize
                for e in self._records.values()
                for b in e.blobs
            )

    def _relative_codec(self, leaf: np.ndarray, tau: float, salt: str):
        """The codec and its config for `leaf` under the relative bound `tau`
        (`salt`: the record's key and the leaf's index, which pick its dither)."""
        from .codecs import ErrorBounded

        if leaf.dtype.kind != "f" or leaf.size == 0:
            return self.codec, self._config  # exact or empty whatever the bound
        top = float(np.max(np.abs(leaf)))
        if not math.isfinite(top):
            return self._raw_codec, self._raw_config
        if top == 0.0:
            return self.codec, self._config  # zeros are exact at any bound
        # The dither: 2^(-h / BOUND_GRID), h in [0, BOUND_GRID), a hash of the
        # record's key and the leaf's index.  Reproducible, and a different
        # quantisation lattice for each checkpoint.
        h = zlib.crc32(salt.encode()) % BOUND_GRID
        eb = 2.0 ** ((math.floor(BOUND_GRID * math.log2(tau * top)) - h) / BOUND_GRID)
        codec = ErrorBounded(eb)
        config = json.dumps(codec.config(), sort_keys=True)
        with self._lock:
            return self._decoders.setdefault(config, codec), config

    def _encode(self, leaf: np.ndarray, salt: str = "") -> _Blob:
        if leaf.dtype.kind in "biufc" and leaf.dtype.names is None:
            tau = self._relative
            codec, config = (
                (self.codec, self._config) if tau is None else self._relative_codec(leaf, tau, salt)
            )
            data = codec.encode(leaf)
            codec, raw = config, False
        else:  # not a numeric dtype: its raw bytes, exactly
            data = self._raw_codec.encode(leaf.reshape(-1).view(np.uint8))
            codec, raw = self._raw_config, True
        return _Blob(data, bytes_checksum(data), codec, raw, leaf.dtype, leaf.shape)

    def put(self, key: str, record: Record) -> None:
        """Encode and store `record` under the new key `key`.

        Raises :class:`TierFullError` if the *encoded* record does not fit
        (nothing is stored), ``KeyError`` if the key is taken.
        """
        check_record(key, record)
        spec_json = encode_spec(key, record.spec)
        if key in self._records:  # fail before spending time on encoding
            raise VlccKeyError(f"record {key!r} is already in tier {self.name!r}; delete it first")
        blobs = [
            self._encode(leaf, f"{key}/{i}")  # outside the lock
            for i, leaf in enumerate(record.leaves)
        ]
        need = sum(len(b.data) for b in blobs)
        with self._lock:
            if key in self._records:
                raise VlccKeyError(
                    f"record {key!r} is already in tier {self.name!r}; delete it first"
                )
            if self.capacity_bytes is not None and self._used + need > self.capacity_bytes:
                raise TierFullError.no_room(key, self.name, need, self._used, self.capacity_bytes)
            self._records[key] = _Entry(spec_json, blobs, tuple(record.checksums), self._lossless)
            self._used += need
            self._raw_put += sum(leaf.nbytes for leaf in record.leaves)
            self._encoded_put += need

    def _decoder(self, config: str):
        codec = self._decoders.get(config)
        if codec is None:
            from .codecs import codec_from_config

            codec = codec_from_config(json.loads(config))
            self._decoders[config] = codec
        return codec

    def get(self, key: str) -> Record:
        """Decode the record under `key`, after verifying its encoded bytes.

        Lossless: the decoded leaves are also checked against the original
        checksums.  Lossy: the decoded approximation, with checksums of it.
        """
        with self._lock:
            entry = self._records.get(key)
        if entry is None:
            raise VlccKeyError(f"no record {key!r} in tier {self.name!r}")
        spec = json.loads(entry.spec)
        step = step_of(spec)
        leaves = []
        for i, blob in enumerate(entry.blobs):
            got = bytes_checksum(blob.data)
            if got != blob.checksum:
                raise CorruptCheckpointError.in_record(
                    f"the encoded bytes of leaf {i} have checksum {got}, stored {blob.checksum}",
                    key,
                    self.name,
                    step,
                )
            out = np.empty(blob.shape, blob.dtype)
            target = out.reshape(-1).view(np.uint8) if blob.raw else out
            try:
                self._decoder(blob.codec).decode(blob.data, out=target)
            except ValueError as err:
                raise CorruptCheckpointError.in_record(
                    f"leaf {i} does not decode ({err})", key, self.name, step
                ) from None
            leaves.append(out)
        checksums = []
        for i, (leaf, want, blob) in enumerate(zip(leaves, entry.checksums, entry.blobs)):
            got = leaf_checksum(leaf)
            if (entry.lossless or blob.raw) and got != want:
                raise CorruptCheckpointError.in_record(
                    f"decoded leaf {i} has checksum {got}, the record says {want}",
                    key,
                    self.name,
                    step,
                )
            checksums.append(got)
        return Record(spec, tuple(leaves), tuple(checksums))

    def delete(self, key: str) -> None:
        """Free the record under `key`."""
        with self._lock:
            entry = self._records.pop(key, None)
            if entry is None:
                raise VlccKeyError(f"no record {key!r} in tier {self.name!r}")
            self._used -= sum(len(b.data) for b in entry.blobs)

    def keys(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._records))

    def __contains__(self, key: str) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        cap = "unbounded" if self.capacity_bytes is None else f"{self.capacity_bytes} B"
        return f"CompressedMemoryTier(codec={self.codec!r}, used={self._used} B, capacity={cap})"
