"""Dtypes as JSON: the one place a checkpoint's dtype text is written and read.

A spec names each leaf's dtype as numpy's ``dtype.str`` (byte order
included: ``"<f8"``, ``">i4"``, ``"|b1"``), an ``ml_dtypes`` name
(``"bfloat16"``, the ``float8`` family) or ``{"descr": ...}`` for a
structured dtype.  :func:`dtype_from_json` accepts only these forms, checked
against an allow-list before numpy parses anything, so a crafted
checkpoint can never name an ``object`` dtype or make numpy import a type.
"""

from __future__ import annotations

import re

import numpy as np

from .errors import VlccTypeError, VlccValueError

__all__ = ["dtype_from_json", "dtype_to_json"]

# numpy's dtype.str forms we accept: byte order, kind, item size, and a
# datetime unit.  Anything else (object "O", strings numpy would parse as
# structured dtypes or type names) is refused before np.dtype sees it.
_DTYPE_STR = re.compile(
    r"[<>|][biufc]\d{1,2}|[<>|][mM]8(\[\d{0,9}[A-Za-z]{1,2}\])?|[<>|][SUV]\d{1,10}"
)
# ml_dtypes types (the narrow floats of accelerator frameworks); looked up by name in ml_dtypes, never imported by name.
_ML_DTYPES = frozenset(
    {
        "bfloat16",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e4m3b11fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e3m4",
        "float8_e4m3",
        "float8_e8m0fnu",
        "float4_e2m1fn",
        "float6_e2m3fn",
        "float6_e3m2fn",
        "int2",
        "int4",
        "uint2",
        "uint4",
    }
)


def dtype_to_json(dtype: np.dtype) -> str | dict:
    """A JSON form of `dtype` that :func:`dtype_from_json` rebuilds exactly.

    **Returns:** numpy's ``dtype.str`` (byte order included: ``"<f8"``,
    ``">i4"``, ``"|b1"``), an ``ml_dtypes`` name (``"bfloat16"``), or
    ``{"descr": ...}`` for structured dtypes.

    Raises ``TypeError`` for dtypes that hold Python objects.
    """
    dtype = np.dtype(dtype)
    known = _DTYPE_JSON.get(dtype)
    if known is not None:  # every leaf of every save asks: answer the common ones at once
        return known
    text = _dtype_to_json(dtype)
    if isinstance(text, str):
        _DTYPE_JSON[dtype] = text
    return text


#: dtype -> its JSON string, filled as dtypes are met.
_DTYPE_JSON: dict[np.dtype, str] = {}


def _dtype_to_json(dtype: np.dtype) -> str | dict:
    if dtype.hasobject:
        raise VlccTypeError(
            f"dtype {dtype} holds Python objects, which cannot be checkpointed without pickle; "
            "convert to a numeric or fixed-width string dtype (e.g. np.asarray(x, dtype=float) "
            "or x.astype('U')), or keep the objects in a list"
        )
    if dtype.names is not None or dtype.subdtype is not None:
        return {"descr": _descr_to_json(np.lib.format.dtype_to_descr(dtype))}
    if dtype.kind == "V" and dtype.type.__module__.startswith("ml_dtypes"):
        if dtype.name not in _ML_DTYPES:
            raise VlccTypeError(f"unsupported ml_dtypes type {dtype.name}")
        return dtype.name
    text = dtype.str
    if _DTYPE_STR.fullmatch(text) is None:  # pragma: no cover - exotic numpy dtypes
        raise VlccTypeError(
            f"unsupported dtype {dtype!r} ({text}); convert the array to a numeric dtype"
        )
    return text


def _descr_to_json(descr):
    if isinstance(descr, str):
        return descr
    return [
        [_descr_to_json(part) for part in field] if isinstance(field, tuple) else field
        for field in descr
    ]


def dtype_from_json(value: object) -> np.dtype:
    """The dtype that :func:`dtype_to_json` wrote, after validating it.

    Only numpy's plain dtype strings (numeric, bool, datetime, ``S``/``U``/``V``),
    the known ``ml_dtypes`` names, and structured dtypes built from them are
    accepted; anything else raises ``ValueError``.  Safe on untrusted input:
    nothing is imported or evaluated.
    """
    if isinstance(value, str):
        if value in _ML_DTYPES:
            import ml_dtypes

            return np.dtype(getattr(ml_dtypes, value))
        if _DTYPE_STR.fullmatch(value) is None:
            raise VlccValueError(f"invalid or unsupported dtype {value!r} in checkpoint metadata")
        try:
            return np.dtype(value)
        except TypeError:  # well-formed but not a numpy dtype, e.g. "<b8"
            raise VlccValueError(f"invalid dtype {value!r} in checkpoint metadata") from None
    if isinstance(value, dict) and set(value) == {"descr"} and isinstance(value["descr"], list):
        try:
            dtype = np.lib.format.descr_to_dtype(_descr_from_json(value["descr"], 0))
        except TypeError as err:  # e.g. duplicate field names
            raise VlccValueError(
                f"invalid structured dtype in checkpoint metadata ({err})"
            ) from None
        if dtype.hasobject:
            raise VlccValueError("structured dtype with object fields in checkpoint metadata")
        return dtype
    raise VlccValueError(f"invalid dtype {value!r} in checkpoint metadata")


def _descr_from_json(descr, depth: int):
    if depth > 8:
        raise VlccValueError("structured dtype nested too deeply in checkpoint metadata")
    if isinstance(descr, str):
        dtype_from_json(descr)
        return descr
    if not isinstance(descr, list):
        raise VlccValueError(f"invalid structured dtype field {descr!r} in checkpoint metadata")
    fields = []
    for field in descr:
        if not (isinstance(field, list) and len(field) in (2, 3)):
            raise VlccValueError(f"invalid structured dtype field {field!r} in checkpoint metadata")
        name = field[0]
        if isinstance(name, list):  # (title, name)
            if not (len(name) == 2 and all(isinstance(s, str) for s in name)):
                raise VlccValueError(f"invalid field name {name!r} in checkpoint metadata")
            name = tuple(name)
        elif not isinstance(name, str):
            raise VlccValueError(f"invalid field name {name!r} in checkpoint metadata")
        item = [name, _descr_from_json(field[1], depth + 1)]
        if len(field) == 3:
            shape = field[2]
            if not (
                isinstance(shape, list) and all(type(s) is int and 0 <= s < 2**31 for s in shape)
            ):
                raise VlccValueError(f"invalid field shape {shape!r} in checkpoint metadata")
            item.append(tuple(shape))
        fields.append(tuple(item))
    return fields
