"""checkpoint_sequential: torch's call, with any vlcc schedule over the layers.

``torch.utils.checkpoint.checkpoint_sequential(functions, segments, input,
use_reentrant=..., preserve_rng_state=True)`` runs a list of layers (an
``nn.Sequential``) and keeps only the inputs of ``segments - 1`` segments
for the backward pass; each segment is re-run, with grad, when the backward
pass reaches it.  :func:`checkpoint_sequential` takes the same arguments,
returns the same values and gradients, and adds ``schedule=``: a
:mod:`vlcc_adjoint.schedules` table over the ``segments`` blocks of layers,
interpreted by the same machine as :func:`~vlcc_adjoint.torch.checkpoint_sequence`
(the semantics of :mod:`vlcc_adjoint.schedules.actions`):

=====================  ====================================================
action                 what it does here
=====================  ====================================================
``Advance(a, b)``      run blocks ``a .. b-1`` under ``no_grad``
``Save(i, 0)``         keep the state between blocks ``i - 1`` and ``i``
``Save(i, k >= 1)``    ``store.save(i, tensors, k - 1)``
``Load(i, k)``         make a kept state the one in hand
``Delete``, ``Move``   free a kept state / move it between levels
``Reverse(i)``         re-run block ``i`` with grad from a detached copy
                       of its input and ``torch.autograd.grad`` the
                       incoming cotangent to the input and the block's
                       parameters
=====================  ====================================================

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

from ..errors import VlccRuntimeError, VlccTypeError, VlccValueError
from ..schedules import ActionKind, Online, Schedule, StoreAll, simulate
from ._recompute import (
    close_quietly,
    collect_params,
    dispatch,
    foreign_leaf,
    get_rng,
    rng_devices,
    schedule_store,
    set_rng,
    with_cotangent,
)
from ._slots import Slots
from ._state import register_providers

if TYPE_CHECKING:
    from ..storage import TieredStore

__all__ = ["checkpoint_sequential"]

_REVERSE = int(ActionKind.REVERSE)

_REENTRANT_GRAPH = (
    "checkpoint_sequential(use_reentrant=True) cannot differentiate its gradient "
    "(create_graph=True), as torch.utils.checkpoint is incompatible with .grad() in its "
    "reentrant variant; pass use_reentrant=False, which supports double backward."
)


# -- the state between layers: tensors and the structure around them -------------------


def _flatten(obj, tensors: list, depth: int = 0):
    """A tree description of `obj` whose tensors are appended to `tensors`."""
    if depth > 32:
        raise VlccValueError(
            "checkpoint_sequential: the state between layers is nested more than 32 levels deep"
        )
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return ("t",)
    if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
        return ("n", type(obj), [_flatten(x, tensors, depth + 1) for x in obj])
    if type(obj) in (tuple, list):
        return (type(obj), [_flatten(x, tensors, depth + 1) for x in obj])
    if type(obj) is dict:
        return ("d", list(obj), [_flatten(v, tensors, depth + 1) for v in obj.values()])
    return ("c", obj)  # any other value travels as is


def _rebuild(tree, it):
    tag = tree[0]
    if tag == "t":
        return next(it)
    if tag == "c":
        return tree[1]
    if tag == "n":
        return tree[1](*[_rebuild(x, it) for x in tree[2]])
    if tag == "d":
        return {k: _rebuild(v, it) for k, v in zip(tree[1], tree[2])}
    return tag(_rebuild(x, it) for x in tree[1])


def _unflatten(tree, tensors):
    return _rebuild(tree, iter(tensors))


def _differentiable(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


# -- the interpreter -------------------------------------------------------------------


class _Layers:
    """One forward/backward of a sequence of layers under a schedule table."""

    def __init__(
        self,
        functions,
        bounds,
        schedule,
        store,
        own_store,
        params,
        block_params,
        preserve_rng,
        reentrant,
    ):
        self.functions = functions
        self.bounds = bounds  # block j = layers bounds[j] .. bounds[j+1]-1
        self.m = len(bounds) - 1
        self.table = schedule.table
        self.store = store
        self.own_store = own_store
        self.params = params  # every parameter, the Function's inputs after the state
        self.block_params = block_params  # per block: indices into params
        self.preserve = preserve_rng
        self.reentrant = reentrant
        self.devices: list[int] = []
        self.calls = 0
        self.out_tree = None
        self.used = False
        self.checked: set[int] = set()

    # -- running layers ------------------------------------------------------------

    def _run_block(self, j: int, state):
        for k in range(self.bounds[j], self.bounds[j + 1]):
            state = self.functions[k](state)
            self.calls += 1
        return state

    def _advance(self, a: int, b: int):
        if self.preserve:
            set_rng(self.rng, self.devices)
        # A kept state is copied before layers see it: a first layer that works in
        # place (ReLU(inplace=True)) must not change what a later Load returns.
        cur = [t.clone() for t in self.cur] if self.cur_kept else self.cur
        state = _unflatten(self.tree, cur)
        self.cur_kept = False
        with torch.no_grad():
            for j in range(a, b):
                state = self._run_block(j, state)
        self.cur = []
        self.tree = _flatten(state, self.cur)
        self.cur_step = b
        if self.preserve:
            self.rng = get_rng(self.devices)

    def _tape(self, j: int):
        """Block j with grad from detached copies of the state in hand:
        ``(input tensors, output tensors, output tree)``."""
        if self.preserve:
            set_rng(self.rng, self.devices)
        with torch.enable_grad():
            xin = [t.detach().requires_grad_(_differentiable(t)) for t in self.cur]
            # Layers see copies (exact, and the identity for the gradient): an in-place
            # first layer neither modifies a leaf that requires grad nor a kept state.
            state = self._run_block(j, _unflatten(self.tree, [t.clone() for t in xin]))
        out: list = []
        tree = _flatten(state, out)
        return xin, out, tree

    # -- storage ---------------------------------------------------------------------

    def _save(self, i: int, level: int):
        if self.cur_step != i:  # pragma: no cover - simulate() validated the table
            raise VlccRuntimeError(f"Save({i}, {level}) without the input of block {i} in hand")
        self.slots.save(i, level, self.cur)
        self.kept[(i, level)] = (self.tree, [t.device for t in self.cur], self.rng)

    def _load(self, i: int, level: int):
        self.tree, devices, self.rng = self.kept[(i, level)]
        self.cur = self.slots.load(
            i,
            level,
            lambda loaded: [t.to(d) for t, d in zip(loaded, devices)],
            f"checkpoint_sequential: the kept input of layer {self.bounds[i]} was modified in "
            "place; a layer must not modify its input in place",
        )
        self.cur_step = i
        self.cur_kept = True

    def _delete(self, i: int, level: int):
        self.slots.delete(i, level)
        del self.kept[(i, level)]

    def _move(self, i: int, src: int, dst: int):
        devices = self.kept[(i, src)][1]
        self.slots.move(i, src, dst, lambda loaded: [t.to(d) for t, d in zip(loaded, devices)])
        self.kept[(i, dst)] = self.kept.pop((i, src))

    # -- the passes --------------------------------------------------------------------

    def _rows(self, start: int, stop: int):
        t = self.table[start:stop]
        return zip(
            t["kind"].tolist(),
            t["a"].tolist(),
            t["b"].tolist(),
            t["level"].tolist(),
            t["dst"].tolist(),
        )

    _dispatch = dispatch

    def sweep(self, tree, leaves: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The forward part of the table, then the last block with grad; returns the
        output's tensors (detached)."""
        self.slots = Slots(self.store)  # level 0 and the store
        self.kept: dict[tuple[int, int], tuple] = {}  # (step, level) -> (tree, devices, rng)
        self.tree, self.cur, self.cur_step = tree, [t.detach() for t in leaves], 0
        self.cur_kept = True  # the caller's input: never modified by a layer here
        self.rng = self.rng0
        kinds = self.table["kind"]
        rev = (kinds == _REVERSE).nonzero()[0]
        self.split = int(rev[0]) if len(rev) else len(self.table)
        for row in self._rows(0, self.split):
            self._dispatch(*row)
        if self.cur_step != self.m - 1:  # pragma: no cover - simulate() validated the table
            raise VlccRuntimeError("the schedule's forward sweep does not end at the last block")
        xin, out, tree = self._tape(self.m - 1)
        self.tape = (self.m - 1, xin, out)
        self.out_tree = tree
        return [t.detach() for t in out]

    def forward(self, tree, leaves):
        self.devices = rng_devices(leaves)
        self.rng0 = get_rng(self.devices) if self.preserve else None
        return self.sweep(tree, leaves)

    def backward(self, tree, leaves, grads):
        with torch.random.fork_rng(devices=self.devices, enabled=self.preserve):
            if self.used:  # a second backward (retain_graph=True): sweep again
                self.sweep(tree, leaves)
            self.used = True
            self.lam = list(grads)
            self.grad_params = [None] * len(self.params)
            for row in self._rows(self.split, len(self.table)):
                self._dispatch(*row)
        self.finish()
        return self.lam, self.grad_params

    def _reverse(self, j: int):
        if self.tape is not None and self.tape[0] == j:
            _, xin, out = self.tape
            self.tape = None
        else:
            if self.cur_step != j:  # pragma: no cover - simulate() validated the table
                raise VlccRuntimeError(f"Reverse({j}) without the input of block {j} in hand")
            xin, out, _ = self._tape(j)
        self.cur, self.cur_step = None, -1
        outs, cots = with_cotangent(out, self.lam)
        mine = [self.params[p] for p in self.block_params[j]]
        wrt = [t for t in xin if t.requires_grad]
        if not outs:  # the cotangent is zero from here back
            self.lam = [None] * len(xin)
            return
        if j not in self.checked:
            self._check_closure(j, outs, xin, mine)
            self.checked.add(j)
        got = torch.autograd.grad(outs, wrt + mine, cots, allow_unused=True)
        it = iter(got[: len(wrt)])
        self.lam = [next(it) if t.requires_grad else None for t in xin]
        for p, g in zip(self.block_params[j], got[len(wrt) :]):
            if g is not None:
                acc = self.grad_params[p]
                self.grad_params[p] = g if acc is None else acc + g

    def _check_closure(self, j, outs, xin, mine):
        """Raise if block j's tape reaches a leaf that requires grad and is not an input."""
        ours = {id(t) for t in xin} | {id(p) for p in self.params}
        stops = {p.grad_fn for p in mine if p.grad_fn is not None}
        var = foreign_leaf(outs, ours, stops)
        if var is not None:
            raise VlccValueError(
                f"checkpoint_sequential: layer {self.bounds[j]}..{self.bounds[j + 1] - 1} "
                f"uses a tensor of shape {tuple(var.shape)} that requires grad but is "
                "neither a parameter of the layers nor reachable from their closures, so "
                "it would get no gradient; make it an nn.Parameter of a layer (or pass the "
                "layer as an nn.Module that owns it)"
            )

    def double_backward(self, tree, leaves, grads):
        """The gradient as a differentiable function of the inputs, the parameters and
        the cotangent: the whole sequence again with grad, from the saved inputs."""
        if self.reentrant:
            raise VlccRuntimeError(_REENTRANT_GRAPH)
        with torch.random.fork_rng(devices=self.devices, enabled=self.preserve):
            if self.preserve:
                set_rng(self.rng0, self.devices)
            state = _unflatten(tree, leaves)
            for j in range(self.m):
                state = self._run_block(j, state)
        out: list = []
        _flatten(state, out)
        outs, cots = with_cotangent(out, grads)
        wrt = [t for t in leaves if t.requires_grad]
        if not outs:
            return [None] * len(leaves), [None] * len(self.params)
        got = torch.autograd.grad(
            outs, wrt + self.params, cots, allow_unused=True, create_graph=True
        )
        it = iter(got[: len(wrt)])
        return [next(it) if t.requires_grad else None for t in leaves], list(got[len(wrt) :])

    def finish(self):
        if self.store is None:
            return
        self.slots.release()


