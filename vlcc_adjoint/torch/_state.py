"""Torch tensors and training states as vlcc states: numpy leaves + JSON, never pickle.

:func:`register_providers` (run when :mod:`vlcc_adjoint.torch` is imported)
teaches :mod:`vlcc_adjoint.state` the types a ``state_dict`` of a module or
an optimizer holds, so a ``TieredStore``, a ``ZarrTier`` or a
``lineage.History`` stores them like any other state::

    from vlcc_adjoint.lineage import History
    import vlcc_adjoint.torch as vt

    with History("run.vlcc") as h:
        h.commit(vt.training_state(model, optimizer), meta={"step": step})
        vt.restore_training_state(h.checkout(), model, optimizer)

Types and how they are stored
-----------------------------

``torch.Tensor`` / ``torch.nn.Parameter``
    One numpy leaf, bit-exact, through the *leaf provider* :data:`PROVIDER`
    (tag ``"torch"``).  Dtypes numpy has (``float64/32/16``, ``int8..64``,
    ``uint8..64``, ``bool``, ``complex64/128``) are stored as themselves
    (zero-copy ``Tensor.numpy()`` on CPU).  Dtypes numpy lacks
    (``bfloat16``, the ``float8`` family, ``complex32``) are stored as the
    signed integer of the same width, through ``Tensor.view(int16)`` and
    friends, with the real dtype in the leaf's spec node: a bit-for-bit copy
    that any zarr reader can open, and that :func:`numpy_to_tensor` views
    back.  The node is ``{"leaf": i, "torch": dtype name, "device": ...}``
    plus ``"parameter": true`` for a ``Parameter`` and
    ``"requires_grad": true`` when it is set.  The device is
    informational: tensors are rebuilt on the CPU (``load_state_dict``
    copies them where the parameters live, as
    ``torch.load(map_location="cpu")`` would).

    The provider *describes* a tensor from its metadata (dtype, shape, the
    node's fields) without bringing it to the host, so structure checks and
    byte counts (:class:`vlcc_adjoint.state.Structure`,
    :func:`vlcc_adjoint.state.state_nbytes`) of a state of CUDA tensors copy
    nothing.  A tensor is mutable and may live on a device, so its leaves
    are neither ``immutable`` (a store copies them at ``save``) nor written
    in place by a restore (``rebuilt``: ``load(out=)`` makes new tensors).

    Checkpoints written before tensors were leaves hold them as registered
    types, ``{"type": "torch.Tensor", "aux": {"dtype", "device",
    "requires_grad"}, "items": [leaf]}`` (and ``"torch.nn.Parameter"``):
    those names stay registered for reading (:func:`register_providers`).
``collections.OrderedDict``
    Its keys and values, and the ``_metadata`` attribute that
    ``Module.state_dict()`` attaches (per-submodule versions that
    ``load_state_dict`` hooks read) when it is JSON.
``torch.Size``, ``torch.dtype``, ``torch.device``
    Inline in the spec (names from an allow-list).

Refused, with a ``TypeError`` naming the path and the remedy: sparse,
quantized, nested, meta and other non-strided tensors, and tensor
subclasses (DTensor, FakeTensor, ...; they are not registered, so
:mod:`vlcc_adjoint.state` reports them as unknown types).  Tensors that
share storage (tied weights) are stored once each; restoring them through
``load_state_dict`` keeps the model's own tying.

Reading never executes anything: a spec names a type only by a registered
string, a dtype only from the allow-list below, and leaves are raw bytes
checked against their dtype and shape.  ``torch.load`` (pickle) is never
called.
"""

from __future__ import annotations

import collections
import json
import re
from typing import Any

import numpy as np
import torch

from .. import state as _vstate
from ..errors import VlccTypeError, VlccValueError
from ._deepspeed_state import register_deepspeed_providers

__all__ = [
    "DTYPES",
    "PROVIDER",
    "TAG",
    "dtype_name",
    "numpy_to_tensor",
    "register_providers",
    "restore_training_state",
    "storage_dtype",
    "tensor_to_numpy",
    "training_state",
]

