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
  dtypes; the ``ml_dtypes`` types JAX uses, such as ``bfloat16``) and numpy
  scalars (kept inline in the spec, bit-exact);
* Python ``None``, ``bool``, ``int``, ``float`` (``nan``/``inf`` included),
  ``complex``, ``str`` and ``bytes``;
* ``dict`` (keys: ``str``, or ``int``/``float``/``bool``/``None``/tuples of
  them), ``list``, ``tuple``; named tuples and dataclasses (registered
  automatically the first time they are flattened);
* when JAX is imported: ``jax.Array`` (rebuilt as ``jax.Array`` on the default
  device; typed PRNG keys through their key data) and dataclass pytrees such
  as equinox modules or flax structs (rebuilt field by field, the way JAX
  unflattens them, without calling ``__init__``).

Everything else is an :class:`UnknownStateTypeError` naming the object's
path in the state and the remedy (convert it, or :func:`register` it).

Leaves
------

Leaves are C-contiguous numpy arrays, in a deterministic depth-first order
(dicts in insertion order).  They are *views* of the state's own arrays
when those are already C-contiguous (no copy); non-contiguous arrays are
copied once, to C order.  JAX arrays are brought to the host with
``np.asarray`` (a zero-copy view on CPU).  The store, not :func:`flatten`,
takes the snapshot copy.

Spec format (``"format": "vlcc-state/1"``)
------------------------------------------

``{"format", "tree", "leaves"}``: ``leaves[i]`` is ``{"dtype", "shape"}`` of
leaf ``i``; ``tree`` is a nest of one-key-tagged nodes: ``{"leaf": i}``,
``{"value": v}`` (``None``, ``bool``, ``int``, finite ``float``, ``str``),
``{"float": "nan"}``, ``{"complex": [re, im]}``, ``{"bytes": hex}``,
``{"npscalar": dtype, "hex": raw bytes}``, ``{"dict": keys, "items": [...]}``,
``{"mapping": [key nodes], "items": [...]}``, ``{"list": [...]}``,
``{"tuple": [...]}`` and ``{"type": name, "aux": json, "items": [...]}`` for
registered types.  Dtypes are numpy's ``dtype.str`` (byte order included),
an ``ml_dtypes`` name, or ``{"descr": ...}`` for structured dtypes;
:func:`dtype_from_json` accepts only these forms (never ``object``).

Deduplication
-------------

:func:`leaf_digest` is a content address for a leaf: xxh3-128 of its bytes,
dtype and shape.  The store keeps a content-addressed table of leaves
(:class:`vlcc_adjoint.storage.LeafTable`): a leaf whose digest equals one
already stored (a velocity model carried unchanged in every checkpoint, the
frozen layers of a network) is stored once and referenced by every record
that holds it; the table counts references and frees a leaf with its last
reference, and byte accounting counts a shared leaf once.  Hashing runs at
6-10 GB/s on one core of the shared 2-core VM (``benchmarks/bench_tiers.py``),
about the speed of copying a state that fits in cache and 3-4x the speed of
copying a large one (1.5-3 GB/s for 128 MiB), so the engine hashes before
it copies and skips the copy on a hit.  With 128 bits, an accidental
collision among even 10^12 distinct leaves has probability below 10^-14.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import xxhash

__all__ = [
    "UnknownStateTypeError",
    "dtype_from_json",
    "dtype_to_json",
    "flatten",
    "is_registered",
    "leaf_digest",
    "register",
    "unflatten",
]

SPEC_FORMAT = "vlcc-state/1"


class UnknownStateTypeError(TypeError):
    """A state (or spec) holds a type no provider knows."""


# -- providers --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Provider:
    name: str
    flatten: Callable[[Any], tuple[Sequence, Any]]  # obj -> (children, JSON aux)
    unflatten: Callable[[Any, list], Any]  # (aux, children) -> obj
    user: bool  # aux comes from user code: validate and normalise it through JSON


