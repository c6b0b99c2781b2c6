"""What recomputing a chain of layers or steps needs, shared by
:func:`~vlcc_adjoint.torch.checkpoint_sequence` and
:func:`~vlcc_adjoint.torch.checkpoint_sequential`.

* The tensors a step closes over (:func:`collect_params`): autograd routes
  gradients only to the inputs of a ``torch.autograd.Function``, so the
  parameters a step uses besides its argument become explicit inputs.
* The random generators (:func:`rng_devices`, :func:`get_rng`,
  :func:`set_rng`): recorded with the states a schedule keeps and restored
  before a recomputation, so dropout draws the same masks.
* The store of levels ``>= 1`` (:func:`check_store`, :func:`close_quietly`).
"""

from __future__ import annotations

import functools
import types

import torch

__all__ = ["check_store", "close_quietly", "collect_params", "get_rng", "rng_devices",
           "set_rng"]

def _tensors_in(obj, out: list, depth: int = 0) -> None:
    """Tensors that require grad reachable from `obj`: a tensor, a module, a short
    container of them, or a function / bound method / ``functools.partial`` whose
    closure, owner or arguments hold them (a few levels deep)."""
    if depth > 3:
        return
    if isinstance(obj, torch.Tensor):
        if obj.requires_grad:
            out.append(obj)
    elif isinstance(obj, torch.nn.Module):
        out.extend(p for p in obj.parameters() if p.requires_grad)
    elif isinstance(obj, (list, tuple)) and len(obj) <= 64:
        for item in obj:
            _tensors_in(item, out, depth + 1)
    elif isinstance(obj, dict) and len(obj) <= 64:
        for item in obj.values():
            _tensors_in(item, out, depth + 1)
    elif isinstance(obj, functools.partial):
        _tensors_in(obj.func, out, depth + 1)
        _tensors_in(obj.args, out, depth + 1)
        _tensors_in(obj.keywords, out, depth + 1)
    elif isinstance(obj, types.MethodType):
        _tensors_in(obj.__self__, out, depth + 1)
        _tensors_in(obj.__func__, out, depth + 1)
    elif isinstance(obj, types.FunctionType):
        for cell in obj.__closure__ or ():
            try:
                _tensors_in(cell.cell_contents, out, depth + 1)
            except ValueError:  # an empty cell
                pass
        # Module-level functions name their model as a global.
        glob = obj.__globals__
        for name in obj.__code__.co_names:
            value = glob.get(name)
            if isinstance(value, (torch.Tensor, torch.nn.Module, types.FunctionType,
                                  functools.partial)):
                _tensors_in(value, out, depth + 1)
    elif callable(obj) and isinstance(getattr(obj, "__dict__", None), dict) \
            and not isinstance(obj, type):
        # A callable object (a wrapper around a module): its attributes.
        for value in list(obj.__dict__.values())[:64]:
            if isinstance(value, (torch.Tensor, torch.nn.Module, types.FunctionType,
                                  types.MethodType, functools.partial, list, tuple, dict)):
                _tensors_in(value, out, depth + 1)


def collect_params(step, params) -> list[torch.Tensor]:
    """The tensors step uses besides its argument, deduplicated, in a stable order."""
    found: list[torch.Tensor] = []
    _tensors_in(step, found)
    if params is not None:
        if isinstance(params, torch.Tensor):
            params = [params]
        for i, p in enumerate(params):
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"params[{i}] is a {type(p).__name__}; params= lists tensors "
                                "(use list(module.parameters()) for a module)")
        found.extend(p for p in params if p.requires_grad)
    seen, out = set(), []
    for p in found:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


# -- random number generators ------------------------------------------------------------


def rng_devices(tensors) -> list[int]:
    return sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})


def get_rng(devices):
    cuda = [torch.cuda.get_rng_state(d) for d in devices]
    return torch.get_rng_state(), cuda


def set_rng(state, devices):
    cpu, cuda = state
    torch.set_rng_state(cpu)
    for d, s in zip(devices, cuda):
        torch.cuda.set_rng_state(s, d)


def close_quietly(store):
    try:
        store.close()
    except Exception:  # pragma: no cover - at garbage collection, nobody to tell
        pass


def check_store(store, levels: int):
    tiers = getattr(store, "tiers", None)
    if tiers is None or not all(hasattr(store, m) for m in ("save", "load", "delete", "move")):
        raise TypeError(f"checkpoint_sequence: store must be a vlcc_adjoint.storage.TieredStore, "
                        f"got {type(store).__name__}")
    if len(tiers) < levels - 1:
        raise ValueError(f"checkpoint_sequence: the schedule uses levels 1..{levels - 1} below "
                         f"the tensors' own slots, but the store has {len(tiers)} tier(s); "
                         f"store.tiers[k - 1] holds level k, so give TieredStore({levels - 1} "
                         "tiers)")
    if getattr(store, "plan", None) is not None:
        raise ValueError("checkpoint_sequence: build the TieredStore without plan=; its levels "
                         "are the schedule's levels >= 1 (level 0 stays in tensor slots), which "
                         "an io_plan of the whole schedule does not describe")
