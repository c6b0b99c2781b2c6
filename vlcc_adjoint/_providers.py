"""The state providers' registries: container types, leaf types, lazy hooks.

Three registries teach :func:`vlcc_adjoint.state.flatten` what a state may
hold, and nothing here names any particular library:

* **Container providers** (:func:`register`): a type's children and a JSON
  ``aux``; dataclasses and named tuples register themselves the first time
  they are flattened.
* **Leaf providers** (:func:`register_leaf_provider`): array types of other
  libraries (an accelerator framework's arrays) that become numpy leaves.  A
  :class:`LeafProvider` converts to and from numpy, marks its leaves in the
  spec with its ``tag`` (the node ``{"leaf": i, tag: value, ...}``), and
  declares two facts the store relies on: whether the host arrays it
  returns can never change (``immutable``: the store may keep them by
  reference instead of copying), and whether its objects are rebuilt on a
  restore rather than written in place (``rebuilt``: immutable arrays).
  It may also say which dataclasses its library flattens as tree nodes
  whose ``__init__`` cannot rebuild them (``tree_node``), and describe an
  array without bringing it to the host (``describe``: dtype, shape and
  spec fields, which is all that structure checks and byte counts need).
* **Lazy hooks** (:func:`register_lazy_provider`): a loader that registers a
  library's providers, run the first time it is needed and not before: when
  ``flatten`` or ``unflatten`` runs after the library was imported, when a
  spec holds one of its tags, or when a leaf's type comes from its package.
  The package's ``__init__`` registers the hook for the integrations it
  ships, so a state holding that library's arrays works without importing
  the integration first, and ``import vlcc_adjoint`` imports no optional
  dependency.  This is the pattern of ``importlib``'s lazy loading and of
  pytest's entry-point plugins: the registry knows a module *name* and a
  loader, never the module.

The interface the rest of the package reads: :data:`CONTAINERS` (a
:class:`Registry` of :class:`ContainerProvider`, looked up by type or by
the name a spec records), :func:`automatic_provider` (the dataclass and
named-tuple providers, registered on first use), :func:`leaf_provider_of`,
:func:`leaf_provider_of_node`, :func:`describe_leaf`, :func:`tree_node_owner`,
:func:`activate_imported`, :data:`SPEC_FORMAT` and :data:`RESERVED_KEYS`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .errors import VlccError, VlccTypeError, VlccValueError

__all__ = [
    "CONTAINERS",
    "RESERVED_KEYS",
    "SPEC_FORMAT",
    "ContainerProvider",
    "LeafProvider",
    "Registry",
    "UnknownStateTypeError",
    "activate_imported",
    "automatic_provider",
    "describe_leaf",
    "is_registered",
    "leaf_provider_of",
    "leaf_provider_of_node",
    "register",
    "register_lazy_provider",
    "register_leaf_provider",
    "tree_node_owner",
]

#: The ``format`` of the specs :func:`vlcc_adjoint.state.flatten` writes.
SPEC_FORMAT = "vlcc-state/1"


class UnknownStateTypeError(VlccError, TypeError):
    """A state (or spec) holds a type no provider knows."""


# -- container providers --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ContainerProvider:
    """How a container type splits into children and a JSON ``aux``, and back.

    **Attributes:**

    - `name`: the name a spec records (``{"type": name, ...}``).
    - `cls`: the exact type it flattens.
    - `flatten(obj) -> (children, aux)` and `unflatten(aux, children) -> obj`:
      as given to :func:`register`.
    - `kind`: ``"user"`` (functions given to :func:`register`: `aux` is
      normalised through JSON, see :meth:`split`), ``"dataclass"`` or
      ``"namedtuple"`` (the automatic providers: the children depend on the
      class alone, and `fields` names them for a dataclass).
    - `fields`: a dataclass provider's field names, in order; ``()``
      otherwise.
    """

    name: str
    cls: type
    flatten: Callable[[Any], tuple[Sequence, Any]]
    unflatten: Callable[[Any, list], Any]
    kind: str = "user"
    fields: tuple[str, ...] = ()

    @property
    def user(self) -> bool:
        """Whether `aux` comes from user code (and is normalised through JSON)."""
        return self.kind == "user"

    def split(self, obj: Any) -> tuple[Sequence, Any]:
        """``(children, aux)`` of `obj` as a spec records them: a user
        provider's `aux` read back through strict JSON (tuples become lists),
        so that it equals what a spec read from disk holds.

        Raises ``TypeError`` naming the remedy if that `aux` is not JSON.
        """
        children, aux = self.flatten(obj)
        if self.kind == "user":
            try:
                aux = json.loads(json.dumps(aux, allow_nan=False))
            except (TypeError, ValueError) as err:
                raise VlccTypeError(
                    f"the aux data of {self.name} is not JSON-serialisable ({err}); return "
                    "only dicts, lists, strings, numbers, bools and None as aux from its "
                    "flatten_fn"
                ) from None
        return children, aux


class Registry:
    """The container providers, by exact type and by the name specs record.

    **Attributes:** `by_type` (``{type: ContainerProvider}``) and `by_name`
    (``{name: ContainerProvider}``): read them freely (a lookup is one dict
    access, which the compiled structure checks rely on), change them only
    through :meth:`add` (that is, :func:`register`).  Registering a name
    again replaces the earlier provider, in both tables.
    """

    def __init__(self) -> None:
        self.by_type: dict[type, ContainerProvider] = {}
        self.by_name: dict[str, ContainerProvider] = {}

    def add(self, provider: ContainerProvider) -> ContainerProvider:
        """Register `provider` for its type and its name; returns it."""
        self.by_type[provider.cls] = provider
        self.by_name[provider.name] = provider
        return provider


#: The registry of container providers (see :class:`Registry`).
CONTAINERS = Registry()


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def register(
    cls: type,
    flatten_fn: Callable | None = None,
    unflatten_fn: Callable | None = None,
    name: str | None = None,
) -> None:
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
        raise VlccTypeError(f"register expects a class, got {cls!r}")
    if flatten_fn is None and unflatten_fn is None:
        if automatic_provider(cls, name) is None:
            raise VlccTypeError(
                f"{cls.__qualname__} is neither a dataclass nor a named tuple; pass "
                "flatten_fn(obj) -> (children, aux) and unflatten_fn(aux, children) -> obj"
            )
        return
    if not (callable(flatten_fn) and callable(unflatten_fn)):
        raise VlccTypeError(
            "register needs both flatten_fn and unflatten_fn (or neither, "
            "for dataclasses and named tuples)"
        )
    CONTAINERS.add(ContainerProvider(name or _type_name(cls), cls, flatten_fn, unflatten_fn))


def is_registered(cls: type) -> bool:
    """Whether a provider for exactly `cls` is registered (by :func:`register`,
    or by flattening a dataclass or named tuple of that type)."""
    return cls in CONTAINERS.by_type


def automatic_provider(cls: type, name: str | None = None) -> ContainerProvider | None:
    """Register the automatic provider of the dataclass or named tuple type
    `cls` (under `name`, default ``"module:qualname"``) and return it;
    ``None`` (nothing registered) for any other type.

    A dataclass's children are its fields, read by name; a named tuple's
    its items.  Both depend on the class alone, never on the values.
    """
    if dataclasses.is_dataclass(cls):
        return _register_dataclass(cls, name)
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return _register_namedtuple(cls, name)
    return None


def _register_dataclass(cls: type, name: str | None = None) -> ContainerProvider:
    unflatten_fn: Callable[[Any, list], Any]
    if tree_node_owner(cls) is not None:
        # A dataclass another library flattens as a tree node (a neural
        # network module): rebuild it the way that library's own unflatten
        # does, by setting every field on a bare instance.  Its __init__
        # usually takes other arguments (layer sizes, a random key).
        names = [f.name for f in dataclasses.fields(cls)]

        def unflatten_fn(aux, children):
            _check_fields(cls, aux, children, names)
            obj = object.__new__(cls)
            for field, value in zip(aux, children):
                object.__setattr__(obj, field, value)
            return obj
    else:
        # A plain dataclass: call the constructor with the init fields (so
        # __post_init__ re-derives what it derives).  Fields added to the
        # class since the checkpoint was written take their defaults.
        names = [f.name for f in dataclasses.fields(cls) if f.init]

        def unflatten_fn(aux, children):
            _check_fields(cls, aux, children, names)
            return cls(**dict(zip(aux, children)))

    def flatten_fn(obj):
        return [getattr(obj, n) for n in names], list(names)  # the spec gets its own list

    return CONTAINERS.add(
        ContainerProvider(
            name or _type_name(cls), cls, flatten_fn, unflatten_fn, "dataclass", tuple(names)
        )
    )


def _check_fields(cls: type, aux, children, names: list[str]) -> None:
    """The spec's field names must be fields of the class (nothing else is set)."""
    if not (
        isinstance(aux, list) and len(aux) == len(children) and all(type(a) is str for a in aux)
    ):
        raise VlccValueError(f"malformed field list {aux!r} for {cls.__qualname__} in state spec")
    unknown = set(aux) - set(names)
    if unknown:
        raise VlccValueError(
            f"the checkpoint has fields {sorted(unknown)} that {cls.__qualname__} does not have "
            "(the class changed since it was written?); restore with the matching class version"
        )