_BY_TYPE: dict[type, _Provider] = {}
_BY_NAME: dict[str, _Provider] = {}


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def register(cls: type, flatten_fn: Callable | None = None,
             unflatten_fn: Callable | None = None, name: str | None = None) -> None:
    """Teach the providers a container type.

    **Arguments:**

    - `cls`: the type (exact type; subclasses register separately).
    - `flatten_fn(obj) -> (children, aux)`: the object's children (states
      themselves, flattened recursively) and a JSON-serialisable ``aux``.
    - `unflatten_fn(aux, children) -> obj`: the inverse.  ``aux`` arrives as
      it reads back from JSON (tuples become lists), in this process as in a
      restarted one.
    - `name`: the name stored in specs (default ``"module:qualname"``).  A
      checkpoint naming a type is rebuilt only by a process that registered
      that name; registering a name again replaces the earlier type (as when
      a notebook cell redefines a class).

    Dataclasses and named tuples need no functions: ``register(cls)`` (or
    simply flattening one) registers them.  A process that *loads* a
    checkpoint before it flattens such a type calls ``register(cls)`` first.
    """
    if not isinstance(cls, type):
        raise TypeError(f"register expects a class, got {cls!r}")
    if flatten_fn is None and unflatten_fn is None:
        if dataclasses.is_dataclass(cls):
            _register_dataclass(cls, name)
        elif issubclass(cls, tuple) and hasattr(cls, "_fields"):
            _register_namedtuple(cls, name)
        else:
            raise TypeError(
                f"{cls.__qualname__} is neither a dataclass nor a named tuple; pass "
                "flatten_fn(obj) -> (children, aux) and unflatten_fn(aux, children) -> obj"
            )
        return
    if not (callable(flatten_fn) and callable(unflatten_fn)):
        raise TypeError("register needs both flatten_fn and unflatten_fn (or neither, "
                        "for dataclasses and named tuples)")
    _add(cls, _Provider(name or _type_name(cls), flatten_fn, unflatten_fn, user=True))


def is_registered(cls: type) -> bool:
    """Whether a provider for exactly `cls` is registered (by :func:`register`,
    or by flattening a dataclass or named tuple of that type)."""
    return cls in _BY_TYPE


def _add(cls: type, provider: _Provider) -> _Provider:
    _BY_TYPE[cls] = provider
    _BY_NAME[provider.name] = provider
    return provider


def _register_dataclass(cls: type, name: str | None = None) -> _Provider:
    if _is_jax_pytree_node(cls):
        # A dataclass JAX already flattens (equinox modules, flax structs):
        # rebuild it the way JAX's own unflatten does, by setting every field
        # on a bare instance.  Its __init__ usually takes other arguments
        # (eqx.nn.Linear(in_features, out_features, key=...)).
        names = [f.name for f in dataclasses.fields(cls)]

        def unflatten_fn(aux, children):
            _check_fields(cls, aux, children, names)
            obj = object.__new__(cls)
            for field, value in zip(aux, children):
                object.__setattr__(obj, field, value)
            return obj
    else:
        # A plain dataclass: call the constructor with the init fields (so
        # __post_init__ re-derives what it derives), like
        # jax.tree_util.register_dataclass.  Fields added to the class since
        # the checkpoint was written take their defaults.
        names = [f.name for f in dataclasses.fields(cls) if f.init]

        def unflatten_fn(aux, children):
            _check_fields(cls, aux, children, names)
            return cls(**dict(zip(aux, children)))

    def flatten_fn(obj):
        return [getattr(obj, n) for n in names], list(names)  # the spec gets its own list

    return _add(cls, _Provider(name or _type_name(cls), flatten_fn, unflatten_fn, user=False))


def _check_fields(cls: type, aux, children, names: list[str]) -> None:
    """The spec's field names must be fields of the class (nothing else is set)."""
    if not (isinstance(aux, list) and len(aux) == len(children)
            and all(type(a) is str for a in aux)):
        raise ValueError(f"malformed field list {aux!r} for {cls.__qualname__} in state spec")
    unknown = set(aux) - set(names)
    if unknown:
        raise ValueError(
            f"the checkpoint has fields {sorted(unknown)} that {cls.__qualname__} does not have "
            "(the class changed since it was written?); restore with the matching class version"
        )


def _register_namedtuple(cls: type, name: str | None = None) -> _Provider:
    return _add(cls, _Provider(name or _type_name(cls), lambda obj: (list(obj), None),
                               lambda aux, children: cls(*children), user=False))


_JAX_NODE_CACHE: dict[type, bool] = {}


def _is_jax_pytree_node(cls: type) -> bool:
    """Whether JAX (if imported) has ``cls`` registered as a pytree node."""
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    known = _JAX_NODE_CACHE.get(cls)
    if known is None:
        registry = getattr(getattr(jax, "_src", None), "tree_util", None)
        registry = getattr(registry, "_registry", None)
        if registry is not None:
            known = cls in registry
        else:  # pragma: no cover - JAX moved its registry
            known = False
        if not known:
            # Types registered from C++ or with keys (equinox) live in the
            # default registry only; ask it with a bare instance.
            try:
                from jax.tree_util import default_registry  # type: ignore[attr-defined]
            except ImportError:  # pragma: no cover
                default_registry = None
            if default_registry is not None:
                try:
                    known = default_registry.flatten_one_level(object.__new__(cls)) is not None
                except Exception:
                    known = False
        _JAX_NODE_CACHE[cls] = known
    return known


