"""checkpoint_sequence: the gradient of a long chain of steps, under a vlcc schedule.

``u_{i+1} = step(u_i)`` for ``i = 0 .. n-1`` (an RNN over time, a neural
ODE, a stack of identical residual blocks) is, for autograd, a chain of ``n``
tapes: plain backpropagation keeps all of them (memory ``O(n)``);
``torch.utils.checkpoint.checkpoint_sequential`` keeps ``s`` segment inputs
and re-tapes one segment at a time (memory ``s + n/s`` tapes, recomputation
``n - n/s``, and no way below ``~2 sqrt(n)`` tapes).  Here the chain is one
``torch.autograd.Function`` whose backward pass *interprets a vlcc schedule
table* over blocks of steps: the engine of :mod:`vlcc_adjoint.torch._engine`
(shared with :func:`~vlcc_adjoint.torch.checkpoint_sequential`) gives each
action the semantics of :mod:`vlcc_adjoint.schedules.actions`; here a block
is ``block`` consecutive calls of ``step``, a ``Reverse`` differentiates
w.r.t. ``(u_i, inputs, *params)`` and parameter gradients are accumulated.

The forward pass of the Function runs the table up to its first
``Reverse`` (the forward sweep), then runs the last block *with* grad and
keeps that tape for ``Reverse(n - 1)``: a step is never evaluated twice in a
row for nothing, and (one step per block) the number of step evaluations is
exactly ``forward_count + n`` (``forward_count`` from
:func:`vlcc_adjoint.schedules.simulate`; plain autograd evaluates ``n``):
the ``forward_count`` ones without grad, the ``n`` taped ones once each.

Blocks, and how this compares with ``checkpoint_sequential``.  Storing
states, not tapes, a one-step-per-block schedule re-tapes every step in the
backward pass, so it evaluates at least ``n - 1`` steps more than plain
autograd, where ``checkpoint_sequential`` with ``s`` segments evaluates
``n - n/s`` more (it re-tapes a whole segment at once) at the price of
``n/s`` tapes of memory.  A schedule step may therefore be a *block* of
``block`` consecutive steps, taped together by ``Reverse``; every schedule
then works over ``ceil(n / block)`` blocks.  ``StoreAll`` over blocks is
``checkpoint_sequential`` with ``n / block`` segments, ``Revolve`` over
blocks its recursive refinement, which keeps working far below
``checkpoint_sequential``'s floor of ``~2 sqrt(n)`` states;
:func:`plan_sequence` picks ``(block, snapshots)`` for a memory budget.  At
equal memory the number of recomputed steps is then about the same as the
best ``checkpoint_sequential`` (both near the bound ``n - memory / tape``:
every step not taped in the forward pass is taped again); what differs is
their cost: ours run under ``no_grad``, ``use_reentrant=False`` builds the
graph and routes every saved tensor through Python hooks in the forward
pass (``benchmarks/bench_torch.py`` measures both).

Storage levels.  The store owns every level of the schedule, numbered as
in the schedule: ``store.tiers[0]`` is a
:class:`~vlcc_adjoint.storage.DeviceTier` whose records are clones of the
state's tensors on their own devices (with their ``_version`` counters: a
kept state changed in place is refused at its ``Load``), ``store.tiers[k]``
holds level ``k``, and the store follows ``io_plan(schedule)``, so it reads
restores ahead, evicts with foresight and checks every call against the
plan::

    plan = io_plan(schedule)
    store = TieredStore([DeviceTier(), MemoryTier(), ZarrTier(path)], plan=plan)
    u = checkpoint_sequence(step, x, n, schedule=schedule, store=store)

Default: a store of the run's own, one unbounded ``MemoryTier`` per level
``>= 1``.  A store runs one run at a time: a new forward pass restarts its
plan (:meth:`~vlcc_adjoint.storage.TieredStore.restart`), deleting what a run
whose backward pass never ran left behind.  The earlier form, host tiers
without a plan whose tier ``k - 1`` holds level ``k``, still works with a
``DeprecationWarning``: its tiers are adopted below a ``DeviceTier`` in a
planned store of the run's own (the caller's store object sees none of that
run's statistics, and its tiers are left open).

Gradients of what ``step`` closes over.  Autograd routes gradients only to
the inputs of a Function, so the tensors ``step`` uses besides its argument
are passed as explicit inputs: the parameters of ``step`` when it is an
``nn.Module`` (or a bound method of one, or a ``functools.partial`` / closure
over modules and tensors), plus whatever ``params=`` lists.  They then
receive their gradients under ``loss.backward()`` and
``torch.autograd.grad(loss, ...)`` alike, as with
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``.  A leaf
tensor that requires grad, reached by ``step`` and not listed, would get no
gradient: the first ``Reverse`` walks the tape and raises a ``ValueError``
naming its shape.  (Tensors computed *outside* ``step`` from listed
parameters, e.g. ``w = 2 * layer.weight``, propagate correctly.)

Higher derivatives.  Under ``create_graph=True`` (``torch.autograd.grad``
of a gradient, Hessian-vector products) the backward pass re-runs the whole
chain with grad from the caller's own input tensors and differentiates that
tape with ``create_graph=True``: the gradient is then a differentiable
function of the input, the per-step inputs, the parameters and the
cotangent, exact to rounding, at the memory of plain autograd for that one
backward pass.

Randomness.  With ``preserve_rng_state=True`` (the default, as in
``torch.utils.checkpoint``) the CPU generator state (and the CUDA one of
every device the state lives on) is recorded with every snapshot and at
the end of every ``Advance`` (a 5 KB copy, not per step), restored before
each recomputation, and the backward pass runs under
``torch.random.fork_rng``: dropout masks are reproduced exactly and the
caller's generator ends where a plain forward pass leaves it.  Other
sources of nondeterminism (non-deterministic kernels, Python-side
randomness, state kept by ``step`` between calls) are not replayed: steps
must be functions of their inputs.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import VlccTypeError, VlccValueError
from ..schedules import Online, Revolve, Schedule, default_snapshots
from ._engine import Chain, Checkpointed, Recompute
from ._recompute import close_quietly, collect_params, planned_store
from ._state import register_providers

if TYPE_CHECKING:
    from ..storage import TieredStore

__all__ = ["checkpoint_sequence"]


@functools.lru_cache(maxsize=32)
def _default_schedule(n: int, snapshots: int) -> Schedule:
    return Revolve(n, snapshots)


def _resolve_schedule(schedule, snapshots, n_blocks: int) -> Schedule:
    if schedule is None:
        if snapshots is None:
            snapshots = default_snapshots(n_blocks, repetitions=2)
        if isinstance(snapshots, bool) or not isinstance(snapshots, int) or snapshots < 1:
            raise VlccValueError(f"snapshots must be an int >= 1, got {snapshots!r}")
        return _default_schedule(n_blocks, min(snapshots, n_blocks))
    if snapshots is not None:
        raise VlccValueError("give either schedule= or snapshots= (Revolve's slots), not both")
    if isinstance(schedule, Online) and schedule.n_steps is None:
        raise VlccValueError(
            "checkpoint_sequence knows its number of steps: use Revolve, "
            "Multistage, StoreAll, Periodic or Online(steps, snapshots=...)"
        )
    if not isinstance(schedule, Schedule):
        raise VlccTypeError(
            f"schedule must be a vlcc_adjoint.schedules.Schedule (Revolve, "
            f"Multistage, ...), got {type(schedule).__name__}"
        )
    if schedule.n_steps != n_blocks:
        raise VlccValueError(
            f"the schedule is for {schedule.n_steps} steps, but the chain has "
            f"{n_blocks} (steps / block, rounded up); build it with "
            f"{type(schedule).__name__}({n_blocks}, ...)"
        )
    return schedule


# -- the state and what step closes over -------------------------------------------------


def _split_state(x):
    """``(leaves, rebuild)`` for a tensor or a tuple/list of tensors."""
    if isinstance(x, torch.Tensor):
        return [x], None
    if isinstance(x, (tuple, list)) and x and all(isinstance(t, torch.Tensor) for t in x):
        kind = type(x)
        if kind not in (tuple, list):  # named tuples: rebuild by position
            return list(x), lambda leaves: kind(*leaves)
        return list(x), kind
    raise VlccTypeError(
        f"checkpoint_sequence: the state must be a tensor or a tuple/list of "
        f"tensors (e.g. an LSTM's (h, c)), got {type(x).__name__}"
    )


# -- the chain of steps ------------------------------------------------------------------


class StepChain(Chain):
    """The blocks of :func:`checkpoint_sequence`: ``block`` consecutive calls of
    one `step` each (the last block the rest), the state a fixed list of
    tensors (rebuilt into the caller's tuple or list around each call), and the
    per-step inputs an extra indexed by step.

    Every block runs the same code, so the closure check runs once; steps must
    leave their argument unchanged (a kept state changed in place is caught at
    its ``Load``), so no copies are made for them.
    """

    name = "checkpoint_sequence"

    def __init__(self, step, n, block, inputs, rebuild, leaves, params) -> None:
        self.step = step
        self.n = n
        self.block = block
        self.blocks = -(-n // block)
        self.inputs = inputs  # per-step inputs (leading dim n), or None
        self.extras = [] if inputs is None else [inputs]
        self.rebuild = rebuild
        self.n_leaves = len(leaves)
        self.signature = [(t.shape, t.dtype) for t in leaves]
        self.params = params

    def span(self, j: int) -> tuple[int, int]:
        return j * self.block, min((j + 1) * self.block, self.n)

    def closure_key(self, j: int) -> int:
        return 0

    def modified(self, i: int) -> str:
        return (
            f"checkpoint_sequence: the snapshot of step {i * self.block} was modified in "
            "place; `step` must return a new state and leave its argument unchanged"
        )

    def foreign(self, j: int, var: torch.Tensor) -> Exception:
        return VlccValueError(
            f"checkpoint_sequence: `step` uses a tensor of shape {tuple(var.shape)} "
            f"and dtype {var.dtype} that requires grad but is not an input of the "
            "checkpointed sequence, so it would get no gradient; pass it with "
            "params=[...] (module parameters are found automatically when step is "
            "the module, a bound method of it, or a closure/partial over it)"
        )

    def run(self, a: int, b: int, tree, tensors: list, xs: list | None):
        start = a * self.block
        x = None if not xs or xs[0] is None else xs[0]
        for i in range(start, min(b * self.block, self.n)):
            tensors = self._call(i, tensors, None if x is None else x[i - start])
        return tree, tensors

    def _call(self, i: int, leaves: list, x_i=None) -> list:
        u = leaves[0] if self.rebuild is None else self.rebuild(leaves)
        if self.inputs is None:
            out = self.step(u)
        else:
            out = self.step(self.inputs[i] if x_i is None else x_i, u)
        if self.rebuild is None:
            if not isinstance(out, torch.Tensor):
                raise VlccTypeError(
                    f"checkpoint_sequence: step {i} returned a "
                    f"{type(out).__name__}; it must return the next state, a "
                    "tensor like its input"
                )
            out = [out]
        else:
            if not isinstance(out, (tuple, list)) or len(out) != self.n_leaves:
                raise VlccTypeError(
                    f"checkpoint_sequence: step {i} returned {type(out).__name__}; "
                    f"it must return the next state, {self.n_leaves} tensors like "
                    "its input"
                )
            out = list(out)
        sig = [(t.shape, t.dtype) if isinstance(t, torch.Tensor) else None for t in out]
        if sig != self.signature:
            raise VlccValueError(
                f"checkpoint_sequence: step {i} returned a state of shapes/dtypes "
                f"{sig}, its input was {self.signature}; a step must map the state "
                "to a state of the same shapes and dtypes"
            )
        return out


def checkpoint_sequence(
    step: Callable,
    x: Any,
    steps: int,
    *,
    schedule: Schedule | None = None,
    snapshots: int | None = None,
    store: TieredStore | None = None,
    block: int = 1,
    inputs: torch.Tensor | None = None,
    params: Sequence[torch.Tensor] | None = None,
    preserve_rng_state: bool = True,
) -> Any:
    """Apply `step` `steps` times, with a backward pass that follows a vlcc schedule.

    ``u = x; for i in range(steps): u = step(u)`` (or ``u = step(inputs[i], u)``
    with `inputs`, the calling convention of ``nn.RNNCell``/``GRUCell``/
    ``LSTMCell``); returns ``u``.  The forward pass keeps only the
    schedule's snapshots; the backward pass recomputes what it needs (see
    the module docstring for the action-by-action semantics).

    **Arguments:**

    - `step`: an ``nn.Module`` or any callable mapping a state to a state of
      the same shapes and dtypes.  It must be deterministic given its inputs
      and the random generator state (dropout is fine, see
      `preserve_rng_state`).
    - `x`: the initial state: a tensor, or a tuple/list of tensors (an LSTM's
      ``(h, c)``).
    - `steps`: the number of steps ``n >= 1``.
    - `schedule`: a :class:`~vlcc_adjoint.schedules.Schedule` for
      ``ceil(steps / block)`` steps (``Revolve``, ``Multistage``, ``StoreAll``,
      ...).  Default: ``Revolve(ceil(steps / block), snapshots)``.
    - `snapshots`: the default Revolve's slots (default
      ``vlcc_adjoint.schedules.default_snapshots(n, repetitions=2)``: each block
      recomputed at most twice).
    - `store`: a :class:`~vlcc_adjoint.storage.TieredStore` of every level,
      ``TieredStore([DeviceTier(), MemoryTier(), ...], plan=io_plan(schedule))``
      (the module docstring); default: unbounded memory tiers.  A user's
      store is left open.
    - `block`: steps per schedule step (taped together in one ``Reverse``);
      ``StoreAll(ceil(n / block))`` with ``block = n / s`` is
      ``checkpoint_sequential`` with ``s`` segments.
    - `inputs`: optional per-step inputs, a tensor whose first dimension is
      `steps`; ``step(inputs[i], u)`` is called.  It receives gradients.
    - `params`: tensors `step` uses besides its arguments, to receive
      gradients.  A module's parameters (when `step` is a module, a bound
      method of one, or a closure / ``functools.partial`` over modules and
      tensors) are found automatically.
    - `preserve_rng_state`: replay the random generators during
      recomputation (see the module docstring).

    **Returns:** the final state ``u_n``, with the structure of `x`.

    With grad disabled, or when nothing requires grad, this is the plain loop.
    """
    register_providers()
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise VlccValueError(f"steps must be an int >= 1, got {steps!r}")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise VlccValueError(f"block must be an int >= 1, got {block!r}")
    leaves, rebuild = _split_state(x)
    if inputs is not None:
        if not isinstance(inputs, torch.Tensor) or inputs.dim() < 1 or inputs.shape[0] < steps:
            raise VlccValueError(
                f"inputs must be a tensor whose first dimension has at least "
                f"steps={steps} entries, got "
                f"{getattr(inputs, 'shape', type(inputs).__name__)}"
            )
    n_blocks = -(-steps // block)
    schedule = _resolve_schedule(schedule, snapshots, n_blocks)
    plist = collect_params(step, params)
    needs_grad = torch.is_grad_enabled() and (
        any(t.requires_grad for t in leaves)
        or bool(plist)
        or (inputs is not None and inputs.requires_grad)
    )
    if not needs_grad:
        u = x
        for i in range(steps):
            u = step(u) if inputs is None else step(inputs[i], u)
        return u
    store, own_store = planned_store(schedule, store, "checkpoint_sequence")
    chain = StepChain(step, steps, block, inputs, rebuild, leaves, plist)
    engine = Recompute(chain, schedule, store, own_store, preserve_rng_state)
    tensors = [*leaves, *chain.extras, *plist]
    try:
        out = Checkpointed.apply(engine, None, len(leaves), *tensors)
    except BaseException:
        engine.finish()
        raise
    if own_store:
        weakref.finalize(engine, close_quietly, store)
    out = list(out)
    return out[0] if rebuild is None else rebuild(out)
