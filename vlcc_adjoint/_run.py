"""The per-action interpreter of a schedule's table: the machine of
:mod:`vlcc_adjoint.schedules.actions` driving a solver and a store.

:func:`vlcc_adjoint.execute.run_adjoint` builds one :class:`_Run` per call
and hands it the table (or, for an :class:`~vlcc_adjoint.schedules.Online`
schedule, the forward sweep first, see :func:`_run_online`).  What each
action calls is listed in :mod:`vlcc_adjoint.execute`.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ._checks import StateMismatchError as StateMismatchError
from ._checks import check_finite as _check_finite
from ._checks import check_seed as _check_seed
from ._checks import describe_mismatch as _describe_mismatch
from ._checks import matcher as _matcher
from ._checks import signature as _signature
from .errors import VlccRuntimeError, VlccValueError
from .schedules import ActionKind, Online, simulate

_CHUNK = 1 << 16  # table rows converted to Python ints at a time


def _copy_state(state):
    """An independent copy of a state of arrays, containers and scalars."""
    from .state import flatten, unflatten

    leaves, spec = flatten(state)
    return unflatten(spec, [np.array(leaf, copy=True) for leaf in leaves])


# ---------------------------------------------------------------------------
# the interpreter
# ---------------------------------------------------------------------------


class _Run:
    """The machine of :mod:`~vlcc_adjoint.schedules.actions`, driving a solver
    and a store.  One instance per :func:`run_adjoint` call.

    What the run is doing is kept as a template (:attr:`where`) and its
    arguments (:attr:`at`), formatted only when an error needs the text:
    formatting a message every step costs more than the step of a small
    state."""

    def __init__(self, solver, store, n, adj, check, progress_bar, check_finite=False):
        self.solver = solver
        self.store = store
        self.n = n
        self.adj = adj  # lambda_n, or a callable of u_n
        self.check = check
        self.check_finite = check_finite
        self.bar = progress_bar
        self.u = None  # the state in hand
        self.spare = None  # a consumed state whose buffers a Load may reuse
        self.final_state = None
        self.signature = None
        self.adj_signature = None
        self.matches = self.adj_matches = None  # _matcher of each signature
        self.forward_steps = 0
        self.t_forward = self.t_adjoint = self.t_store = 0.0
        # Step by step under check_finite: forward_many would hide which step blew up.
        self.forward_many = None if check_finite else getattr(solver, "forward_many", None)
        self.on_save = getattr(solver, "on_save", None)
        self.on_load = getattr(solver, "on_load", None)
        self.in_place = bool(getattr(solver, "restore_in_place", False))
        self.copy = getattr(solver, "copy", None) or _copy_state
        self.where, self.at = "", ()  # what the run is doing, for error notes
        self.index = -1  # the schedule action being run (recorded when one fails)
        # (shape, dtype) when the state is one numpy array: its check inlined
        self.array = None

    def where_text(self) -> str:
        at = self.at if isinstance(self.at, tuple) else (self.at,)
        return self.where.format(*at)

    # -- forward ---------------------------------------------------------
    def _mismatch(self, state, what: str) -> None:
        sig = _signature(state)
        if sig != self.signature:
            raise StateMismatchError(
                f"{what} returned a state whose {_describe_mismatch(sig, self.signature)} "
                "(as in u_0). A solver must return states of one structure, shape and "
                "dtype; check the step function's output, or convert it (e.g. "
                "np.asarray(..., dtype=...))"
            )

    def advance(self, a, b):
        u = self.u
        check = self.check
        t0 = time.perf_counter()
        if self.forward_many is not None:
            self.where, self.at = "the solver's forward_many({0}, {1})", (a, b)
            u = self.forward_many(u, a, b)
            if check and not self.matches(u):
                self._mismatch(u, f"forward_many({a}, {b})")
        else:
            self.where, self.at = "the solver's forward step {0}", a
            u = self._steps(u, a, b)
        self.t_forward += time.perf_counter() - t0
        self.forward_steps += b - a
        self.u = u
        if b == self.n and self.final_state is None:
            # The sweep reached u_n (Online does): keep it before a Load
            # restores into these buffers.
            self.final_state = self.copy(u)

    def _steps(self, u, a, b):
        """Forward steps ``a .. b-1`` one at a time, each output checked.

        The step being run is recorded (``self.at``) only if one fails: a
        store per step would cost more than a small state's step.  For a
        state that is one numpy array the check is inlined: type, shape
        and dtype identity, with the full matcher asked only when the
        dtype object differs (an equal dtype built anew)."""
        forward = self.solver.forward
        i = a
        try:
            if self.check_finite:
                matches = self.matches if self.check else None
                for i in range(a, b):
                    u = forward(u, i)
                    if matches is not None and not matches(u):
                        self._mismatch(u, f"forward step {i}")
                    _check_finite(u, "forward", i)
            elif not self.check:
                for i in range(a, b):
                    u = forward(u, i)
            elif self.array is not None:
                ndarray, (shape, dtype) = np.ndarray, self.array
                matches = self.matches
                for i in range(a, b):
                    u = forward(u, i)
                    if type(u) is not ndarray or u.shape != shape or u.dtype is not dtype:
                        if not matches(u):
                            self._mismatch(u, f"forward step {i}")
            else:
                matches = self.matches
                for i in range(a, b):
                    u = forward(u, i)
                    if not matches(u):
                        self._mismatch(u, f"forward step {i}")
        except BaseException:
            self.at = i
            raise
        return u

    # -- storage ---------------------------------------------------------
    def save(self, i, level):
        self.where, self.at = "saving u_{0} on level {1}", (i, level)
        state = self.on_save(self.u, i) if self.on_save is not None else self.u
        t0 = time.perf_counter()
        self.store.save(i, state, level=level)
        self.t_store += time.perf_counter() - t0

    def load(self, i, level):
        self.where, self.at = "loading u_{0} from level {1}", (i, level)
        out = self.u if self.u is not None else self.spare
        t0 = time.perf_counter()
        if self.on_load is not None:
            # on_load copies what was stored into the solver's own buffers
            # (the Devito adapter): read-only views of the record spare a copy.
            # They stay valid until the record's Delete, a later action.
            stored = self.store.load(i, level=level, copy=False)
            self.t_store += time.perf_counter() - t0
            self.u = self.on_load(stored, i, out)
        else:
            target = out if (self.in_place and out is not None) else None
            self.u = self.store.load(i, level=level, out=target)
            self.t_store += time.perf_counter() - t0
        self.spare = None

    def delete(self, i, level):
        self.where, self.at = "deleting u_{0} from level {1}", (i, level)
        t0 = time.perf_counter()
        self.store.delete(i, level=level)
        self.t_store += time.perf_counter() - t0

    def move(self, i, src, dst):
        self.where, self.at = "moving u_{0} from level {1} to level {2}", (i, src, dst)
        t0 = time.perf_counter()
        self.store.move(i, src, dst)
        self.t_store += time.perf_counter() - t0

    # -- adjoint ---------------------------------------------------------
    def _seed(self, i):
        """Before adjoint step n-1: u_n (computed if the sweep did not reach
        it) and the seed lambda_n, checked."""
        if self.final_state is None:
            self.where, self.at = "the solver's forward step {0} (computing u_n)", i
            t0 = time.perf_counter()
            u_n = self.solver.forward(self.copy(self.u), i)
            self.t_forward += time.perf_counter() - t0
            self.forward_steps += 1
            if self.check and not self.matches(u_n):
                self._mismatch(u_n, f"forward step {i}")
            if self.check_finite:
                _check_finite(u_n, "forward", i)
            self.final_state = u_n
        if callable(self.adj):
            self.where, self.at = "adj_final(u_n)", ()
            self.adj = self.adj(self.copy(self.final_state))
            if self.check:
                _check_seed(self.adj, self.signature, "adj_final(u_n)")
            if self.check_finite:
                _check_finite(self.adj, "seed", None)
        self.adj_signature = _signature(self.adj)
        self.adj_matches = _matcher(self.adj_signature)

    def _adjoint_mismatch(self, adj, i) -> None:
        sig = _signature(adj)
        if sig != self.adj_signature:
            raise StateMismatchError(
                f"adjoint step {i} returned an adjoint whose "
                f"{_describe_mismatch(sig, self.adj_signature, 'adjoint')} (as in "
                "adj_final). An adjoint step must return lambda_i with the structure, "
                "shapes and dtypes of lambda_{i+1}"
            )

    def reverse(self, i):
        if i == self.n - 1:
            self._seed(i)
        self.where, self.at = "the solver's adjoint step {0}", i
        t0 = time.perf_counter()
        adj = self.solver.adjoint(self.u, self.adj, i)
        self.t_adjoint += time.perf_counter() - t0
        if self.check and not self.adj_matches(adj):
            self._adjoint_mismatch(adj, i)
        if self.check_finite:
            _check_finite(adj, "adjoint", i)
        self.adj = adj
        self.spare, self.u = self.u, None

    # -- the table ---------------------------------------------------------
    def run_table(self, table: np.ndarray, offset: int = 0):
        """Execute the rows of ``table`` (``offset``: index of its first row in
        the whole schedule, for messages).

        One loop with the action kinds tested in the order of their
        frequency in a schedule.  The common actions run in the loop itself
        (the same calls and checks as their methods, with the run's
        attributes read once per block): a forward step of a checked
        one-array state, a store call without the solver's ``on_save`` /
        ``on_load`` hooks, an adjoint step after the first.  What the run
        was doing (:attr:`where`, :attr:`at`) and the index of the action
        (:attr:`index`) are recorded only when one fails."""
        if (
            self.array is None
            and self.check
            and self.signature is not None
            and self.signature[0] == "array"
            and self.u is not None
            and type(self.u) is np.ndarray
            and self.matches(self.u)
        ):
            self.array = (self.u.shape, self.u.dtype)
        advance, reverse, load, save, move = (
            self.advance,
            self.reverse,
            self.load,
            self.save,
            self.move,
        )
        ADVANCE, REVERSE, LOAD, SAVE, DELETE, MOVE = _KINDS
        store = self.store
        # Which actions run in the loop (else: through their methods).
        steps_here = (
            self.forward_many is None
            and self.check
            and not self.check_finite
            and self.array is not None
        )
        save_here = self.on_save is None
        load_here = self.on_load is None and not self.in_place
        adjoint_here = not self.check_finite
        forward, adjoint = self.solver.forward, self.solver.adjoint
        store_save, store_load, store_delete = store.save, store.load, store.delete
        ndarray = np.ndarray
        shape, dtype = self.array if self.array is not None else (None, None)
        matches = self.matches
        check = self.check
        perf = time.perf_counter
        last = self.n - 1
        n = self.n
        t_store = t_forward = t_adjoint = 0.0
        forward_steps = 0
        index = offset - 1
        kind = a = b = level = i = None
        try:
            for start in range(0, len(table), _CHUNK):
                chunk = table[start : start + _CHUNK]
                rows = zip(
                    chunk["kind"].tolist(),
                    chunk["a"].tolist(),
                    chunk["b"].tolist(),
                    chunk["level"].tolist(),
                    chunk["dst"].tolist(),
                )
                for kind, a, b, level, dst in rows:
                    index += 1
                    if kind == ADVANCE:
                        if steps_here:
                            u = self.u
                            t0 = perf()
                            for i in range(a, b):
                                u = forward(u, i)
                                if (
                                    type(u) is not ndarray
                                    or u.shape != shape
                                    or u.dtype is not dtype
                                ):
                                    if not matches(u):
                                        self._mismatch(u, f"forward step {i}")
                            t_forward += perf() - t0
                            forward_steps += b - a
                            self.u = u
                            if b == n and self.final_state is None:
                                self.final_state = self.copy(u)
                        else:
                            advance(a, b)
                    elif kind == REVERSE:
                        if a == last or not adjoint_here:
                            reverse(a)
                        else:
                            t0 = perf()
                            adj = adjoint(self.u, self.adj, a)
                            t_adjoint += perf() - t0
                            if check and not self.adj_matches(adj):
                                self._adjoint_mismatch(adj, a)
                            self.adj = adj
                            self.spare, self.u = self.u, None
                    elif kind == LOAD:
                        if load_here:
                            t0 = perf()
                            self.u = store_load(a, level=level)
                            t_store += perf() - t0
                            self.spare = None
                        else:
                            load(a, level)
                    elif kind == SAVE:
                        if save_here:
                            t0 = perf()
                            store_save(a, self.u, level=level)
                            t_store += perf() - t0
                        else:
                            save(a, level)
                    elif kind == DELETE:
                        t0 = perf()
                        store_delete(a, level=level)
                        t_store += perf() - t0
                    elif kind == MOVE:
                        move(a, level, dst)
                    else:
                        raise VlccValueError(f"unknown action kind {kind} in the schedule table")
                if self.bar is not None:
                    self.bar.update(len(chunk))
        except BaseException:
            self.index = index
            # An action run in the loop: what it was doing, as its method says.
            if kind == ADVANCE and steps_here:
                self.where, self.at = "the solver's forward step {0}", i
            elif kind == REVERSE and a != last and adjoint_here:
                self.where, self.at = "the solver's adjoint step {0}", a
            elif kind == LOAD and load_here:
                self.where, self.at = "loading u_{0} from level {1}", (a, level)
            elif kind == SAVE and save_here:
                self.where, self.at = "saving u_{0} on level {1}", (a, level)
            elif kind == DELETE:
                self.where, self.at = "deleting u_{0} from level {1}", (a, level)
            raise
        finally:
            self.t_store += t_store
            self.t_forward += t_forward
            self.t_adjoint += t_adjoint
            self.forward_steps += forward_steps
        self.index = index


_KINDS = tuple(
    int(k)
    for k in (
        ActionKind.ADVANCE,
        ActionKind.REVERSE,
        ActionKind.LOAD,
        ActionKind.SAVE,
        ActionKind.DELETE,
        ActionKind.MOVE,
    )
)


def _run_online(run: _Run, online: Online, stop, max_steps):
    """The forward sweep of an :class:`Online` schedule, stopped by ``stop``,
    then the backward part of the schedule it turned out to be."""
    from .schedules import Delete, Save

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
        for action in online.capture(i):
            if isinstance(action, Save):
                run.save(action.step, action.level)
            elif isinstance(action, Delete):
                run.delete(action.step, action.level)
            else:  # pragma: no cover - capture only saves and deletes
                raise AssertionError(action)
        run.n = math.inf  # u_n is not known yet: don't snapshot a final state
        run.advance(i, i + 1)
        i += 1
        if run.bar is not None:
            run.bar.update(1)
    n = i
    run.n = n
    run.final_state = run.copy(run.u)
    full = online.stop(n)
    run.schedule = full
    run.run_table(full.table[full.reverse_start :], offset=full.reverse_start)
    return full, simulate(full)
