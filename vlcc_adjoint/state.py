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

The structure of a state
------------------------

The spec is the one description of a state's structure; everything that
needs the structure derives it from the spec or from its compiled form:

* :class:`Structure` is a spec with the values of its scalars aside,
  made from a state without copying its arrays or bringing them to the
  host (:meth:`Structure.of`: the same walk as :func:`flatten`, recording
  each leaf's dtype and shape only; a leaf provider answers through its
  :attr:`~LeafProvider.describe`).  Compiled once, it checks whether
  another state has the same structure, dtypes and shapes
  (:attr:`Structure.matches`: the executor checks every step's output
  with it), names the first difference by its path
  (:meth:`Structure.mismatch`), and counts the state's bytes
  (:func:`state_nbytes`).
* :class:`Layout` is the structure of a state whose spec has no values
  (arrays in plain containers), with compiled walks that re-flatten and
  rebuild states of that structure: the store's path for a time loop.
* :func:`spec_nodes` and :func:`leaf_paths` walk a spec's tree and name
  each leaf and value by its path in the state, ``state['params'].c``,
  ``state[0]``, as :func:`flatten`'s error messages do (lineage's diffs and
  the MPI layer's distributed blocks read them).

The walks of spec trees, their comparison and their compiled forms live in
:mod:`._layout`, which reads only the provider registries (:mod:`._providers`)
and the dtype codec, so the two modules never import each other.

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

import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Self

import numpy as np
import xxhash

from ._dtype_json import dtype_from_json as dtype_from_json
from ._dtype_json import dtype_to_json as dtype_to_json
from ._layout import (
    INLINE_TYPES,
    LeafInfo,
    build,
    compile_build,
    compile_check,
    difference,
    inline_node,
    item_segments,
    key_node,
    key_segment,
)
from ._layout import inline_value as inline_value
from ._layout import leaf_paths as leaf_paths
from ._layout import spec_nodes as spec_nodes
from ._providers import (
    CONTAINERS,
    SPEC_FORMAT,
    activate_imported,
    automatic_provider,
    describe_leaf,
    leaf_provider_of,
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
    "Structure",
    "UnknownStateTypeError",
    "byte_view",
    "dtype_from_json",
    "dtype_to_json",
    "flatten",
    "flatten_traits",
    "immutable_array",
    "is_registered",
    "join_leaves",
    "leaf_digest",
    "leaf_paths",
    "register",
    "register_lazy_provider",
    "register_leaf_provider",
    "spec_nodes",
    "split_leaves",
    "state_nbytes",
    "unflatten",
]


# -- the walk of a state ----------------------------------------------------------------


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


class _Sink:
    """Where :func:`_flatten` puts the leaves of a flatten, and what is
    known about them: the arrays themselves, brought to C order and to the
    host."""

    __slots__ = ("leaves", "fresh", "immutable", "rebuilt", "opaque")

    def __init__(self, opaque: bool = False) -> None:
        self.leaves: list[np.ndarray] = []
        self.fresh: set[int] = set()
        self.immutable: set[int] = set()
        self.rebuilt: set[int] = set()
        self.opaque = opaque  # an object no provider knows: an opaque node, not an error

    def array(self, arr: np.ndarray) -> dict:
        dtype_to_json(arr.dtype)  # refuses object arrays with a clear message
        leaf = _contiguous(arr)
        i = len(self.leaves)
        self.leaves.append(leaf)
        if leaf is not arr:
            self.fresh.add(i)
        elif not leaf.flags.writeable and immutable_array(leaf):
            self.immutable.add(i)
        return {"leaf": i}

    def provided(self, obj: Any, provider: LeafProvider) -> dict:
        arr, fields = provider.to_numpy(obj)
        if (
            type(arr) is not np.ndarray
            or not isinstance(fields, dict)
            or provider.tag not in fields
        ):
            raise VlccTypeError(
                f"the {provider.tag!r} leaf provider's to_numpy must return (a numpy "
                f"array, fields with {provider.tag!r}), got {type(arr).__name__}, "
                f"{fields!r}"
            )
        node = self.array(arr)
        i = node["leaf"]
        if provider.immutable and i not in self.fresh:
            self.immutable.add(i)
        if provider.rebuilt:
            self.rebuilt.add(i)
        node.update(fields)
        return node

    def unknown(self, obj: Any) -> dict:
        return {"opaque": type(obj)}