# -- dtypes -----------------------------------------------------------------------

# numpy's dtype.str forms we accept: byte order, kind, item size, and a
# datetime unit.  Anything else (object "O", strings numpy would parse as
# structured dtypes or type names) is refused before np.dtype sees it.
_DTYPE_STR = re.compile(r"[<>|][biufc]\d{1,2}|[<>|][mM]8(\[\d{0,9}[A-Za-z]{1,2}\])?|[<>|][SUV]\d{1,10}")
# ml_dtypes types JAX uses; looked up by name in ml_dtypes, never imported by name.
_ML_DTYPES = frozenset({
    "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e4m3b11fnuz", "float8_e5m2",
    "float8_e5m2fnuz", "float8_e3m4", "float8_e4m3", "float8_e8m0fnu", "float4_e2m1fn",
    "float6_e2m3fn", "float6_e3m2fn", "int2", "int4", "uint2", "uint4",
})


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
        raise TypeError(
            f"dtype {dtype} holds Python objects, which cannot be checkpointed without pickle; "
            "convert to a numeric or fixed-width string dtype (e.g. np.asarray(x, dtype=float) "
            "or x.astype('U')), or keep the objects in a list"
        )
    if dtype.names is not None or dtype.subdtype is not None:
        return {"descr": _descr_to_json(np.lib.format.dtype_to_descr(dtype))}
    if dtype.kind == "V" and dtype.type.__module__.startswith("ml_dtypes"):
        if dtype.name not in _ML_DTYPES:
            raise TypeError(f"unsupported ml_dtypes type {dtype.name}")
        return dtype.name
    text = dtype.str
    if _DTYPE_STR.fullmatch(text) is None:  # pragma: no cover - exotic numpy dtypes
        raise TypeError(f"unsupported dtype {dtype!r} ({text}); convert the array to a numeric dtype")
    return text


def _descr_to_json(descr):
    if isinstance(descr, str):
        return descr
    return [[_descr_to_json(part) for part in field] if isinstance(field, tuple) else field
            for field in descr]


def dtype_from_json(value) -> np.dtype:
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
            raise ValueError(f"invalid or unsupported dtype {value!r} in checkpoint metadata")
        try:
            return np.dtype(value)
        except TypeError:  # well-formed but not a numpy dtype, e.g. "<b8"
            raise ValueError(f"invalid dtype {value!r} in checkpoint metadata") from None
    if isinstance(value, dict) and set(value) == {"descr"} and isinstance(value["descr"], list):
        try:
            dtype = np.lib.format.descr_to_dtype(_descr_from_json(value["descr"], 0))
        except TypeError as err:  # e.g. duplicate field names
            raise ValueError(f"invalid structured dtype in checkpoint metadata ({err})") from None
        if dtype.hasobject:
            raise ValueError("structured dtype with object fields in checkpoint metadata")
        return dtype
    raise ValueError(f"invalid dtype {value!r} in checkpoint metadata")


def _descr_from_json(descr, depth: int):
    if depth > 8:
        raise ValueError("structured dtype nested too deeply in checkpoint metadata")
    if isinstance(descr, str):
        dtype_from_json(descr)
        return descr
    if not isinstance(descr, list):
        raise ValueError(f"invalid structured dtype field {descr!r} in checkpoint metadata")
    fields = []
    for field in descr:
        if not (isinstance(field, list) and len(field) in (2, 3)):
            raise ValueError(f"invalid structured dtype field {field!r} in checkpoint metadata")
        name = field[0]
        if isinstance(name, list):  # (title, name)
            if not (len(name) == 2 and all(isinstance(s, str) for s in name)):
                raise ValueError(f"invalid field name {name!r} in checkpoint metadata")
            name = tuple(name)
        elif not isinstance(name, str):
            raise ValueError(f"invalid field name {name!r} in checkpoint metadata")
        item = [name, _descr_from_json(field[1], depth + 1)]
        if len(field) == 3:
            shape = field[2]
            if not (isinstance(shape, list) and all(type(s) is int and 0 <= s < 2**31 for s in shape)):
                raise ValueError(f"invalid field shape {shape!r} in checkpoint metadata")
            item.append(tuple(shape))
        fields.append(tuple(item))
    return fields


# -- flatten ----------------------------------------------------------------------


