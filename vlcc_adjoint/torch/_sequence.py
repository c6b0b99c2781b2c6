"""checkpoint_sequence: the gradient of a long chain of steps, under a vlcc schedule.

``u_{i+1} = step(u_i)`` for ``i = 0 .. n-1`` (an RNN over time, a neural
ODE, a stack of identical residual blocks) is, for autograd, a chain of ``n``
tapes: plain backpropagation keeps all of them (memory ``O(n)``);
``torch.utils.checkpoint.checkpoint_sequential`` keeps ``s`` segment inputs
and re-tapes one segment at a time (memory ``s + n/s`` tapes, recomputation
``n - n/s``, and no way below ``~2 sqrt(n)`` tapes).  Here the chain is one
``torch.autograd.Function`` whose backward pass *interprets a vlcc schedule
table*, with the semantics of :mod:`vlcc_adjoint.schedules.actions`:

=====================  ====================================================
action                 what it does here
=====================  ====================================================
``Advance(a, b)``      run blocks ``a .. b-1`` under ``no_grad``
``Save(i, 0)``         keep a clone of the state's tensors in a slot
``Save(i, k >= 1)``    ``store.save(i, tensors, k - 1)`` (numpy, via the
                       torch state provider)
``Load(i, k)``         the slot, or ``store.load(i, k - 1)`` moved back to
                       the state's device
``Delete``, ``Move``   free the slot / the store record; move between them
``Reverse(i)``         re-run block ``i`` with grad enabled from a detached,
                       ``requires_grad`` copy of ``u_i`` and call
                       ``torch.autograd.grad`` with the incoming cotangent
                       w.r.t. ``(u_i, inputs, *params)``; parameter
                       gradients are accumulated
=====================  ====================================================

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
pass (``benchmarks/bench_torch.py``: 2.6-4.3x less extra CPU time than
``use_reentrant=False``, within +-20% of ``use_reentrant=True``).

Storage levels follow :mod:`vlcc_adjoint.jax`: level 0 is a list of tensor
slots on the state's device; level ``k >= 1`` is ``store.tiers[k - 1]`` of a
:class:`~vlcc_adjoint.storage.TieredStore` built *without* ``plan=`` (an
``io_plan`` of the whole schedule would describe level 0 too, which never
reaches the store).  Default: one unbounded ``MemoryTier`` per level >= 1.

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

from ..errors import VlccRuntimeError, VlccTypeError, VlccValueError
from ..schedules import ActionKind, Online, Revolve, Schedule, default_snapshots, simulate
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

__all__ = ["checkpoint_sequence"]

_REVERSE = int(ActionKind.REVERSE)

# Records (step, store level) a run left in a user's store: the next run on
# that store deletes them first (a forward whose backward never ran).
_HELD: weakref.WeakKeyDictionary[object, set] = weakref.WeakKeyDictionary()


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


# -- the interpreter ---------------------------------------------------------------------


class _Run:
    """One forward/backward of a chain: the machine of
    :mod:`~vlcc_adjoint.schedules.actions` over torch tensors."""

    def __init__(
        self,
        step,
        n,
        block,
        schedule,
        store,
        own_store,
        inputs,
        rebuild,
        n_leaves,
        params,
        preserve_rng,
    ):
        self.step = step
        self.n = n
        self.block = block
        self.m = schedule.n_steps  # blocks
        self.schedule = schedule
        self.table = schedule.table
        self.store = store
        self.own_store = own_store
        self.inputs = inputs  # per-step inputs (leading dim n), or None
        self.rebuild = rebuild
        self.n_leaves = n_leaves
        self.params = params
        self.preserve = preserve_rng
        self.devices: list[int] = []
        self.slots = Slots(store)  # level 0 and the store
        self.rngs: dict[tuple[int, int], object] = {}
        self.cur = None  # the state in hand (list of tensors)
        self.cur_step = -1
        self.rng = None  # generator state belonging to the state in hand
        self.rng0 = None  # ... and to u_0 (for create_graph=True)
        self.tape = None  # (block, inputs, outputs) of the last block, taped in forward
        self.final = None
        self.final_rng = None
        self.signature = None
        self.calls = 0  # step evaluations (for tests and statistics)
        self.checked = False
        self.used = False
        self.index = -1
        self.lam = None
        self.grad_inputs = None
        self.grad_params = None

    # -- one step, one block ---------------------------------------------------------

    def _call(self, i: int, leaves: list, x_i=None):
        u = leaves[0] if self.rebuild is None else self.rebuild(leaves)
        if self.inputs is None:
            out = self.step(u)
        else:
            out = self.step(self.inputs[i] if x_i is None else x_i, u)
        self.calls += 1
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

    def _advance(self, a: int, b: int):
        """Blocks a .. b-1 under no_grad, from the state in hand."""
        if self.preserve:
            set_rng(self.rng, self.devices)
        leaves = self.cur
        with torch.no_grad():
            for i in range(a * self.block, min(b * self.block, self.n)):
                leaves = self._call(i, leaves)
        self.cur, self.cur_step = leaves, b
        if self.preserve:
            self.rng = get_rng(self.devices)
        if b == self.m and self.final is None:  # the sweep reached u_n (Online)
            self.final = [t.detach() for t in leaves]
            self.final_rng = self.rng

    def _tape(self, j: int):
        """Block j with grad, from detached copies of the state in hand:
        ``(state inputs, per-step inputs of the block or None, outputs)``."""
        if self.preserve:
            set_rng(self.rng, self.devices)
        start, stop = j * self.block, min((j + 1) * self.block, self.n)
        with torch.enable_grad():
            leaves = [
                t.detach().requires_grad_(t.is_floating_point() or t.is_complex()) for t in self.cur
            ]
            xs = None
            if self.inputs is not None and self.inputs.requires_grad:
                xs = self.inputs[start:stop].detach().requires_grad_(True)
            out = leaves
            for i in range(start, stop):
                out = self._call(i, out, None if xs is None else xs[i - start])
        return leaves, xs, out

    # -- storage -----------------------------------------------------------------------

    def _save(self, i: int, level: int):
        if self.cur_step != i:  # pragma: no cover - simulate() validated the table
            raise VlccRuntimeError(f"Save({i}, {level}) without u_{i} in hand")
        self.slots.save(i, level, self.cur)
        self.rngs[(i, level)] = self.rng

    def _load(self, i: int, level: int):
        self.cur = self.slots.load(
            i,
            level,
            lambda loaded: [t.to(d.device, non_blocking=True) for t, d in zip(loaded, self.like)],
            f"checkpoint_sequence: the snapshot of step {i * self.block} was modified in "
            "place; `step` must return a new state and leave its argument unchanged",
        )
        self.cur_step = i
        self.rng = self.rngs[(i, level)]

    def _delete(self, i: int, level: int):
        self.slots.delete(i, level)
        del self.rngs[(i, level)]

    def _move(self, i: int, src: int, dst: int):
        self.slots.move(
            i, src, dst, lambda loaded: [t.to(d.device) for t, d in zip(loaded, self.like)]
        )
        self.rngs[(i, dst)] = self.rngs.pop((i, src))

    # -- the passes --------------------------------------------------------------------

    def _rows(self, start: int, stop: int):
        t = self.table[start:stop]
        return zip(
            range(start, stop),
            t["kind"].tolist(),
            t["a"].tolist(),
            t["b"].tolist(),
            t["level"].tolist(),
            t["dst"].tolist(),
        )

    _dispatch = dispatch

    def forward(self, leaves: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        self.like = [t.detach() for t in leaves]
        self.signature = [(t.shape, t.dtype) for t in leaves]
        self.devices = rng_devices(leaves)
        if self.store is not None:
            stale = _HELD.setdefault(self.store, set())
            for step, level in sorted(stale):  # left by a run whose backward never ran
                self.store.delete(step, level)
            stale.clear()
            self.slots.held = stale
        kinds = self.table["kind"]
        rev = (kinds == _REVERSE).nonzero()[0]
        self.split = int(rev[0]) if len(rev) else len(self.table)
        self.cur, self.cur_step = [t.detach() for t in leaves], 0
        if self.preserve:
            self.rng = self.rng0 = get_rng(self.devices)
        for index, kind, a, b, level, dst in self._rows(0, self.split):
            self.index = index
            self._dispatch(kind, a, b, level, dst)
        if self.final is None:
            # Holding u_{m-1} (Reverse(m-1) comes first): tape the last block
            # now, the output is its result and Reverse(m-1) reuses the tape.
            if self.cur_step != self.m - 1:  # pragma: no cover - simulate() validated
                raise VlccRuntimeError("the schedule's forward sweep does not end at the last step")
            xin, xs, out = self._tape(self.m - 1)
            self.tape = (self.m - 1, xin, xs, out)
            self.final = [t.detach() for t in out]
            self.final_rng = get_rng(self.devices) if self.preserve else None
        if self.preserve:  # the caller's generator ends where a plain loop leaves it
            set_rng(self.final_rng, self.devices)
        return self.final

    def backward(self, grads):
        if self.used:
            raise VlccRuntimeError(
                "checkpoint_sequence: its backward pass runs once per forward pass (the "
                "schedule consumes its snapshots); run the forward pass again, or keep the "
                "tapes with plain autograd if you need retain_graph=True"
            )
        self.used = True
        self.lam = [None if g is None else g for g in grads]
        self.grad_params = [None] * len(self.params)
        if self.inputs is not None and self.inputs.requires_grad:
            self.grad_inputs = torch.zeros_like(self.inputs)
        with torch.random.fork_rng(devices=self.devices, enabled=self.preserve):
            for index, kind, a, b, level, dst in self._rows(self.split, len(self.table)):
                self.index = index
                self._dispatch(kind, a, b, level, dst)
        return self.lam, self.grad_inputs, self.grad_params

    def double_backward(self, leaves, grads):
        """The gradient as a differentiable function of `leaves`, the per-step inputs,
        the parameters and the cotangent (``create_graph=True``): the whole chain
        again, with grad, from the forward pass's own input tensors."""
        if self.used:
            raise VlccRuntimeError(
                "checkpoint_sequence: its backward pass runs once per forward pass; run the "
                "forward pass again"
            )
        self.used = True
        with torch.random.fork_rng(devices=self.devices, enabled=self.preserve):
            if self.preserve:
                set_rng(self.rng0, self.devices)
            out = list(leaves)
            for i in range(self.n):
                out = self._call(i, out)
        outs, cots = with_cotangent(out, grads)
        xs = [self.inputs] if self.inputs is not None and self.inputs.requires_grad else []
        wrt = [t for t in leaves if t.requires_grad] + xs + self.params
        got = (
            torch.autograd.grad(outs, wrt, cots, allow_unused=True, create_graph=True)
            if outs
            else [None] * len(wrt)
        )
        it = iter(got)
        lam = [next(it) if t.requires_grad else None for t in leaves]
        grad_inputs = next(it) if xs else None
        return lam, grad_inputs, list(it)

    def _reverse(self, j: int):
        if self.tape is not None and self.tape[0] == j:
            _, xin, xs, out = self.tape
            self.tape = None
        else:
            if self.cur_step != j:  # pragma: no cover - simulate() validated the table
                raise VlccRuntimeError(f"Reverse({j}) without u_{j} in hand")
            xin, xs, out = self._tape(j)
        self.cur, self.cur_step = None, -1
        outs, cots = with_cotangent(out, self.lam)
        if not self.checked:
            self._check_closure(out, xin, xs)
        wrt = [t for t in xin if t.requires_grad]
        extra = [xs] if xs is not None else []
        if not outs:  # the cotangent is zero from here back
            self.lam = [None] * len(xin)
            return
        got = torch.autograd.grad(
            outs, wrt + extra + self.params, cots, allow_unused=True, retain_graph=True
        )
        it = iter(got[: len(wrt)])
        self.lam = [next(it) if t.requires_grad else None for t in xin]
        k = len(wrt)
        if xs is not None:
            g = got[k]
            k += 1
            if g is not None:
                start = j * self.block
                self.grad_inputs[start : start + g.shape[0]] += g
        for p, g in enumerate(got[k:]):
            if g is not None:
                acc = self.grad_params[p]
                self.grad_params[p] = g if acc is None else acc.add_(g)

    def _check_closure(self, out, xin, xs):
        """Raise if the tape reaches a leaf that requires grad and is not an input."""
        self.checked = True
        ours = {id(t) for t in xin} | {id(p) for p in self.params}
        if xs is not None:
            ours.add(id(xs))
        stops = {p.grad_fn for p in self.params if p.grad_fn is not None}
        var = foreign_leaf(out, ours, stops)
        if var is not None:
            raise VlccValueError(
                f"checkpoint_sequence: `step` uses a tensor of shape {tuple(var.shape)} "
                f"and dtype {var.dtype} that requires grad but is not an input of the "
                "checkpointed sequence, so it would get no gradient; pass it with "
                "params=[...] (module parameters are found automatically when step is "
                "the module, a bound method of it, or a closure/partial over it)"
            )

    def finish(self):
        """Delete what this run left in the store; close the store if it is ours."""
        store = self.store
        if store is None:
            return
        try:
            self.slots.release()
        finally:
            if self.own_store:
                store.close()


