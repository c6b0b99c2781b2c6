"""Run a checkpoint schedule against a solver.

:func:`run_adjoint` runs a schedule's table through the action machine
(:class:`vlcc_adjoint.schedules.Machine`, the one dispatch loop;
:mod:`vlcc_adjoint.schedules.actions` gives the one semantics) with a client
(:class:`vlcc_adjoint._run.AdjointRun`) that maps each action to one call:

=====================  ====================================================
action                 call
=====================  ====================================================
``Advance(a, b)``      ``solver.forward_many(u, a, b)`` or ``forward`` b - a
                       times
``Save(i, k)``         ``store.save(i, solver.on_save(u, i), level=k)``
``Load(i, k)``         ``u = solver.on_load(store.load(i, level=k), i, u)``
``Delete(i, k)``       ``store.delete(i, level=k)``
``Move(i, k, d)``      ``store.move(i, k, d)``
``Reverse(i)``         ``lam = solver.adjoint(u, lam, i)``
=====================  ====================================================

The store copies what it saves, so the solver may keep advancing its state
in place; the store's own plan (from :func:`~vlcc_adjoint.schedules.io_plan`)
lets it prefetch every ``Load`` before the executor reaches it.

The final state ``u_n`` is never needed by the schedules themselves
(``Reverse(n - 1)`` starts from ``u_{n-1}``), but the objective is a
function of it, so the executor evaluates the last forward step once from a
copy of ``u_{n-1}`` unless the schedule's sweep already reached ``u_n``.

Integrations sit above this module and it imports none of them.  One that
runs the same interpreter on every rank of a communicator (SPMD; the MPI
integration, :mod:`vlcc_adjoint.mpi`, does so when imported) registers its
runner with :func:`register_spmd`; ``run_adjoint(..., comm=comm)`` hands
the run to it.

Checks.  With ``check=True`` (the default) the adjoint seed ``adj_final``
is compared with the state's shapes and keys before the first step,
and every step's output with the structure, shapes and dtypes of its
input, as it happens; the work of a check is planned once per structure
(:func:`vlcc_adjoint._checks.matcher`) and its message written only when
it fails.  With ``check_finite=True`` every state and adjoint is also
tested for nan/inf, and the first one found is named
(:class:`NonFiniteError`).

Lossy checkpoints under a gradient-error budget.  With ``gradient_rtol``
the store's ``ErrorBounded`` levels get error bounds chosen so that the
gradient's relative L2 error against exact checkpoints stays within the
budget: two pilot runs measure the gradient's sensitivity to the bound, a
run at the bound it allows follows, checked a posteriori and repeated
tighter if needed (:mod:`vlcc_adjoint._error_budget` has the model, the
estimate and the references).  The result then carries ``error_estimate``,
``compression_ratio`` and the whole ``error_budget`` report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ._checks import NonFiniteError as NonFiniteError
from ._checks import StateMismatchError as StateMismatchError
from ._checks import check_finite as _check_finite
from ._checks import check_seed as _check_seed
from ._checks import signature as _signature
from ._error_budget import ErrorBudgetReport as ErrorBudgetReport
from ._error_budget import check_rtol as _check_rtol
from ._error_budget import controlled_run as _controlled_run
from ._result import AdjointResult as AdjointResult
from ._run import AdjointRun, copy_state, run_online, run_schedule
from .errors import VlccRuntimeError, VlccTypeError, VlccValueError
from .schedules import Online, Schedule, ScheduleStats, io_plan, simulate
from .solver import Solver
from .state import state_nbytes

if TYPE_CHECKING:
    from .storage import TieredStore

__all__ = [
    "AdjointResult",
    "ErrorBudgetReport",
    "NonFiniteError",
    "StateMismatchError",
    "register_spmd",
    "run_adjoint",
]

_spmd_runner: Callable[..., Any] | None = None


def register_spmd(runner: Callable[..., Any]) -> None:
    """Install the runner that ``run_adjoint(..., comm=comm)`` hands a run to.

    An integration that runs the interpreter on every rank of a
    communicator registers itself here when it is imported
    (:mod:`vlcc_adjoint.mpi` does), so that this module names no layer
    above it.  The last registration wins.

    **Arguments:**

    - `runner`: called as ``runner(solver, schedule, u0, adj_final, store,
      progress, comm=comm, stop=..., max_steps=..., check=...,
      check_finite=...)``; it returns the run's result.
    """
    global _spmd_runner
    if not callable(runner):
        raise VlccTypeError(f"register_spmd needs a callable runner, got {type(runner).__name__}")
    _spmd_runner = runner


def _default_store(schedule: Schedule, stats: ScheduleStats, u0, solver):
    """One memory tier per level, each sized to the schedule's peak slots,
    in a single-threaded store: only the executor's thread calls it, and
    memory tiers need no background work, so its calls take no lock."""
    from .storage import MemoryTier, TieredStore

    on_save = getattr(solver, "on_save", None)
    nbytes = state_nbytes(on_save(u0, 0) if on_save is not None else u0)
    tiers = [MemoryTier(capacity_bytes=max(peak, 1) * nbytes) for peak in stats.peak_slots]
    plan = None if isinstance(schedule, Online) else io_plan(schedule)  # never builds the table
    return TieredStore(tiers, plan=plan, threadsafe=False)


def _lossy_tiers(levels: int) -> list:
    """The default levels under a gradient budget: error-bounded compressed
    memory (the controller sets their bounds), unbounded (an encoded record
    is at most a header larger than the state)."""
    from .storage import CompressedMemoryTier
    from .storage.codecs import ErrorBounded

    return [CompressedMemoryTier(ErrorBounded(1e-3)) for _ in range(max(levels, 1))]


def _budget_store(tiers, plan, store):
    """A store over `tiers` for one run under the budget: synchronous
    writes (every lossy checkpoint is read back decoded), the user's
    store's policy and dedup, the tiers left open for the next run."""
    from .storage import TieredStore

    policy = "raise" if store is None else store.policy
    dedup = False if store is None else store.dedup
    return TieredStore(
        tiers,
        plan=plan,
        workers=0,
        policy=policy,
        dedup=dedup,
        close_tiers=False,
        threadsafe=False,
    )


