"""The executor's client of the action machine: what each action of a
schedule does to a solver and a store.

:func:`vlcc_adjoint.execute.run_adjoint` builds one :class:`AdjointRun` per
call and hands it to a :class:`~vlcc_adjoint.schedules.Machine`, the one
loop that runs a schedule's rows (or, for an
:class:`~vlcc_adjoint.schedules.Online` schedule, drives the forward sweep
first and then the machine, see :func:`run_online`).  What each action
calls is listed in :mod:`vlcc_adjoint.execute`.

Lean by construction.  The machine calls one bound method per action; which
variant of a method that is (a solver with ``forward_many``, with
``on_save`` / ``on_load`` hooks, restoring in place, checks on or off,
``check_finite``) is decided once, when the run is built, so no method tests
an option per action.  What the run was doing when something failed is
recorded only then (an ``except`` clause, free when nothing is raised), as a
template (:attr:`AdjointRun.where`) and its arguments (:attr:`AdjointRun.at`),
formatted only for the error's note: formatting text every step would cost
more than the step of a small state.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from time import perf_counter
from typing import Any

import numpy as np

from ._checks import StateMismatchError, check_seed, matcher, signature
from ._checks import check_finite as check_finite_values
from .errors import VlccRuntimeError
from .schedules import Machine, Online, Schedule, ScheduleStats, perform, simulate
from .state import Structure

__all__ = ["AdjointRun", "copy_state", "run_online", "run_schedule"]


def copy_state(state):
    """An independent copy of a state of arrays, containers and scalars."""
    from .state import flatten, unflatten

    leaves, spec = flatten(state)
    return unflatten(spec, [np.array(leaf, copy=True) for leaf in leaves])


def _unset(value: Any) -> bool:
    """The adjoint matcher before the seed is known (never called: the seed
    comes with the first Reverse, before any adjoint step returns)."""
    raise VlccRuntimeError("the adjoint seed is not known yet")


class AdjointRun:
    """The machine's client for one :func:`~vlcc_adjoint.execute.run_adjoint`
    call: the rules of :mod:`~vlcc_adjoint.schedules.actions` applied to a
    solver and a store.

    **Arguments:**

    - `solver`: the solver (``forward``, ``adjoint``; optionally
      ``forward_many``, ``copy``, ``on_save``, ``on_load``,
      ``restore_in_place``).
    - `store`: the store (``save``, ``load``, ``delete``, ``move``).
    - `n`: the number of steps (``math.inf`` while an online sweep runs).
    - `adj`: ``lambda_n``, or a callable ``adj_final(u_n) -> lambda_n``.
    - `u0`: the initial state, in hand when the run starts.
    - `signature`: ``u0``'s structure (:func:`vlcc_adjoint._checks.signature`).
    - `check`, `check_finite`: as for ``run_adjoint``.

    **Attributes** read after the run: ``adj`` (``lambda_0``),
    ``final_state``, ``forward_steps``, ``t_forward``, ``t_adjoint``,
    ``t_store``; on a failure ``where_text()`` and ``machine`` (the
    machine that ran the schedule, which knows the failing action).
    """

    def __init__(
        self, solver, store, n, adj, u0, signature, check=True, check_finite=False
    ) -> None:
        self.solver = solver
        self.store = store
        self.n = n
        self.adj = adj  # lambda_n, or a callable of u_n
        self.check = check
        self.check_finite = check_finite
        self.u = u0  # the state in hand
        self.spare = None  # a consumed state whose buffers a Load may reuse
        self.final_state = None
        self.signature = signature
        self.matches = matcher(signature)
        self.adj_signature: Structure | None = None
        # matcher of adj_signature, set with the seed (before the first Reverse)
        self.adj_matches: Callable[[Any], bool] = _unset
        self.forward_steps = 0
        self.t_forward = self.t_adjoint = self.t_store = 0.0
        # What the run is doing, for error notes: a template and its arguments.
        self.where: str = ""
        self.at: tuple[int, ...] | int = ()
        self.machine: Machine | None = None  # set by whoever runs the schedule
        self.forward = solver.forward
        self.adjoint = solver.adjoint
        self.copy = getattr(solver, "copy", None) or copy_state
        # The solver's optional methods (Any: each is called only by the
        # variant chosen below because it exists).
        self.on_save: Any = getattr(solver, "on_save", None)
        self.on_load: Any = getattr(solver, "on_load", None)
        self.store_save, self.store_load = store.save, store.load
        # The variant of each action for this solver and these options.
        # Step by step under check_finite: forward_many would hide which step blew up.
        self.forward_many: Any = None if check_finite else getattr(solver, "forward_many", None)
        self.advance = self._advance_many if self.forward_many is not None else self._advance_steps
        self.save = self._save_hooked if self.on_save is not None else self._save
        if self.on_load is not None:
            self.load = self._load_hooked
        elif getattr(solver, "restore_in_place", False):
            self.load = self._load_in_place
        else:
            self.load = self._load

    def where_text(self) -> str:
        """What the run was doing when it failed, in words."""
        at = self.at if isinstance(self.at, tuple) else (self.at,)
        return self.where.format(*at)

    # -- checks ------------------------------------------------------------------

    def _mismatch(self, state, what: str) -> None:
        text = self.signature.mismatch(state)
        if text:
            raise StateMismatchError(
                f"{what} returned a state whose {text} "
                "(as in u_0). A solver must return states of one structure, shape and "
                "dtype; check the step function's output, or convert it (e.g. "
                "np.asarray(..., dtype=...))"
            )

    def _adjoint_mismatch(self, adj, i) -> None:
        want = self.adj_signature
        text = "" if want is None else want.mismatch(adj, "adjoint")
        if text:
            raise StateMismatchError(
                f"adjoint step {i} returned an adjoint whose {text} (as in "
                "adj_final). An adjoint step must return lambda_i with the structure, "
                "shapes and dtypes of lambda_{i+1}"
            )

    # -- Advance -----------------------------------------------------------------

    def _advance_steps(self, a: int, b: int) -> None:
        """Forward steps ``a .. b-1`` one at a time, each output checked."""
        forward = self.forward
        u = self.u
        i = a
        t0 = perf_counter()
        try:
            if self.check_finite:
                matches = self.matches if self.check else None
                for i in range(a, b):
                    u = forward(u, i)
                    if matches is not None and not matches(u):
                        self._mismatch(u, f"forward step {i}")
                    check_finite_values(u, "forward", i)
            elif self.check:
                matches = self.matches
                for i in range(a, b):
                    u = forward(u, i)
                    if not matches(u):
                        self._mismatch(u, f"forward step {i}")
            else:
                for i in range(a, b):
                    u = forward(u, i)
        except BaseException:
            self.where, self.at = "the solver's forward step {0}", i
            raise
        self.t_forward += perf_counter() - t0
        self.forward_steps += b - a
        self.u = u
        if b == self.n and self.final_state is None:
            # The sweep reached u_n (Online does): keep it before a Load
            # restores into these buffers.
            self.final_state = self.copy(u)

    def _advance_many(self, a: int, b: int) -> None:
        """Forward steps ``a .. b-1`` in one call of ``forward_many``."""
        t0 = perf_counter()
        try:
            u = self.forward_many(self.u, a, b)
            if self.check and not self.matches(u):
                self._mismatch(u, f"forward_many({a}, {b})")
        except BaseException:
            self.where, self.at = "the solver's forward_many({0}, {1})", (a, b)
            raise
        self.t_forward += perf_counter() - t0
        self.forward_steps += b - a
        self.u = u
        if b == self.n and self.final_state is None:
            self.final_state = self.copy(u)

    # -- Save, Load, Delete, Move ------------------------------------------------

    def _save(self, i: int, level: int) -> None:
        t0 = perf_counter()
        try:
            self.store_save(i, self.u, level=level)
        except BaseException:
            self.where, self.at = "saving u_{0} on level {1}", (i, level)
            raise
        self.t_store += perf_counter() - t0

    def _save_hooked(self, i: int, level: int) -> None:
        """Save what the solver's ``on_save(u, i)`` hands over."""
        try:
            state = self.on_save(self.u, i)
            t0 = perf_counter()
            self.store_save(i, state, level=level)
        except BaseException:
            self.where, self.at = "saving u_{0} on level {1}", (i, level)
            raise
        self.t_store += perf_counter() - t0

    def _load(self, i: int, level: int) -> None:
        t0 = perf_counter()
        try:
            self.u = self.store_load(i, level=level)
        except BaseException:
            self.where, self.at = "loading u_{0} from level {1}", (i, level)
            raise
        self.t_store += perf_counter() - t0
        self.spare = None

    def _load_in_place(self, i: int, level: int) -> None:
        """Restore into the buffers of the state in hand (or of the spare)."""
        out = self.u if self.u is not None else self.spare
        t0 = perf_counter()
        try:
            self.u = self.store_load(i, level=level, out=out)
        except BaseException:
            self.where, self.at = "loading u_{0} from level {1}", (i, level)
            raise
        self.t_store += perf_counter() - t0
        self.spare = None

    def _load_hooked(self, i: int, level: int) -> None:
        """``on_load`` copies what was stored into the solver's own buffers
        (the Devito adapter): read-only views of the record spare a copy.
        They stay valid until the record's Delete, a later action."""
        out = self.u if self.u is not None else self.spare
        try:
            t0 = perf_counter()
            stored = self.store_load(i, level=level, copy=False)
            self.t_store += perf_counter() - t0
            self.u = self.on_load(stored, i, out)
        except BaseException:
            self.where, self.at = "loading u_{0} from level {1}", (i, level)
            raise
        self.spare = None

    def delete(self, i: int, level: int) -> None:
        t0 = perf_counter()
        try:
            self.store.delete(i, level=level)
        except BaseException:
            self.where, self.at = "deleting u_{0} from level {1}", (i, level)
            raise
        self.t_store += perf_counter() - t0

    def move(self, i: int, src: int, dst: int) -> None:
        t0 = perf_counter()
        try:
            self.store.move(i, src, dst)
        except BaseException:
            self.where, self.at = "moving u_{0} from level {1} to level {2}", (i, src, dst)
            raise
        self.t_store += perf_counter() - t0

    # -- Reverse -----------------------------------------------------------------

    def _seed(self, i: int) -> None:
        """Before adjoint step n-1: u_n (computed if the sweep did not reach
        it) and the seed lambda_n, checked."""
        if self.final_state is None:
            self.where, self.at = "the solver's forward step {0} (computing u_n)", i
            t0 = perf_counter()
            u_n = self.forward(self.copy(self.u), i)
            self.t_forward += perf_counter() - t0
            self.forward_steps += 1
            if self.check and not self.matches(u_n):
                self._mismatch(u_n, f"forward step {i}")
            if self.check_finite:
                check_finite_values(u_n, "forward", i)
            self.final_state = u_n
        if callable(self.adj):
            self.where, self.at = "adj_final(u_n)", ()
            self.adj = self.adj(self.copy(self.final_state))
            if self.check:
                check_seed(self.adj, self.signature, "adj_final(u_n)")
            if self.check_finite:
                check_finite_values(self.adj, "seed", None)
        self.adj_signature = signature(self.adj)
        self.adj_matches = matcher(self.adj_signature)
        self.where, self.at = "", ()

    def reverse(self, i: int) -> None:
        if i == self.n - 1:
            self._seed(i)
        try:
            t0 = perf_counter()
            adj = self.adjoint(self.u, self.adj, i)
            self.t_adjoint += perf_counter() - t0
            if self.check and not self.adj_matches(adj):
                self._adjoint_mismatch(adj, i)
            if self.check_finite:
                check_finite_values(adj, "adjoint", i)
        except BaseException:
            self.where, self.at = "the solver's adjoint step {0}", i
            raise
        self.adj = adj
        self.spare, self.u = self.u, None