# The allow-list of dtypes a spec may name: torch's own names, nothing else.
_DTYPE_NAMES = [
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "complex128",
    "complex64",
    "complex32",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint64",
    "uint32",
    "uint16",
    "uint8",
    "bool",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
]
#: The torch dtypes a checkpoint may name, by name (an allow-list: a name
#: read from a file is looked up here, never evaluated).
DTYPES: dict[str, torch.dtype] = {n: getattr(torch, n) for n in _DTYPE_NAMES if hasattr(torch, n)}
_NAME_OF = {d: n for n, d in DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str | None:
    """The allow-listed name of `dtype` (``"bfloat16"``), or ``None`` when a
    checkpoint cannot hold tensors of it."""
    return _NAME_OF.get(dtype)


# Dtypes that Tensor.numpy() converts as themselves; the others travel as
# the signed integer of their width (a bit-exact view, both ways).
_NUMPY_OF = {
    torch.float64: np.float64,
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.complex128: np.complex128,
    torch.complex64: np.complex64,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint64: np.uint64,
    torch.uint32: np.uint32,
    torch.uint16: np.uint16,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
}
_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NP_INT_OF_SIZE = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}

_DEVICE = re.compile(r"[a-z_]{1,16}(:[0-9]{1,4})?")


def storage_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype a tensor of `dtype` is stored as: itself where numpy has
    it, else the signed integer of its width (``bfloat16`` -> ``int16``)."""
    if dtype in _NUMPY_OF:
        return np.dtype(_NUMPY_OF[dtype])
    return np.dtype(_NP_INT_OF_SIZE[dtype.itemsize])


def _check_plain(t: torch.Tensor) -> None:
    if t.layout != torch.strided:
        raise VlccTypeError(
            f"a {t.layout} tensor cannot be checkpointed as is; convert it with "
            ".to_dense() (or store its indices and values as two tensors)"
        )
    if t.is_quantized:
        raise VlccTypeError(
            "a quantized tensor cannot be checkpointed as is; store "
            "t.dequantize() or t.int_repr() with its scale and zero point"
        )
    if t.is_nested:
        raise VlccTypeError("a nested tensor cannot be checkpointed; store t.unbind() as a list")
    if t.device.type == "meta":
        raise VlccTypeError(
            "a tensor on the meta device has no data to checkpoint; materialise it "
            "first (e.g. module.to_empty(device='cpu') and initialise it)"
        )
    if t.dtype not in _NAME_OF:
        raise VlccTypeError(f"tensors of dtype {t.dtype} are not supported; convert with .to(...)")


def tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    """The bytes of `t` as a numpy array (on the CPU), bit-exact.

    A zero-copy view for a CPU tensor of a dtype numpy has; a host copy for
    other devices; dtypes numpy lacks (``bfloat16``, ``float8``) come back
    as the signed integer of their width (``Tensor.view(torch.int16)``).
    """
    _check_plain(t)
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.dtype not in _NUMPY_OF:
        t = t.view(_INT_OF_SIZE[t.dtype.itemsize])
    return t.numpy()


def numpy_to_tensor(arr: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of :func:`tensor_to_numpy`: a CPU tensor of `dtype` over `arr`'s
    bytes (zero-copy when `arr` is writeable, aligned and native-endian)."""
    want = storage_dtype(dtype)
    if not isinstance(arr, np.ndarray) or arr.dtype.newbyteorder("=") != want.newbyteorder("="):
        got = getattr(arr, "dtype", type(arr).__name__)
        raise VlccValueError(f"a {dtype} tensor is stored as {want}, the checkpoint holds {got}")
    if not (arr.flags.writeable and arr.flags.aligned and arr.dtype.isnative):
        arr = np.array(arr, dtype=want.newbyteorder("="), copy=True)
    t = torch.from_numpy(arr)
    return t if dtype in _NUMPY_OF else t.view(dtype)


# -- providers --------------------------------------------------------------------------


#: The tag of torch's leaves in a spec (``{"leaf": i, "torch": "float32", ...}``).
TAG = "torch"


def _claims(cls: type) -> bool:
    # Exactly these two: tensor subclasses (DTensor, FakeTensor, ...) carry
    # more than their data and are refused as unknown types.
    return cls is torch.Tensor or cls is torch.nn.Parameter


def _fields(t: torch.Tensor) -> dict:
    """The spec node's fields of the tensor `t` (its dtype by name first)."""
    _check_plain(t)
    fields: dict[str, Any] = {TAG: _NAME_OF[t.dtype], "device": str(t.device)}
    if type(t) is torch.nn.Parameter:
        fields["parameter"] = True
    if t.requires_grad:
        fields["requires_grad"] = True
    return fields


