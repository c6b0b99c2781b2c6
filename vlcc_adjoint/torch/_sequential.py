"""checkpoint_sequential: torch's call, with any vlcc schedule over the layers.

``torch.utils.checkpoint.checkpoint_sequential(functions, segments, input,
use_reentrant=..., preserve_rng_state=True)`` runs a list of layers (an
``nn.Sequential``) and keeps only the inputs of ``segments - 1`` segments
for the backward pass; each segment is re-run, with grad, when the backward
pass reaches it.  :func:`checkpoint_sequential` takes the same arguments,
returns the same values and gradients, and adds ``schedule=``: a
:mod:`vlcc_adjoint.schedules` table over the ``segments`` blocks of layers,
run by the engine of :func:`~vlcc_adjoint.torch.checkpoint_sequence`
(:mod:`vlcc_adjoint.torch._engine`, the semantics of
:mod:`vlcc_adjoint.schedules.actions`): a block is a segment of layers,
kept states are the inputs of blocks, and a ``Reverse`` differentiates the
block w.r.t. its input and its layers' parameters.

The forward pass runs the table up to its first ``Reverse`` and then the
last block with grad (its tape serves ``Reverse(m - 1)``).  Without
``schedule=`` the table is ``StoreAll(segments)`` over torch's segments
(``len(functions) // segments`` layers each, the last one taking the rest):
every layer of the first ``segments - 1`` segments runs twice, the last
segment once, as in torch.  ``Revolve(segments, snapshots)`` keeps at most
``snapshots`` block inputs instead of ``segments - 1`` (Griewank's binomial
checkpointing, Griewank & Walther, ACM TOMS 26(1), 2000), e.g. one block
per layer with ``segments=len(functions)``.

What the state between layers may be.  As in torch, each layer takes the
previous one's output as its only argument, and shapes change freely.  The
state may be a tensor or a tuple / list / dict (named tuples too) of
tensors and other values (``None``, numbers, strings, masks): its tensors
receive gradients, the other values are passed along as they are.

``use_reentrant``.  Torch requires it to be passed (a warning, then
``True``, when it is not); so does this function.  Both values compute the
gradients with the same machinery and give the gradients of plain autograd,
also where torch's reentrant variant gives none (parameters of checkpointed
segments when no input requires grad; tensors inside a tuple input).  They
differ where torch's do: with ``use_reentrant=False`` the gradient is itself
differentiable (``create_graph=True``, double backward: the backward pass
then re-runs the whole sequence with grad from the saved input, so the
second-order graph is connected, at the memory of one full tape); with
``use_reentrant=True`` that raises torch's error.

In-place layers (``nn.ReLU(inplace=True)``) may start a block: the layers
run on copies of a kept input (and of the caller's input), so neither is
changed; torch's variants raise there.

Randomness: with ``preserve_rng_state=True`` (the default) the CPU generator
(and the CUDA generators of the devices the input lives on) is restored
before every recomputation, so dropout draws the same masks, and the
caller's generator ends where a plain forward pass leaves it.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import VlccTypeError, VlccValueError
from ..schedules import Online, Schedule, StoreAll
from ..state import join_leaves, split_leaves
from ._engine import Chain, Checkpointed, Recompute
from ._recompute import close_quietly, collect_params, planned_store
from ._state import register_providers

if TYPE_CHECKING:
    from ..storage import TieredStore

__all__ = ["checkpoint_sequential"]

_REENTRANT_GRAPH = (
    "checkpoint_sequential(use_reentrant=True) cannot differentiate its gradient "
    "(create_graph=True), as torch.utils.checkpoint is incompatible with .grad() in its "
    "reentrant variant; pass use_reentrant=False, which supports double backward."
)


# -- the state between layers: tensors and the structure around them -------------------


def _is_tensor(obj) -> bool:
    return isinstance(obj, torch.Tensor)


def _flatten(obj, tensors: list) -> dict:
    """The tree of `obj`, its tensors appended to `tensors` by reference.

    A *carry*, not a record: the live tensors between layers go to autograd
    and the engine and come back in place (:func:`vlcc_adjoint.state.
    split_leaves`, the state model's one walk), every other value (a mask, a
    module, a config object) travelling as the object it is.  What is
    stored of a layer state goes through the model as a record: the tensors
    of a kept state are saved as a list (the ``"torch"`` leaf provider
    describes them), the tree stays with the engine.
    """
    leaves, tree = split_leaves(obj, _is_tensor)
    tensors.extend(leaves)
    return tree


def _unflatten(tree: dict, tensors) -> object:
    return join_leaves(tree, tensors)


# -- the layers as a chain of blocks ----------------------------------------------------


class LayerChain(Chain):
    """The blocks of :func:`checkpoint_sequential`: segments of layers, each
    taking the previous one's output, the state between them any tree of
    tensors and other values (its shapes change from layer to layer).

    Layers may work in place (``nn.ReLU(inplace=True)``), so they are handed
    copies of kept states (``protect``); each block closes over its own
    layers' parameters and is checked once; a second backward pass sweeps
    again (``retain_graph=True``, as torch allows).
    """

    name = "checkpoint_sequential"
    protect = True
    repeatable = True

    def __init__(self, functions, bounds, params, block_params, reentrant) -> None:
        self.functions = functions
        self.bounds = bounds  # block j = layers bounds[j] .. bounds[j+1]-1
        self.blocks = len(bounds) - 1
        self.extras = []
        self.params = params  # every parameter, the Function's inputs after the state
        self.mine = block_params  # per block: indices into params
        self.graph_error = _REENTRANT_GRAPH if reentrant else None

    def block_params(self, j: int) -> Sequence[int]:
        return self.mine[j]

    def modified(self, i: int) -> str:
        return (
            f"checkpoint_sequential: the kept input of layer {self.bounds[i]} was modified in "
            "place; a layer must not modify its input in place"
        )

    def foreign(self, j: int, var: torch.Tensor) -> Exception:
        return VlccValueError(
            f"checkpoint_sequential: layer {self.bounds[j]}..{self.bounds[j + 1] - 1} "
            f"uses a tensor of shape {tuple(var.shape)} that requires grad but is "
            "neither a parameter of the layers nor reachable from their closures, so "
            "it would get no gradient; make it an nn.Parameter of a layer (or pass the "
            "layer as an nn.Module that owns it)"
        )

    def run(self, a: int, b: int, tree, tensors: list, xs: list | None):
        state = _unflatten(tree, tensors)
        for k in range(self.bounds[a], self.bounds[b]):
            state = self.functions[k](state)
        out: list[torch.Tensor] = []
        tree = _flatten(state, out)
        return tree, out


def _blocks(n_layers: int, segments: int) -> list[int]:
    """torch's segments: ``n // segments`` layers each, the last one the rest."""
    size = n_layers // segments
    return [k * size for k in range(segments)] + [n_layers]