class _Sequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run, *tensors):
        out = run.forward(tensors[: run.n_leaves])
        ctx.leaves = tensors[: run.n_leaves]  # for create_graph=True (the caller's tensors)
        ctx.run = run
        ctx.n_leaves = run.n_leaves
        ctx.n_inputs = 0 if run.inputs is None else 1
        for t in out:
            if not (t.is_floating_point() or t.is_complex()):
                ctx.mark_non_differentiable(t)
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        run = ctx.run
        if run is None:
            raise VlccRuntimeError(
                "checkpoint_sequence: its backward pass runs once per forward pass (the "
                "schedule consumes its snapshots); run the forward pass again, or keep the "
                "tapes with plain autograd if you need retain_graph=True"
            )
        try:
            if torch.is_grad_enabled():  # create_graph=True: a differentiable gradient
                lam, grad_inputs, grad_params = run.double_backward(ctx.leaves, grads)
            else:
                lam, grad_inputs, grad_params = run.backward(grads)
        finally:
            ctx.run = ctx.leaves = None
            run.finish()
        head = list(lam) + ([grad_inputs] if ctx.n_inputs else [])
        return (None, *head, *grad_params)


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
    - `store`: a :class:`~vlcc_adjoint.storage.TieredStore` (without ``plan=``)
      whose tier ``k - 1`` holds the schedule's level ``k >= 1``; default:
      unbounded memory tiers.  Level 0 is always tensors on the state's
      device.  A user's store is left open.
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
    store, own_store = schedule_store(simulate(schedule), store)
    run = _Run(
        step,
        steps,
        block,
        schedule,
        store,
        own_store,
        inputs,
        rebuild,
        len(leaves),
        plist,
        preserve_rng_state,
    )
    tensors = [*leaves, *([inputs] if inputs is not None else []), *plist]
    try:
        out = _Sequence.apply(run, *tensors)
    except BaseException:
        run.finish()
        raise
    if own_store:
        weakref.finalize(run, close_quietly, store)
    out = list(out)
    return out[0] if rebuild is None else rebuild(out)
