"""The executor's checks of what a solver hands back: structure, shapes and
dtypes of every state and adjoint against the first one, the adjoint seed
against the state, and nan/inf.

All of them read the state through the one model of a state's structure,
:class:`vlcc_adjoint.state.Structure` (``flatten``'s spec, values aside,
compiled once): a state's *signature* is its structure, made without
copying anything or bringing it to the host; :func:`matcher` is the
structure's compiled check, which answers ``signature(x) == sig`` in
place, so checking a step costs a few comparisons per container and per
array (for a state that is one numpy array: a type, a shape and a dtype
identity test); the messages are written only when a check fails, and
name the first difference by its path in the state, as ``flatten`` names
paths (``state['u']``, ``state.params.c``, ``state[0]``).  Objects no
state provider knows (a solver may carry one in a state it never stores)
are compared by class.
"""

from __future__ import annotations

import cmath
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import VlccError
from .state import Structure, flatten_opaque, inline_value, spec_nodes

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


def signature(state: Any) -> Structure:
    """The structure, shapes and dtypes of a state or an adjoint as the
    executor keeps it (values ignored): a
    :class:`~vlcc_adjoint.state.Structure` made with ``opaque=True``, so that
    objects no provider knows are compared by class.  Nothing is copied or
    brought to the host."""
    return Structure.of(state, opaque=True)


def matcher(sig: Structure) -> Callable[[Any], bool]:
    """``match(state) -> bool``: whether ``signature(state) == sig``,
    without building the signature (the structure's compiled check,
    :attr:`~vlcc_adjoint.state.Structure.matches`)."""
    return sig.matches


def describe_mismatch(got: Structure, want: Structure, path: str = "state") -> str:
    """How the signature `got` differs from `want`, in one sentence naming
    the first difference by its path (``""`` if they are equal), e.g.
    ``"state['b'] is an array of shape (3,) and dtype <f8, expected shape
    (4,) and dtype <f8"``."""
    return want.difference(got, path)


def check_seed(adj: Any, state_signature: Structure, path: str) -> None:
    """A :class:`StateMismatchError` if the adjoint seed does not fit the state.

    The adjoint's form is the solver's to define (it may leave out parts of
    the state that carry no derivative, or be a different object), so only
    what mirrors the state is compared: an array where the state has an
    array must have its shape (dtypes may differ; a scalar fits a 0-d
    array), a dict where the state has a dict its keys, a list or tuple
    where the state has one its length, the same registered type (a
    dataclass) its fields; then the parts, recursively.
    """
    text = state_signature.difference(signature(adj), path, seed=True)
    if text:
        raise StateMismatchError(
            f"the adjoint seed does not fit the state: {text} (as in u_0). adj_final is "
            "lambda_n = dJ/du_n and has the structure and shapes of the final state u_n: "
            "build it like the state (e.g. np.zeros_like(u_n) for an array), or pass a "
            "callable adj_final(u_n) -> lambda_n"
        )


def _first_nonfinite(x: Any, root: str) -> tuple[str, int, int] | None:
    """``(path, count, size)`` of the first array or number of `x` (depth
    first, as ``flatten`` orders them) holding nan or inf, or ``None``."""
    leaves, spec = flatten_opaque(x)
    for kind, path, node in spec_nodes(spec["tree"], root):
        if kind == "leaf":
            a = leaves[node["leaf"]]
            if a.dtype.kind not in "fc":
                continue
            ok = np.isfinite(a)
            if not ok.all():
                return (path, int(a.size - np.count_nonzero(ok)), int(a.size))
        elif kind == "value" and type(node) is dict and node.keys() & {"float", "complex"}:
            if not cmath.isfinite(inline_value(node)):
                return (path, 1, 1)
        elif kind == "value" and type(node) is dict and "npscalar" in node:
            value = inline_value(node)
            if value.dtype.kind in "fc" and not np.isfinite(value):
                return (path, 1, 1)
    return None


def check_finite(x: Any, kind: str, step: int | None) -> None:
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
