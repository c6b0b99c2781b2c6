"""The executor's checks of what a solver hands back: structure, shapes and
dtypes of every state and adjoint against the first one, the adjoint seed
against the state, and nan/inf.

A state's *signature* is its structure with the shapes and dtypes of its
arrays (values ignored).  :func:`matcher` compiles a signature once into a
function that answers ``signature(x) == sig`` in place, without building
the signature, so checking a step costs a few comparisons per node; the
messages are written only when a check fails.
"""

from __future__ import annotations

import cmath
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import VlccError

__all__ = [
    "NonFiniteError",
    "StateMismatchError",
    "check_finite",
    "check_seed",
    "describe_mismatch",
    "matcher",
    "signature",
]


class StateMismatchError(VlccError, ValueError):
    """A solver returned a state whose structure, shapes or dtypes differ
    from the initial one, or the adjoint seed does not fit the state."""


class NonFiniteError(VlccError, FloatingPointError):
    """A state or adjoint of a ``run_adjoint(..., check_finite=True)`` run
    holds nan or inf.

    **Attributes:**

    - `kind`: ``"forward"`` (a state ``u_{step+1}``), ``"adjoint"`` (an
      adjoint ``lambda_step``), ``"initial"`` (``u_0``) or ``"seed"``
      (``adj_final``).
    - `step`: the forward or adjoint step that returned it (``None`` for
      ``u_0`` and the seed).
    - `path`: where in the state, e.g. ``"state['p']"``.
    """

    def __init__(self, message: str, *, kind: str, step: int | None, path: str):
        super().__init__(message)
        self.kind = kind
        self.step = step
        self.path = path


def signature(state) -> Any:
    """The structure, shapes and dtypes of a state (values ignored)."""
    if isinstance(state, np.ndarray):
        return ("array", state.shape, state.dtype.str)
    if hasattr(state, "shape") and hasattr(state, "dtype"):  # jax / torch arrays
        try:
            dtype = np.dtype(state.dtype).str
        except TypeError:
            dtype = str(state.dtype)
        return ("array", tuple(state.shape), dtype)
    if isinstance(state, dict):
        return ("dict", tuple((k, signature(v)) for k, v in state.items()))
    if isinstance(state, (list, tuple)):
        return (type(state), tuple(signature(v) for v in state))
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return (
            type(state),
            tuple((f.name, signature(getattr(state, f.name))) for f in dataclasses.fields(state)),
        )
    return (type(state),)


def matcher(sig) -> Callable[[Any], bool]:
    """``match(state) -> bool``: whether ``signature(state) == sig``,
    without building the signature.

    ``signature`` builds nested tuples and asks ``dataclasses.fields`` at
    every level, a few microseconds a node, twice per time step.  The
    matcher compares the same things in place: types, keys and lengths, and
    per numpy array its shape and dtype.  It answers exactly what the
    comparison would, so a mismatch is still found at the step it happens
    (and described from the full signatures)."""
    kind = sig[0]
    if kind == "array":
        shape, dstr = sig[1], sig[2]
        dtypes = []  # dtype objects seen with this dtype.str: an identity check

        def match_array(x):
            if type(x) is np.ndarray:
                if x.shape != shape:
                    return False
                dtype = x.dtype
                for seen in dtypes:
                    if dtype is seen:
                        return True
                if dtype.str != dstr:
                    return False
                if len(dtypes) < 4:
                    dtypes.append(dtype)
                return True
            return signature(x) == sig  # JAX / torch arrays

        return match_array
    if kind == "dict":
        pairs = tuple((k, matcher(v)) for k, v in sig[1])

        def match_dict(x):
            if type(x) is not dict:
                return signature(x) == sig
            if len(x) != len(pairs):
                return False
            for (k, v), (key, match) in zip(x.items(), pairs):
                if not (k == key and match(v)):
                    return False
            return True

        return match_dict
    cls = kind
    if len(sig) == 1:  # a type signature does not look into
        return lambda x: signature(x) == sig
    if issubclass(cls, (list, tuple)):
        subs = tuple(matcher(v) for v in sig[1])

        def match_seq(x):
            if type(x) is not cls or len(x) != len(subs):
                return False
            for v, match in zip(x, subs):
                if not match(v):
                    return False
            return True

        return match_seq
    names = tuple(name for name, _ in sig[1])
    subs = tuple(matcher(v) for _, v in sig[1])

    def match_fields(x):
        if type(x) is not cls:
            return False
        for name, match in zip(names, subs):
            if not match(getattr(x, name)):
                return False
        return True

    return match_fields