class _Describe:
    """Where :func:`_flatten` puts the leaves of a structure: each leaf's
    dtype and shape only, read from the array (or from its leaf provider's
    :attr:`~LeafProvider.describe`) without copying anything or bringing it
    to the host."""

    __slots__ = ("infos", "opaque")

    def __init__(self, opaque: bool = False) -> None:
        self.infos: list[tuple[np.dtype, tuple[int, ...]]] = []
        self.opaque = opaque

    def array(self, arr: np.ndarray) -> dict:
        dtype_to_json(arr.dtype)  # refuses object arrays, as flatten does
        self.infos.append((arr.dtype, arr.shape))
        return {"leaf": len(self.infos) - 1}

    def provided(self, obj: Any, provider: LeafProvider) -> dict:
        dtype, shape, fields = describe_leaf(provider, obj)
        dtype_to_json(dtype)
        self.infos.append((dtype, shape))
        node = {"leaf": len(self.infos) - 1}
        node.update(fields)
        return node

    def unknown(self, obj: Any) -> dict:
        return {"opaque": type(obj)}


class _Objects:
    """Where :func:`_flatten` puts the leaves of :func:`split_leaves`: the
    objects themselves, by reference, those that `is_leaf` picks as leaves
    and every other array and object as an ``{"object": obj}`` node."""

    __slots__ = ("leaves", "is_leaf", "opaque")

    def __init__(self, is_leaf: Callable[[Any], bool]) -> None:
        self.leaves: list[Any] = []
        self.is_leaf = is_leaf
        self.opaque = True

    def take(self, obj: Any) -> dict:
        if self.is_leaf(obj):
            self.leaves.append(obj)
            return {"leaf": len(self.leaves) - 1}
        return {"object": obj}

    def array(self, arr: np.ndarray) -> dict:
        return self.take(arr)

    def provided(self, obj: Any, provider: LeafProvider) -> dict:
        return self.take(obj)

    def unknown(self, obj: Any) -> dict:
        return self.take(obj)


class _PathError(Exception):
    """Carries a failure and the path of the failing object up to :func:`flatten`."""

    def __init__(self, error: Exception, path: str):
        self.error = error
        self.path = path


def _below(err: Exception, segment: str) -> _PathError:
    """The failure `err` of a child, with the child's path segment prefixed.

    A container flattens its children in one ``try``: the segment of the
    child that failed is written only then, never on the way down."""
    if isinstance(err, _PathError):
        return _PathError(err.error, segment + err.path)
    return _PathError(err, segment)


def _flatten(obj, sink) -> Any:
    """The spec node of `obj`, its leaves handed to `sink` (:class:`_Sink`
    or :class:`_Describe`): the one walk of a state's objects."""
    cls = type(obj)
    if cls is np.ndarray:
        return sink.array(obj)
    if cls is dict:
        keys = list(obj)
        items = []
        try:
            for k in keys:
                items.append(_flatten(obj[k], sink))
        except (_PathError, TypeError) as err:  # UnknownStateTypeError included
            raise _below(err, key_segment(k)) from None
        if all(type(k) is str for k in keys):
            return {"dict": keys, "items": items}
        return {"mapping": [key_node(k) for k in keys], "items": items}
    if cls is list or cls is tuple:
        seq = []
        i = 0
        try:
            for i, x in enumerate(obj):
                seq.append(_flatten(x, sink))
        except (_PathError, TypeError) as err:
            raise _below(err, f"[{i}]") from None
        return {cls.__name__: seq}
    if cls in INLINE_TYPES or isinstance(obj, np.generic):
        return inline_node(obj)
    if cls is np.memmap:  # its data, restored as a plain array
        return sink.array(np.asarray(obj))
    provider = CONTAINERS.by_type.get(cls)
    if provider is None:
        leaf_provider = leaf_provider_of(cls)
        if leaf_provider is not None:
            return sink.provided(obj, leaf_provider)
        provider = automatic_provider(cls)
        if provider is None:
            if sink.opaque:
                return sink.unknown(obj)
            raise _unknown(obj, cls)
    # split() normalises a user provider's aux through JSON; the automatic
    # providers' flatten returns what the spec records.
    children, aux = provider.split(obj) if provider.kind == "user" else provider.flatten(obj)
    items = []
    i = 0
    try:
        for i, x in enumerate(children):
            items.append(_flatten(x, sink))
    except (_PathError, TypeError) as err:
        raise _below(err, item_segments(aux, len(children))[i]) from None
    return {"type": provider.name, "aux": aux, "items": items}