class _Sequential(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run, tree, n_leaves, *tensors):
        ctx.set_materialize_grads(False)
        leaves = tensors[:n_leaves]
        out = run.forward(tree, leaves)
        ctx.run, ctx.tree, ctx.n_leaves = run, tree, n_leaves
        ctx.save_for_backward(*tensors)
        for t in out:
            if not _differentiable(t):
                ctx.mark_non_differentiable(t)
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        run = ctx.run
        tensors = ctx.saved_tensors
        leaves = tensors[: ctx.n_leaves]
        if torch.is_grad_enabled():  # create_graph=True
            lam, grad_params = run.double_backward(ctx.tree, leaves, grads)
            run.used = True  # a later backward (retain_graph=True) sweeps again
            run.finish()
        else:
            lam, grad_params = run.backward(ctx.tree, leaves, grads)
        return (None, None, None, *lam, *grad_params)


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
    - `store`: a :class:`~vlcc_adjoint.storage.TieredStore` (without
      ``plan=``) whose tier ``k - 1`` holds the schedule's level ``k >= 1``;
      default: unbounded memory tiers.
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
    store, own_store = schedule_store(simulate(schedule), store)
    run = _Layers(
        layers,
        bounds,
        schedule,
        store,
        own_store,
        params,
        block_params,
        preserve_rng_state,
        use_reentrant,
    )
    try:
        out = _Sequential.apply(run, tree, len(leaves), *leaves, *params)
    except BaseException:
        run.finish()
        if own_store:
            store.close()
        raise
    if own_store:
        weakref.finalize(run, close_quietly, store)
    return _unflatten(run.out_tree, list(out))
