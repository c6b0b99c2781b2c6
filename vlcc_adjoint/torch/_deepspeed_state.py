"""State providers for the objects DeepSpeed puts in its checkpoints (ZeRO stages 0-3).

Besides tensors, dicts and numbers, ``model_engine.save_checkpoint`` writes
a few DeepSpeed objects into the optimizer's state dict (DeepSpeed 0.19):

=========================================================  ==========================
object                                                     where
=========================================================  ==========================
``deepspeed.runtime.fp16.loss_scaler.LossScaler``           ``loss_scaler`` (ZeRO 1-3,
                                                            fp16 optimizers; static)
``deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler``    ``loss_scaler`` (fp16 with
                                                            dynamic loss scaling)
``deepspeed.utils.tensor_fragment.fragment_address``        ``param_slice_mappings``
                                                            (ZeRO 1-2, bf16)
``deepspeed.runtime.zero.config.ZeroStageEnum``             ``zero_stage`` (ZeRO 1-3)
=========================================================  ==========================

Each is stored as plain data and rebuilt from it, never unpickled:

* the loss scalers as their attribute dict (``cur_scale``, ``dynamic``,
  ``cur_iter``, ``scale_window``, ..., numbers, bools and a
  ``torch.dtype``): a reader makes a bare instance (``object.__new__``) and
  sets the attributes, checking that every name is a plain identifier and
  every value a number, bool, string, ``None``, ``torch.dtype`` or tensor;
* ``fragment_address`` as its two int fields (``numel``, ``start``);
* ``ZeroStageEnum`` as its int value, rebuilt with ``ZeroStageEnum(value)``.

A checkpoint names these types by the strings in :data:`ALLOWED` and
nothing else: a reader rebuilds a type only if its name is in that
allow-list, and imports only the module the allow-list gives for it
(:func:`register_deepspeed_providers` with ``import_modules=True``, which
:class:`~vlcc_adjoint.torch.VlccCheckpointEngine` uses before it loads).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys

import torch

from .. import state as _vstate
from ..errors import VlccTypeError, VlccValueError

__all__ = ["ALLOWED", "register_deepspeed_providers"]

# name in a checkpoint -> (module, class name, how it is stored)
ALLOWED: dict[str, tuple[str, str, str]] = {
    "deepspeed.LossScaler": ("deepspeed.runtime.fp16.loss_scaler", "LossScaler", "attrs"),
    "deepspeed.DynamicLossScaler": (
        "deepspeed.runtime.fp16.loss_scaler",
        "DynamicLossScaler",
        "attrs",
    ),
    "deepspeed.fragment_address": ("deepspeed.utils.tensor_fragment", "fragment_address", "fields"),
    "deepspeed.ZeroStageEnum": ("deepspeed.runtime.zero.config", "ZeroStageEnum", "enum"),
}

_ATTR_VALUES = (bool, int, float, str, type(None), torch.dtype, torch.Tensor)
_MAX_ATTRS = 64

_registered: set[str] = set()


def _attrs_provider(name: str, cls: type):
    def flatten_fn(obj):
        attrs = dict(vars(obj))
        bad = [k for k, v in attrs.items() if not isinstance(v, _ATTR_VALUES)]
        if bad:
            raise VlccTypeError(
                f"{cls.__qualname__}.{bad[0]} is a {type(attrs[bad[0]]).__name__}; "
                f"the {name} provider stores numbers, bools, strings, dtypes and "
                "tensors only"
            )
        return [attrs], None

    def unflatten_fn(aux, children):
        if aux is not None or len(children) != 1 or not isinstance(children[0], dict):
            raise VlccValueError(f"malformed {name} entry in checkpoint metadata")
        attrs = children[0]
        if len(attrs) > _MAX_ATTRS:
            raise VlccValueError(
                f"{name} entry with {len(attrs)} attributes in checkpoint metadata"
            )
        for key, value in attrs.items():
            if not (isinstance(key, str) and key.isidentifier() and not key.startswith("__")):
                raise VlccValueError(
                    f"{name} entry with attribute {key!r:.40} in checkpoint metadata"
                )
            if not isinstance(value, _ATTR_VALUES):
                raise VlccValueError(
                    f"{name}.{key} is a {type(value).__name__} in checkpoint "
                    "metadata; expected a number, bool, string, dtype or tensor"
                )
        obj = object.__new__(cls)
        obj.__dict__.update(attrs)
        return obj

    return flatten_fn, unflatten_fn


def _fields_provider(name: str, cls: type):
    names = [f.name for f in dataclasses.fields(cls)]

    def flatten_fn(obj):
        return [], {k: getattr(obj, k) for k in names}

    def unflatten_fn(aux, children):
        if (
            children
            or not isinstance(aux, dict)
            or sorted(aux) != sorted(names)
            or not all(type(v) is int for v in aux.values())
        ):
            raise VlccValueError(f"malformed {name} {aux!r:.80} in checkpoint metadata")
        return cls(**aux)

    return flatten_fn, unflatten_fn


def _enum_provider(name: str, cls: type):
    def flatten_fn(obj):
        return [], int(obj.value)

    def unflatten_fn(aux, children):
        if children or type(aux) is not int:
            raise VlccValueError(f"malformed {name} {aux!r:.40} in checkpoint metadata")
        return cls(aux)  # ValueError for a value the enum does not have

    return flatten_fn, unflatten_fn


_KINDS = {"attrs": _attrs_provider, "fields": _fields_provider, "enum": _enum_provider}


def register_deepspeed_providers(import_modules: bool = False) -> list[str]:
    """Register the providers of :data:`ALLOWED` whose modules are available.

    **Arguments:**

    - `import_modules`: import the allow-listed modules (only those) when
      they are not imported yet.  Default: register only the classes of
      modules DeepSpeed has already imported, so that importing
      :mod:`vlcc_adjoint.torch` never imports DeepSpeed.

    **Returns:** the names registered so far (idempotent).
    """
    for name, (module, qualname, kind) in ALLOWED.items():
        if name in _registered:
            continue
        mod = sys.modules.get(module)
        if mod is None and import_modules:
            try:
                mod = importlib.import_module(module)
            except ImportError:  # another DeepSpeed layout: that type is not supported
                mod = None
        cls = getattr(mod, qualname, None) if mod is not None else None
        if not isinstance(cls, type):
            continue
        flatten_fn, unflatten_fn = _KINDS[kind](name, cls)
        _vstate.register(cls, flatten_fn, unflatten_fn, name=name)
        _registered.add(name)
    return sorted(_registered)