def _unknown(obj, cls: type) -> TypeError:
    """The error for an object no provider knows, with the remedy."""
    if isinstance(obj, np.ndarray):
        remedy = "pass np.asarray(x)"
        if isinstance(obj, np.ma.MaskedArray):
            remedy = "store x.data and np.ma.getmaskarray(x) as two arrays"
        return UnknownStateTypeError(
            f"array subclass {cls.__module__}.{cls.__qualname__} is not supported ({remedy}, "
            "or teach it with vlcc_adjoint.state.register)"
        )
    hint = ""
    owner = tree_node_owner(cls)
    if callable(obj):
        hint = (
            " Functions and other callables cannot be checkpointed; keep them out of the "
            "state (e.g. split an equinox module with eqx.partition(model, eqx.is_array))."
        )
    elif owner is not None:
        hint = (
            f" It is a tree node of the {owner.tag!r} provider's library, but "
            "only dataclass nodes are flattened automatically."
        )
    return UnknownStateTypeError(
        f"no state provider for {cls.__module__}.{cls.__qualname__}; use numpy arrays, "
        "scalars, strings, dicts, lists, tuples, named tuples or dataclasses, or teach it with "
        "vlcc_adjoint.state.register(cls, flatten_fn, unflatten_fn)." + hint
    )


def _walk(state: Any, sink) -> Any:
    """The spec tree of `state` (see :func:`_flatten`), with a failure below
    the root reported as ``state<path>: <error>``."""
    activate_imported()
    try:
        return _flatten(state, sink)
    except _PathError as err:
        kind = UnknownStateTypeError if isinstance(err.error, UnknownStateTypeError) else TypeError
        raise kind(f"state{err.path}: {err.error}") from None


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
    sink = _Sink()
    tree = _walk(state, sink)
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


def flatten_opaque(state: Any) -> tuple[list[np.ndarray], dict]:
    """:func:`flatten`, except that an object no provider knows becomes an
    ``{"opaque": its class}`` node instead of an error.

    For checks of states that need not be stored (the executor's nan/inf
    check of whatever a solver returns): such a spec is not JSON and is
    never written anywhere.
    """
    sink = _Sink(opaque=True)
    tree = _walk(state, sink)
    leaf_specs = [{"dtype": dtype_to_json(a.dtype), "shape": list(a.shape)} for a in sink.leaves]
    return sink.leaves, {"format": SPEC_FORMAT, "tree": tree, "leaves": leaf_specs}


# -- unflatten --------------------------------------------------------------------


def split_leaves(state: Any, is_leaf: Callable[[Any], bool]) -> tuple[list[Any], dict]:
    """The objects of `state` that `is_leaf` picks, by reference, and the
    tree that :func:`join_leaves` puts them (or others in their place) back
    into: the one walk of a state, for code that carries live objects
    rather than storing them (an integration's live arrays between the
    steps of a recomputation, handed to its autodiff).

    **Arguments:**

    - `state`: any nest of the supported containers (see the module
      docstring).
    - `is_leaf`: called on every array, leaf provider's object and object no
      provider knows; those for which it is true are the leaves.

    **Returns:** ``(leaves, tree)``: the leaves in depth-first order, and a
    spec tree in which every other array or object is an ``{"object": obj}``
    node that travels as the object it is.  Such a tree is not JSON and is
    never written anywhere.
    """
    sink = _Objects(is_leaf)
    tree = _walk(state, sink)
    return sink.leaves, tree


