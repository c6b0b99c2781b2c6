"""Devito integration: drive Devito operators with vlcc schedules and stores.

Devito checkpoints through pyrevolve's interface: operator objects applied
over ``(t_start, t_end)`` (``devito.CheckpointOperator``), a checkpoint
object naming the live fields (``devito.DevitoCheckpoint([u])``) and
``pyrevolve.Revolver``.  This module offers the same interface backed by
:func:`~vlcc_adjoint.execute.run_adjoint`, so every vlcc schedule (Revolve,
Multistage over memory and disk, StoreAll, a budget plan) and every store
(memory, compressed, zarr, with prefetch) works for a Devito solver.  The
swap is one import::

    from devito import CheckpointOperator, DevitoCheckpoint
    from vlcc_adjoint.devito import Revolver        # was: from devito import Revolver

    cp = DevitoCheckpoint([u])
    wrap_fw = CheckpointOperator(op_fwd, src=src, rec=rec, u=u, dt=dt)
    wrap_rev = CheckpointOperator(op_grad, u=u, v=v, rec=residual, grad=grad, dt=dt)
    wrp = Revolver(cp, wrap_fw, wrap_rev, n_checkpoints, nt - 2)
    wrp.apply_forward()
    residual.data[:] = rec.data - d_obs
    wrp.apply_reverse()

and ``Revolver(..., schedule=Multistage(...), store=TieredStore(...))`` picks
any other schedule and store.  Without pyrevolve, :class:`DevitoSolver` takes
Devito ``Operator`` objects and their keyword arguments directly.

**Steps and time levels.** Step ``i`` is pyrevolve's: the forward operator
applied over ``(a, b)`` runs Devito's time loop for ``t = a + o .. b - 1 + o``,
``o`` the operator's first time index (``time_m`` of its default arguments;
1 for a second-order acoustic solver).  Iteration ``t`` reads ``u[t]``,
``u[t-1]`` and writes ``u[t+1]``, so the state ``u_i`` is the
``time_order`` newest levels ``u[i+o], u[i+o-1], ...`` of every checkpointed
TimeFunction.  Without ``save=`` Devito keeps ``time_order + 1`` levels in a
circular buffer, level ``L`` in slot ``L mod (time_order + 1)``: which slot
holds ``u_i``'s levels depends on ``i``.  A snapshot therefore stores the
levels in time order (newest first), and a restore copies each level back
into *its* slot for the restored step, so the operator's modulo indexing
finds it where a straight forward run would have left it.  The state the
executor carries is the tuple of the fields' whole buffers (numpy views, the
same objects for the whole run); snapshots hold only the live levels
(``time_order`` of the ``time_order + 1`` slots), halos included so a restore
is bit-exact.

**The reverse step.** pyrevolve 2.2.8 applies the reverse operator ``n``
times, over ``(i, i + 1)`` for ``i = n - 1 .. 0``, and runs the forward
operator over ``(i, i + 1)`` just before each one (for ``i = n - 1`` that is
the last forward step itself), so the reverse operator at ``t`` may read
``u[t+1]`` and whatever else the forward operator writes at ``t``
(receivers).  The usual imaging condition (``grad -= u * v.dt2``) reads only
``u[t]``, which the restored state already holds; :class:`DevitoSolver`
reads both operators' generated code and skips that forward step when the
reverse operator reads nothing it writes: ``n`` of the ``~6n`` forward
iterations of a Revolve run at pyrevolve's default snapshot count.  A
buffered field's time index is known only modulo its buffer size ``B``
(Devito writes ``u[t+1]`` of a two-slot buffer as ``u[t-1]``): a read of the
one slot outside the state's ``time_order`` live levels is a read of
``u[t+1]``, which the forward step provides.  When the code cannot be read,
the forward step runs, as in pyrevolve; either way the results are
pyrevolve's, bit for bit.  One reverse operator call per step: the
arguments are prepared once and each step calls the compiled kernel
directly (as ``devito.CheckpointOperator`` does), microseconds per call.

**The end of the forward sweep.** The last forward step runs in the
fields' own buffers, as in pyrevolve: after the forward sweep (for
:class:`Revolver`, after ``apply_forward()``) every checkpointed field holds
what a plain forward run leaves in it, receivers included.

**Caveat (as with pyrevolve).** Recomputation reruns the forward operator,
which rewrites whatever it writes besides the state, receivers included: the
reverse operator must read the data residual from its own object, not from
the forward operator's receivers.  In the swap above, ``residual`` is that
object (``residual.data[:] = rec.data - d_obs`` between the sweeps); a
reverse operator given ``rec=rec`` would read traces that the reverse sweep's
forward steps have overwritten.

**Caveat (Devito's).** Devito's CPU operators switch the calling thread to
flush-to-zero / denormals-are-zero (``_MM_SET_FLUSH_ZERO_MODE``) and leave
it so: after the first operator call, subnormal numbers computed on that
thread become zero, in Devito's code and everyone else's.

References: Kukreja et al., "High-level Python abstractions for optimal
checkpointing in inversion problems" (pyrevolve), arXiv:1802.02474 (2018);
Louboutin et al., "Devito (v3.1.0): an embedded domain-specific language for
finite differences and geophysical exploration", GMD 12 (2019).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .budget import BudgetPlan
from .errors import VlccRuntimeError, VlccTypeError, VlccValueError
from .execute import AdjointResult, run_adjoint
from .schedules import Revolve, Schedule, StoreAll, default_snapshots

if TYPE_CHECKING:
    from .storage import TieredStore

__all__ = ["DevitoSolver", "Revolver", "default_snapshots"]


# ---------------------------------------------------------------------------
# operators over pyrevolve-style ranges
# ---------------------------------------------------------------------------


class _KernelRange:
    """A Devito ``Operator`` applied over ``(t_start, t_end)``.

    The argument map is prepared once (``Operator.arguments``); each call
    sets the two time bounds and calls the compiled kernel, skipping the
    per-call argument processing of ``Operator.apply`` (milliseconds, as much
    as a small grid's time step).  The data pointers in the map stay valid:
    the adapter only ever copies into the fields' existing buffers.
    """

    def __init__(self, op, kwargs: dict, time_name: str):
        self.op = op
        self._cfunction = op.cfunction  # compiles now, not inside the run
        try:
            self.args = op.arguments(**kwargs)
        except Exception:
            # e.g. only buffered fields, so no default time_M: the bounds are
            # set per call anyway (devito.CheckpointOperator does the same).
            self.args = op._prepare_arguments(**kwargs)
        self._m, self._M = f"{time_name}_m", f"{time_name}_M"
        self.start_offset = int(self.args[self._m])
        self._names = [p.name for p in op.parameters]

    def apply(self, t_start: int, t_end: int) -> None:
        args = self.args
        args[self._m] = t_start + self.start_offset
        args[self._M] = t_end - 1 + self.start_offset
        retval = self._cfunction(*[args[name] for name in self._names])
        if retval:
            check = getattr(self.op, "_postprocess_errors", None)
            if check is not None:
                check(retval)
            raise VlccRuntimeError(f"Devito operator {self.op.name!r} returned error code {retval}")


def _as_range_op(op, kwargs, time_name, what):
    if hasattr(op, "cfunction") and hasattr(op, "arguments"):  # a devito.Operator
        return _KernelRange(op, dict(kwargs or {}), time_name)
    if kwargs:
        raise VlccTypeError(
            f"{what}_kwargs only apply to a devito.Operator; {type(op).__name__} "
            "carries its own arguments (e.g. CheckpointOperator(op, **kwargs))"
        )
    if not callable(getattr(op, "apply", None)):
        raise VlccTypeError(
            f"{what} must be a devito.Operator or an object with "
            f"apply(t_start, t_end) such as devito.CheckpointOperator, got {op!r}"
        )
    return op


def _accesses(op) -> tuple[dict[str, set[int]], set[str]] | None:
    """``(reads, writes)`` of the generated code of `op`: for each function it
    reads, the time offsets ``k`` of its accesses ``f[t + k]`` (empty for a
    function without time), and the names of the functions it writes;
    ``None`` when the code cannot be read."""
    while hasattr(op, "op"):  # CheckpointOperator, _KernelRange, ... wrap one
        op = op.op
    try:
        import sympy
        from devito.ir.iet import Expression, FindNodes
        from devito.symbolics import retrieve_indexed

        nodes = [op] + [getattr(f, "root", f) for f in getattr(op, "_func_table", {}).values()]
        reads: dict[str, set[int]] = {}
        writes: set[str] = set()
        for node in nodes:
            for expr in FindNodes(Expression).visit(node):
                for indexed in retrieve_indexed(expr.expr.lhs):
                    writes.add(indexed.function.name)
                for indexed in retrieve_indexed(expr.expr.rhs):
                    f = indexed.function
                    offsets = reads.setdefault(f.name, set())
                    if not getattr(f, "is_TimeFunction", False) or getattr(f, "is_Sparse", False):
                        continue
                    index = indexed.indices[0]
                    # A buffered field is indexed by a ModuloDimension whose
                    # origin is ``t + k``; a saved one by ``time + k``.
                    k = sympy.simplify(getattr(index, "origin", index) - f.indices[0])
                    if not k.is_Integer:
                        return None
                    offsets.add(int(k))
    except Exception:  # an IR this code does not know: fall back to the safe path
        return None
    return (reads, writes) if reads else None


def _data_address(range_op, name: str) -> int | None:
    """The address of the data bound to `name` in a prepared operator's
    arguments (``CheckpointOperator.args``, ``_KernelRange.args``); ``None``
    when unknown."""
    arg = getattr(range_op, "args", {}).get(name)
    if arg is None:
        return None
    try:
        return int(arg._obj.data.value)
    except (AttributeError, TypeError):
        return None


# ---------------------------------------------------------------------------
# the solver
# ---------------------------------------------------------------------------


class DevitoSolver:
    """A vlcc :class:`~vlcc_adjoint.solver.Solver` made of two Devito operators.

    **Arguments:**

    - `forward`: the forward operator: a ``devito.Operator`` (give its
      arguments in `forward_kwargs`) or a pyrevolve-style operator with
      ``apply(t_start, t_end)``, e.g. ``devito.CheckpointOperator``.
    - `reverse`: the reverse (gradient) operator, the same way; it reads the
      checkpointed fields and updates its own (adjoint wavefield, gradient).
    - `state`: the checkpointed TimeFunctions (the forward wavefields, each
      buffered without ``save=``), or a ``devito.DevitoCheckpoint``.
    - `forward_kwargs`, `reverse_kwargs`: arguments of the operators'
      ``apply``, prepared once (fields, ``dt``, ...).
    - `recompute`: run the forward operator for one step before each reverse
      step, as pyrevolve does, so the reverse operator may read level
      ``t + 1`` and the forward operator's other outputs at ``t``.  Default
      ``None``: only if the reverse operator's code reads a level the
      restored state lacks or a field the forward operator writes.

    Step ``i`` is pyrevolve's (see the module docstring): ``forward_many(u,
    a, b)`` is the forward operator over ``(a, b)``, ``adjoint(u, adj, i)``
    the reverse operator over ``(i, i + 1)``, ``i = n - 1 .. 0`` (``n``
    reverse iterations, as pyrevolve and Devito's store-everything gradient).
    The adjoint state lives in the reverse operator's fields, so the
    executor's ``adj`` is ``None``.

    **Attributes:** `live` (the state in hand: the fields' whole buffers),
    `recompute` (the decision taken), `offset` (the first time index ``o``).
    """

    restore_in_place = True

    def __init__(
        self,
        forward: Any,
        reverse: Any,
        state: Any,
        *,
        forward_kwargs: dict | None = None,
        reverse_kwargs: dict | None = None,
        recompute: bool | None = None,
    ):
        functions = list(getattr(state, "objects", state))
        if not functions:
            raise VlccValueError("state must name the checkpointed TimeFunctions, e.g. [u]")
        for f in functions:
            if not (getattr(f, "is_TimeFunction", False) and hasattr(f, "_data_allocated")):
                raise VlccTypeError(
                    f"state holds {f!r}; give the TimeFunctions whose live time "
                    "levels make the state (e.g. [u]) or a DevitoCheckpoint"
                )
        self.functions = functions
        time_name = functions[0].time_dim.root.name
        self._fwd = _as_range_op(forward, forward_kwargs, time_name, "forward")
        self._rev = _as_range_op(reverse, reverse_kwargs, time_name, "reverse")
        # The first time index o of the forward loop.  Without it (a bare
        # pyrevolve operator) follow DevitoCheckpoint: newest level i + order - 1.
        offset = getattr(self._fwd, "start_offset", None)
        if offset is None:
            offset = max(f.time_order for f in functions) - 1
        self.offset = int(offset)
        rev_offset = getattr(self._rev, "start_offset", None)
        self._rev_offset = int(rev_offset) if rev_offset is not None else self.offset
        # Whole allocations (halo and padding included): contiguous per slot,
        # and a copy of one is an exact restore.
        self.live = tuple(np.asarray(f._data_allocated).view(np.ndarray) for f in functions)
        self._orders = [int(f.time_order) for f in functions]
        self._buffered = [bool(getattr(f, "_time_buffering", True)) for f in functions]
        self.recompute = self._decide_recompute(recompute)
        self.n_steps: int | None = None  # set by run()
        # The live buffers went through forward step n - 1 (u_n is in them):
        # the reverse step n - 1 needs no recomputation.
        self._at_end = False

    # -- which levels the reverse step needs ---------------------------------
    def _decide_recompute(self, recompute):
        if recompute is not None:
            return bool(recompute)
        rev, fwd = _accesses(self._rev), _accesses(self._fwd)
        if rev is None or fwd is None:
            return True  # unknown: do as pyrevolve does
        reads, _ = rev
        _, writes = fwd
        shift = self._rev_offset - self.offset  # reverse iteration t_i + shift for state i
        needs_next = False
        for f, order, buffered, buf in zip(self.functions, self._orders, self._buffered, self.live):
            size = buf.shape[0]
            live = {(-j) % size for j in range(order)} if buffered else None
            for k in reads.get(f.name, ()):
                level = shift + k  # relative to the newest level of state i
                if buffered:
                    # Only the slot is known: level mod the buffer size.
                    if level % size in live:
                        continue  # a live level of the restored state
                    if level % size == 1 % size:
                        needs_next = True  # the slot one forward step writes
                        continue
                elif -order < level <= 0:
                    continue  # a live level of the restored state
                elif level == 1:
                    needs_next = True  # the level one forward step writes
                    continue
                raise VlccValueError(
                    f"the reverse operator reads {f.name}[t{k:+d}], a time level that neither "
                    f"the checkpointed state (the {order} newest levels) nor one forward step "
                    f"provides; raise {f.name}'s time_order or checkpoint another field"
                )
        # Another output of the forward step (receivers) read by the reverse
        # step: pyrevolve's reverse step reads it as that forward step left it.
        state = {f.name for f in self.functions}
        for name in writes - state:
            if name in reads:
                a, b = _data_address(self._fwd, name), _data_address(self._rev, name)
                if a is None or b is None or a == b:
                    needs_next = True
        return needs_next

    # -- slots ---------------------------------------------------------------
    def _slots(self, j: int, step: int, size: int) -> list[int]:
        """The buffer slots of field `j`'s live levels at `step`, newest first."""
        newest = step + self.offset
        levels = [newest - k for k in range(self._orders[j])]
        if self._buffered[j]:
            return [level % size for level in levels]
        return levels

    def on_save(self, state: tuple[np.ndarray, ...], step: int) -> tuple[np.ndarray, ...]:
        """The live levels of `state` at `step`, newest first (views; the
        store copies them)."""
        return tuple(
            buf[s] for j, buf in enumerate(state) for s in self._slots(j, step, buf.shape[0])
        )

    def on_load(
        self, stored: tuple[np.ndarray, ...], step: int, out: tuple[np.ndarray, ...] | None = None
    ) -> tuple[np.ndarray, ...]:
        """Copy a snapshot's levels into their slots of the live buffers."""
        self._at_end = False
        it = iter(stored)
        for j, buf in enumerate(self.live):
            for s in self._slots(j, step, buf.shape[0]):
                np.copyto(buf[s], next(it))
        return self.live

    def copy(self, state: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        return tuple(np.array(buf, copy=True) for buf in state)

    # -- steps ---------------------------------------------------------------
    def forward_many(
        self, state: tuple[np.ndarray, ...], start: int, stop: int
    ) -> tuple[np.ndarray, ...]:
        final = self.n_steps is not None and stop == self.n_steps
        if state is self.live:
            self._fwd.apply(t_start=start, t_end=stop)
            self._at_end = final
            return state
        # A detached state (the executor's copy, to compute u_n): run it in the
        # fields' buffers.
        held = None if final else self.copy(self.live)
        for buf, src in zip(self.live, state):
            np.copyto(buf, src)
        try:
            self._fwd.apply(t_start=start, t_end=stop)
            for buf, dst in zip(self.live, state):
                np.copyto(dst, buf)
        finally:
            if held is not None:  # put back what the buffers held
                for buf, src in zip(self.live, held):
                    np.copyto(buf, src)
        # The last step stays in the buffers, as in pyrevolve: they hold u_n
        # after the forward sweep, and the live levels of u_{n-1} still (the
        # step writes only the slot outside them), ready for reverse step n - 1.
        self._at_end = final
        return state

    def forward(self, state: tuple[np.ndarray, ...], step: int) -> tuple[np.ndarray, ...]:
        return self.forward_many(state, step, step + 1)

    def adjoint(self, state: tuple[np.ndarray, ...], adj: Any, step: int) -> Any:
        if state is not self.live:
            for buf, src in zip(self.live, state):
                np.copyto(buf, src)
            self._at_end = False
        if self.recompute and not (self._at_end and step + 1 == self.n_steps):
            self._fwd.apply(t_start=step, t_end=step + 1)
        self._at_end = False
        self._rev.apply(t_start=step, t_end=step + 1)
        return adj

    # -- running -------------------------------------------------------------
    def run(
        self,
        steps: int,
        schedule: Schedule | int | BudgetPlan | None = None,
        store: TieredStore | None = None,
        *,
        before_reverse: Callable[[], Any] | None = None,
        progress: bool = False,
        gradient_rtol: float | None = None,
        gradient: Callable[[], Any] | None = None,
        reset_gradient: Callable[[], None] | None = None,
    ) -> AdjointResult:
        """The forward sweep and the reverse sweep over `steps` steps.

        **Arguments:**

        - `steps`: forward steps ``n`` (``nt - 2`` for Devito's acoustic
          example: iterations ``t = 1 .. nt - 2``).
        - `schedule`: a :class:`~vlcc_adjoint.schedules.Schedule` of `steps`
          steps, an int (Revolve's snapshot count), a
          :class:`~vlcc_adjoint.budget.BudgetPlan`, or ``None`` (Revolve
          with :func:`default_snapshots`).
        - `store`: a :class:`~vlcc_adjoint.storage.TieredStore` with one
          tier per schedule level; default: memory sized by the schedule
          (a budget plan's own store for a plan).
        - `before_reverse`: called once between the sweeps, when every
          forward step has run (compute the data residual here).
        - `progress`: a progress bar over the schedule's actions.
        - `gradient_rtol`: a budget on the gradient's relative L2 error
          against exact checkpoints (see
          :func:`~vlcc_adjoint.execute.run_adjoint`): the store's
          ``CompressedMemoryTier(ErrorBounded(...))`` levels get the bound
          it allows (default store: one such level per schedule level), and
          the sweeps run two to four times (two pilots, the run, a tighter
          rerun if its a posteriori estimate exceeds the budget).  The
          gradient lives in the reverse operator's fields, so it needs:
        - `gradient`: ``gradient() -> array``, the gradient field's data
          (e.g. ``lambda: grad.data``), read after each run; and
        - `reset_gradient`: zero the gradient and the adjoint wavefields
          before each run (e.g. ``grad.data.fill(0); v.data.fill(0)``).

        **Returns:** :func:`~vlcc_adjoint.execute.run_adjoint`'s
        :class:`~vlcc_adjoint.execute.AdjointResult`; the gradient is in the
        reverse operator's fields.
        """
        resolved, store, scratch = _resolve_schedule(schedule, steps, store)
        self.n_steps = resolved.n_steps
        self._at_end = False

        def between(_final_state):
            if before_reverse is not None:
                before_reverse()
            return None  # the adjoint state lives in the reverse operator's fields

        try:
            # check=False: the states are always the same buffers.
            return run_adjoint(
                self,
                resolved,
                self.live,
                between,
                store,
                progress,
                check=False,
                gradient_rtol=gradient_rtol,
                gradient=gradient,
                reset_gradient=reset_gradient,
            )
        finally:
            _remove(scratch)

    def __repr__(self) -> str:
        names = ", ".join(f.name for f in self.functions)
        return f"DevitoSolver(state=[{names}], offset={self.offset}, recompute={self.recompute})"


def _remove(scratch: str | None) -> None:
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)


def _resolve_schedule(
    schedule: Schedule | int | BudgetPlan | None, steps: int, store: TieredStore | None = None
) -> tuple[Schedule, TieredStore | None, str | None]:
    """``(schedule, store, scratch)`` from what a caller may give: a
    Schedule, an int (Revolve's snapshots), a BudgetPlan (with its store, on
    disk in the temporary directory `scratch` to remove after the run), or
    None."""
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise VlccValueError(f"the number of time steps must be an integer >= 1, got {steps!r}")
    steps = int(steps)
    scratch = None
    if isinstance(schedule, BudgetPlan):
        if store is None:
            if len(schedule.schedule.levels) > 1:
                scratch = tempfile.mkdtemp(prefix="vlcc-devito-")
            store = schedule.make_store(path=scratch)
        schedule = schedule.schedule
    if schedule is None or isinstance(schedule, (int, np.integer)):
        snapshots = default_snapshots(steps) if schedule is None else int(schedule)
        if snapshots < 1:
            raise VlccValueError(f"the number of checkpoints must be >= 1, got {snapshots}")
        schedule = StoreAll(steps) if snapshots >= steps - 1 else Revolve(steps, snapshots)
    if not isinstance(schedule, Schedule):
        raise VlccTypeError(
            f"schedule must be a vlcc Schedule, an int (Revolve snapshots), a "
            f"BudgetPlan or None; got {type(schedule).__name__}"
        )
    if schedule.n_steps != steps:
        _remove(scratch)
        raise VlccValueError(
            f"the schedule has {schedule.n_steps} steps but the run has {steps}; "
            f"build it for n_timesteps={steps}"
        )
    return schedule, store, scratch


# ---------------------------------------------------------------------------
# pyrevolve.Revolver, backed by vlcc
# ---------------------------------------------------------------------------


class _Stop(BaseException):
    """Unwinds the worker thread when a Revolver is dropped between sweeps."""


class _Sweeps:
    """What the caller's thread and the worker share: two events, the
    outcome.  It holds no reference to the :class:`Revolver`, so dropping
    one between the sweeps lets ``__del__`` release its worker."""

    def __init__(self) -> None:
        self.forward_done = threading.Event()
        self.go = threading.Event()
        self.cancel = False
        self.result: AdjointResult | None = None
        self.error: BaseException | None = None

    def between(self, _final_state):
        self.forward_done.set()
        self.go.wait()
        if self.cancel:
            raise _Stop()
        return None  # the adjoint state lives in the reverse operator's fields

    def work(self, solver, schedule, store, scratch):
        try:
            self.result = run_adjoint(
                solver, schedule, solver.live, self.between, store, check=False
            )
        except _Stop:
            pass
        except BaseException as error:  # handed to the caller's thread
            self.error = error
        finally:
            _remove(scratch)
            self.forward_done.set()

    def reraise(self):
        if self.error is not None:
            error, self.error = self.error, None
            raise error


class Revolver:
    """A drop-in for ``pyrevolve.Revolver`` (``devito.Revolver``).

    **Arguments:**

    - `checkpoint`: a ``devito.DevitoCheckpoint`` (or the list of
      checkpointed TimeFunctions).
    - `fwd_operator`, `rev_operator`: pyrevolve-style operators
      (``devito.CheckpointOperator(op, **kwargs)``), or ``devito.Operator``
      objects with `fwd_kwargs` / `rev_kwargs`.
    - `n_checkpoints`: Revolve's snapshots (``None``: pyrevolve's default,
      :func:`default_snapshots`); ignored when `schedule` is given.
    - `n_timesteps`: forward steps ``n``.
    - `schedule`: any vlcc schedule of `n_timesteps` steps, or a
      :class:`~vlcc_adjoint.budget.BudgetPlan`.
    - `store`: a :class:`~vlcc_adjoint.storage.TieredStore` for it.
    - `recompute`: see :class:`DevitoSolver`.

    ``apply_forward()`` runs the forward sweep, taking snapshots; the caller
    may then read the forward's outputs (receivers) and set the adjoint's
    inputs (the residual); ``apply_reverse()`` runs the reverse sweep.  As
    with pyrevolve, the fields hold the final forward state after
    ``apply_forward()``, and the reverse operator runs over steps
    ``n - 1 .. 0`` (``n`` iterations).  After it, :attr:`result` is the run's
    :class:`~vlcc_adjoint.execute.AdjointResult` (timings, schedule and
    storage statistics).

    The two halves are one :func:`~vlcc_adjoint.execute.run_adjoint` call in
    a worker thread that waits between the sweeps: the executor stays the
    only interpreter of schedules, and the caller's code between the halves
    runs in the caller's thread, as with pyrevolve.
    """

    def __init__(
        self,
        checkpoint: Any,
        fwd_operator: Any,
        rev_operator: Any,
        n_checkpoints: int | None = None,
        n_timesteps: int | None = None,
        *,
        schedule: Schedule | BudgetPlan | None = None,
        store: TieredStore | None = None,
        fwd_kwargs: dict | None = None,
        rev_kwargs: dict | None = None,
        recompute: bool | None = None,
    ):
        if n_timesteps is None:
            raise VlccValueError(
                "give n_timesteps (for a loop of unknown length, run "
                "vlcc_adjoint.Online through DevitoSolver.run)"
            )
        self.solver = DevitoSolver(
            fwd_operator,
            rev_operator,
            checkpoint,
            forward_kwargs=fwd_kwargs,
            reverse_kwargs=rev_kwargs,
            recompute=recompute,
        )
        self.n_timesteps = int(n_timesteps)
        self.n_checkpoints = n_checkpoints
        self.schedule, self.store, self._scratch = _resolve_schedule(
            n_checkpoints if schedule is None else schedule, self.n_timesteps, store
        )
        self.solver.n_steps = self.n_timesteps
        self._sweeps = _Sweeps()
        self._thread: threading.Thread | None = None

    @property
    def result(self) -> AdjointResult | None:
        """The :class:`~vlcc_adjoint.execute.AdjointResult`, once
        :meth:`apply_reverse` has returned."""
        return self._sweeps.result

    def apply_forward(self) -> None:
        """Run the forward sweep (all ``n_timesteps`` steps), taking the
        schedule's snapshots."""
        if self._thread is not None:
            raise VlccRuntimeError(
                "apply_forward was already called; build a new Revolver for another gradient"
            )
        sweeps = self._sweeps
        self._thread = threading.Thread(
            target=sweeps.work,
            name="vlcc-devito",
            daemon=True,
            args=(self.solver, self.schedule, self.store, self._scratch),
        )
        self._thread.start()
        sweeps.forward_done.wait()
        if sweeps.error is not None:
            self._thread.join()
            sweeps.reraise()

    def apply_reverse(self) -> None:
        """Run the reverse sweep, recomputing forward steps as the schedule
        says; returns when the gradient is complete."""
        if self._thread is None:
            raise VlccRuntimeError("call apply_forward() before apply_reverse()")
        if self._sweeps.go.is_set():
            raise VlccRuntimeError(
                "apply_reverse was already called; build a new Revolver for another gradient"
            )
        self._sweeps.go.set()
        self._thread.join()
        self._sweeps.reraise()

    def __del__(self):
        sweeps = getattr(self, "_sweeps", None)
        if sweeps is None:
            return
        if getattr(self, "_thread", None) is None:  # never run: drop a plan's disk store
            if getattr(self, "_scratch", None) is not None:
                self.store.close()
                _remove(self._scratch)
        elif not sweeps.go.is_set():
            # Dropped between the sweeps: the worker unwinds and closes the store.
            sweeps.cancel = True
            sweeps.go.set()

    def __repr__(self) -> str:
        # Also for an instance whose __init__ raised (debuggers, tracebacks).
        solver = getattr(self, "solver", None)
        recompute = getattr(solver, "recompute", None)
        return (
            f"vlcc_adjoint.devito.Revolver({getattr(self, 'schedule', None)!r}, "
            f"n_timesteps={getattr(self, 'n_timesteps', None)}, recompute={recompute})"
        )