def _is_jax_array(obj) -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(obj, jax.Array)


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


def _child(obj, leaves: list, segment: str):
    """Flatten a child, prefixing the path segment to any failure below it."""
    try:
        return _flatten(obj, leaves)
    except _PathError as err:
        raise _PathError(err.error, segment + err.path) from None
    except TypeError as err:  # UnknownStateTypeError included
        raise _PathError(err, segment) from None


def _leaf(arr: np.ndarray, leaves: list) -> dict:
    dtype_to_json(arr.dtype)  # refuses object arrays with a clear message
    leaves.append(_contiguous(arr))
    return {"leaf": len(leaves) - 1}


def _jax_leaf(obj, leaves: list) -> dict:
    jax = sys.modules["jax"]
    if jax.dtypes.issubdtype(obj.dtype, jax.dtypes.prng_key):
        # Typed PRNG keys have no numpy dtype: store the key data, rebuild
        # with jax.random.wrap_key_data and the implementation's name.
        node = _leaf(np.asarray(jax.random.key_data(obj)), leaves)
        node["jax"] = "key"
        node["impl"] = str(jax.random.key_impl(obj))
        return node
    node = _leaf(np.asarray(obj), leaves)
    node["jax"] = True
    return node


_SCALAR_KEY_TYPES = (str, int, float, bool, type(None))


def _key_ok(key) -> bool:
    if type(key) in _SCALAR_KEY_TYPES:
        return True
    return type(key) is tuple and all(_key_ok(k) for k in key)


def _flatten(obj, leaves: list) -> Any:
    cls = type(obj)
    if cls is np.ndarray:
        return _leaf(obj, leaves)
    if cls is dict:
        keys = list(obj)
        if all(type(k) is str for k in keys):
            return {"dict": keys, "items": [_child(obj[k], leaves, f"[{k!r}]") for k in keys]}
        bad = [k for k in keys if not _key_ok(k)]
        if bad:
            raise TypeError(
                f"state dict keys must be str, int, float, bool, None or tuples of them, "
                f"got {bad[0]!r}; convert the keys (e.g. with str) or use a list"
            )
        return {"mapping": [_flatten(k, []) for k in keys],
                "items": [_child(obj[k], leaves, f"[{k!r}]") for k in keys]}
    if cls is list or cls is tuple:
        return {cls.__name__: [_child(x, leaves, f"[{i}]") for i, x in enumerate(obj)]}
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
    if _is_jax_array(obj):
        return _jax_leaf(obj, leaves)
    if cls is np.memmap:  # its data, restored as a plain array
        return _leaf(np.asarray(obj), leaves)
    provider = _BY_TYPE.get(cls)
    if provider is None:
        provider = _auto_provider(obj, cls)
    children, aux = provider.flatten(obj)
    if provider.user:
        try:
            aux = json.loads(json.dumps(aux, allow_nan=False))
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"the aux data of {provider.name} is not JSON-serialisable ({err}); return "
                "only dicts, lists, strings, numbers, bools and None as aux from its flatten_fn"
            ) from None
    named = isinstance(aux, list) and len(aux) == len(children) and all(type(a) is str for a in aux)
    items = [_child(x, leaves, f".{aux[i]}" if named else f"[{i}]")
             for i, x in enumerate(children)]
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
        hint = (" Functions and other callables cannot be checkpointed; keep them out of the "
                "state (e.g. split an equinox module with eqx.partition(model, eqx.is_array)).")
    elif _is_jax_pytree_node(cls):
        hint = " It is a JAX pytree node, but only dataclass pytrees are flattened automatically."
    raise UnknownStateTypeError(
        f"no state provider for {cls.__module__}.{cls.__qualname__}; use numpy arrays, "
        "scalars, strings, dicts, lists, tuples, named tuples or dataclasses, or teach it with "
        "vlcc_adjoint.state.register(cls, flatten_fn, unflatten_fn)." + hint
    )


def flatten(state) -> tuple[list[np.ndarray], dict]:
    """Split `state` into C-contiguous numpy leaves and a JSON spec.

    **Arguments:**

    - `state`: any nest of the supported types (see the module docstring).

    **Returns:** ``(leaves, spec)``: the leaves, in depth-first order, as
    views of the state's own arrays where those are C-contiguous (copies
    only where they are not; JAX arrays are brought to the host), and the
    pure-JSON spec that :func:`unflatten` rebuilds the state from.

    Raises :class:`UnknownStateTypeError` (or ``TypeError``) naming the path
    of the first object it cannot checkpoint, e.g. ``state['params'].f``.
    """
    leaves: list[np.ndarray] = []
    try:
        tree = _flatten(state, leaves)
    except _PathError as err:
        kind = UnknownStateTypeError if isinstance(err.error, UnknownStateTypeError) else TypeError
        raise kind(f"state{err.path}: {err.error}") from None
    spec = {
        "format": SPEC_FORMAT,
        "tree": tree,
        "leaves": [{"dtype": dtype_to_json(leaf.dtype), "shape": list(leaf.shape)} for leaf in leaves],
    }
    return leaves, spec