def run_online(
    run: AdjointRun, online: Online, stop, max_steps, progress=None
) -> tuple[Online, ScheduleStats]:
    """The forward sweep of an :class:`Online` schedule, stopped by ``stop``,
    then the backward part of the schedule it turned out to be, through the
    machine.  Returns the complete schedule and its statistics.

    The sweep's saves and deletes, decided step by step by
    ``online.capture(i)``, run through the machine's loop too
    (:func:`~vlcc_adjoint.schedules.machine.perform`)."""
    i = 0
    limit = math.inf if max_steps is None else max_steps
    while True:
        if i >= 1:
            run.where, run.at = "the stop criterion at step {0}", i
            if stop(run.u, i):
                break
            if i >= limit:
                raise VlccRuntimeError(
                    f"the stop criterion did not hold within max_steps={max_steps} steps; "
                    "raise max_steps or check the criterion"
                )
        perform(run, online.capture(i))
        run.n = math.inf  # u_n is not known yet: don't snapshot a final state
        run.advance(i, i + 1)
        i += 1
        if progress is not None:
            progress(1)
    n = i
    run.n = n
    run.final_state = run.copy(run.u)
    full = online.stop(n)
    start = full.reverse_start
    if start is None:  # pragma: no cover - a schedule with steps knows where it turns
        raise VlccRuntimeError(f"{full!r} does not say where its backward pass starts")
    run.machine = Machine(full, run, start=start, progress=progress)
    run.machine.run()
    return full, simulate(full)


def run_schedule(run: AdjointRun, schedule: Schedule, progress=None) -> None:
    """Every action of `schedule` through the machine, against `run`."""
    run.machine = Machine(schedule, run, progress=progress)
    run.machine.run()