def _register_namedtuple(cls: type, name: str | None = None) -> ContainerProvider:
    return CONTAINERS.add(
        ContainerProvider(
            name or _type_name(cls),
            cls,
            lambda obj: (list(obj), None),
            lambda aux, children: cls(*children),
            "namedtuple",
        )
    )


# -- leaf providers -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LeafProvider:
    """How the arrays of another library become numpy leaves, and come back.

    **Attributes:**

    - `tag`: the key that marks this provider's leaves in a spec (a leaf
      node is ``{"leaf": i, tag: value, ...}``); stable, it is on disk.
    - `claims(cls) -> bool`: whether objects of type `cls` are its arrays.
    - `to_numpy(obj) -> (array, fields)`: the object's data as a numpy
      array (a zero-copy host view where the library allows) and the JSON
      fields its leaf node carries, ``fields[tag]`` included (e.g. which
      kind of array it was).
    - `from_numpy(array, node) -> obj`: the inverse, from the leaf and its
      spec node.
    - `immutable`: the host arrays `to_numpy` returns can never change (the
      library's arrays are immutable, and the view keeps their buffer
      alive), so a store may keep them by reference instead of copying.
      Declare it only when it holds: a leaf kept by reference and changed
      later would be checkpointed changed.
    - `rebuilt`: its objects are rebuilt by `from_numpy` on a restore into
      an existing state (``TieredStore.load(out=)``) instead of being
      written in place.
    - `tree_node(cls) -> bool`: optional; whether the library flattens the
      dataclass `cls` as a tree node whose ``__init__`` cannot rebuild it
      (it is then rebuilt field by field on a bare instance).
    - `describe(obj) -> (dtype, shape, fields)`: optional; what `to_numpy`
      would return, without the data: the numpy dtype and the shape of the
      array and the same `fields`, read from the object's metadata (no
      copy, no transfer from an accelerator).  Structure checks and byte
      counts (:class:`vlcc_adjoint.state.Structure`) ask it; without it
      they call `to_numpy` and read the array's dtype and shape.
    """

    tag: str
    claims: Callable[[type], bool]
    to_numpy: Callable[[Any], tuple[np.ndarray, dict]]
    from_numpy: Callable[[np.ndarray, dict], Any]
    immutable: bool = False
    rebuilt: bool = True
    tree_node: Callable[[type], bool] | None = None
    describe: Callable[[Any], tuple[np.dtype, tuple[int, ...], dict]] | None = None


