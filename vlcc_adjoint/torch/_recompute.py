"""What recomputing a chain of layers or steps needs, shared by
:func:`~vlcc_adjoint.torch.checkpoint_sequence` and
:func:`~vlcc_adjoint.torch.checkpoint_sequential`.

* The tensors a step closes over (:func:`collect_params`): autograd routes
  gradients only to the inputs of a ``torch.autograd.Function``, so the
  parameters a step uses besides its argument become explicit inputs.
* The leaves a tape reaches that are not its inputs (:func:`foreign_leaf`):
  they would get no gradient, so the drop-ins raise naming them.
* The random generators (:func:`rng_devices`, :func:`get_rng`,
  :func:`set_rng`): recorded with the states a schedule keeps and restored
  before a recomputation, so dropout draws the same masks.
* The store of levels ``>= 1`` (:func:`schedule_store`, :func:`check_store`,
  :func:`close_quietly`).

The engine that runs a schedule over the blocks is :mod:`._engine`.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch

from ..errors import VlccTypeError, VlccValueError

__all__ = [
    "check_store",
    "close_quietly",
    "collect_params",
    "foreign_leaf",
    "get_rng",
    "rng_devices",
    "schedule_store",
    "set_rng",
    "with_cotangent",
]


def _tensors_in(obj, out: list, depth: int = 0) -> None:
    """Tensors that require grad reachable from `obj`: a tensor, a module, a short
    container of them, or a function / bound method / ``functools.partial`` whose
    closure, owner or arguments hold them (a few levels deep).

    A walk of *code*, not of a state: closures, bound methods, globals named
    by a function and modules' parameters, the tensors autograd would not
    see as inputs of the Function.  The state model describes data and has
    no notion of any of these, so this walk is the torch integration's own;
    the autograd graph walk of :func:`foreign_leaf` is too."""
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
            if isinstance(
                value, (torch.Tensor, torch.nn.Module, types.FunctionType, functools.partial)
            ):
                _tensors_in(value, out, depth + 1)
    elif (
        callable(obj)
        and isinstance(getattr(obj, "__dict__", None), dict)
        and not isinstance(obj, type)
    ):
        # A callable object (a wrapper around a module): its attributes.
        for value in list(obj.__dict__.values())[:64]:
            if isinstance(
                value,
                (
                    torch.Tensor,
                    torch.nn.Module,
                    types.FunctionType,
                    types.MethodType,
                    functools.partial,
                    list,
                    tuple,
                    dict,
                ),
            ):
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
                raise VlccTypeError(
                    f"params[{i}] is a {type(p).__name__}; params= lists tensors "
                    "(use list(module.parameters()) for a module)"
                )
        found.extend(p for p in params if p.requires_grad)
    seen, out = set(), []
    for p in found:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def with_cotangent(out, grads) -> tuple[list, list]:
    """``(outputs, cotangents)``: the outputs that require grad and receive a
    cotangent (not ``None``), with theirs, for ``torch.autograd.grad``."""
    outs, cots = [], []
    for o, g in zip(out, grads):
        if g is not None and o.requires_grad:
            outs.append(o)
            cots.append(g)
    return outs, cots


_WALK_LIMIT = 100_000  # autograd nodes visited when looking for foreign leaves


def foreign_leaf(outs, ours: set, stops: set):
    """A leaf that requires grad, reached from `outs` through the autograd graph,
    whose ``id`` is not in `ours`; ``None`` if there is none.

    A depth-first walk from the outputs' ``grad_fn`` along ``next_functions``
    (at most 100,000 nodes), not entering the nodes in `stops` (the
    ``grad_fn`` of non-leaf parameters: what lies behind them is the caller's
    graph, which autograd reaches through the Function's inputs).
    """
    stack = [o.grad_fn for o in outs if o.grad_fn is not None]
    seen: set[Any] = set()  # autograd nodes visited
    while stack and len(seen) < _WALK_LIMIT:
        node = stack.pop()
        if node in seen or node in stops:
            continue
        seen.add(node)
        var = getattr(node, "variable", None)
        if var is not None and id(var) not in ours:
            return var
        stack.extend(nxt for nxt, _ in node.next_functions if nxt is not None)
    return None


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


def check_store(store, levels: int, name: str = "checkpoint_sequence") -> None:
    """Raise unless `store` is a plan-less TieredStore with a tier per level ``>= 1``
    (`name`, the drop-in's, starts the message)."""
    tiers = getattr(store, "tiers", None)
    if tiers is None or not all(hasattr(store, m) for m in ("save", "load", "delete", "move")):
        raise VlccTypeError(
            f"{name}: store must be a vlcc_adjoint.storage.TieredStore, got {type(store).__name__}"
        )
    if len(tiers) < levels - 1:
        raise VlccValueError(
            f"{name}: the schedule uses levels 1..{levels - 1} below "
            f"the tensors' own slots, but the store has {len(tiers)} tier(s); "
            f"store.tiers[k - 1] holds level k, so give TieredStore({levels - 1} "
            "tiers)"
        )
    if getattr(store, "plan", None) is not None:
        raise VlccValueError(
            f"{name}: build the TieredStore without plan=; its levels "
            "are the schedule's levels >= 1 (level 0 stays in tensor slots), which "
            "an io_plan of the whole schedule does not describe"
        )


def schedule_store(stats, store, name: str = "checkpoint_sequence"):
    """The store a run of a schedule uses for its levels ``>= 1``.

    **Arguments:** `stats` is :func:`~vlcc_adjoint.schedules.simulate` of the
    schedule; `store` the caller's :class:`~vlcc_adjoint.storage.TieredStore`
    or ``None``.

    **Returns:** ``(store, own)``: the caller's store (checked), or, when the
    schedule keeps states at a level ``>= 1`` and none was given, one
    unbounded ``MemoryTier`` per level (``own`` is then ``True``: the run
    closes it); the store is ``None`` when the schedule has level 0 only.
    """
    levels = len(stats.peak_slots)
    own = False
    if levels > 1 and any(stats.peak_slots[1:]):
        if store is None:
            from ..storage import MemoryTier, TieredStore

            store = TieredStore([MemoryTier() for _ in range(levels - 1)])
            own = True
        else:
            check_store(store, levels, name)
    elif store is not None:
        check_store(store, 1, name)
    return (store if (own or levels > 1) else None), own