def _describe(t: torch.Tensor) -> tuple[np.dtype, tuple[int, ...], dict]:
    """``(stored dtype, shape, fields)`` from `t`'s metadata: no copy, no transfer."""
    fields = _fields(t)
    return storage_dtype(t.dtype), tuple(t.shape), fields


def _to_numpy(t: torch.Tensor) -> tuple[np.ndarray, dict]:
    return tensor_to_numpy(t), _fields(t)


def _from_numpy(arr: np.ndarray, node: dict) -> torch.Tensor:
    name = node.get(TAG)
    dtype = DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise VlccValueError(f"unknown torch dtype {name!r:.40} in checkpoint metadata")
    t = numpy_to_tensor(arr, dtype)
    grad = node.get("requires_grad") is True and (t.is_floating_point() or t.is_complex())
    if node.get("parameter") is True:
        return torch.nn.Parameter(t, requires_grad=grad)
    if grad:
        t.requires_grad_(True)
    return t


#: The leaf provider of ``torch.Tensor`` and ``torch.nn.Parameter``.
PROVIDER = _vstate.LeafProvider(
    tag=TAG,
    claims=_claims,
    to_numpy=_to_numpy,
    from_numpy=_from_numpy,
    immutable=False,
    rebuilt=True,
    describe=_describe,
)


# -- the container form of checkpoints written before tensors were leaves --------------


class _TensorBefore:
    """The type the old ``"torch.Tensor"`` name is registered for: never
    instantiated, so no tensor is flattened as a container again."""


class _ParameterBefore:
    """The same for ``"torch.nn.Parameter"``."""


def _rebuild_tensor(aux, children) -> torch.Tensor:
    if not (isinstance(aux, dict) and isinstance(aux.get("dtype"), str) and len(children) == 1):
        raise VlccValueError(f"malformed torch tensor entry {aux!r:.80} in checkpoint metadata")
    dtype = DTYPES.get(aux["dtype"])
    if dtype is None:
        raise VlccValueError(f"unknown torch dtype {aux['dtype']!r:.40} in checkpoint metadata")
    t = numpy_to_tensor(children[0], dtype)
    if aux.get("requires_grad") is True and (t.is_floating_point() or t.is_complex()):
        t.requires_grad_(True)
    return t


def _unflatten_tensor(aux, children):
    return _rebuild_tensor(aux, children)


def _unflatten_parameter(aux, children):
    t = _rebuild_tensor(aux, children)
    return torch.nn.Parameter(t.detach(), requires_grad=bool(aux.get("requires_grad", False)))


def _refuse(obj):  # pragma: no cover - the placeholder types are never instantiated
    raise VlccTypeError("torch tensors are leaves of the 'torch' provider, not containers")


def _flatten_ordered_dict(d):
    aux = {}
    meta = getattr(d, "_metadata", None)
    if meta is not None:
        try:
            aux["metadata"] = json.loads(json.dumps(meta))
        except (TypeError, ValueError):
            pass  # not JSON: dropped, as load_state_dict tolerates
    return [dict(d)], aux


def _unflatten_ordered_dict(aux, children):
    if not (isinstance(aux, dict) and len(children) == 1 and isinstance(children[0], dict)):
        raise VlccValueError("malformed OrderedDict entry in checkpoint metadata")
    out = collections.OrderedDict(children[0])
    meta = aux.get("metadata")
    if isinstance(meta, dict):
        out._metadata = collections.OrderedDict(meta)
    return out


def _unflatten_size(aux, children):
    if not (isinstance(aux, list) and all(type(s) is int and s >= 0 for s in aux)) or children:
        raise VlccValueError(f"malformed torch.Size {aux!r:.80} in checkpoint metadata")
    return torch.Size(aux)


def _unflatten_dtype(aux, children):
    if not isinstance(aux, str) or aux not in DTYPES or children:
        raise VlccValueError(f"unknown torch dtype {aux!r:.40} in checkpoint metadata")
    return DTYPES[aux]


def _flatten_device(dev):
    return [], str(dev)


def _unflatten_device(aux, children):
    if not isinstance(aux, str) or _DEVICE.fullmatch(aux) is None or children:
        raise VlccValueError(f"malformed torch.device {aux!r:.40} in checkpoint metadata")
    return torch.device(aux)