def describe_leaf(provider: LeafProvider, obj: Any) -> tuple[np.dtype, tuple[int, ...], dict]:
    """``(dtype, shape, fields)`` of the leaf `provider` makes of `obj`:
    its :attr:`~LeafProvider.describe` when it has one, else read from
    ``to_numpy(obj)`` (which may copy the data to the host).

    Raises ``TypeError`` naming the provider when the answer is malformed.
    """
    if provider.describe is not None:
        dtype, shape, fields = provider.describe(obj)
        dtype, shape = np.dtype(dtype), tuple(int(n) for n in shape)
    else:
        arr, fields = provider.to_numpy(obj)
        if type(arr) is not np.ndarray:
            raise VlccTypeError(
                f"the {provider.tag!r} leaf provider's to_numpy must return a numpy array, "
                f"got {type(arr).__name__}"
            )
        dtype, shape = arr.dtype, arr.shape
    if not isinstance(fields, dict) or provider.tag not in fields:
        raise VlccTypeError(
            f"the {provider.tag!r} leaf provider must describe its leaves with fields holding "
            f"{provider.tag!r}, got {fields!r}"
        )
    return dtype, shape, fields


_LEAF_PROVIDERS: dict[str, LeafProvider] = {}  # tag -> provider
_LEAF_OF_TYPE: dict[type, LeafProvider | None] = {}  # cache of claims(), per type
_NODE_OWNER: dict[type, LeafProvider | None] = {}  # cache of tree_node(), per type
#: The keys of spec nodes (and ``"opaque"``, the node of an object no
#: provider knows in a structure made with ``opaque=True``): no leaf
#: provider may use one as its tag.
RESERVED_KEYS = frozenset(
    {
        "opaque",
        "leaf",
        "value",
        "dict",
        "items",
        "mapping",
        "list",
        "tuple",
        "type",
        "aux",
        "float",
        "complex",
        "bytes",
        "npscalar",
        "hex",
    }
)


