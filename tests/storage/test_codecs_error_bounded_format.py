"""ErrorBounded format 2 (interpolation) and format 1 (Lorenzo): old blobs
decode, the new encoder honours the bound on every shape, and crafted blobs
are refused with a clear error before anything large is allocated."""

import struct
from pathlib import Path

import numpy as np
import pytest

from vlcc_adjoint.storage.codecs import ErrorBounded, decode
from vlcc_adjoint.storage.codecs._error_bounded import _PARAMS

FIXTURE = Path(__file__).parent / "fixtures" / "error_bounded_v1.npz"
NAMES = ["f32_2d", "f64_3d", "f64_1d", "f32_4d", "i4_lossless"]


def _check(x, y, eb):
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    fin = np.isfinite(x64)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert not fin.any() or np.abs(x64[fin] - y64[fin]).max() <= eb
    assert np.array_equal(
        x[~fin].view(np.uint8) if x.ndim else x, y[~fin].view(np.uint8) if y.ndim else y
    )


@pytest.mark.parametrize("name", NAMES)
def test_format_1_blobs_written_by_the_lorenzo_codec_still_decode(name):
    data = np.load(FIXTURE)
    blob = data[name + "_blob"].tobytes()
    assert blob[6] == 1  # written by the format-1 encoder
    y = decode(blob)
    assert np.array_equal(y.view(np.uint8), data[name + "_decoded"].view(np.uint8))
    _check(data[name + "_x"], y, float(data[name + "_eb"]))


def test_the_format_1_encoder_and_decoder_still_agree():
    x = np.cumsum(np.random.default_rng(0).standard_normal((30, 40)), axis=1)
    codec = ErrorBounded(1e-2)
    blob = codec._encode_v1(x)
    assert blob[6] == 1
    _check(x, codec.decode(blob), 1e-2)


def test_new_blobs_are_format_2():
    assert ErrorBounded(1e-3).encode(np.linspace(0, 1, 1000))[6] == 2


SHAPES = [
    (1,),
    (2,),
    (3,),
    (5,),
    (8,),
    (9,),
    (7, 9),
    (4, 4),
    (3, 5, 7),
    (9, 2, 17),
    (2, 3, 4, 5),
    (33, 65),
    (1000,),
    (1, 300, 1),
    (17, 1, 5),
    (65, 3),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES)
def test_interpolation_bound_holds_on_odd_and_tiny_shapes(dtype, shape):
    rng = np.random.default_rng(sum(shape))
    x = np.cumsum(rng.standard_normal(int(np.prod(shape)))).reshape(shape).astype(dtype)
    for eb in (1e-3, 0.3):
        y = ErrorBounded(eb).decode(ErrorBounded(eb).encode(x))
        _check(x, y, eb)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_non_contiguous_input_is_encoded_within_the_bound(dtype):
    base = np.sin(np.linspace(0, 40, 60 * 80)).reshape(60, 80).astype(dtype)
    for x in (base[::2, ::3], base.T, base[5:50, 7:70], np.asfortranarray(base)):
        y = ErrorBounded(1e-3).decode(ErrorBounded(1e-3).encode(x))
        _check(np.ascontiguousarray(x), y, 1e-3)


def test_escapes_exceptions_and_large_codes_round_trip():
    # a smooth field with jumps (escaped codes), NaN/inf (exceptions) and huge values
    x = np.sin(np.linspace(0, 30, 5000))
    x[100] = 1e6
    x[200], x[201], x[4999] = np.nan, np.inf, -np.inf
    x[300] = 1e300
    for eb in (1e-6, 1e-2):
        y = ErrorBounded(eb).decode(ErrorBounded(eb).encode(x))
        _check(x, y, eb)


def _blob():
    x = np.sin(np.linspace(0, 50, 40 * 50)).reshape(40, 50) * 3
    x[3, 3] = 1e5  # an escape
    x[7, 7] = np.nan  # an exception
    return bytearray(ErrorBounded(1e-4).encode(x))


def _params(blob):
    return list(_PARAMS.unpack_from(blob, 16 + 8 * 2))


def _with(blob, i, value):
    p = _params(blob)
    p[i] = value
    out = bytearray(blob)
    _PARAMS.pack_into(out, 16 + 8 * 2, *p)
    return bytes(out)


@pytest.mark.parametrize(
    "field,value",
    [
        (0, 7),  # unknown mode
        (1, 1),  # unknown flags
        (5, float("nan")),  # step
        (5, -1.0),
        (6, 2),  # 3-D view that does not match the shape
        (9, 10**12),  # escapes beyond the array
        (10, 10**12),  # exceptions beyond the array
        (9, 0),  # escapes used by the codes but not declared
        (11, 5),  # widths length
        (12, 8),  # words length
        (13, 10**9),  # escapes length beyond the blob
    ],
)
def test_crafted_format_2_parameters_are_refused(field, value):
    blob = _blob()
    assert _params(blob)[9] > 0 and _params(blob)[10] > 0
    with pytest.raises(ValueError, match="corrupt|truncated"):
        ErrorBounded(1.0).decode(_with(blob, field, value))


def test_a_crafted_shape_is_refused_before_allocation():
    blob = bytearray(_blob())
    struct.pack_into("<Q", blob, 16, 1 << 40)  # a huge first axis, same payload
    with pytest.raises(ValueError, match="corrupt|truncated"):
        ErrorBounded(1.0).decode(bytes(blob))


def test_flipped_bytes_anywhere_raise_or_decode_never_crash():
    blob = _blob()
    rng = np.random.default_rng(1)
    for pos in rng.integers(16, len(blob), 300):
        bad = bytearray(blob)
        bad[pos] ^= 1 << int(rng.integers(8))
        try:
            y = ErrorBounded(1.0).decode(bytes(bad))
        except ValueError:
            continue
        assert y.shape == (40, 50)


def test_truncated_and_padded_blobs_are_refused():
    blob = bytes(_blob())
    for cut in (len(blob) - 1, len(blob) // 2, 60):
        with pytest.raises(ValueError):
            ErrorBounded(1.0).decode(blob[:cut])
    with pytest.raises(ValueError):
        ErrorBounded(1.0).decode(blob + b"\0")
