"""Composable state providers: application state <-> named arrays + JSON.

A checkpoint stores a state as a flat list of arrays (*leaves*) and a
JSON-serialisable *spec* that rebuilds the structure around them::

    leaves, spec = flatten({"u": u, "t": 0.5, "params": Params(c=c, rho=rho)})
    state = unflatten(spec, leaves)

Nothing is pickled.  The spec holds only names, numbers and strings
(``json.dumps(spec)`` always works), and a type named in a spec is rebuilt
only if this process registered it (:func:`register`), so reading a
checkpoint never imports or executes anything it names.

Supported out of the box
------------------------

* numpy arrays (any shape, including 0-d and empty; any byte order; numeric,
  ``datetime64``/``timedelta64``, fixed-width ``S``/``U``/``V`` and structured
  dtypes; the ``ml_dtypes`` types such as ``bfloat16``) and numpy scalars
  (kept inline in the spec, bit-exact);
* Python ``None``, ``bool``, ``int``, ``float`` (``nan``/``inf`` included),
  ``complex``, ``str`` and ``bytes``;
* ``dict`` (keys: ``str``, or ``int``/``float``/``bool``/``None``/tuples of
  them), ``list``, ``tuple``; named tuples and dataclasses (registered
  automatically the first time they are flattened);
* the arrays of other libraries through *leaf providers*, and their
  container types through *container providers* (:mod:`._providers`).
  The integrations this package ships register theirs: the accelerator
  array libraries lazily (the package ``__init__`` registers a hook that
  runs when the library is imported), the others when their integration
  module is imported.

Everything else is an :class:`UnknownStateTypeError` naming the object's
path in the state and the remedy (convert it, or :func:`register` it).

Leaves
------

Leaves are C-contiguous numpy arrays, in a deterministic depth-first order
(dicts in insertion order).  They are *views* of the state's own arrays
when those are already C-contiguous (no copy); non-contiguous arrays are
copied once, to C order.  A leaf provider's arrays are brought to the host
by the provider (a zero-copy view where it can).  The store, not
:func:`flatten`, takes the snapshot copy; :func:`flatten_traits` tells it
which leaves need none (see :class:`LeafTraits`).

Spec format (``"format": "vlcc-state/1"``)
------------------------------------------

``{"format", "tree", "leaves"}``: ``leaves[i]`` is ``{"dtype", "shape"}`` of
leaf ``i``; ``tree`` is a nest of one-key-tagged nodes: ``{"leaf": i}``
(plus a leaf provider's tag and fields for its arrays),
``{"value": v}`` (``None``, ``bool``, ``int``, finite ``float``, ``str``),
``{"float": "nan"}``, ``{"complex": [re, im]}``, ``{"bytes": hex}``,
``{"npscalar": dtype, "hex": raw bytes}``, ``{"dict": keys, "items": [...]}``,
``{"mapping": [key nodes], "items": [...]}``, ``{"list": [...]}``,
``{"tuple": [...]}`` and ``{"type": name, "aux": json, "items": [...]}`` for
registered types.  Dtypes are written by :mod:`._dtype_json`.

Deduplication
-------------

:func:`leaf_digest` is a content address for a leaf: xxh3-128 of its bytes,
dtype and shape.  The store keeps a content-addressed table of leaves
(the store's leaf table, ``storage/_dedup.py``): a leaf whose digest equals one
already stored (a velocity model carried unchanged in every checkpoint, the
frozen layers of a network) is stored once and referenced by every record
that holds it.  With 128 bits, an accidental collision among even 10^12
distinct leaves has probability below 10^-14 (the birthday bound
n^2 / 2^129).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import xxhash

from ._dtype_json import dtype_from_json as dtype_from_json
from ._dtype_json import dtype_to_json as dtype_to_json
from ._layout import Layout as Layout
from ._providers import (
    _BY_NAME,
    _BY_TYPE,
    SPEC_FORMAT,
    _Provider,
    _register_dataclass,
    _register_namedtuple,
    activate_imported,
    leaf_provider_of,
    leaf_provider_of_node,
    tree_node_owner,
)
from ._providers import LeafProvider as LeafProvider
from ._providers import UnknownStateTypeError as UnknownStateTypeError
from ._providers import is_registered as is_registered
from ._providers import register as register
from ._providers import register_lazy_provider as register_lazy_provider
from ._providers import register_leaf_provider as register_leaf_provider
from .errors import VlccTypeError, VlccValueError

__all__ = [
    "Layout",
    "LeafProvider",
    "LeafTraits",
    "UnknownStateTypeError",
    "byte_view",
    "dtype_from_json",
    "dtype_to_json",
    "flatten",
    "flatten_traits",
    "immutable_array",
    "is_registered",
    "leaf_digest",
    "register",
    "register_lazy_provider",
    "register_leaf_provider",
    "unflatten",
]


# -- flatten ----------------------------------------------------------------------


class LeafTraits(NamedTuple):
    """What :func:`flatten_traits` knows about the leaves it returned.

    **Attributes** (sets of leaf indices):

    - `fresh`: copies that ``flatten`` made (a non-contiguous array brought
      to C order): nobody else holds them.
    - `immutable`: leaves whose data nobody can ever change: a leaf
      provider vouched for them, or (:func:`immutable_array`) numpy arrays
      read-only down to an immutable ``bytes`` buffer.
    - `rebuilt`: leaves of providers whose objects are rebuilt on a restore,
      never written in place.
    """

    fresh: frozenset
    immutable: frozenset
    rebuilt: frozenset


class _Sink:
    """The leaves of a flatten, and what is known about them."""

    __slots__ = ("leaves", "fresh", "immutable", "rebuilt")

    def __init__(self):
        self.leaves: list[np.ndarray] = []
        self.fresh: set[int] = set()
        self.immutable: set[int] = set()
        self.rebuilt: set[int] = set()


def immutable_array(arr: np.ndarray) -> bool:
    """Whether nobody can ever change the data of the numpy array `arr`.

    True only when every array along its base chain is read-only and the
    chain ends in an immutable Python buffer (``bytes``, or a read-only
    ``memoryview`` of one): numpy refuses to make such an array writeable
    again.  An array that owns its data is never immutable, read-only or
    not: its owner may set ``flags.writeable = True`` at any time.
    """
    if arr.flags.writeable:
        return False
    base = arr.base
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return False
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj if base.readonly else None
    return type(base) is bytes


def _contiguous(arr: np.ndarray) -> np.ndarray:
    """``arr`` if C-contiguous (no copy), else a C-ordered copy."""
    if arr.flags.c_contiguous:
        return arr
    return np.ascontiguousarray(arr)  # never 0-d here: 0-d arrays are contiguous


class _PathError(Exception):
    """Carries a failure and the path of the failing object up to :func:`flatten`."""

    def __init__(self, error: Exception, path: str):
        self.error = error
        self.path = path


def _child(obj, sink: _Sink, segment: str):
    """Flatten a child, prefixing the path segment to any failure below it."""
    try:
        return _flatten(obj, sink)
    except _PathError as err:
        raise _PathError(err.error, segment + err.path) from None
    except TypeError as err:  # UnknownStateTypeError included
        raise _PathError(err, segment) from None


def _leaf(arr: np.ndarray, sink: _Sink) -> dict:
    dtype_to_json(arr.dtype)  # refuses object arrays with a clear message
    leaf = _contiguous(arr)
    i = len(sink.leaves)
    sink.leaves.append(leaf)
    if leaf is not arr:
        sink.fresh.add(i)
    elif not leaf.flags.writeable and immutable_array(leaf):
        sink.immutable.add(i)
    return {"leaf": i}


def _provided_leaf(obj, provider, sink: _Sink) -> dict:
    arr, fields = provider.to_numpy(obj)
    if type(arr) is not np.ndarray or not isinstance(fields, dict) or provider.tag not in fields:
        raise VlccTypeError(
            f"the {provider.tag!r} leaf provider's to_numpy must return (a numpy "
            f"array, fields with {provider.tag!r}), got {type(arr).__name__}, "
            f"{fields!r}"
        )
    node = _leaf(arr, sink)
    i = node["leaf"]
    if provider.immutable and i not in sink.fresh:
        sink.immutable.add(i)
    if provider.rebuilt:
        sink.rebuilt.add(i)
    node.update(fields)
    return node


_SCALAR_KEY_TYPES = (str, int, float, bool, type(None))


def _key_ok(key) -> bool:
    if type(key) in _SCALAR_KEY_TYPES:
        return True
    return type(key) is tuple and all(_key_ok(k) for k in key)


def _flatten(obj, sink: _Sink) -> Any:
    cls = type(obj)
    if cls is np.ndarray:
        return _leaf(obj, sink)
    if cls is dict:
        keys = list(obj)
        if all(type(k) is str for k in keys):
            return {"dict": keys, "items": [_child(obj[k], sink, f"[{k!r}]") for k in keys]}
        bad = [k for k in keys if not _key_ok(k)]
        if bad:
            raise VlccTypeError(
                f"state dict keys must be str, int, float, bool, None or tuples of them, "
                f"got {bad[0]!r}; convert the keys (e.g. with str) or use a list"
            )
        return {
            "mapping": [_flatten(k, _Sink()) for k in keys],
            "items": [_child(obj[k], sink, f"[{k!r}]") for k in keys],
        }
    if cls is list or cls is tuple:
        return {cls.__name__: [_child(x, sink, f"[{i}]") for i, x in enumerate(obj)]}
    if obj is None or cls is bool or cls is str or cls is int:
        return {"value": obj}
    if cls is float:
        if obj != obj or obj in (float("inf"), float("-inf")):
            return {"float": repr(obj)}  # JSON has no inf / nan
        return {"value": obj}
    if cls is complex:
        return {"complex": [repr(obj.real), repr(obj.imag)]}
    if cls is bytes:
        return {"bytes": obj.hex()}
    if isinstance(obj, np.generic):
        # Inline and bit-exact: a numpy scalar is a few bytes, not worth a leaf.
        return {"npscalar": dtype_to_json(obj.dtype), "hex": np.asarray(obj).tobytes().hex()}
    if cls is np.memmap:  # its data, restored as a plain array
        return _leaf(np.asarray(obj), sink)
    provider = _BY_TYPE.get(cls)
    if provider is None:
        leaf_provider = leaf_provider_of(cls)
        if leaf_provider is not None:
            return _provided_leaf(obj, leaf_provider, sink)
        provider = _auto_provider(obj, cls)
    children, aux = provider.flatten(obj)
    if provider.user:
        try:
            aux = json.loads(json.dumps(aux, allow_nan=False))
        except (TypeError, ValueError) as err:
            raise VlccTypeError(
                f"the aux data of {provider.name} is not JSON-serialisable ({err}); return "
                "only dicts, lists, strings, numbers, bools and None as aux from its flatten_fn"
            ) from None
    named = isinstance(aux, list) and len(aux) == len(children) and all(type(a) is str for a in aux)
    items = [_child(x, sink, f".{aux[i]}" if named else f"[{i}]") for i, x in enumerate(children)]
    return {"type": provider.name, "aux": aux, "items": items}


def _auto_provider(obj, cls: type) -> _Provider:
    if dataclasses.is_dataclass(obj):
        return _register_dataclass(cls)
    if isinstance(obj, tuple) and hasattr(cls, "_fields"):
        return _register_namedtuple(cls)
    if isinstance(obj, np.ndarray):
        remedy = "pass np.asarray(x)"
        if isinstance(obj, np.ma.MaskedArray):
            remedy = "store x.data and np.ma.getmaskarray(x) as two arrays"
        raise UnknownStateTypeError(
            f"array subclass {cls.__module__}.{cls.__qualname__} is not supported ({remedy}, "
            "or teach it with vlcc_adjoint.state.register)"
        )
    hint = ""
    if callable(obj):
        hint = (
            " Functions and other callables cannot be checkpointed; keep them out of the "
            "state (e.g. split an equinox module with eqx.partition(model, eqx.is_array))."
        )
    elif tree_node_owner(cls) is not None:
        hint = (
            f" It is a tree node of the {tree_node_owner(cls).tag!r} provider's library, but "
            "only dataclass nodes are flattened automatically."
        )
    raise UnknownStateTypeError(
        f"no state provider for {cls.__module__}.{cls.__qualname__}; use numpy arrays, "
        "scalars, strings, dicts, lists, tuples, named tuples or dataclasses, or teach it with "
        "vlcc_adjoint.state.register(cls, flatten_fn, unflatten_fn)." + hint
    )


def flatten(state: Any) -> tuple[list[np.ndarray], dict]:
    """Split `state` into C-contiguous numpy leaves and a JSON spec.

    **Arguments:**

    - `state`: any nest of the supported types (see the module docstring).

    **Returns:** ``(leaves, spec)``: the leaves, in depth-first order, as
    views of the state's own arrays where those are C-contiguous (copies
    only where they are not; a leaf provider's arrays are brought to the
    host), and the pure-JSON spec that :func:`unflatten` rebuilds the state
    from.

    Raises :class:`UnknownStateTypeError` (or ``TypeError``) naming the path
    of the first object it cannot checkpoint, e.g. ``state['params'].f``.
    """
    leaves, spec, _ = flatten_traits(state)
    return leaves, spec


def flatten_traits(state: Any) -> tuple[list[np.ndarray], dict, LeafTraits]:
    """:func:`flatten`, plus what is known about each leaf's ownership.

    **Returns:** ``(leaves, spec, traits)``, `traits` a :class:`LeafTraits`:
    which leaves ``flatten`` copied (nobody else holds them), which can
    never change (a store may keep them by reference) and which a restore
    rebuilds instead of writing in place.
    """
    activate_imported()
    sink = _Sink()
    try:
        tree = _flatten(state, sink)
    except _PathError as err:
        kind = UnknownStateTypeError if isinstance(err.error, UnknownStateTypeError) else TypeError
        raise kind(f"state{err.path}: {err.error}") from None
    leaves = sink.leaves
    spec = {
        "format": SPEC_FORMAT,
        "tree": tree,
        "leaves": [
            {"dtype": dtype_to_json(leaf.dtype), "shape": list(leaf.shape)} for leaf in leaves
        ],
    }
    return (
        leaves,
        spec,
        LeafTraits(frozenset(sink.fresh), frozenset(sink.immutable), frozenset(sink.rebuilt)),
    )


# -- unflatten --------------------------------------------------------------------


def _unflatten(node, leaves):
    if type(node) is not dict:
        raise VlccValueError(f"malformed state spec node {node!r}")
    if "leaf" in node:
        leaf = leaves[node["leaf"]]
        if len(node) > 1:  # a leaf provider's array
            return leaf_provider_of_node(node).from_numpy(leaf, node)
        return leaf
    if "value" in node:
        return node["value"]
    if "dict" in node:
        return {k: _unflatten(v, leaves) for k, v in zip(node["dict"], node["items"], strict=True)}
    if "list" in node:
        return [_unflatten(v, leaves) for v in node["list"]]
    if "tuple" in node:
        return tuple(_unflatten(v, leaves) for v in node["tuple"])
    if "type" in node:
        provider = _BY_NAME.get(node["type"])
        if provider is None:
            raise UnknownStateTypeError(
                f"the checkpoint holds a {node['type']!r}, which this process has not "
                "registered; call vlcc_adjoint.state.register(cls) (dataclasses, named tuples) "
                "or register(cls, flatten_fn, unflatten_fn) before loading (types are never "
                "imported from a checkpoint)"
            )
        return provider.unflatten(node["aux"], [_unflatten(v, leaves) for v in node["items"]])
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
    if "bytes" in node:
        return bytes.fromhex(node["bytes"])
    if "mapping" in node:
        return {
            _hashable(_unflatten(k, ())): _unflatten(v, leaves)
            for k, v in zip(node["mapping"], node["items"], strict=True)
        }
    raise VlccValueError(f"malformed state spec node {node!r}")


def _hashable(key):
    if type(key) is list:  # pragma: no cover - tuples are tagged, lists never keys
        raise VlccValueError("list as dict key in state spec")
    return key


def unflatten(spec: dict, leaves: Sequence[np.ndarray], *, copy: bool = False) -> Any:
    """Rebuild the state that :func:`flatten` described.

    **Arguments:**

    - `spec`: the spec from :func:`flatten` (or read back from JSON).
    - `leaves`: the arrays, in order; each must have the dtype (byte order
      included) and shape the spec records.
    - `copy`: copy every numpy leaf into a new array the state owns.  By
      default the leaves themselves go into the state (no copy), which is
      what a restore into a fresh state wants; pass ``copy=True`` when the
      leaves belong to a store (tiers hand out read-only views).

    **Returns:** the state: the same structure, types and values that were
    flattened (a leaf provider's arrays come back as its own arrays).

    Raises ``ValueError`` when the leaves do not match the spec and
    :class:`UnknownStateTypeError` for a type this process has not
    registered.
    """
    if not isinstance(spec, dict) or "tree" not in spec or "leaves" not in spec:
        raise VlccValueError(
            "not a state spec: expected a dict with 'tree' and 'leaves' "
            "(as returned by vlcc_adjoint.state.flatten)"
        )
    fmt = spec.get("format", SPEC_FORMAT)
    if fmt != SPEC_FORMAT:
        raise VlccValueError(
            f"unsupported state spec format {fmt!r}; this version reads {SPEC_FORMAT!r}"
        )
    activate_imported()
    if len(leaves) != len(spec["leaves"]):
        raise VlccValueError(f"the spec has {len(spec['leaves'])} leaves, got {len(leaves)} arrays")
    checked = []
    for i, (leaf, want) in enumerate(zip(leaves, spec["leaves"])):
        if not isinstance(leaf, np.ndarray):
            raise VlccTypeError(f"leaf {i} is a {type(leaf).__name__}, not a numpy array")
        dtype = dtype_from_json(want["dtype"])
        if leaf.dtype != dtype or leaf.dtype.str != dtype.str or list(leaf.shape) != want["shape"]:
            raise VlccValueError(
                f"leaf {i} is {leaf.dtype.str}{list(leaf.shape)}, the spec says "
                f"{dtype.str}{want['shape']}"
            )
        checked.append(np.array(leaf, copy=True) if copy else leaf)
    return _unflatten(spec["tree"], checked)


# -- content hashing --------------------------------------------------------------

# Hash in slices: xxhash holds the GIL while it hashes, so slicing bounds the
# time other threads (the engine's workers, the solver) wait for it.
_SLICE = 8 << 20


def byte_view(arr: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array as a flat ``uint8`` memoryview (any dtype)."""
    return memoryview(arr.reshape(-1).view(np.uint8))


def _hash_into(h, arr: np.ndarray):
    view = byte_view(_contiguous(arr))
    for start in range(0, len(view), _SLICE):
        h.update(view[start : start + _SLICE])
    return h


def leaf_digest(arr: np.ndarray) -> str:
    """A content address of `arr`: xxh3-128 of its bytes, dtype and shape.

    Equal digests mean equal leaves (same bytes, same dtype including byte
    order, same shape) up to a 2^-128 chance; the store keys its
    deduplication table on it (see the module docstring).

    **Arguments:**

    - `arr`: a numpy array (non-contiguous arrays are hashed in C order).

    **Returns:** 32 hexadecimal characters.
    """
    arr = np.asarray(arr)
    h = _hash_into(xxhash.xxh3_128(), arr)
    h.update(json.dumps([dtype_to_json(arr.dtype), list(arr.shape)]).encode())
    return h.hexdigest()
