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
"""

from __future__ import annotations

import operator

import numpy as np

from ._providers import _BY_TYPE, SPEC_FORMAT

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

    __slots__ = ("tree", "leaf_specs", "nbytes", "_walk", "_n")

    def __init__(self, tree, leaf_specs, nbytes, walk, n):
        self.tree = tree
        self.leaf_specs = leaf_specs
        self.nbytes = nbytes
        self._walk = walk
        self._n = n

    @classmethod
    def of(cls, state, leaves=None, spec=None) -> Layout | None:
        """The layout of `state` (optionally with its ``flatten`` result), or
        ``None`` if the state holds anything a layout does not model."""
        if spec is None:
            from .state import flatten  # state imports this module

            leaves, spec = flatten(state)
        walk = _compile(state, spec["tree"], leaves)
        if walk is None:
            return None
        return cls(spec["tree"], spec["leaves"], sum(leaf.nbytes for leaf in leaves), walk,
                   len(leaves))

    def leaves(self, state) -> list[np.ndarray] | None:
        """The leaves of `state` if it has this layout, else ``None``."""
        out: list[np.ndarray] = []
        if self._walk(state, out) and len(out) == self._n:
            return out
        return None

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
            if type(x) is np.ndarray and x.dtype is dtype and x.shape == shape \
                    and x.flags.c_contiguous:
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
    if all(type(c) is np.ndarray and item.keys() == {"leaf"} and leaves[item["leaf"]] is c
           for c, item in zip(children, items)):
        infos = tuple((c.dtype, c.shape) for c in children)
        count = len(infos)

        def walk_leaves(x, out):
            if not check(x):
                return False
            xs = get(x) if get is not None else x
            if len(xs) != count:
                return False
            for v, (dtype, shape) in zip(xs, infos):
                if type(v) is not np.ndarray or v.dtype is not dtype or v.shape != shape \
                        or not v.flags.c_contiguous:
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