def _restarter(solver, u0):
    """``start() -> u_0`` for each run under the budget.

    A solver may advance states, and update the seed, in place, so every
    run starts from a copy of the original.  A solver that restores in
    place and owns its buffers (Devito's fields) gets its own arrays back,
    refilled, when they are plain numpy arrays."""
    from .state import flatten

    copy = getattr(solver, "copy", None) or copy_state
    pristine = copy(u0)
    own = flatten(pristine)[0]
    in_place = bool(getattr(solver, "restore_in_place", False))

    def start():
        # flattened each time: a step may have swapped the state's arrays
        leaves = flatten(u0)[0]
        if in_place and all(
            isinstance(x, np.ndarray) and x.flags.writeable and x.shape == y.shape
            for x, y in zip(leaves, own)
        ):
            for dst, src in zip(leaves, own):
                np.copyto(dst, src)
            return u0
        return copy(pristine)

    return start


def _clear(tiers, kept: list[set]) -> None:
    """Delete what a run left in `tiers` beyond the keys in `kept`."""
    for tier, before in zip(tiers, kept):
        for key in list(tier.keys()):
            if key not in before:
                tier.delete(key)


def _progress(total, enabled):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="action", desc="vlcc adjoint")


def run_adjoint(
    solver: Solver,
    schedule: Schedule,
    u0: Any,
    adj_final: Any,
    store: TieredStore | None = None,
    progress: bool = False,
    *,
    stop: Callable[[Any, int], bool] | None = None,
    max_steps: int | None = None,
    check: bool = True,
    check_finite: bool = False,
    comm: Any = None,
    gradient_rtol: float | None = None,
    gradient: Callable[[], Any] | None = None,
    reset_gradient: Callable[[], None] | None = None,
) -> AdjointResult:
    """Run the forward sweep and the adjoint of a time loop under `schedule`.

    **Arguments:**

    - `solver`: a :class:`~vlcc_adjoint.solver.Solver` (``forward`` and
      ``adjoint``; :func:`~vlcc_adjoint.solver.timestep` builds one).
    - `schedule`: any :class:`~vlcc_adjoint.schedules.Schedule`, or an
      :class:`~vlcc_adjoint.schedules.Online` without ``steps``, whose loop
      runs until `stop` says so.
    - `u0`: the initial state (numpy arrays, dicts, lists, dataclasses, JAX
      arrays; anything :mod:`vlcc_adjoint.state` flattens).  The executor
      does not modify it, unless the solver advances states in place.
    - `adj_final`: ``lambda_n``, or a callable ``adj_final(u_n) -> lambda_n``
      (e.g. ``lambda u: u`` for ``J = 0.5 ||u_n||^2``).
    - `store`: a :class:`~vlcc_adjoint.storage.TieredStore` with one tier per
      schedule level; default: memory tiers sized by the schedule.  The store
      is closed when the run ends, successfully or not.
    - `progress`: show a progress bar over the schedule's actions.
    - `stop`: for an ``Online`` schedule without steps: ``stop(u_i, i)``
      returns true when the forward loop should end at ``u_i`` (``i >= 1``).
    - `max_steps`: with `stop`, the most steps the loop may run before a
      ``RuntimeError`` (default: no limit).
    - `check`: verify, before the first step, that `adj_final` fits the
      state where it mirrors it (arrays of the state's shapes, dicts of its
      keys; a callable's result when it returns), and that every step
      returns a state (and adjoint) of the initial structure, shapes and
      dtypes.
    - `check_finite`: test ``u_0``, the seed, and every state and adjoint
      the run computes for nan/inf, and stop at the first one with a
      :class:`NonFiniteError` naming its step (forward steps then run one
      at a time, even for a solver with ``forward_many``).  A debugging aid:
      each test reads the whole state.
    - `comm`: a communicator: run SPMD on every rank of it, each on its own
      partition, through the runner an integration registered with
      :func:`register_spmd` (:func:`vlcc_adjoint.mpi.run_adjoint`, once
      ``vlcc_adjoint.mpi`` is imported).
    - `gradient_rtol`: a budget on the gradient's relative L2 error against
      exact checkpoints, in (0, 1), e.g. ``1e-3``: the levels of `store`
      with an ``ErrorBounded`` codec (a
      ``CompressedMemoryTier(ErrorBounded(...))``; with ``store=None``,
      every level is one) get the largest relative error bound whose
      estimated gradient error is within it.  The schedule then runs two
      to four times (two pilots, the run, a tighter rerun if its a
      posteriori estimate exceeds the budget); the result is the last run's.
      The store's tiers serve every run, each through a synchronous
      ``TieredStore`` with the store's plan, policy and dedup.
      ``result.error_estimate`` is the estimate, ``result.error_budget``
      the report (:mod:`vlcc_adjoint._error_budget`: the model, the
      estimate and its references).
    - `gradient`: with `gradient_rtol`, ``gradient() -> array or pytree``:
      the gradient under the budget, read after each run, for a solver that
      accumulates a parameter gradient in its adjoint steps (e.g.
      ``lambda: problem.gradient``).  Default: ``lambda_0``.
    - `reset_gradient`: with `gradient`, called before each run to zero
      that accumulator; default the solver's ``reset_gradient`` method.

    **Returns:** an :class:`AdjointResult`; ``result.adjoint`` is
    ``lambda_0``.

    **Raises:** :class:`StateMismatchError` naming the step whose output has
    the wrong shape or dtype, or the part of `adj_final` that does not fit
    the state; :class:`NonFiniteError` (with `check_finite`);
    ``ValueError`` for a `gradient_rtol` outside (0, 1) or a store without
    an ``ErrorBounded`` level; a ``RuntimeError`` (a
    :class:`~vlcc_adjoint.VlccError`) if the estimate stays above the
    budget; any exception
    of the solver or the store, unchanged, with a note naming the step and
    the schedule action.
    """
    if gradient_rtol is not None:
        gradient_rtol = _check_rtol(gradient_rtol)
        if comm is not None:
            raise VlccValueError(
                "gradient_rtol does not apply to SPMD runs (comm=...) yet: run "
                "with exact checkpoints there, or without comm"
            )
        if gradient is not None and not callable(gradient):
            raise VlccTypeError(
                f"gradient must be a callable returning the gradient, got {type(gradient).__name__}"
            )
        if gradient is not None and reset_gradient is None:
            reset_gradient = getattr(solver, "reset_gradient", None)
            if not callable(reset_gradient):
                raise VlccValueError(
                    "gradient_rtol with gradient= runs the schedule several times, and the "
                    "gradient the solver accumulates must start from zero each time: pass "
                    "reset_gradient=... (or give the solver a reset_gradient() method)"
                )
    elif gradient is not None or reset_gradient is not None:
        raise VlccValueError(
            "gradient= and reset_gradient= say what gradient_rtol controls; "
            "pass gradient_rtol=... too, or leave them out"
        )
    if comm is not None:
        if _spmd_runner is None:
            raise VlccRuntimeError(
                "run_adjoint(..., comm=...) runs on every rank of the communicator through an "
                "SPMD integration, and none is loaded: import vlcc_adjoint.mpi first (it "
                "registers itself; pip install 'vlcc-adjoint[mpi]'), or call "
                "vlcc_adjoint.mpi.run_adjoint directly"
            )
        return _spmd_runner(
            solver,
            schedule,
            u0,
            adj_final,
            store,
            progress,
            comm=comm,
            stop=stop,
            max_steps=max_steps,
            check=check,
            check_finite=check_finite,
        )
    online = isinstance(schedule, Online) and schedule.n_steps is None
    if online:
        if stop is None:
            raise VlccValueError(
                "an Online schedule without steps runs until a stop criterion holds: pass "
                "stop=lambda state, step: ... (or give Online its number of steps)"
            )
        if max_steps is not None and max_steps < 1:
            raise VlccValueError(f"max_steps must be >= 1, got {max_steps}")
    elif not isinstance(schedule, Schedule):
        raise VlccTypeError(
            f"schedule must be a vlcc_adjoint.schedules.Schedule (Revolve, Multistage, ...), "
            f"got {type(schedule).__name__}"
        )
    elif stop is not None:
        raise VlccValueError(
            "stop= only applies to an Online schedule without a step count; this schedule "
            f"has {schedule.n_steps} steps"
        )
    if not hasattr(solver, "forward") or not hasattr(solver, "adjoint"):
        raise VlccTypeError(
            f"{type(solver).__name__} is not a solver: it needs forward(state, step) and "
            "adjoint(state, adj, step) methods; wrap plain functions with "
            "vlcc_adjoint.timestep"
        )
    signature = _signature(u0)
    if check and not callable(adj_final):
        _check_seed(adj_final, signature, "adj_final")
    if check_finite:
        _check_finite(u0, "initial", None)
        if not callable(adj_final):
            _check_finite(adj_final, "seed", None)

    if gradient_rtol is not None:
        return _run_under_budget(
            solver,
            schedule,
            u0,
            adj_final,
            store,
            progress,
            stop,
            max_steps,
            check,
            check_finite,
            signature,
            gradient_rtol,
            gradient,
            reset_gradient,
        )
    return _run_once(
        solver,
        schedule,
        u0,
        adj_final,
        store,
        progress,
        stop,
        max_steps,
        check,
        check_finite,
        signature,
    )