def _layers(functions) -> list:
    if isinstance(functions, torch.nn.Sequential):
        return list(functions.children())
    if isinstance(functions, (list, tuple, torch.nn.ModuleList)):
        layers = list(functions)
    else:
        raise VlccTypeError(
            f"checkpoint_sequential: functions must be an nn.Sequential, an "
            f"nn.ModuleList or a list of modules/functions, got "
            f"{type(functions).__name__}"
        )
    for i, f in enumerate(layers):
        if not callable(f):
            raise VlccTypeError(
                f"checkpoint_sequential: functions[{i}] is a {type(f).__name__}, "
                "not a module or function"
            )
    return layers


def checkpoint_sequential(
    functions: torch.nn.Sequential | torch.nn.ModuleList | Sequence[Callable],
    segments: int,
    input: Any,
    use_reentrant: bool | None = None,
    *,
    schedule: Schedule | None = None,
    store: TieredStore | None = None,
    preserve_rng_state: bool = True,
    **kwargs: Any,
) -> Any:
    """``torch.utils.checkpoint.checkpoint_sequential``, optionally under a vlcc schedule.

    **Arguments:**

    - `functions`: an ``nn.Sequential``, an ``nn.ModuleList`` or a list of
      modules / functions, run in order; each takes the previous one's
      output (shapes may change from layer to layer).
    - `segments`: the number of blocks: ``len(functions) // segments``
      layers each, the last block the rest (torch's segments).
    - `input`: the first layer's argument: a tensor, or a tuple / list /
      dict holding tensors and other values.
    - `use_reentrant`: pass it, as torch asks (``None`` warns, as torch
      does, and means ``True``).  ``False`` supports ``create_graph=True``;
      ``True`` raises torch's error for it (see the module docstring).
    - `schedule`: a :class:`~vlcc_adjoint.schedules.Schedule` for
      `segments` steps (``Revolve(segments, snapshots)``,
      ``Multistage``, ...).  Default: ``StoreAll(segments)``, torch's
      segment checkpointing.
    - `store`: a :class:`~vlcc_adjoint.storage.TieredStore` of every level,
      ``TieredStore([DeviceTier(), MemoryTier(), ...], plan=io_plan(schedule))``
      (as for :func:`~vlcc_adjoint.torch.checkpoint_sequence`); default:
      unbounded memory tiers.
    - `preserve_rng_state`: restore the random generators before every
      recomputation (torch's keyword).
    - `kwargs`: any other keyword raises ``ValueError``, as in torch.

    **Returns:** the last layer's output.

    With grad disabled, or when neither the input nor any parameter
    requires grad, this is the plain loop.
    """
    if use_reentrant is None:
        warnings.warn(
            "vlcc_adjoint.torch.checkpoint_sequential: the use_reentrant parameter should be "
            "passed explicitly, as torch.utils.checkpoint.checkpoint_sequential asks; "
            "use_reentrant=False is recommended (it supports double backward); None means "
            "True, torch's current default.",
            stacklevel=2,
        )
        use_reentrant = True
    if kwargs:
        raise VlccValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    if not isinstance(use_reentrant, bool):
        raise VlccTypeError(
            f"checkpoint_sequential: use_reentrant must be True or False, got a "
            f"{type(use_reentrant).__name__} (it takes one input; pack several "
            "into a tuple)"
        )
    layers = _layers(functions)
    n = len(layers)
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= n:
        raise VlccValueError(
            f"checkpoint_sequential: segments must be an int between 1 and the "
            f"number of layers ({n}), got {segments!r}"
        )
    register_providers()
    if schedule is None:
        schedule = StoreAll(segments)
    elif not isinstance(schedule, Schedule):
        raise VlccTypeError(
            f"schedule must be a vlcc_adjoint.schedules.Schedule (Revolve, "
            f"Multistage, ...), got {type(schedule).__name__}"
        )
    elif isinstance(schedule, Online) and schedule.n_steps is None:
        raise VlccValueError(
            "checkpoint_sequential knows its number of blocks: use Revolve, "
            "Multistage, StoreAll, Periodic or Online(steps, snapshots=...)"
        )
    elif schedule.n_steps != segments:
        raise VlccValueError(
            f"the schedule is for {schedule.n_steps} steps, but segments="
            f"{segments}: the schedule's steps are the segments (pass "
            f"segments={schedule.n_steps}, or build "
            f"{type(schedule).__name__}({segments}, ...)); one block per layer "
            f"is segments={n}"
        )
    bounds = _blocks(n, segments)
    params: list[torch.Tensor] = []
    index: dict[int, int] = {}
    block_params = []
    for j in range(segments):
        mine, seen = [], set()
        for f in layers[bounds[j] : bounds[j + 1]]:
            for p in collect_params(f, None):
                if id(p) not in seen:
                    seen.add(id(p))
                    mine.append(p)
        for p in mine:
            index.setdefault(id(p), len(params))
            if index[id(p)] == len(params):
                params.append(p)
        block_params.append([index[id(p)] for p in mine])
    leaves: list[torch.Tensor] = []
    tree = _flatten(input, leaves)
    needs_grad = torch.is_grad_enabled() and (any(t.requires_grad for t in leaves) or bool(params))
    if not needs_grad or segments == 1 and schedule.n_steps == 1:
        state = input
        for f in layers:
            state = f(state)
        return state
    store, own_store = planned_store(schedule, store, "checkpoint_sequential")
    chain = LayerChain(layers, bounds, params, block_params, use_reentrant)
    engine = Recompute(chain, schedule, store, own_store, preserve_rng_state)
    try:
        out = Checkpointed.apply(engine, tree, len(leaves), *leaves, *params)
    except BaseException:
        engine.finish()
        if own_store:
            store.close()
        raise
    if own_store:
        weakref.finalize(engine, close_quietly, store)
    return _unflatten(engine.final_tree, list(out))