# -- re-flattening states of a known structure -----------------------------------
#
# A time loop hands the store states of one structure over and over (the
# same dataclass of the same two arrays, every step).  Re-deriving the spec
# of each one costs tens of microseconds of Python (a provider lookup, a
# path-tracking recursion and a dtype -> JSON conversion per node), which on
# a small state is as much as copying it.  A Layout remembers the spec of
# a state made only of numpy arrays and of containers whose structure does
# not depend on values (dicts with str keys, lists, tuples, dataclasses and
# named tuples flattened by their automatic providers), and checks a new
# state against it in one walk that compares types, keys, lengths and, per
# leaf, dtype *identity*, shape and C-contiguity.  When all of them match,
# flatten(state) would return exactly these leaves and an equal spec; any
# difference (or anything the walk does not model: scalars, JAX arrays,
# user providers) sends the caller to flatten itself.


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


# -- unflatten --------------------------------------------------------------------


def _unflatten(node, leaves):
    if type(node) is not dict:
        raise ValueError(f"malformed state spec node {node!r}")
    if "leaf" in node:
        leaf = leaves[node["leaf"]]
        tag = node.get("jax")
        if tag:
            return _to_jax(leaf, tag, node.get("impl"))
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
            raise ValueError(f"malformed float {text!r} in state spec")
        return float(text)
    if "complex" in node:
        re_, im = node["complex"]
        return complex(float(re_), float(im))
    if "npscalar" in node:
        dtype = dtype_from_json(node["npscalar"])
        raw = bytes.fromhex(node["hex"])
        if len(raw) != dtype.itemsize:
            raise ValueError(f"numpy scalar of dtype {dtype} with {len(raw)} bytes in state spec")
        return np.frombuffer(raw, dtype=dtype)[0]
    if "bytes" in node:
        return bytes.fromhex(node["bytes"])
    if "mapping" in node:
        return {_hashable(_unflatten(k, ())): _unflatten(v, leaves)
                for k, v in zip(node["mapping"], node["items"], strict=True)}
    raise ValueError(f"malformed state spec node {node!r}")


def _hashable(key):
    if type(key) is list:  # pragma: no cover - tuples are tagged, lists never keys
        raise ValueError("list as dict key in state spec")
    return key


def _to_jax(leaf: np.ndarray, tag, impl):
    import jax
    import jax.numpy as jnp

    if tag == "key":
        if not isinstance(impl, str):
            raise ValueError("PRNG key without its implementation name in state spec")
        return jax.random.wrap_key_data(jnp.asarray(leaf), impl=impl)
    return jnp.asarray(leaf)


def unflatten(spec: dict, leaves: Sequence[np.ndarray], *, copy: bool = False):
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
    flattened (JAX arrays come back as JAX arrays on the default device).

    Raises ``ValueError`` when the leaves do not match the spec and
    :class:`UnknownStateTypeError` for a type this process has not
    registered.
    """
    if not isinstance(spec, dict) or "tree" not in spec or "leaves" not in spec:
        raise ValueError("not a state spec: expected a dict with 'tree' and 'leaves' "
                         "(as returned by vlcc_adjoint.state.flatten)")
    fmt = spec.get("format", SPEC_FORMAT)
    if fmt != SPEC_FORMAT:
        raise ValueError(f"unsupported state spec format {fmt!r}; this version reads {SPEC_FORMAT!r}")
    if len(leaves) != len(spec["leaves"]):
        raise ValueError(f"the spec has {len(spec['leaves'])} leaves, got {len(leaves)} arrays")
    checked = []
    for i, (leaf, want) in enumerate(zip(leaves, spec["leaves"])):
        if not isinstance(leaf, np.ndarray):
            raise TypeError(f"leaf {i} is a {type(leaf).__name__}, not a numpy array")
        dtype = dtype_from_json(want["dtype"])
        if leaf.dtype != dtype or leaf.dtype.str != dtype.str or list(leaf.shape) != want["shape"]:
            raise ValueError(
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
        h.update(view[start:start + _SLICE])
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