def _run_under_budget(
    solver,
    schedule,
    u0,
    adj_final,
    store,
    progress,
    stop,
    max_steps,
    check,
    check_finite,
    signature,
    rtol,
    gradient,
    reset,
):
    """`run_adjoint` under a gradient-error budget: every run on a store of
    its own over the tiers of `store` (or default lossy tiers)."""
    import dataclasses

    from ._error_budget import lossy_levels

    online = isinstance(schedule, Online) and schedule.n_steps is None
    if store is None:
        tiers = _lossy_tiers(1 if online else len(simulate(schedule).peak_slots))
        plan = None if isinstance(schedule, Online) else io_plan(schedule)
    else:
        tiers, plan = list(store.tiers), store.plan
    try:
        lossy_levels(tiers)  # a clear error before anything runs
        kept = [set(t.keys()) for t in tiers]

        start = _restarter(solver, u0)
        copy = getattr(solver, "copy", None) or copy_state
        seed = adj_final if callable(adj_final) else copy(adj_final)

        def run_once():
            try:
                return _run_once(
                    solver,
                    schedule,
                    start(),
                    seed if callable(seed) else copy(seed),
                    _budget_store(tiers, plan, store),
                    progress,
                    stop,
                    max_steps,
                    check,
                    check_finite,
                    signature,
                )
            finally:
                _clear(tiers, kept)

        def read(result):
            return result.adjoint if gradient is None else gradient()

        result, report = _controlled_run(run_once, tiers, rtol, read, reset)
    except BaseException as error:
        if store is not None:
            _close_after_error(store, error)
        raise
    if store is not None:
        store.close()
    else:
        for tier in tiers:
            tier.close()
    return dataclasses.replace(
        result,
        error_estimate=report.error_estimate,
        compression_ratio=report.compression_ratio,
        error_budget=report,
    )