def join_leaves(tree: dict, leaves: Sequence[Any]) -> Any:
    """The state that `tree` (from :func:`split_leaves`) describes, around
    `leaves`, each taken as it is."""
    return build(tree, leaves, objects=True)


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
    return build(spec["tree"], checked)


# -- the structure of a state, compiled -----------------------------------------------


class Structure:
    """The structure of a state: what :func:`flatten`'s spec records of it,
    with the values of its scalars aside; compiled once into a check.

    Two states have the same structure when their specs have the same
    containers (dict keys in order, lengths), the same registered types
    (with the same ``aux`` for types registered with functions), arrays of
    the same dtype (byte order included) and shape (a leaf provider's with
    the same spec fields), and scalars of the same types (numpy scalars of
    the same dtype), whatever their values.  This is what a time loop
    keeps from step to step, and what the executor checks.

    Made by :meth:`of` from a state (without copying its arrays or bringing
    them to the host: numpy arrays are read for dtype and shape, leaf
    providers are asked through :attr:`LeafProvider.describe`), or by
    :meth:`from_spec` from a spec.

    **Attributes:**

    - `tree`, `leaf_specs`: the spec's ``tree`` and ``leaves`` (read-only:
      never modify them).
    - `infos`: per leaf ``(dtype, shape)``.
    - `nbytes`: the bytes of all leaves (what a store holds for the state).
    - `array`: ``(dtype, shape)`` when the state is one numpy array (the
      common case, and the fast path of every check), else ``None``.
    - `matches(x) -> bool`: whether `x` has this structure, compiled when
      first used (:func:`vlcc_adjoint._layout.compile_check`): a few
      comparisons per container and per array, and for a one-array state
      a type, a shape and a dtype identity test.
    """

    __slots__ = ("tree", "leaf_specs", "infos", "nbytes", "array", "matches")

    def __init__(
        self,
        tree: Any,
        leaf_specs: list[dict[str, Any]],
        infos: Sequence[tuple[np.dtype, tuple[int, ...]]],
    ) -> None:
        self.tree = tree
        self.leaf_specs = leaf_specs
        self.infos = infos = tuple(infos)
        nbytes = 0
        for dtype, shape in infos:
            nbytes += dtype.itemsize * _count(shape)
        self.nbytes = nbytes
        self.array = infos[0] if type(tree) is dict and len(tree) == 1 and "leaf" in tree else None

    def __getattr__(self, name: str) -> Any:
        # The check is compiled on first use and kept in its slot; later
        # reads find it there without calling this.
        if name == "matches":
            match = compile_check(self.tree, self.leaf_infos())
            assert match is not None  # only a layout walk may be absent
            self.matches = match
            return match
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def leaf_infos(self) -> list[LeafInfo]:
        """Per leaf ``(dtype, shape, dtype JSON)``: what the compiled checks compare."""
        return [
            (dtype, tuple(shape), entry["dtype"])
            for (dtype, shape), entry in zip(self.infos, self.leaf_specs)
        ]

    @classmethod
    def of(cls, state: Any, *, opaque: bool = False) -> Self:
        """The structure of `state`.

        **Arguments:**

        - `state`: any state :func:`flatten` accepts.
        - `opaque`: describe an object no provider knows by its class
          (``{"opaque": cls}``; it matches objects of that exact class)
          instead of raising :class:`UnknownStateTypeError`: for checks of
          states that are never stored (the executor checks whatever a
          solver returns).

        Nothing is copied and nothing is brought to the host, except the
        arrays of a leaf provider without :attr:`~LeafProvider.describe`
        (read with its ``to_numpy``) and of a container provider whose
        ``flatten_fn`` converts (an accelerator library's arrays registered with
        :func:`register`).
        """
        if type(state) is np.ndarray:  # the common case, without the walk
            dtype_json = dtype_to_json(state.dtype)
            return cls(
                {"leaf": 0},
                [{"dtype": dtype_json, "shape": list(state.shape)}],
                ((state.dtype, state.shape),),
            )
        sink = _Describe(opaque)
        tree = _walk(state, sink)
        leaf_specs = [
            {"dtype": dtype_to_json(dtype), "shape": list(shape)} for dtype, shape in sink.infos
        ]
        return cls(tree, leaf_specs, sink.infos)

    @classmethod
    def from_spec(cls, spec: dict) -> Self:
        """The structure a spec describes (a spec from :func:`flatten`, or
        read back from JSON).

        Raises ``ValueError`` for a spec that is not one.
        """
        if not isinstance(spec, dict) or "tree" not in spec or "leaves" not in spec:
            raise VlccValueError(
                "not a state spec: expected a dict with 'tree' and 'leaves' "
                "(as returned by vlcc_adjoint.state.flatten)"
            )
        infos = []
        for entry in spec["leaves"]:
            if not (isinstance(entry, dict) and type(entry.get("shape")) is list):
                raise VlccValueError(f"malformed leaf entry {entry!r:.200} in state spec")
            infos.append((dtype_from_json(entry["dtype"]), tuple(entry["shape"])))
        return cls(spec["tree"], spec["leaves"], infos)

    def spec(self) -> dict:
        """A spec of this structure (a new top-level dict; its parts are
        shared).  For a structure made by :meth:`of`, it equals
        ``flatten(state)[1]``, values included."""
        return {"format": SPEC_FORMAT, "tree": self.tree, "leaves": self.leaf_specs}

    def difference(self, got: Structure, path: str = "state", *, seed: bool = False) -> str:
        """How the structure `got` differs from this one (the reference), in
        one sentence naming the first difference by its path, or ``""``.
        With `seed`, only what `got` has of this structure's form is
        compared (see :func:`vlcc_adjoint._layout.difference`)."""
        return difference(got.tree, got.leaf_specs, self.tree, self.leaf_specs, path, seed=seed)

    def mismatch(self, x: Any, path: str = "state") -> str:
        """How the state `x` differs from this structure, or ``""`` when it
        matches (``""`` exactly when ``matches(x)``), e.g. ``"state['u'] is
        an array of shape (5,) and dtype <f8, expected shape (6,) and dtype
        <f8"``.  Objects no provider knows are compared by class."""
        return self.difference(type(self).of(x, opaque=True), path)

    def paths(self) -> list[str]:
        """The path of each leaf in the state, in leaf order (``state['u']``)."""
        found = leaf_paths(self.spec())
        return [found.get(i, f"#{i}") for i in range(len(self.infos))]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Structure):
            return NotImplemented
        return other is self or not self.difference(other)

    def __repr__(self) -> str:
        if self.array is not None:
            dtype, shape = self.array
            return f"{type(self).__name__}(array of shape {shape} and dtype {dtype.str})"
        return f"{type(self).__name__}({len(self.infos)} leaves, {self.nbytes} bytes)"


