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
* The store of a run (:func:`planned_store`, :func:`close_quietly`): every
  level, level 0 included, in one planned
  :class:`~vlcc_adjoint.storage.TieredStore`.

The engine that runs a schedule over the blocks is :mod:`._engine`.
"""

from __future__ import annotations

import functools
import types
import warnings
from typing import Any

import numpy as np
import torch

from ..errors import VlccTypeError, VlccValueError
from ..schedules import IOPlan, Schedule, io_plan, simulate
from ..storage import DeviceTier, MemoryTier, Tier, TieredStore

__all__ = [
    "NEW_FORM",
    "close_quietly",
    "collect_params",
    "foreign_leaf",
    "get_rng",
    "planned_store",
    "rng_devices",
    "schedule_plan",
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


#: The store form the drop-ins take (levels numbered as in the schedule).
NEW_FORM = "TieredStore([DeviceTier(), MemoryTier(), ...], plan=io_plan(schedule))"


@functools.lru_cache(maxsize=32)
def schedule_plan(schedule: Schedule) -> tuple[IOPlan, int, int]:
    """``(io_plan(schedule), the most level-0 records at once, the number of
    levels)``, computed once per schedule object (a training loop runs one
    schedule at every step); :func:`~vlcc_adjoint.schedules.simulate`
    validates the schedule on the way.

    The device tier counts level-0 records against the schedule's peak; it
    needs no slot map: a record's clones are its own tensors, not rows of a
    preallocated buffer."""
    peaks = simulate(schedule).peak_slots
    return io_plan(schedule), int(peaks[0]), len(peaks)


def _same_table(a: Schedule, b: Schedule) -> bool:
    return a.n_steps == b.n_steps and len(a) == len(b) and np.array_equal(a.table, b.table)


def planned_store(schedule: Schedule, store: Any, name: str) -> tuple[TieredStore, bool]:
    """The store that holds every level of a run of `schedule` and follows
    its plan: tier 0 a :class:`~vlcc_adjoint.storage.DeviceTier` (the kept
    tensors on their own devices), tier ``k`` level ``k``.

    **Arguments:**

    - `schedule`: the run's schedule (valid).
    - `store`: the caller's store, or ``None``.  The store form is
      :data:`NEW_FORM`, with the plan of this schedule; the earlier form, a
      store of host tiers without a plan whose tier ``k - 1`` holds level
      ``k``, still works: its tiers are adopted below a ``DeviceTier`` in a
      planned store of the run's own (which leaves them open), with a
      ``DeprecationWarning`` naming the new form.
    - `name`: the drop-in's name, which starts the messages.

    **Returns:** ``(store, own)``: `own` when the store was made for the run
    (the run closes it); a caller's store of the new form is returned as
    is.  A ``TypeError``/``ValueError`` names what is wrong and the fix.
    """
    plan, slots, levels = schedule_plan(schedule)
    if store is None:
        own: list[Tier] = [DeviceTier(slots)]
        own += [MemoryTier() for _ in range(1, levels)]
        return TieredStore(own, plan=plan, threadsafe=False), True
    tiers = getattr(store, "tiers", None)
    if tiers is None or not all(
        hasattr(store, m) for m in ("save", "load", "delete", "move", "restart", "plan")
    ):
        raise VlccTypeError(
            f"{name}: store must be a vlcc_adjoint.storage.TieredStore, got {type(store).__name__}"
        )
    if tiers and getattr(tiers[0], "holds_payloads", False):
        if len(tiers) < levels:
            raise VlccValueError(
                f"{name}: the schedule uses levels 0..{levels - 1}, but the store has "
                f"{len(tiers)} tier(s); store.tiers[k] holds level k, so give it {levels} tiers "
                "(a DeviceTier and one host tier per level below the device)"
            )
        if store.plan is None:
            raise VlccValueError(
                f"{name}: a store with a DeviceTier runs the schedule's plan: build it as "
                f"{NEW_FORM}, with the schedule given to {name}"
            )
        planned = getattr(store.plan, "schedule", None)
        if planned is not None and planned is not schedule and not _same_table(planned, schedule):
            raise VlccValueError(
                f"{name}: the store's plan is for {planned!r}, not for the schedule being run, "
                f"{schedule!r}; build the store with plan=io_plan(schedule) of the schedule "
                f"passed to {name}"
            )
        return store, False
    if store.plan is not None:
        raise VlccValueError(
            f"{name}: this store has a plan but no DeviceTier for level 0; the store owns every "
            f"level of the schedule: build it as {NEW_FORM}"
        )
    warnings.warn(
        f"{name}(store=TieredStore(host tiers)) without a plan, store.tiers[k - 1] holding "
        f"level k, is deprecated: give the store every level and the plan, {NEW_FORM}, levels "
        "numbered as in the schedule; the store then reads restores ahead, evicts with "
        "foresight and checks the plan on every level",
        DeprecationWarning,
        stacklevel=3,  # the caller of the drop-in
    )
    if len(tiers) < levels - 1:
        raise VlccValueError(
            f"{name}: the schedule uses levels 1..{levels - 1} below the device, but the store "
            f"has {len(tiers)} tier(s); in this (deprecated) form store.tiers[k - 1] holds level "
            f"k; better, give the store every level: {NEW_FORM}"
        )
    adopted = TieredStore([DeviceTier(slots), *tiers], plan=plan, close_tiers=False)
    return adopted, True