def describe_mismatch(got, want, path="state") -> str:
    if got == want:
        return ""
    if got[0] == "array" and want[0] == "array":
        return (
            f"{path} is an array of shape {got[1]} and dtype {got[2]}, "
            f"expected shape {want[1]} and dtype {want[2]}"
        )
    if got[0] != want[0]:
        gname = got[0] if isinstance(got[0], str) else got[0].__name__
        wname = want[0] if isinstance(want[0], str) else want[0].__name__
        return f"{path} is a {gname}, expected a {wname}"
    if len(got) > 1 and len(got[1]) != len(want[1]):
        return f"{path} has {len(got[1])} entries, expected {len(want[1])}"
    for i, (g, w) in enumerate(zip(got[1], want[1])):
        if got[0] == "dict" or dataclasses.is_dataclass(got[0]):
            if g[0] != w[0]:
                return f"{path} has key {g[0]!r} where {w[0]!r} was expected"
            sub = describe_mismatch(g[1], w[1], f"{path}[{g[0]!r}]")
        else:
            sub = describe_mismatch(g, w, f"{path}[{i}]")
        if sub:
            return sub
    return f"{path} differs in structure"


def _seed_mismatch(got, want, path: str) -> str:
    """How an adjoint seed's signature `got` fails to fit the state's
    `want`, or ``""``.

    The adjoint's form is the solver's to define (it may leave out parts of
    the state that carry no derivative, or be a different object), so only
    what mirrors the state is compared: an array where the state has an
    array must have its shape (dtypes may differ; a scalar fits a 0-d
    array), a dict where the state has a dict its keys, a list or tuple
    where the state has one its length; then the parts, recursively.
    """
    gk, wk = got[0], want[0]
    if wk == "array" and gk == "array":
        return "" if got[1] == want[1] else f"{path} has shape {got[1]}, expected {want[1]}"
    if wk == "dict" and gk == "dict":
        have, need = dict(got[1]), dict(want[1])
        if have.keys() != need.keys():
            extra = sorted(map(repr, have.keys() - need.keys()))
            missing = sorted(map(repr, need.keys() - have.keys()))
            return (
                f"{path} has keys {', '.join(extra) or '(none extra)'} where the state has "
                f"{', '.join(missing) or '(none missing)'}"
            )
        for key, sub in need.items():
            text = _seed_mismatch(have[key], sub, f"{path}[{key!r}]")
            if text:
                return text
        return ""
    if isinstance(wk, type) and issubclass(wk, (list, tuple)) and gk is wk:
        if len(got[1]) != len(want[1]):
            return f"{path} has {len(got[1])} entries, expected {len(want[1])}"
        for i, (g, w) in enumerate(zip(got[1], want[1])):
            text = _seed_mismatch(g, w, f"{path}[{i}]")
            if text:
                return text
        return ""
    if isinstance(wk, type) and gk is wk and len(want) > 1:  # the same dataclass
        for (name, g), (_, w) in zip(got[1], want[1]):
            text = _seed_mismatch(g, w, f"{path}.{name}")
            if text:
                return text
    return ""


def check_seed(adj, state_signature, path: str) -> None:
    """A :class:`StateMismatchError` if the adjoint seed does not fit the state."""
    text = _seed_mismatch(signature(adj), state_signature, path)
    if text:
        raise StateMismatchError(
            f"the adjoint seed does not fit the state: {text} (as in u_0). adj_final is "
            "lambda_n = dJ/du_n and has the structure and shapes of the final state u_n: "
            "build it like the state (e.g. np.zeros_like(u_n) for an array), or pass a "
            "callable adj_final(u_n) -> lambda_n"
        )


def _first_nonfinite(x, path: str):
    """``(path, count, size)`` of the first leaf of `x` holding nan or inf, or ``None``."""
    if isinstance(x, (float, complex)):
        return None if cmath.isfinite(x) else (path, 1, 1)
    if isinstance(x, np.ndarray) or (hasattr(x, "shape") and hasattr(x, "dtype")):
        a = np.asarray(x)
        if a.dtype.kind not in "fc":
            return None
        ok = np.isfinite(a)
        if ok.all():
            return None
        return (path, int(a.size - np.count_nonzero(ok)), int(a.size))
    if isinstance(x, dict):
        items = ((f"{path}[{k!r}]", v) for k, v in x.items())
    elif isinstance(x, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(x))
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        items = ((f"{path}.{f.name}", getattr(x, f.name)) for f in dataclasses.fields(x))
    else:
        return None
    for sub_path, value in items:
        found = _first_nonfinite(value, sub_path)
        if found is not None:
            return found
    return None


def check_finite(x, kind: str, step: int | None) -> None:
    """:class:`NonFiniteError` if `x` (a state or an adjoint) holds nan or inf."""
    root = "adjoint" if kind in ("adjoint", "seed") else "state"
    found = _first_nonfinite(x, root)
    if found is None:
        return
    path, count, size = found
    what = {
        "forward": f"forward step {step} returned a state u_{step + 1}" if step is not None else "",
        "adjoint": f"adjoint step {step} returned an adjoint lambda_{step}",
        "initial": "the initial state u_0",
        "seed": "the adjoint seed adj_final",
    }[kind]
    raise NonFiniteError(
        f"{what} that is not finite: {path} holds {count} nan/inf value(s) of {size}. This is "
        "the first non-finite one of the run; check the step's stability (time step, CFL "
        "condition), its inputs and its divisions",
        kind=kind,
        step=step,
        path=path,
    )