def _count(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def state_nbytes(state: Any) -> int:
    """The bytes of `state`'s leaves (what a store holds for it), from its
    structure: nothing is copied or brought to the host (see
    :meth:`Structure.of`)."""
    return Structure.of(state).nbytes


class Layout:
    """The :class:`Structure` of a state whose spec depends on its structure
    alone (numpy arrays in dicts with string keys, lists, tuples,
    dataclasses and named tuples: no scalars, no leaf or user providers),
    with the walks that re-flatten and rebuild states of that structure
    quickly.

    A time loop hands the store states of one structure over and over (the
    same dataclass of the same two arrays, every step).  Re-deriving the
    spec of each one costs tens of microseconds of Python, which on a small
    state is as much as copying it.  :meth:`leaves` checks a new state
    against the layout in one compiled walk (types, keys, lengths, and per
    leaf dtype, shape and C-contiguity) and returns exactly the leaves
    ``flatten`` would return, whose spec is then :meth:`spec`; :meth:`build`
    rebuilds a state of the layout from its leaves, as :func:`unflatten`
    would, with the spec's nodes read once.

    Built by :meth:`of` from a state.  **Attributes:** `structure` (the
    :class:`Structure`), and from it `tree`, `leaf_specs` (the parts of the
    spec shared by every state of the layout: read-only, never modify
    them), `infos` (per leaf ``(dtype, shape)``, the dtype objects of the
    state's own arrays, compared by identity first), `nbytes` and `array`
    (``(dtype, shape)`` when the state is one numpy array, else ``None``).
    """

    __slots__ = (
        "structure",
        "tree",
        "leaf_specs",
        "infos",
        "nbytes",
        "array",
        "_walk",
        "_n",
        "_build",
    )

    def __init__(
        self,
        structure: Structure,
        walk: Callable[[Any, list[np.ndarray]], bool],
        build_fn: Callable[[Sequence[Any]], Any],
    ) -> None:
        self.structure = structure
        self.tree = structure.tree
        self.leaf_specs = structure.leaf_specs
        self.infos = structure.infos
        self.nbytes = structure.nbytes
        self.array = structure.array
        self._walk = walk
        self._n = len(structure.infos)
        self._build = build_fn

    @classmethod
    def of(
        cls,
        state: Any,
        leaves: list[np.ndarray] | None = None,
        spec: dict[str, Any] | None = None,
    ) -> Layout | None:
        """The layout of `state` (optionally with its ``flatten`` result), or
        ``None`` if its spec depends on more than its structure, or if
        ``flatten`` copied one of its arrays (a non-contiguous one): no
        state of its structure would then be re-flattened."""
        if leaves is None or spec is None:
            leaves, spec = flatten(state)
        structure = Structure(
            spec["tree"], spec["leaves"], [(leaf.dtype, leaf.shape) for leaf in leaves]
        )
        walk = compile_check(spec["tree"], structure.leaf_infos(), collect=True)
        if walk is None:
            return None
        layout = cls(structure, walk, compile_build(spec["tree"]))
        again = layout.leaves(state)
        if again is None or any(a is not b for a, b in zip(again, leaves)):
            return None
        return layout

    def leaves(self, state: Any) -> list[np.ndarray] | None:
        """The leaves of `state` if it has this layout, else ``None``."""
        out: list[np.ndarray] = []
        if self._walk(state, out) and len(out) == self._n:
            return out
        return None

    def build(self, leaves: Sequence[Any]) -> Any:
        """The state of this layout around `leaves` (``unflatten(self.spec(),
        leaves)``, the leaves going into the state uncopied).

        Each leaf must be a numpy array of the dtype (byte order included)
        and shape of the layout's leaf; if one is not, :func:`unflatten`
        rebuilds it, raising its error.
        """
        if len(leaves) != self._n:
            return unflatten(self.spec(), leaves)
        for leaf, (dtype, shape) in zip(leaves, self.infos):
            if (
                type(leaf) is not np.ndarray
                or leaf.shape != shape
                or (
                    leaf.dtype is not dtype and (leaf.dtype != dtype or leaf.dtype.str != dtype.str)
                )
            ):
                return unflatten(self.spec(), leaves)
        return self._build(leaves)

    def spec(self) -> dict:
        """A spec of this layout (a new top-level dict; its parts are shared)."""
        return {"format": SPEC_FORMAT, "tree": self.tree, "leaves": self.leaf_specs}


# -- content hashing --------------------------------------------------------------

# Hash in slices: xxhash holds the GIL while it hashes, so slicing bounds the
# time other threads (the engine's workers, the solver) wait for it.
_SLICE = 8 << 20


def byte_view(arr: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array as a flat ``uint8`` memoryview (any dtype)."""
    return arr.reshape(-1).view(np.uint8).data


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
