"""Spec trees: the walks, comparisons and compiled forms of ``flatten``'s spec.

:func:`vlcc_adjoint.state.flatten` describes a state by a *spec tree* (the
node kinds are listed in :mod:`vlcc_adjoint.state`).  Every consumer of a
state's structure reads that tree through this module, which knows nothing
of the objects a state is made of beyond what the provider registries
(:mod:`._providers`) say:

* **Paths** (:func:`spec_nodes`, :func:`leaf_paths`): the one walk of a
  spec tree.  It names every leaf and inline value by its path in the
  state, ``state['u']``, ``state.params.c``, ``state[0]``, with the
  segments :func:`key_segment` and :func:`item_segments` that ``flatten``'s
  error messages use too.  It reads untrusted specs (a checkpoint read from
  disk): a node it does not know is reported as a value, never followed,
  and it keeps its own stack, so no spec can exhaust the interpreter's.
* **Comparison** (:func:`difference`): whether two trees describe the same
  structure, dtypes and shapes, values ignored, and if not, a sentence
  naming the first place where they differ (depth first, by path).
* **Compiled checks** (:func:`compile_check`): a tree compiled once into
  closures that answer, for a new object, what ``difference`` would answer
  for its tree, without building that tree.  Types, keys and lengths are
  compared in place, each array's dtype first by identity (the common case
  of a time loop) and its shape as a tuple; a container whose children are
  all arrays checks them in one loop instead of one call per leaf.  In
  *collect* mode, the compiled walk also gathers the leaves ``flatten``
  would return, for the states whose spec does not depend on their values
  (arrays in plain containers: :class:`vlcc_adjoint.state.Layout`).
* **Building** (:func:`build`, :func:`compile_build`): the state a tree
  describes, around its leaves: interpreted node by node (``unflatten``),
  or compiled once for the trees of a layout.
* **Inline values** (:func:`inline_node`, :func:`key_node`): the one
  encoding of the scalars a spec keeps inline (``None``, ``bool``, ``int``,
  ``float``, ``complex``, ``str``, ``bytes``, numpy scalars) and of dict
  keys, shared by ``flatten`` and the checks of dicts with non-string keys.

The matching rules follow ``flatten``'s dispatch exactly: a node made from
an exact ``numpy.ndarray`` (or ``numpy.memmap``) is an array leaf, a
``float`` subclass such as ``numpy.float64`` is a numpy scalar, not a
float, and a registered container type matches only while its provider is
still the one registered (:func:`~vlcc_adjoint.state.register` may replace
it).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ._dtype_json import dtype_from_json, dtype_to_json
from ._providers import (
    CONTAINERS,
    UnknownStateTypeError,
    describe_leaf,
    leaf_provider_of,
    leaf_provider_of_node,
)
from .errors import VlccTypeError, VlccValueError

__all__ = [
    "INLINE_TYPES",
    "LeafInfo",
    "build",
    "compile_build",
    "compile_check",
    "difference",
    "inline_node",
    "inline_value",
    "item_segments",
    "key_node",
    "key_segment",
    "kind_name",
    "leaf_paths",
    "missing_type",
    "spec_nodes",
]

#: Per leaf of a tree: its dtype object (compared by identity first), its
#: shape and its dtype's JSON form (what the spec records, and what an
#: equal dtype built anew is compared by).
LeafInfo = tuple[np.dtype, tuple[int, ...], Any]


# -- inline values and path segments ---------------------------------------------------

#: The exact Python types a spec keeps inline (numpy scalars are inline too):
#: :func:`inline_node` encodes them.
INLINE_TYPES = frozenset({type(None), bool, int, float, complex, str, bytes})


def inline_node(obj: Any) -> dict | None:
    """The spec node of a value a spec keeps inline, or ``None`` if `obj`
    is not one.

    ``None``, ``bool``, ``int`` and ``str`` are ``{"value": obj}``; a finite
    ``float`` too, a non-finite one ``{"float": "nan"}`` (JSON has no
    ``nan`` or ``inf``); ``complex`` is ``{"complex": [re, im]}`` (as
    ``repr`` text), ``bytes`` ``{"bytes": hex}`` and a numpy scalar
    ``{"npscalar": dtype, "hex": its bytes}``, bit-exact.  Exact types
    only: a subclass of ``int`` or ``str`` is not inline (``numpy.float64``
    is a numpy scalar, not a ``float``).
    """
    cls = type(obj)
    if obj is None or cls is bool or cls is str or cls is int:
        return {"value": obj}
    if cls is float:
        if obj != obj or obj in (math.inf, -math.inf):
            return {"float": repr(obj)}
        return {"value": obj}
    if cls is complex:
        return {"complex": [repr(obj.real), repr(obj.imag)]}
    if cls is bytes:
        return {"bytes": obj.hex()}
    if isinstance(obj, np.generic):
        # Inline and bit-exact: a numpy scalar is a few bytes, not worth a leaf.
        return {"npscalar": dtype_to_json(obj.dtype), "hex": np.asarray(obj).tobytes().hex()}
    return None


_KEY_TYPES = (str, int, float, bool, type(None))


def key_node(key: Any) -> dict:
    """The spec node of a dict key of a ``{"mapping": ...}`` node: a
    ``str``, ``int``, ``float``, ``bool`` or ``None`` inline, a tuple of
    them ``{"tuple": [...]}``.

    Raises ``TypeError`` naming the remedy for any other key.
    """
    cls = type(key)
    if cls in _KEY_TYPES:
        node = inline_node(key)
        assert node is not None
        return node
    if cls is tuple:
        return {"tuple": [key_node(k) for k in key]}
    raise VlccTypeError(
        f"state dict keys must be str, int, float, bool, None or tuples of them, "
        f"got {key!r}; convert the keys (e.g. with str) or use a list"
    )


def key_segment(key: Any) -> str:
    """The path segment of the item under dict key `key`: ``['u']``."""
    return f"[{key!r}]"


def item_segments(aux: Any, n: int) -> list[str]:
    """The path segments of the `n` children of a registered type whose
    ``aux`` is `aux`: ``.name`` when `aux` names them (a list of `n`
    strings, as a dataclass's field names), else ``[i]``."""
    if isinstance(aux, list) and len(aux) == n and all(type(a) is str for a in aux):
        return [f".{a}" for a in aux]
    return [f"[{i}]" for i in range(n)]


def _list(x: Any) -> list:
    """`x` if it is a list (a well-formed spec's sequences are), else ``[]``."""
    return x if type(x) is list else []


def _key_value(node: Any) -> Any:
    """The Python value of a key node, for display; the node itself when
    it is malformed (a spec read from disk)."""
    try:
        return inline_value(node)
    except Exception:  # a malformed key node: name it by its JSON
        return _Raw(node)


class _Raw:
    """A malformed node, shown as its JSON text in a path."""

    __slots__ = ("node",)

    def __init__(self, node: Any) -> None:
        self.node = node

    def __repr__(self) -> str:
        return repr(self.node)


# -- the walk of a spec tree ---------------------------------------------------------


def spec_nodes(tree: Any, path: str = "state") -> Iterator[tuple[str, str, Any]]:
    """Every leaf, inline value and registered type of a spec tree, depth
    first in the state's order, with its path.

    **Arguments:**

    - `tree`: a spec's ``tree`` (trusted or not).
    - `path`: the name of the root (``"state"``, ``"adjoint"``, ...).

    **Yields:** ``(kind, path, node)``: ``("leaf", path, node)`` for a leaf
    (``node["leaf"]`` is its index; a leaf provider's node carries its tag
    too), ``("type", path, node)`` for a registered type's node, before its
    children, and ``("value", path, node)`` for an inline value, and for
    anything that is not a node this module knows (a malformed spec), which
    is never followed.  Containers (dicts, lists, tuples) are walked into,
    not yielded.  The segments of a path are those of ``flatten``'s error
    messages: ``['key']`` for a dict item, ``[i]`` for a list or tuple item,
    ``.field`` for a named child of a registered type.

    The walk keeps its own stack: a spec nested deeper than Python's
    recursion limit is walked all the same.
    """
    stack: list[tuple[Any, str]] = [(tree, path)]
    while stack:
        node, here = stack.pop()
        if type(node) is not dict:
            yield "value", here, node
        elif "leaf" in node:
            yield "leaf", here, node
        elif "dict" in node:
            pairs = list(zip(_list(node["dict"]), _list(node.get("items"))))
            stack.extend((v, here + key_segment(k)) for k, v in reversed(pairs))
        elif "mapping" in node:
            pairs = list(zip(_list(node["mapping"]), _list(node.get("items"))))
            stack.extend((v, here + key_segment(_key_value(k))) for k, v in reversed(pairs))
        elif "list" in node or "tuple" in node:
            items = _list(node["list"] if "list" in node else node["tuple"])
            stack.extend((v, f"{here}[{i}]") for i, v in reversed(list(enumerate(items))))
        elif "type" in node:
            items = _list(node.get("items"))
            # Segments are read before the node is handed out: a caller may
            # rewrite the node's aux while the walk goes on.
            segments = item_segments(node.get("aux"), len(items))
            yield "type", here, node
            stack.extend((v, here + s) for v, s in reversed(list(zip(items, segments))))
        else:
            yield "value", here, node


def leaf_paths(spec: dict) -> dict[int, str]:
    """``{leaf index: path}`` of a state spec, e.g. ``{0: "state['u']"}``
    (leaf nodes without an integer index, in a malformed spec, are left
    out)."""
    tree = spec.get("tree") if isinstance(spec, dict) else None
    return {
        node["leaf"]: path
        for kind, path, node in spec_nodes(tree)
        if kind == "leaf" and type(node["leaf"]) is int
    }


# -- names of node kinds, for messages -------------------------------------------------


def _kind(node: Any) -> str:
    """The kind of a spec node: ``leaf``, ``dict`` (string keys), ``mapping``,
    ``list``, ``tuple``, ``type``, ``opaque``, ``value`` or ``?``."""
    if type(node) is not dict:
        return "?"
    for kind in ("leaf", "dict", "mapping", "list", "tuple", "type", "opaque"):
        if kind in node:
            return kind
    if node.keys() & {"value", "float", "complex", "bytes", "npscalar"}:
        return "value"
    return "?"


def _dtype_text(dtype_json: Any) -> str:
    if isinstance(dtype_json, str):
        return dtype_json
    try:
        return str(dtype_from_json(dtype_json))
    except Exception:
        return repr(dtype_json)


def kind_name(node: Any) -> str:
    """What a node describes, in words: ``array`` (a numpy leaf), ``<tag>
    array`` (a leaf provider's, by its tag), ``dict``, ``list``, ``tuple``,
    a registered type's class name, a value's type name (``float``,
    ``NoneType``, ...), ``numpy <f4 scalar``, or an opaque object's class
    name."""
    kind = _kind(node)
    if kind == "leaf":
        tags = [k for k in node if k != "leaf"]
        return f"{tags[0]} array" if tags else "array"
    if kind in ("dict", "mapping"):
        return "dict"
    if kind in ("list", "tuple"):
        return kind
    if kind == "type":
        provider = CONTAINERS.by_name.get(node["type"])
        if provider is not None:
            return provider.cls.__name__
        return str(node["type"]).rpartition(":")[2]
    if kind == "opaque":
        cls = node["opaque"]
        return getattr(cls, "__name__", str(cls))
    if kind == "value":
        if "value" in node:
            return type(node["value"]).__name__
        if "float" in node:
            return "float"
        if "npscalar" in node:
            return f"numpy {_dtype_text(node['npscalar'])} scalar"
        return "complex" if "complex" in node else "bytes"
    return "malformed node"


# -- comparing two trees ---------------------------------------------------------------


def _leaf_info(node: dict, leaves: Sequence[Any]) -> tuple[Any, tuple]:
    """(dtype JSON, shape tuple) of a leaf node; ``(None, ())`` if malformed."""
    i = node.get("leaf")
    if type(i) is int and 0 <= i < len(leaves):
        entry = leaves[i]
        if isinstance(entry, dict):
            return entry.get("dtype"), tuple(_list(entry.get("shape")))
    return None, ()


def _dict_items(node: dict) -> list[tuple[Any, Any, Any]]:
    """``(key value, key node, item)`` of a ``dict`` or ``mapping`` node."""
    if "dict" in node:
        keys = _list(node["dict"])
        return [(k, {"value": k}, v) for k, v in zip(keys, _list(node.get("items")))]
    keys = _list(node["mapping"])
    return [(_key_value(k), k, v) for k, v in zip(keys, _list(node.get("items")))]


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 120 else text[:117] + "..."


def difference(
    got: Any,
    got_leaves: Sequence[Any],
    want: Any,
    want_leaves: Sequence[Any],
    path: str = "state",
    *,
    seed: bool = False,
) -> str:
    """How the structure tree `got` differs from `want`, or ``""``.

    **Arguments:**

    - `got`, `want`: spec trees; `got_leaves`, `want_leaves`: their specs'
      ``leaves`` lists (``{"dtype", "shape"}`` per leaf).
    - `path`: the name of the root in the sentence.
    - `seed`: compare only what `got` has of `want`'s form, as the
      executor does for an adjoint seed, whose form the solver defines:
      an array where `want` has an array (or a numpy scalar) must have its
      shape (dtypes may differ), a dict where `want` has a dict its keys
      (in any order), a list or tuple where `want` has the same its
      length, the same registered type its children; anything else passes.

    **Returns:** ``""`` when the trees describe the same structure, dtypes
    and shapes, values ignored: the same containers with the same keys and
    lengths, arrays (and leaf providers' arrays, with the same spec fields)
    of the same dtype and shape, values of the same type (numpy scalars of
    the same dtype), registered types with the same name and, for types
    registered with functions, the same ``aux``.  Otherwise one sentence
    naming the first difference by its path, e.g. ``"state['u'] is an array
    of shape (5,) and dtype <f8, expected shape (6,) and dtype <f8"``.
    """
    gk, wk = _kind(got), _kind(want)
    if seed:
        return _seed_difference(got, got_leaves, want, want_leaves, path, gk, wk)
    if gk == "leaf" and wk == "leaf":
        if {k: v for k, v in got.items() if k != "leaf"} != {
            k: v for k, v in want.items() if k != "leaf"
        }:
            return f"{path} is a {kind_name(got)}, expected a {kind_name(want)}"
        (gd, gs), (wd, ws) = _leaf_info(got, got_leaves), _leaf_info(want, want_leaves)
        if gd != wd or gs != ws:
            return (
                f"{path} is an array of shape {gs} and dtype {_dtype_text(gd)}, "
                f"expected shape {ws} and dtype {_dtype_text(wd)}"
            )
        return ""
    dicts = ("dict", "mapping")
    if gk != wk and not (gk in dicts and wk in dicts):
        return f"{path} is a {kind_name(got)}, expected a {kind_name(want)}"
    if gk in dicts:
        g_items, w_items = _dict_items(got), _dict_items(want)
        if len(g_items) != len(w_items):
            return f"{path} has {len(g_items)} entries, expected {len(w_items)}"
        for (gkey, gnode, g), (wkey, wnode, w) in zip(g_items, w_items):
            if gnode != wnode:
                return f"{path} has key {gkey!r} where {wkey!r} was expected"
            text = difference(g, got_leaves, w, want_leaves, path + key_segment(gkey))
            if text:
                return text
        return ""
    if gk in ("list", "tuple"):
        g_seq, w_seq = _list(got[gk]), _list(want[wk])
        if len(g_seq) != len(w_seq):
            return f"{path} has {len(g_seq)} entries, expected {len(w_seq)}"
        for i, (g, w) in enumerate(zip(g_seq, w_seq)):
            text = difference(g, got_leaves, w, want_leaves, f"{path}[{i}]")
            if text:
                return text
        return ""
    if gk == "type":
        if got["type"] != want["type"]:
            return f"{path} is a {got['type']}, expected a {want['type']}"
        if got.get("aux") != want.get("aux"):
            return (
                f"{path} is a {kind_name(got)} with {_short(got.get('aux'))}, expected "
                f"{_short(want.get('aux'))}"
            )
        g_seq, w_seq = _list(got.get("items")), _list(want.get("items"))
        if len(g_seq) != len(w_seq):
            return f"{path} has {len(g_seq)} entries, expected {len(w_seq)}"
        segments = item_segments(got.get("aux"), len(g_seq))
        for s, g, w in zip(segments, g_seq, w_seq):
            text = difference(g, got_leaves, w, want_leaves, path + s)
            if text:
                return text
        return ""
    if gk == "opaque":
        if got["opaque"] is not want["opaque"]:
            return f"{path} is a {got['opaque']!r}, expected a {want['opaque']!r}"
        return ""
    if gk == "value":
        gname, wname = kind_name(got), kind_name(want)
        return "" if gname == wname else f"{path} is a {gname}, expected a {wname}"
    return "" if got == want else f"{path} differs in structure"


def _seed_difference(got, got_leaves, want, want_leaves, path, gk, wk) -> str:
    """:func:`difference` with ``seed=True`` (see there)."""

    def shape_of(node, kind, leaves):
        if kind == "leaf":
            return _leaf_info(node, leaves)[1]
        if kind == "value" and "npscalar" in node:
            return ()  # a numpy scalar: a 0-d array
        return None

    w_shape = shape_of(want, wk, want_leaves)
    g_shape = shape_of(got, gk, got_leaves)
    if w_shape is not None and g_shape is not None:
        return "" if g_shape == w_shape else f"{path} has shape {g_shape}, expected {w_shape}"
    dicts = ("dict", "mapping")
    if gk in dicts and wk in dicts:
        have = {k: v for k, _, v in _dict_items(got)}
        need = {k: v for k, _, v in _dict_items(want)}
        if have.keys() != need.keys():
            extra = sorted(map(repr, have.keys() - need.keys()))
            missing = sorted(map(repr, need.keys() - have.keys()))
            return (
                f"{path} has keys {', '.join(extra) or '(none extra)'} where the state has "
                f"{', '.join(missing) or '(none missing)'}"
            )
        for key, w in need.items():
            text = difference(
                have[key], got_leaves, w, want_leaves, path + key_segment(key), seed=True
            )
            if text:
                return text
        return ""
    if gk in ("list", "tuple") and gk == wk:
        g_seq, w_seq = _list(got[gk]), _list(want[wk])
        if len(g_seq) != len(w_seq):
            return f"{path} has {len(g_seq)} entries, expected {len(w_seq)}"
        for i, (g, w) in enumerate(zip(g_seq, w_seq)):
            text = difference(g, got_leaves, w, want_leaves, f"{path}[{i}]", seed=True)
            if text:
                return text
        return ""
    if gk == "type" and wk == "type" and got["type"] == want["type"]:
        g_seq, w_seq = _list(got.get("items")), _list(want.get("items"))
        segments = item_segments(want.get("aux"), len(w_seq))
        for s, g, w in zip(segments, g_seq, w_seq):
            text = difference(g, got_leaves, w, want_leaves, path + s, seed=True)
            if text:
                return text
    return ""


# -- compiled checks -------------------------------------------------------------------

_ndarray = np.ndarray
_memmap = np.memmap


def _same_dtype(dtype: np.dtype, dtype_json: Any) -> bool:
    """Whether `dtype` is recorded as `dtype_json` in a spec."""
    try:
        return dtype_to_json(dtype) == dtype_json
    except TypeError:  # object dtypes: never in a spec
        return False


def missing_type(name: str) -> UnknownStateTypeError:
    """The error for a spec naming a type this process has not registered."""
    return UnknownStateTypeError(
        f"the checkpoint holds a {name!r}, which this process has not registered; call "
        "vlcc_adjoint.state.register(cls) (dataclasses, named tuples) or register(cls, "
        "flatten_fn, unflatten_fn) before loading (types are never imported from a checkpoint)"
    )


def compile_check(
    tree: Any, infos: Sequence[LeafInfo], *, collect: bool = False
) -> Callable[..., bool] | None:
    """Compile a spec tree into ``check(x, out=None) -> bool``.

    **Arguments:**

    - `tree`: a spec tree (the structure to check against).
    - `infos`: per leaf of the tree its :data:`LeafInfo`.
    - `collect`: compile the *layout* walk instead of the structure check.

    **Returns:** with ``collect=False``, ``check(x)``: whether `x` has the
    structure, dtypes and shapes that `tree` describes, values ignored,
    exactly when :func:`difference` finds none between `x`'s tree and
    `tree`; non-contiguous arrays pass (``flatten`` would copy them).

    With ``collect=True``, ``check(x, out)``: true when ``flatten(x)``
    would return a spec equal to one with this tree and these leaves, and,
    as its leaves, the C-contiguous numpy arrays of `x` itself, which it
    appends to the list `out` (on false, `out` holds an unspecified part of
    them).  Such a walk exists only for trees of numpy leaves in dicts with
    string keys, lists, tuples, dataclasses and named tuples (nothing whose
    spec records values); ``None`` for any other tree.

    Raises :class:`UnknownStateTypeError` when `tree` names a type this
    process has not registered (no object can then match it).
    """
    try:
        return _compile(tree, infos, collect)
    except _NotModelled:
        return None


class _NotModelled(Exception):
    """A node a layout walk (``collect=True``) does not model."""


def _compile(node: Any, infos: Sequence[LeafInfo], collect: bool) -> Callable[..., bool]:
    kind = _kind(node)
    if kind == "leaf":
        return _compile_leaf(node, infos, collect)
    if kind in ("dict", "list", "tuple", "type"):
        return _compile_container(node, kind, infos, collect)
    if collect:
        raise _NotModelled
    if kind == "mapping":
        return _compile_mapping(node, infos)
    if kind == "value":
        return _compile_value(node)
    if kind == "opaque":
        cls = node["opaque"]
        return lambda x, out=None: type(x) is cls
    raise VlccValueError(f"malformed state spec node {node!r:.200}")


def _plain_leaf(node: Any) -> bool:
    return _kind(node) == "leaf" and len(node) == 1


def _compile_leaf(node: dict, infos: Sequence[LeafInfo], collect: bool) -> Callable[..., bool]:
    dtype, shape, dtype_json = infos[node["leaf"]]
    if len(node) == 1:  # a numpy array
        if collect:

            def collect_leaf(x, out):
                if (
                    type(x) is _ndarray
                    and x.shape == shape
                    and (x.dtype is dtype or _same_dtype(x.dtype, dtype_json))
                    and x.flags.c_contiguous
                ):
                    out.append(x)
                    return True
                return False

            return collect_leaf

        def match_leaf(x, out=None):
            return (
                (type(x) is _ndarray or type(x) is _memmap)
                and x.shape == shape
                and (x.dtype is dtype or _same_dtype(x.dtype, dtype_json))
            )

        return match_leaf
    if collect:
        raise _NotModelled
    # A leaf provider's array: claimed by the same provider (and by no
    # container provider, which flatten would ask first), described with
    # the same fields, dtype and shape.
    provider = leaf_provider_of_node(node)
    fields = {k: v for k, v in node.items() if k != "leaf"}
    by_type = CONTAINERS.by_type

    def match_provided(x, out=None):
        cls = type(x)
        if cls in by_type or leaf_provider_of(cls) is not provider:
            return False
        got_dtype, got_shape, got_fields = describe_leaf(provider, x)
        return (
            got_shape == shape
            and got_fields == fields
            and (got_dtype is dtype or _same_dtype(got_dtype, dtype_json))
        )

    return match_provided


def _compile_value(node: dict) -> Callable[..., bool]:
    if "npscalar" in node:
        dtype_json = node["npscalar"]

        def match_npscalar(x, out=None):
            return isinstance(x, np.generic) and _same_dtype(x.dtype, dtype_json)

        return match_npscalar
    if "value" in node:
        cls: type = type(node["value"])
    else:
        cls = float if "float" in node else complex if "complex" in node else bytes
    return lambda x, out=None: type(x) is cls


def _compile_mapping(node: dict, infos: Sequence[LeafInfo]) -> Callable[..., bool]:
    keys = tuple(_list(node["mapping"]))
    subs = tuple(_compile(v, infos, False) for v in _list(node.get("items")))
    if len(keys) != len(subs):
        raise VlccValueError(f"malformed state spec node {node!r:.200}")
    n = len(keys)

    def match_mapping(x, out=None):
        if type(x) is not dict or len(x) != n:
            return False
        try:
            for k, want in zip(x, keys):
                if key_node(k) != want:
                    return False
        except TypeError:  # a key flatten refuses
            return False
        for v, sub in zip(x.values(), subs):
            if not sub(v):
                return False
        return True

    return match_mapping


def _compile_container(
    node: dict, kind: str, infos: Sequence[LeafInfo], collect: bool
) -> Callable[..., bool]:
    """A dict with string keys, a list, a tuple or a registered type.

    The container is compiled into ``children(x)``: `x`'s children when `x`
    is this container (its type, keys and length), else ``None``, in one
    call; the walk then checks the children."""
    children: Callable[[Any], Any]
    if kind == "dict":
        keys = tuple(_list(node["dict"]))
        items = _list(node.get("items"))
        n = len(keys)
        values = dict.values

        def dict_children(x):
            if type(x) is not dict or len(x) != n:
                return None
            for k, key in zip(x, keys):
                if type(k) is not str or k != key:
                    return None
            return values(x)

        children = dict_children
    elif kind in ("list", "tuple"):
        cls: type = list if kind == "list" else tuple
        items = _list(node[kind])
        n = len(items)

        def seq_children(x):
            return x if type(x) is cls and len(x) == n else None

        children = seq_children
    else:
        children, items = _type_children(node, collect)
    if all(_plain_leaf(item) for item in items):
        return _compile_leaves(children, items, infos, collect)
    subs = tuple(_compile(item, infos, collect) for item in items)
    count = len(subs)

    def walk(x, out=None):
        xs = children(x)
        if xs is None or len(xs) != count:
            return False
        for v, sub in zip(xs, subs):
            if not sub(v, out):
                return False
        return True

    return walk


def _type_children(node: dict, collect: bool) -> tuple[Callable[[Any], Any], list]:
    """``children(x)`` of a registered type's node, and the node's items.

    The children are read as the provider compiled for reads them (a
    dataclass's fields with one ``attrgetter``, a named tuple's items, a
    user provider's ``flatten_fn`` with its ``aux`` compared) while it is
    the one registered for the class.  A layout walk (`collect`) then
    refuses the object, so that ``flatten`` asks the new provider; a
    structure check asks the new provider itself, which describes the same
    structure when it records the same name and ``aux``."""
    name = node["type"]
    provider = CONTAINERS.by_name.get(name)
    if provider is None:
        if collect:
            raise _NotModelled
        raise missing_type(name)
    items = _list(node.get("items"))
    cls = provider.cls
    by_type = CONTAINERS.by_type
    aux = node.get("aux")
    own: Callable[[Any], Any]  # x -> its children, with the provider compiled for
    if provider.kind == "dataclass":
        if aux != list(provider.fields):  # written by another version of the class
            return (lambda x: None), items
        if not items:
            own = lambda x: ()  # noqa: E731
        else:
            getter = operator.attrgetter(*provider.fields)
            own = (lambda x: (getter(x),)) if len(items) == 1 else getter
    elif provider.kind == "namedtuple":
        if aux is not None:
            return (lambda x: None), items
        own = lambda x: x  # noqa: E731
    elif collect:
        raise _NotModelled  # a user provider's aux is a value
    else:
        split = provider.split

        def own(x):
            found, got = split(x)
            return found if got == aux else None

    if collect:

        def layout_children(x):
            if type(x) is cls and by_type.get(cls) is provider:
                return own(x)
            return None

        return layout_children, items

    def type_children(x):
        if type(x) is not cls:
            return None
        current = by_type.get(cls)
        if current is provider:
            return own(x)
        if current is None or current.name != name:
            return None  # flatten would record another type
        found, got = current.split(x)  # a provider registered since
        return found if got == aux else None

    return type_children, items


def _compile_leaves(children, items, infos, collect) -> Callable[..., bool]:
    """A container whose children are all numpy leaves: one loop, no call per leaf."""
    leaf_infos = tuple(infos[item["leaf"]] for item in items)
    count = len(leaf_infos)
    if collect:

        def collect_leaves(x, out):
            xs = children(x)
            if xs is None or len(xs) != count:
                return False
            for v, (dtype, shape, dtype_json) in zip(xs, leaf_infos):
                if (
                    type(v) is not _ndarray
                    or v.shape != shape
                    or (v.dtype is not dtype and not _same_dtype(v.dtype, dtype_json))
                    or not v.flags.c_contiguous
                ):
                    return False
            out.extend(xs)
            return True

        return collect_leaves

    def match_leaves(x, out=None):
        xs = children(x)
        if xs is None or len(xs) != count:
            return False
        for v, (dtype, shape, dtype_json) in zip(xs, leaf_infos):
            if (
                (type(v) is not _ndarray and type(v) is not _memmap)
                or v.shape != shape
                or (v.dtype is not dtype and not _same_dtype(v.dtype, dtype_json))
            ):
                return False
        return True

    return match_leaves


# -- building the state a tree describes -------------------------------------------------


def build(node: Any, leaves: Sequence[Any], *, objects: bool = False) -> Any:
    """The state that the spec tree `node` describes, around `leaves` (each
    already checked against the spec by the caller: ``unflatten``).

    Registered types are rebuilt by their providers, found by name (types
    are never imported); a leaf provider's array by its provider, found by
    its tag.  Raises ``ValueError`` for a malformed node and
    :class:`UnknownStateTypeError` for a type this process has not
    registered.  The same as ``compile_build(node, objects=objects)(leaves)``.
    """
    return compile_build(node, objects=objects)(leaves)


def inline_value(node: Any) -> Any:
    """The Python value of an inline spec node (a value, or a dict key's
    node): :func:`build` without leaves."""
    return build(node, ())


def _constant(node: dict) -> Any:
    """The value of an inline node other than ``{"value": ...}``: a
    non-finite float, a complex number, a numpy scalar or bytes."""
    if "float" in node:
        text = node["float"]
        if text not in ("nan", "inf", "-inf"):
            raise VlccValueError(f"malformed float {text!r} in state spec")
        return float(text)
    if "complex" in node:
        re_, im = node["complex"]
        return complex(float(re_), float(im))
    if "npscalar" in node:
        dtype = dtype_from_json(node["npscalar"])
        raw = bytes.fromhex(node["hex"])
        if len(raw) != dtype.itemsize:
            raise VlccValueError(
                f"numpy scalar of dtype {dtype} with {len(raw)} bytes in state spec"
            )
        return np.frombuffer(raw, dtype=dtype)[0]
    return bytes.fromhex(node["bytes"])


def _children(node: dict, key: str) -> tuple[Any, ...]:
    """The child nodes of a dict, mapping or registered type node, one per
    key (or aux entry) it names."""
    items = node.get("items")
    if type(items) is not list or (key != "type" and len(items) != len(node[key])):
        raise VlccValueError(f"malformed state spec node {node!r}")
    return tuple(items)


def compile_build(node: Any, *, objects: bool = False) -> Callable[[Sequence[Any]], Any]:
    """``build(leaves) -> state`` for the spec tree `node`: the dispatch on
    each node's kind, the inline values and the dict keys worked out once,
    here, so that a :class:`~vlcc_adjoint.state.Layout` rebuilds state after
    state at the cost of the containers alone.  Providers are looked up by
    name or tag at every call, as ``register`` may replace them.  With
    `objects`, a tree of :func:`~vlcc_adjoint.state.split_leaves`: its
    ``{"object": obj}`` nodes are the objects they carry (a spec read back
    from JSON never has one).  Raises ``ValueError`` for a malformed node
    (when compiled)."""
    if type(node) is not dict:
        raise VlccValueError(f"malformed state spec node {node!r}")
    if "leaf" in node:
        i = node["leaf"]
        if len(node) > 1:  # a leaf provider's array

            def build_provider_leaf(leaves):
                return leaf_provider_of_node(node).from_numpy(leaves[i], node)

            return build_provider_leaf
        return lambda leaves: leaves[i]
    if "dict" in node or "mapping" in node:
        kind = "dict" if "dict" in node else "mapping"
        items = _children(node, kind)
        keys = tuple(node["dict"]) if kind == "dict" else tuple(map(inline_value, node[kind]))
        if any(type(k) is list for k in keys):  # pragma: no cover - lists are never keys
            raise VlccValueError("list as dict key in state spec")
        subs = tuple(compile_build(v, objects=objects) for v in items)
        if all("leaf" in v and len(v) == 1 for v in items):
            idx = tuple(v["leaf"] for v in items)
            return lambda leaves: {k: leaves[i] for k, i in zip(keys, idx)}
        return lambda leaves: {k: sub(leaves) for k, sub in zip(keys, subs)}
    if "list" in node or "tuple" in node:
        seq = list if "list" in node else tuple
        subs = tuple(compile_build(v, objects=objects) for v in node[seq.__name__])
        return lambda leaves: seq([sub(leaves) for sub in subs])
    if "type" in node and "aux" in node:
        name, aux = node["type"], node["aux"]
        items = _children(node, "type")
        subs = tuple(compile_build(v, objects=objects) for v in items)
        if all("leaf" in v and len(v) == 1 for v in items):
            idx = tuple(v["leaf"] for v in items)

            def build_type_of_leaves(leaves):
                provider = CONTAINERS.by_name.get(name)
                if provider is None:
                    raise missing_type(name)
                return provider.unflatten(aux, [leaves[i] for i in idx])

            return build_type_of_leaves

        def build_type(leaves):
            provider = CONTAINERS.by_name.get(name)
            if provider is None:
                raise missing_type(name)
            return provider.unflatten(aux, [sub(leaves) for sub in subs])

        return build_type
    if "value" in node:
        value = node["value"]
        return lambda leaves: value
    if objects and "object" in node:  # carried by reference (state.split_leaves)
        obj = node["object"]
        return lambda leaves: obj
    if "float" in node or "complex" in node or "npscalar" in node or "bytes" in node:
        constant = _constant(node)
        return lambda leaves: constant
    raise VlccValueError(f"malformed state spec node {node!r}")