def _run_once(
    solver,
    schedule,
    u0,
    adj_final,
    store,
    progress,
    stop,
    max_steps,
    check,
    check_finite,
    signature,
) -> AdjointResult:
    """One run of the schedule (checks already done); closes the store."""
    online = isinstance(schedule, Online) and schedule.n_steps is None
    t_start = time.perf_counter()
    stats: ScheduleStats | None = None
    if online:
        if store is None:
            from .storage import MemoryTier, TieredStore

            store = TieredStore(
                [MemoryTier(capacity_bytes=schedule.snapshots * state_nbytes(u0))],
                threadsafe=False,
            )
    else:
        stats = simulate(schedule)
        if store is None:
            store = _default_store(schedule, stats, u0, solver)
    total = None if online else len(schedule)
    bar = _progress(total, progress)
    run = AdjointRun(
        solver,
        store,
        None if online else schedule.n_steps,
        adj_final,
        u0,
        signature,
        check=check,
        check_finite=check_finite,
    )
    update = None if bar is None else bar.update
    try:
        if online:
            schedule, stats = run_online(run, schedule, stop, max_steps, update)
        else:
            run_schedule(run, schedule, update)
        run.where, run.at = "flushing the store", ()
        run.machine = None  # the schedule is done: no action to name
        t0 = time.perf_counter()
        store.wait()
        run.t_store += time.perf_counter() - t0
        store_stats = store.stats()
    except BaseException as error:
        where = f"vlcc_adjoint.run_adjoint: while {run.where_text()}"
        action = "" if run.machine is None else run.machine.describe()
        if action:
            where += f" ({action})"
        error.add_note(where)
        _close_after_error(store, error)
        raise
    finally:
        if bar is not None:
            bar.close()
    store.close()
    if run.final_state is None or stats is None:  # pragma: no cover - it ends with Reverse(0)
        raise VlccRuntimeError("the schedule never reached the last adjoint step")
    return AdjointResult(
        adjoint=run.adj,
        final_state=run.final_state,
        schedule_stats=stats,
        store_stats=store_stats,
        forward_steps=run.forward_steps,
        forward_seconds=run.t_forward,
        adjoint_seconds=run.t_adjoint,
        stall_seconds=run.t_store,
        wall_seconds=time.perf_counter() - t_start,
    )


def _close_after_error(store, error: BaseException) -> None:
    """Close the store after a failed run without hiding the run's error."""
    try:
        store.close()
    except Exception as close_error:  # the run's error stays the one raised
        error.add_note(f"closing the store afterwards also failed: {close_error!r}")
