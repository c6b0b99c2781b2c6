"""JAX arrays and pytrees as vlcc states: the JAX leaf provider.

:func:`register_provider` teaches :mod:`vlcc_adjoint.state` JAX's types,
the way :func:`vlcc_adjoint.torch.register_providers` teaches it torch's:

``jax.Array``
    One numpy leaf, ``np.asarray(x)`` (a zero-copy, read-only host view on
    the CPU backend), tagged ``{"jax": true}`` in the spec and rebuilt with
    ``jnp.asarray`` on the default device, and described (dtype and shape
    for structure checks and byte counts) from its metadata, without a
    transfer.  Typed PRNG keys have no numpy
    dtype: their key data is stored, tagged ``{"jax": "key", "impl":
    name}``, and rebuilt with ``jax.random.wrap_key_data``.  These tags are
    the on-disk format of every checkpoint written so far.

    A JAX array is immutable and the host view keeps its buffer alive, so
    the provider declares its leaves ``immutable``: a ``TieredStore`` keeps
    them by reference instead of copying them at ``save``.  They are also
    ``rebuilt``: a restore into an existing state (``load(out=)``) makes new
    arrays for them rather than writing into the old ones.

Dataclass pytrees (equinox modules, flax structs)
    Flattened field by field like any dataclass, and rebuilt the way JAX's
    own unflatten rebuilds them: fields set on a bare instance, since their
    ``__init__`` usually takes other arguments
    (``eqx.nn.Linear(in_features, out_features, key=...)``).

A user need not import :mod:`vlcc_adjoint.jax`: ``vlcc_adjoint/__init__.py``
registers a lazy hook (:func:`vlcc_adjoint.state.register_lazy_provider`)
that runs :func:`register_provider` the first time a state is flattened or
unflattened after JAX was imported, or a spec holds a ``"jax"`` tag.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import state as _vstate
from ..errors import VlccValueError

__all__ = ["host_aval", "is_key", "leaf_nbytes", "register_provider"]

TAG = "jax"


def _claims(cls: type) -> bool:
    return isinstance(cls, type) and issubclass(cls, jax.Array)


def _to_numpy(x) -> tuple[np.ndarray, dict]:
    if is_key(x):
        return np.asarray(jax.random.key_data(x)), {TAG: "key", "impl": str(jax.random.key_impl(x))}
    return np.asarray(x), {TAG: True}


@functools.lru_cache(maxsize=256)
def _key_data_aval(shape: tuple[int, ...], dtype: Any) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape of ``key_data`` of keys of `shape` and key `dtype`
    (traced abstractly: no key is read)."""
    out = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(shape, dtype))
    return np.dtype(out.dtype), tuple(out.shape)


def is_key(x) -> bool:
    """Whether the array, tracer or abstract value `x` holds typed PRNG keys
    (no numpy dtype: stored and sent to the host as their ``key_data``)."""
    return bool(jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key))


def host_aval(x) -> jax.ShapeDtypeStruct:
    """The shape and dtype of `x` (an array, tracer or abstract value) as
    the host holds it: itself, or for PRNG keys their ``key_data``."""
    if is_key(x):
        dtype, shape = _key_data_aval(tuple(x.shape), x.dtype)
        return jax.ShapeDtypeStruct(shape, dtype)
    return jax.ShapeDtypeStruct(tuple(x.shape), np.dtype(x.dtype))


def leaf_nbytes(x) -> int:
    """The bytes of `x` (an array, tracer or abstract value) as the host
    holds it (:func:`host_aval`), from its metadata: nothing is computed."""
    aval = host_aval(x)
    return int(np.prod(aval.shape)) * np.dtype(aval.dtype).itemsize


def _describe(x) -> tuple[np.dtype, tuple[int, ...], dict]:
    """What :func:`_to_numpy` returns of `x`, from its metadata alone: no
    transfer from the device (the structure checks and byte counts of
    :class:`vlcc_adjoint.state.Structure` ask this)."""
    aval = host_aval(x)
    fields = {TAG: "key", "impl": str(jax.random.key_impl(x))} if is_key(x) else {TAG: True}
    return np.dtype(aval.dtype), tuple(aval.shape), fields


def _from_numpy(leaf: np.ndarray, node: dict):
    tag = node.get(TAG)
    if tag == "key":
        impl = node.get("impl")
        if not isinstance(impl, str):
            raise VlccValueError("PRNG key without its implementation name in state spec")
        return jax.random.wrap_key_data(jnp.asarray(leaf), impl=impl)
    if tag is True:
        return jnp.asarray(leaf)
    raise VlccValueError(f"malformed JAX leaf tag {tag!r} in state spec")


_NODE_CACHE: dict[type, bool] = {}


def _tree_node(cls: type) -> bool:
    """Whether JAX has the dataclass `cls` registered as a pytree node."""
    known = _NODE_CACHE.get(cls)
    if known is None:
        registry = getattr(getattr(jax, "_src", None), "tree_util", None)
        registry = getattr(registry, "_registry", None)
        known = registry is not None and cls in registry
        if not known:
            # Types registered from C++ or with keys (equinox) live in the
            # default registry only; ask it with a bare instance.
            default_registry = getattr(jax.tree_util, "default_registry", None)
            if default_registry is not None:
                try:
                    known = default_registry.flatten_one_level(object.__new__(cls)) is not None
                except Exception:
                    known = False
        _NODE_CACHE[cls] = bool(known)
    return _NODE_CACHE[cls]


PROVIDER = _vstate.LeafProvider(
    tag=TAG,
    claims=_claims,
    to_numpy=_to_numpy,
    from_numpy=_from_numpy,
    immutable=True,
    rebuilt=True,
    tree_node=_tree_node,
    describe=_describe,
)


def register_provider() -> None:
    """Teach :mod:`vlcc_adjoint.state` JAX arrays and dataclass pytrees
    (idempotent; see the module docstring)."""
    _vstate.register_leaf_provider(PROVIDER)
