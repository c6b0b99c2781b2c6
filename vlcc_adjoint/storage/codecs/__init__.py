"""Array codecs for checkpoints: lossless, error-bounded lossy, fixed-rate lossy.

Each codec turns a numeric ndarray into a self-describing blob (magic, codec
id and version, dtype, shape, parameters; never pickled) and back:

- :class:`Lossless`: byte shuffle + LZ4 through C-Blosc2, exact.
- :class:`ErrorBounded`: SZ3-style multilevel spline-interpolation
  prediction and linear quantisation in numba, ``|x - x'| <= abs_error`` for
  every finite value (blobs of the earlier Lorenzo format still decode).
- :class:`FixedRate`: block floating point at ``bits`` bits per value, a
  known size and an error relative to each block's largest value.

All three release the GIL while they work and may be called from several
threads at once.  ``codec.config()`` is a JSON-serialisable dict from which
:func:`codec_from_config` rebuilds the codec (so a tier can record which
codec wrote its data); :func:`decode` reads a blob of any of them.

Example::

    from vlcc_adjoint.storage.codecs import ErrorBounded, decode
    blob = ErrorBounded(1e-4).encode(u)
    v = decode(blob)                  # |u - v| <= 1e-4 elementwise
"""

from ._codec import Codec as Codec
from ._codec import codec_from_config as codec_from_config
from ._codec import decode as decode
from ._error_bounded import ErrorBounded as ErrorBounded
from ._fixed_rate import FixedRate as FixedRate
from ._lossless import Lossless as Lossless

__all__ = ["Codec", "ErrorBounded", "FixedRate", "Lossless", "codec_from_config", "decode"]