_REGISTERED = False


def register_providers() -> None:
    """Teach :mod:`vlcc_adjoint.state` the torch types (idempotent).

    Registers the leaf provider of ``torch.Tensor`` and
    ``torch.nn.Parameter`` (:data:`PROVIDER`, tag ``"torch"``), the
    container types ``torch.Size``, ``torch.dtype``, ``torch.device`` and
    ``collections.OrderedDict`` (which ``Module.state_dict()`` returns)
    under stable names (``"torch.Size"``, ...), the names older checkpoints
    gave tensors (``"torch.Tensor"``, ``"torch.nn.Parameter"``, read only), and the DeepSpeed checkpoint objects (loss scalers,
    ``fragment_address``, ``ZeroStageEnum``) when DeepSpeed is imported
    (:mod:`vlcc_adjoint.torch._deepspeed_state`).  Called when :mod:`vlcc_adjoint.torch` is imported; a process
    that *loads* torch checkpoints imports it first.
    """
    global _REGISTERED
    register_deepspeed_providers()  # the DeepSpeed classes already imported (cheap, idempotent)
    if _REGISTERED:
        return
    _vstate.register_leaf_provider(PROVIDER)
    reg = _vstate.register
    # The names checkpoints written before tensors were leaves use: read only.
    reg(_TensorBefore, _refuse, _unflatten_tensor, name="torch.Tensor")
    reg(_ParameterBefore, _refuse, _unflatten_parameter, name="torch.nn.Parameter")
    reg(torch.Size, lambda s: ([], list(s)), _unflatten_size, name="torch.Size")
    reg(torch.dtype, lambda d: ([], _NAME_OF[d]), _unflatten_dtype, name="torch.dtype")
    reg(torch.device, _flatten_device, _unflatten_device, name="torch.device")
    if not _vstate.is_registered(collections.OrderedDict):  # the core may learn it one day
        reg(
            collections.OrderedDict,
            _flatten_ordered_dict,
            _unflatten_ordered_dict,
            name="collections.OrderedDict",
        )
    _REGISTERED = True


# -- training states ---------------------------------------------------------------------


def training_state(
    model: torch.nn.Module | None = None,
    optimizer: Any = None,
    scheduler: Any = None,
    *,
    rng: bool = False,
    **extra: Any,
) -> dict:
    """The state of a training loop as one checkpointable dict.

    **Arguments:**

    - `model`: an ``nn.Module`` (its ``state_dict()``), or ``None``.
    - `optimizer`, `scheduler`: objects with ``state_dict()``, or ``None``.
    - `rng`: also record the CPU (and CUDA, when initialised) random
      number generator states.
    - `extra`: more entries (step counters, data-loader positions: any
      state :mod:`vlcc_adjoint.state` accepts).

    **Returns:** ``{"model": ..., "optimizer": ..., "scheduler": ...,
    "rng": ..., **extra}`` (absent entries omitted).  The tensors are the
    live ones (no copy): a store or ``History.commit`` takes its snapshot.
    """
    out = {}
    if model is not None:
        out["model"] = model.state_dict()
    if optimizer is not None:
        out["optimizer"] = optimizer.state_dict()
    if scheduler is not None:
        out["scheduler"] = scheduler.state_dict()
    if rng:
        out["rng"] = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["rng"]["cuda"] = torch.cuda.get_rng_state_all()
    out.update(extra)
    return out


def restore_training_state(
    state: dict,
    model: torch.nn.Module | None = None,
    optimizer: Any = None,
    scheduler: Any = None,
    *,
    strict: bool = True,
) -> dict:
    """Load a :func:`training_state` back into live objects.

    **Arguments:** `state` (as read back from a store or ``History``),
    `model`, `optimizer`, `scheduler` (each optional), `strict` (passed to
    ``Module.load_state_dict``).

    **Returns:** the entries of `state` that were not consumed (the `extra`
    of :func:`training_state`).
    """
    rest = dict(state)
    if model is not None:
        model.load_state_dict(rest.pop("model"), strict=strict)
    if optimizer is not None:
        optimizer.load_state_dict(rest.pop("optimizer"))
    if scheduler is not None:
        scheduler.load_state_dict(rest.pop("scheduler"))
    rng = rest.pop("rng", None)
    if rng is not None:
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
    return rest
