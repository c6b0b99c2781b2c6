"""Re-flattening states of a known structure (:class:`Layout`).

A time loop hands the store states of one structure over and over (the
same dataclass of the same two arrays, every step).  Re-deriving the spec
of each one costs tens of microseconds of Python (a provider lookup, a
path-tracking recursion and a dtype -> JSON conversion per node), which on
a small state is as much as copying it.  A Layout remembers the spec of
a state made only of numpy arrays and of containers whose structure does
not depend on values (dicts with str keys, lists, tuples, dataclasses and
named tuples flattened by their automatic providers), and checks a new
state against it in one walk that compares types, keys, lengths and, per
leaf, dtype *identity*, shape and C-contiguity.  When all of them match,
``flatten(state)`` would return exactly these leaves and an equal spec; any
difference (or anything the walk does not model: scalars, leaves of
registered leaf providers, user providers) sends the caller to ``flatten``
itself.

The way back is compiled too: :meth:`Layout.build` rebuilds a state of the
layout from its leaves, as :func:`~vlcc_adjoint.state.unflatten` would from
the spec, with the spec's nodes read once (when the layout is made) instead
of on every restore, and each leaf checked against the dtype and shape the
spec records by identity and tuple comparison instead of by parsing the
dtype's JSON text.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._providers import _BY_NAME, _BY_TYPE, SPEC_FORMAT

__all__ = ["Layout"]


class Layout:
    """The structure of a state of numpy arrays and plain containers, for
    re-flattening states of the same structure quickly.

    Built by :meth:`of` from a state; :meth:`leaves` returns a new state's
    leaves (the same arrays :func:`flatten` would return) when its structure,
    dtypes and shapes match, else ``None``.  :attr:`tree` and
    :attr:`leaf_specs` are the parts of the spec shared by every state of
    the layout: read-only, never modify them.
    """

    __slots__ = ("tree", "leaf_specs", "nbytes", "infos", "_walk", "_n", "_build")

    def __init__(
        self,
        tree: dict[str, Any],
        leaf_specs: list[dict[str, Any]],
        nbytes: int,
        walk: Callable[[Any, list[np.ndarray]], bool],
        n: int,
        infos: tuple[tuple[np.dtype, tuple[int, ...]], ...],
        build: Callable[[Sequence[np.ndarray]], Any],
    ) -> None:
        self.tree = tree
        self.leaf_specs = leaf_specs
        self.nbytes = nbytes
        self.infos = infos  # per leaf: (dtype, shape)
        self._walk = walk
        self._n = n
        self._build = build

    @classmethod
    def of(
        cls, state: Any, leaves: list[np.ndarray] | None = None, spec: dict[str, Any] | None = None
    ) -> Layout | None:
        """The layout of `state` (optionally with its ``flatten`` result), or
        ``None`` if the state holds anything a layout does not model."""
        if spec is None:
            from .state import flatten  # state imports this module

            leaves, spec = flatten(state)
        walk = _compile(state, spec["tree"], leaves)
        if walk is None:
            return None
        build = _compile_build(spec["tree"])
        infos = tuple((leaf.dtype, leaf.shape) for leaf in leaves)
        return cls(
            spec["tree"],
            spec["leaves"],
            sum(leaf.nbytes for leaf in leaves),
            walk,
            len(leaves),
            infos,
            build,
        )

    def leaves(self, state: Any) -> list[np.ndarray] | None:
        """The leaves of `state` if it has this layout, else ``None``."""
        out: list[np.ndarray] = []
        if self._walk(state, out) and len(out) == self._n:
            return out
        return None

    def build(self, leaves: list) -> Any:
        """The state of this layout around `leaves` (``unflatten(self.spec(),
        leaves)``, the leaves going into the state uncopied).

        Each leaf must be a numpy array of the dtype (byte order included)
        and shape of the layout's leaf; if one is not, the spec's own
        :func:`~vlcc_adjoint.state.unflatten` rebuilds it, raising its error.
        """
        if len(leaves) != self._n:
            return self._unflatten(leaves)
        for leaf, (dtype, shape) in zip(leaves, self.infos):
            if (
                type(leaf) is not np.ndarray
                or leaf.shape != shape
                or (
                    leaf.dtype is not dtype and (leaf.dtype != dtype or leaf.dtype.str != dtype.str)
                )
            ):
                return self._unflatten(leaves)
        return self._build(leaves)

    def _unflatten(self, leaves):
        from .state import unflatten  # state imports this module

        return unflatten(self.spec(), leaves)

    def spec(self) -> dict:
        """A spec of this layout (a new top-level dict; its parts are shared)."""
        return {"format": SPEC_FORMAT, "tree": self.tree, "leaves": self.leaf_specs}


def _compile(obj, node, leaves):
    """``walk(x, out) -> bool`` appending the leaves of `x` to `out`, true
    iff `x` has the structure that `obj` (flattened to `node`) has; ``None``
    if that structure holds anything but numpy leaves and plain containers.

    A container whose children are all arrays (the usual state: a dataclass
    or a tuple of fields) checks them in one loop, without a call per leaf."""
    cls = type(obj)
    if cls is np.ndarray:
        if set(node) != {"leaf"} or leaves[node["leaf"]] is not obj:
            return None  # a copy flatten made (not C-contiguous)
        dtype, shape = obj.dtype, obj.shape

        def walk_leaf(x, out):
            if (
                type(x) is np.ndarray
                and x.dtype is dtype
                and x.shape == shape
                and x.flags.c_contiguous
            ):
                out.append(x)
                return True
            return False

        return walk_leaf
    if cls is dict and "dict" in node:
        keys = tuple(node["dict"])
        children, items = [obj[k] for k in keys], node["items"]
    elif (cls is list or cls is tuple) and cls.__name__ in node:
        keys, children, items = None, list(obj), node[cls.__name__]
    else:
        provider = _BY_TYPE.get(cls)
        if provider is None or provider.user or "type" not in node:
            return None
        keys, (children, _), items = None, provider.flatten(obj), node["items"]
    if len(children) != len(items):
        return None
    if cls is not dict and cls is not list and cls is not tuple:
        # The automatic providers' children depend on the class alone: a
        # dataclass's fields (read with one attrgetter) or a named tuple's items.
        names = node["aux"]
        if isinstance(names, list):
            if not names:
                return None
            getter = operator.attrgetter(*names)
            get = (lambda x: (getter(x),)) if len(names) == 1 else getter
        elif issubclass(cls, tuple):
            get = None  # a named tuple: its items
        else:  # pragma: no cover - the automatic providers are the two above
            return None
        current = _BY_TYPE[cls]

        def check(x):
            # The provider must still be the one registered (register() may
            # replace it).
            return type(x) is cls and _BY_TYPE.get(cls) is current
    elif keys is not None:
        get = dict.values

        def check(x):
            if type(x) is not dict or len(x) != len(keys):
                return False
            for k, key in zip(x, keys):
                if type(k) is not str or k != key:
                    return False
            return True
    else:
        length = len(children)
        get = None

        def check(x):
            return type(x) is cls and len(x) == length

    if all(
        type(c) is np.ndarray and item.keys() == {"leaf"} and leaves[item["leaf"]] is c
        for c, item in zip(children, items)
    ):
        infos = tuple((c.dtype, c.shape) for c in children)
        count = len(infos)

        def walk_leaves(x, out):
            if not check(x):
                return False
            xs = get(x) if get is not None else x
            if len(xs) != count:
                return False
            for v, (dtype, shape) in zip(xs, infos):
                if (
                    type(v) is not np.ndarray
                    or v.dtype is not dtype
                    or v.shape != shape
                    or not v.flags.c_contiguous
                ):
                    return False
            out.extend(xs)
            return True

        return walk_leaves
    subs = tuple(_compile(c, n, leaves) for c, n in zip(children, items))
    if any(s is None for s in subs):
        return None

    def walk(x, out):
        if not check(x):
            return False
        xs = get(x) if get is not None else x
        if len(xs) != len(subs):
            return False
        for v, sub in zip(xs, subs):
            if not sub(v, out):
                return False
        return True

    return walk


def _compile_build(node):
    """``build(leaves) -> state`` for a spec tree of a layout (array leaves,
    str-keyed dicts, lists, tuples and registered container types): the
    dispatch of ``state._unflatten`` on each node done once, here.  A
    registered type's provider is looked up by name at every call, as
    ``unflatten`` does (``register`` may replace it)."""
    if "leaf" in node:
        i = node["leaf"]
        return lambda leaves: leaves[i]
    if "dict" in node:
        keys = tuple(node["dict"])
        subs = tuple(_compile_build(v) for v in node["items"])
        if all("leaf" in v for v in node["items"]):
            idx = tuple(v["leaf"] for v in node["items"])
            return lambda leaves: {k: leaves[i] for k, i in zip(keys, idx)}
        return lambda leaves: {k: sub(leaves) for k, sub in zip(keys, subs)}
    if "list" in node or "tuple" in node:
        seq = list if "list" in node else tuple
        subs = tuple(_compile_build(v) for v in node[seq.__name__])
        return lambda leaves: seq([sub(leaves) for sub in subs])
    name, aux = node["type"], node["aux"]
    subs = tuple(_compile_build(v) for v in node["items"])
    if all("leaf" in v for v in node["items"]):
        idx = tuple(v["leaf"] for v in node["items"])

        def build_type_of_leaves(leaves):
            provider = _BY_NAME.get(name)
            if provider is None:
                return _missing(name)
            return provider.unflatten(aux, [leaves[i] for i in idx])

        return build_type_of_leaves

    def build_type(leaves):
        provider = _BY_NAME.get(name)
        if provider is None:
            return _missing(name)
        return provider.unflatten(aux, [sub(leaves) for sub in subs])

    return build_type


def _missing(name):
    from ._providers import UnknownStateTypeError

    raise UnknownStateTypeError(
        f"the checkpoint holds a {name!r}, which this process has not registered; call "
        "vlcc_adjoint.state.register(cls) (dataclasses, named tuples) or register(cls, "
        "flatten_fn, unflatten_fn) before loading (types are never imported from a checkpoint)"
    )
