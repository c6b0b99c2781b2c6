"""The recompute engine of the torch drop-ins: one client of the action machine.

:func:`~vlcc_adjoint.torch.checkpoint_sequence` (a chain of steps) and
:func:`~vlcc_adjoint.torch.checkpoint_sequential` (a list of layers) are
one computation: a sequence of *blocks* ``0 .. m-1`` whose backward pass
follows a schedule over the blocks.  They differ only in what a block is
and what the state between blocks may be; that difference is a
:class:`Chain` (the sequence's steps, the layers of a segment), handed to
the one engine here, :class:`Recompute`.  The engine is a client of
:class:`~vlcc_adjoint.schedules.Machine`, the loop that runs every schedule
table of the package, and gives each action the semantics of
:mod:`vlcc_adjoint.schedules.actions` over torch tensors:

=====================  ====================================================
action                 what it does here
=====================  ====================================================
``Advance(a, b)``      run blocks ``a .. b-1`` under ``no_grad``
``Save(i, k)``         keep the state in hand (the input of block ``i``):
                       a clone on its own device at level 0, the store's
                       level ``k`` otherwise
``Load(i, k)``         make a kept state the one in hand (a level-0 state
                       changed in place since it was kept is an error)
``Delete``, ``Move``   free a kept state / move it between levels
``Reverse(i)``         re-run block ``i`` with grad from detached,
                       ``requires_grad`` copies of its input and
                       ``torch.autograd.grad`` the incoming cotangent to
                       the input, the block's per-step inputs and the
                       tensors the block closes over; their gradients
                       are accumulated
=====================  ====================================================

The two passes.  The forward pass of the autograd Function runs the
machine in pull mode (``returns=(REVERSE,)``) up to the table's first
``Reverse`` (revolve's *firsturn*: the schedule's forward sweep), then, when
the sweep did not reach ``u_m`` itself, runs the last block *with* grad and
keeps that tape for ``Reverse(m - 1)``, so that no block is evaluated twice
in a row for nothing: one step per block evaluates exactly
``forward_count + n`` steps (plain autograd: ``n``).  The backward pass
runs the rest of the table, from that ``Reverse`` on, in push mode.

Randomness.  With ``preserve_rng_state=True`` the CPU generator state (and
the CUDA one of every device the state lives on) is recorded with every
kept state and at the end of every ``Advance``, restored before each
recomputation, and the backward pass runs under ``torch.random.fork_rng``:
dropout draws the same masks and the caller's generator ends where a plain
forward pass leaves it.

Higher derivatives.  Under ``create_graph=True`` the backward pass runs
the whole sequence again with grad from the Function's own inputs and
differentiates that tape with ``create_graph=True`` (exact, at the memory
of plain autograd for that one backward pass), unless the chain refuses it
(``checkpoint_sequential(use_reentrant=True)``, as torch does).

In-place changes.  The Function saves its inputs with
``save_for_backward``, so an input or a parameter changed in place between
the forward and the backward pass raises torch's own error instead of
recomputing from changed values; a state kept at level 0 carries the
``_version`` counters its tensors had when kept, and its ``Load`` raises
the chain's message when they moved.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..errors import VlccRuntimeError, VlccValueError
from ..schedules import REVERSE, Machine, Schedule
from ._recompute import foreign_leaf, get_rng, rng_devices, set_rng, with_cotangent

__all__ = ["Chain", "Checkpointed", "Recompute", "differentiable"]


def differentiable(t: torch.Tensor) -> bool:
    """Whether `t` can carry a gradient (floating point or complex)."""
    return t.is_floating_point() or t.is_complex()


class Chain:
    """What a sequence of blocks is: the part of a drop-in the engine asks.

    A subclass describes its blocks; the engine (:class:`Recompute`) runs
    the schedule over them.  The state between blocks is a list of tensors
    and a *tree* that the chain alone reads (the structure around the
    tensors; the engine keeps it with every kept state).

    **Attributes:**

    - `name`: the drop-in's name, which starts its error messages.
    - `blocks`: ``m``, the schedule's steps.
    - `extras`: tensors indexed by step along their first dimension (a
      recurrent cell's per-step inputs): inputs of the Function after the
      state; block ``j`` reads rows ``span(j)`` of them.
    - `params`: the tensors the blocks close over, inputs of the Function
      after the extras: they receive gradients.
    - `protect`: blocks may change their input in place (an
      ``nn.ReLU(inplace=True)`` first layer): the engine hands them copies
      of a kept state and of the caller's input.
    - `repeatable`: a second backward pass (``retain_graph=True``) sweeps
      the schedule again; otherwise it raises.
    - `graph_error`: the message a ``create_graph=True`` backward pass
      raises, or ``None`` when it is supported.
    """

    name: str = "checkpoint"
    blocks: int = 0
    extras: list[torch.Tensor]
    params: list[torch.Tensor]
    protect: bool = False
    repeatable: bool = False
    graph_error: str | None = None

    def span(self, j: int) -> tuple[int, int]:
        """The rows ``(start, stop)`` of the extras that block `j` reads."""
        return 0, 0

    def run(
        self, a: int, b: int, tree: Any, tensors: list, xs: list | None
    ) -> tuple[Any, list[torch.Tensor]]:
        """Blocks ``a .. b-1`` from the state ``(tree, tensors)``, under the
        caller's grad mode; returns the state after them.  `xs`, when given,
        holds per extra the rows ``span(a)`` to read instead of the extra's
        own (taped copies; ``None`` for an extra without grad)."""
        raise NotImplementedError

    def block_params(self, j: int) -> Sequence[int]:
        """Indices into `params` of the tensors block `j` closes over."""
        return range(len(self.params))

    def closure_key(self, j: int) -> int:
        """Blocks of equal key run the same code: the closure check of
        :meth:`Recompute.reverse` runs once per key."""
        return j

    def modified(self, i: int) -> str:
        """The message when the state kept as the input of block `i` was
        changed in place."""
        return f"{self.name}: the kept input of block {i} was modified in place"

    def foreign(self, j: int, var: torch.Tensor) -> Exception:
        """The error for a tensor block `j` reaches that requires grad and is
        not an input (it would get no gradient)."""
        return VlccValueError(
            f"{self.name}: block {j} uses a tensor of shape {tuple(var.shape)} that "
            "requires grad but is not an input, so it would get no gradient"
        )


class Recompute:
    """One forward and backward pass of a :class:`Chain` under a schedule.

    The machine's client (:class:`~vlcc_adjoint.schedules.ActionClient`):
    :meth:`advance`, :meth:`save`, :meth:`load`, :meth:`delete`,
    :meth:`move`, :meth:`reverse` carry out the actions (module docstring);
    :class:`Checkpointed` calls :meth:`forward`, :meth:`backward` and
    :meth:`double_backward`.

    **Arguments:**

    - `chain`: the :class:`Chain`.
    - `schedule`: a valid :class:`~vlcc_adjoint.schedules.Schedule` over
      ``chain.blocks`` steps.
    - `store`: the :class:`~vlcc_adjoint.storage.TieredStore` of every level,
      following the schedule's plan (:func:`._recompute.planned_store`):
      tier 0 a :class:`~vlcc_adjoint.storage.DeviceTier` whose records are
      ``(clones, their _version counters)``, tier ``k`` level ``k``.
    - `own_store`: the store was made for this run (closed with it).
    - `preserve_rng`: record and replay the random generators.
    """

    def __init__(
        self, chain: Chain, schedule: Schedule, store, own_store: bool, preserve_rng: bool
    ) -> None:
        self.chain = chain
        self.schedule = schedule
        self.m = chain.blocks
        self.store = store
        self.own_store = own_store
        self.closed = False  # this run closed its own store
        self.preserve = preserve_rng
        self.devices: list[int] = []
        self.kept: dict[tuple[int, int], tuple] = {}  # (step, level) -> (tree, devices, rng)
        self.machine: Machine | None = None  # the machine running now (for error notes)
        self.split = 0  # index of the table's first Reverse
        self.tree0: Any = None  # the tree of the Function's input
        self.tree: Any = None  # the state in hand: tree, tensors, step
        self.cur: list[torch.Tensor] | None = None
        self.cur_step = -1
        self.cur_kept = False  # the tensors in hand belong to a kept state (or the caller)
        self.rng: Any = None  # generator state belonging to the state in hand
        self.rng0: Any = None  # ... and to u_0
        self.tape: tuple | None = None  # (block, inputs, taped extras, outputs)
        self.tape_tree: Any = None  # the tree of the outputs of the last block taped
        self.final: list[torch.Tensor] | None = None
        self.final_tree: Any = None
        self.final_rng: Any = None
        self.lam: list = []
        self.grad_extras: list = []
        self.grad_params: list = []
        self.checked: set[int] = set()
        self.used = False

    # -- running blocks ----------------------------------------------------------------

    def _tape(self, j: int) -> tuple[list, list, list]:
        """Block `j` with grad, from detached copies of the state in hand:
        ``(inputs, taped extras, outputs)``; the outputs' tree is
        ``self.tape_tree``."""
        if self.preserve:
            set_rng(self.rng, self.devices)
        assert self.cur is not None
        start, stop = self.chain.span(j)
        with torch.enable_grad():
            xin = [t.detach().requires_grad_(differentiable(t)) for t in self.cur]
            xs = [
                e[start:stop].detach().requires_grad_(True) if e.requires_grad else None
                for e in self.chain.extras
            ]
            # Blocks that may work in place see copies (exact, and the identity for
            # the gradient): neither a leaf that requires grad nor a kept state changes.
            given = [t.clone() for t in xin] if self.chain.protect else xin
            self.tape_tree, out = self.chain.run(j, j + 1, self.tree, given, xs)
        return xin, xs, out

    def advance(self, a: int, b: int) -> None:
        """``Advance(a, b)``: blocks ``a .. b-1`` under ``no_grad``."""
        if self.preserve:
            set_rng(self.rng, self.devices)
        assert self.cur is not None
        # A kept state is copied before blocks that may work in place see it: a
        # later Load must return what was kept.
        cur = [t.clone() for t in self.cur] if self.cur_kept and self.chain.protect else self.cur
        with torch.no_grad():
            self.tree, self.cur = self.chain.run(a, b, self.tree, cur, None)
        self.cur_kept = False
        self.cur_step = b
        if self.preserve:
            self.rng = get_rng(self.devices)
        if b == self.m and self.final is None:  # the sweep reached u_m (Online)
            self.final = [t.detach() for t in self.cur]
            self.final_tree = self.tree
            self.final_rng = self.rng

    # -- storage -----------------------------------------------------------------------

    def save(self, i: int, level: int) -> None:
        """``Save(i, level)`` of the state in hand: at level 0 clones on their
        devices with their version counters, at a host level the tensors
        (the store captures them through the ``"torch"`` leaf provider)."""
        if self.cur_step != i or self.cur is None:  # pragma: no cover - simulate() validated
            raise VlccRuntimeError(f"Save({i}, {level}) without the input of block {i} in hand")
        if level == 0:
            self.store.save(i, _clones(self.cur), 0)
        else:
            self.store.save(i, [t.detach() for t in self.cur], level)
        self.kept[(i, level)] = (self.tree, [t.device for t in self.cur], self.rng)

    def load(self, i: int, level: int) -> None:
        """``Load(i, level)``: the kept state becomes the one in hand (a level-0
        record's own tensors, checked unchanged; a host record's, moved back
        to their devices)."""
        self.tree, devices, self.rng = self.kept[(i, level)]
        got = self.store.load(i, level)
        if level == 0:
            snap, versions = got
            if [t._version for t in snap] != versions:
                raise VlccRuntimeError(self.chain.modified(i))
            self.cur = snap
        else:
            self.cur = [t.to(d, non_blocking=True) for t, d in zip(got, devices)]
        self.cur_step = i
        self.cur_kept = True

    def delete(self, i: int, level: int) -> None:
        """``Delete(i, level)``."""
        self.store.delete(i, level)
        del self.kept[(i, level)]

    def move(self, i: int, src: int, dst: int) -> None:
        """``Move(i, src, dst)``: off the device the store captures the clones;
        onto it the tensors read are placed back on their devices."""
        devices = self.kept[(i, src)][1]
        if src == 0:
            self.store.move(i, 0, dst, fetch=_tensors_of)
        elif dst == 0:
            self.store.move(
                i, src, 0, place=lambda got: _clones([t.to(d) for t, d in zip(got, devices)])
            )
        else:
            self.store.move(i, src, dst)
        self.kept[(i, dst)] = self.kept.pop((i, src))

    # -- the passes --------------------------------------------------------------------

    def _run(self, machine: Machine) -> Any:
        """`machine`'s next handed-back row (or ``None`` at its end), a
        failure noted with the action it happened in."""
        self.machine = machine
        try:
            return next(machine, None)
        except BaseException as err:
            where = machine.describe()
            if where:
                err.add_note(f"{self.chain.name}: raised by {where}")
            raise

    def _sweep(self, tree: Any, leaves: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The schedule's forward sweep from the Function's input, then the last
        block with grad unless the sweep reached ``u_m``; returns the output's
        tensors (detached) and leaves its tree in ``final_tree``."""
        self.tree, self.cur, self.cur_step = tree, [t.detach() for t in leaves], 0
        self.cur_kept = True  # the caller's input: never changed by a block here
        self.rng = self.rng0
        self.final = None
        self.tape = None
        # A new run of the plan: what an earlier run left (a forward pass whose
        # backward never ran, a backward pass that failed) is deleted.
        self.store.restart()
        machine = Machine(self.schedule, self, returns=(REVERSE,))
        row = self._run(machine)
        if row is None:  # pragma: no cover - simulate() validated: the table has Reverses
            raise VlccRuntimeError(f"{self.schedule!r} has no Reverse action")
        self.split = machine.index
        if self.final is None:
            # Holding u_{m-1} (Reverse(m-1) comes first): tape the last block now;
            # its output is the result and Reverse(m-1) reuses the tape.
            if self.cur_step != self.m - 1:  # pragma: no cover - simulate() validated
                raise VlccRuntimeError("the schedule's forward sweep does not end at the last step")
            xin, xs, out = self._tape(self.m - 1)
            self.tape = (self.m - 1, xin, xs, out)
            self.final = [t.detach() for t in out]
            self.final_tree = self.tape_tree
            self.final_rng = get_rng(self.devices) if self.preserve else None
        if self.preserve:  # the caller's generator ends where a plain loop leaves it
            set_rng(self.final_rng, self.devices)
        return self.final

    def forward(self, tree: Any, leaves: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The Function's forward pass: the output's tensors; its tree is
        :attr:`final_tree`."""
        self.tree0 = tree
        self.devices = rng_devices(leaves)
        self.rng0 = get_rng(self.devices) if self.preserve else None
        return self._sweep(tree, leaves)

    def _again(self) -> None:
        """Refuse a second backward pass of a chain that runs one."""
        if self.used and not self.chain.repeatable:
            raise VlccRuntimeError(
                f"{self.chain.name}: its backward pass runs once per forward pass (the "
                "schedule consumes its snapshots); run the forward pass again, or keep the "
                "tapes with plain autograd if you need retain_graph=True"
            )

    def backward(self, leaves: Sequence[torch.Tensor], grads: Sequence) -> tuple[list, list, list]:
        """The Function's backward pass: the rest of the table from its first
        ``Reverse``.  Returns the gradients of the state's tensors, of the
        extras and of the params (``None`` where there is none)."""
        self._again()
        with torch.random.fork_rng(devices=self.devices, enabled=self.preserve):
            if self.used:  # a second backward (retain_graph=True): sweep again
                self._sweep(self.tree0, leaves)
            self.used = True
            self.lam = list(grads)
            self.grad_params = [None] * len(self.chain.params)
            self.grad_extras = [
                torch.zeros_like(e) if e.requires_grad else None for e in self.chain.extras
            ]
            self._run(Machine(self.schedule, self, start=self.split))
        return self.lam, self.grad_extras, self.grad_params

    def reverse(self, j: int) -> None:
        """``Reverse(j)``: tape block `j` (or take the forward pass's tape) and
        pull the cotangent back through it."""
        if self.tape is not None and self.tape[0] == j:
            _, xin, xs, out = self.tape
            self.tape = None
        else:
            if self.cur_step != j:  # pragma: no cover - simulate() validated the table
                raise VlccRuntimeError(f"Reverse({j}) without the input of block {j} in hand")
            xin, xs, out = self._tape(j)
        self.cur, self.cur_step = None, -1
        outs, cots = with_cotangent(out, self.lam)
        if not outs:  # the cotangent is zero from here back
            self.lam = [None] * len(xin)
            return
        params = self.chain.params
        mine = list(self.chain.block_params(j))
        key = self.chain.closure_key(j)
        if key not in self.checked:
            self._check_closure(j, outs, xin, xs, [params[p] for p in mine])
            self.checked.add(key)
        wrt = [t for t in xin if t.requires_grad]
        taped = [x for x in xs if x is not None]
        got = torch.autograd.grad(
            outs, wrt + taped + [params[p] for p in mine], cots, allow_unused=True
        )
        it = iter(got[: len(wrt)])
        self.lam = [next(it) if t.requires_grad else None for t in xin]
        k = len(wrt)
        start = self.chain.span(j)[0]
        for e, x in enumerate(xs):
            if x is not None:
                g = got[k]
                k += 1
                if g is not None:
                    self.grad_extras[e][start : start + g.shape[0]] += g
        for p, g in zip(mine, got[k:]):
            if g is not None:
                acc = self.grad_params[p]
                # The first gradient is copied: autograd may hand out a cotangent
                # itself, which a later in-place sum must not change.
                self.grad_params[p] = g.clone() if acc is None else acc.add_(g)

    def _check_closure(self, j: int, outs: list, xin: list, xs: list, mine: list) -> None:
        """Raise if block `j`'s tape reaches a leaf that requires grad and is
        neither an input nor a tensor the block closes over (autograd would
        give it no gradient)."""
        ours = {id(t) for t in xin} | {id(x) for x in xs if x is not None} | {id(p) for p in mine}
        stops = {p.grad_fn for p in mine if p.grad_fn is not None}
        var = foreign_leaf(outs, ours, stops)
        if var is not None:
            raise self.chain.foreign(j, var)

    def double_backward(
        self, leaves: Sequence[torch.Tensor], grads: Sequence
    ) -> tuple[list, list, list]:
        """The gradient as a differentiable function of the inputs, the extras,
        the params and the cotangent (``create_graph=True``): the whole sequence
        again, with grad, from the Function's own inputs."""
        if self.chain.graph_error is not None:
            raise VlccRuntimeError(self.chain.graph_error)
        self._again()
        self.used = True
        chain = self.chain
        with torch.random.fork_rng(devices=self.devices, enabled=self.preserve):
            if self.preserve:
                set_rng(self.rng0, self.devices)
            given = [t.clone() for t in leaves] if chain.protect else list(leaves)
            _, out = chain.run(0, self.m, self.tree0, given, None)
        outs, cots = with_cotangent(out, grads)
        extras = [e for e in chain.extras if e.requires_grad]
        wrt = [t for t in leaves if t.requires_grad] + extras + chain.params
        got = (
            torch.autograd.grad(outs, wrt, cots, allow_unused=True, create_graph=True)
            if outs
            else [None] * len(wrt)
        )
        it = iter(got)
        lam = [next(it) if t.requires_grad else None for t in leaves]
        grad_extras = [next(it) if e.requires_grad else None for e in chain.extras]
        return lam, grad_extras, list(it)

    def finish(self) -> None:
        """End a pass: free what it keeps (the tape, the records it left in the
        store); close the store if it is this run's and no pass can follow."""
        self.tape = None
        self.kept.clear()
        self.lam, self.grad_extras, self.grad_params = [], [], []
        if self.closed:
            return
        try:
            self.store.restart()
        finally:
            if self.own_store and not self.chain.repeatable:
                self.closed = True
                self.store.close()


def _clones(tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[int]]:
    """A level-0 record's payload: detached clones of `tensors` on their own
    devices, and the ``_version`` counters they have now (a change in place
    after this moves them, and ``Load`` refuses the record)."""
    snap = [t.detach().clone() for t in tensors]
    return snap, [t._version for t in snap]


def _tensors_of(payload: tuple[list[torch.Tensor], list[int]]) -> list[torch.Tensor]:
    """What a ``Move`` off the device captures of a level-0 payload: its clones."""
    return payload[0]


class Checkpointed(torch.autograd.Function):
    """The autograd Function of a :class:`Recompute`: inputs ``(engine,
    tree, n_leaves, *leaves, *extras, *params)``, outputs the final state's
    tensors."""

    @staticmethod
    def forward(
        ctx: Any, engine: Recompute, tree: Any, n_leaves: int, *tensors: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)
        out = engine.forward(tree, tensors[:n_leaves])
        ctx.engine, ctx.n_leaves = engine, n_leaves
        ctx.save_for_backward(*tensors)
        for t in out:
            if not differentiable(t):
                ctx.mark_non_differentiable(t)
        return tuple(out)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple:
        engine: Recompute = ctx.engine
        leaves = ctx.saved_tensors[: ctx.n_leaves]
        try:
            if torch.is_grad_enabled():  # create_graph=True: a differentiable gradient
                lam, grad_extras, grad_params = engine.double_backward(leaves, grads)
            else:
                lam, grad_extras, grad_params = engine.backward(leaves, grads)
        finally:
            engine.finish()
        return (None, None, None, *lam, *grad_extras, *grad_params)