def register_leaf_provider(provider: LeafProvider) -> None:
    """Register (or replace) the leaf provider of ``provider.tag``.

    **Arguments:**

    - `provider`: a :class:`LeafProvider`.  Its tag must not be a key the
      spec format uses itself (``"leaf"``, ``"dict"``, ...).
    """
    if not isinstance(provider, LeafProvider):
        raise VlccTypeError(f"register_leaf_provider expects a LeafProvider, got {provider!r}")
    if not isinstance(provider.tag, str) or not provider.tag or provider.tag in RESERVED_KEYS:
        raise VlccValueError(
            f"invalid leaf provider tag {provider.tag!r}: use a name that is not "
            f"one of the spec's own keys {sorted(RESERVED_KEYS)}"
        )
    _LEAF_PROVIDERS[provider.tag] = provider
    _LEAF_OF_TYPE.clear()
    _NODE_OWNER.clear()


def leaf_provider_of(cls: type) -> LeafProvider | None:
    """The leaf provider whose arrays objects of type `cls` are, if any."""
    try:
        return _LEAF_OF_TYPE[cls]
    except KeyError:
        pass
    _activate_for_type(cls)
    found = None
    for provider in list(_LEAF_PROVIDERS.values()):
        if provider.claims(cls):
            found = provider
            break
    _LEAF_OF_TYPE[cls] = found
    return found


def leaf_provider_of_node(node: dict) -> LeafProvider:
    """The leaf provider of a tagged leaf node (loading a lazy one if needed)."""
    for key in node:
        if key == "leaf":
            continue
        provider = _LEAF_PROVIDERS.get(key)
        if provider is None and _activate_for_tag(key):
            provider = _LEAF_PROVIDERS.get(key)
        if provider is not None:
            return provider
    raise UnknownStateTypeError(
        f"the checkpoint holds a leaf tagged {sorted(set(node) - {'leaf'})}, which no leaf "
        "provider of this process reads; import the integration that wrote it (or register "
        "its provider with vlcc_adjoint.state.register_leaf_provider) before loading"
    )


def tree_node_owner(cls: type) -> LeafProvider | None:
    """The leaf provider whose library flattens the dataclass `cls` as a tree
    node that its ``__init__`` cannot rebuild (see :class:`LeafProvider`)."""
    try:
        return _NODE_OWNER[cls]
    except KeyError:
        pass
    activate_imported()
    found = None
    for provider in list(_LEAF_PROVIDERS.values()):
        if provider.tree_node is not None and provider.tree_node(cls):
            found = provider
            break
    _NODE_OWNER[cls] = found
    return found


# -- lazy hooks -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Lazy:
    module: str  # the top-level package whose import makes the hook due
    tags: frozenset[str]  # spec tags its providers read
    load: str  # "package.module:function"


_PENDING: dict[str, _Lazy] = {}  # module -> hook, until it has run
_LAZY_LOCK = threading.RLock()


def register_lazy_provider(module: str, tags: Sequence[str], load: str) -> None:
    """Register a loader of a library's providers, run only when needed.

    **Arguments:**

    - `module`: the library's top-level package name.  The loader runs the
      first time a state is flattened or unflattened after that package
      was imported, or a leaf's type comes from it.
    - `tags`: the leaf tags its providers write (a spec holding one of them
      runs the loader, which then imports the library).
    - `load`: ``"package.module:function"``, a function of no arguments
      that registers the providers (with :func:`register_leaf_provider` and
      :func:`register`).  Imported only when it runs.
    """
    if not (isinstance(load, str) and load.count(":") == 1):
        raise VlccValueError(f"load must be 'package.module:function', got {load!r}")
    with _LAZY_LOCK:
        _PENDING[module] = _Lazy(module, frozenset(tags), load)


def _run(hook: _Lazy) -> None:
    with _LAZY_LOCK:
        if _PENDING.get(hook.module) is not hook:
            return  # ran meanwhile
        del _PENDING[hook.module]
        try:
            modname, fn = hook.load.split(":")
            getattr(importlib.import_module(modname), fn)()
        except BaseException:
            _PENDING[hook.module] = hook  # not registered: try again next time
            raise


def activate_imported() -> None:
    """Run the pending hooks whose library has been imported (cheap when
    none is pending or none of their libraries is imported)."""
    if _PENDING:
        for hook in [h for m, h in list(_PENDING.items()) if m in sys.modules]:
            _run(hook)


def _activate_for_type(cls: type) -> None:
    root = getattr(cls, "__module__", "").partition(".")[0]
    hook = _PENDING.get(root)
    if hook is not None:
        _run(hook)
    activate_imported()


def _activate_for_tag(tag: str) -> bool:
    for hook in list(_PENDING.values()):
        if tag in hook.tags:
            _run(hook)
            return True
    return False
