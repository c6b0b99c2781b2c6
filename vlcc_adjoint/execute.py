"""Run a checkpoint schedule against a solver: the Python interpreter of the
action table.

:func:`run_adjoint` walks a schedule's table (:mod:`vlcc_adjoint.schedules.actions`
gives the one semantics every interpreter follows) and maps each action to
one call:

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
(:func:`_matcher`) and its message written only when it fails.  With
``check_finite=True`` every state and adjoint is also tested for nan/inf,
and the first one found is named (:class:`NonFiniteError`).
"""

from __future__ import annotations

import cmath
import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .schedules import ActionKind, Online, Schedule, ScheduleStats, io_plan, simulate
from .solver import Solver

__all__ = ["AdjointResult", "NonFiniteError", "StateMismatchError", "register_spmd",
           "run_adjoint"]

_CHUNK = 1 << 16  # table rows converted to Python ints at a time


class StateMismatchError(ValueError):
    """A solver returned a state whose structure, shapes or dtypes differ
    from the initial one, or the adjoint seed does not fit the state."""


class NonFiniteError(FloatingPointError):
    """A state or adjoint of a ``run_adjoint(..., check_finite=True)`` run
    holds nan or inf.

    **Attributes:**

    - `kind`: ``"forward"`` (a state ``u_{step+1}``), ``"adjoint"`` (an
      adjoint ``lambda_step``), ``"initial"`` (``u_0``) or ``"seed"``
      (``adj_final``).
    - `step`: the forward or adjoint step that returned it (``None`` for
      ``u_0`` and the seed).
    - `path`: where in the state, e.g. ``"state['p']"``.
    """

    def __init__(self, message: str, *, kind: str, step: int | None, path: str):
        super().__init__(message)
        self.kind = kind
        self.step = step
        self.path = path


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
        raise TypeError(f"register_spmd needs a callable runner, got {type(runner).__name__}")
    _spmd_runner = runner


@dataclasses.dataclass(frozen=True, repr=False)
class AdjointResult:
    """What :func:`run_adjoint` computed and what it cost.

    **Attributes:**

    - `adjoint`: ``lambda_0``, the gradient of the objective with respect
      to ``u_0``.
    - `final_state`: ``u_n``, the end of the forward sweep.
    - `schedule_stats`: :class:`~vlcc_adjoint.schedules.ScheduleStats` of the
      schedule that ran.
    - `store_stats`: the store's ``stats()`` at the end of the run.
    - `forward_steps`: forward steps evaluated (the schedule's forward count,
      plus one when ``u_n`` was computed for the objective).
    - `forward_seconds`, `adjoint_seconds`: time inside the solver's forward
      and adjoint calls.
    - `stall_seconds`: time the executor waited in store calls (save, load,
      delete, move, and the final flush).
    - `wall_seconds`: the whole run.
    """

    adjoint: Any
    final_state: Any
    schedule_stats: ScheduleStats
    store_stats: Any
    forward_steps: int
    forward_seconds: float
    adjoint_seconds: float
    stall_seconds: float
    wall_seconds: float

    @property
    def n_steps(self) -> int:
        return self.schedule_stats.n_steps

    def __repr__(self) -> str:
        # Summaries, not contents: a state may hold gigabytes.
        parts = [f"n_steps={self.n_steps}"]
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in ("adjoint", "final_state"):
                text = _summary(value)
            elif field.name in ("schedule_stats", "store_stats"):
                text = f"<{type(value).__name__}>"
            elif isinstance(value, float):
                text = f"{value:.4g}"
            else:
                text = _summary(value)
            parts.append(f"{field.name}={text}")
        return f"{type(self).__name__}({', '.join(parts)})"


_SUMMARY_ITEMS = 8  # container entries shown before "..."


def _array_summary(x: np.ndarray) -> str:
    """``float64[300, 300] min=.. max=.. mean=..`` (nan/inf counted apart)."""
    head = f"{x.dtype}[{', '.join(str(d) for d in x.shape)}]"
    if x.size == 0 or x.dtype.kind not in "biufc":
        return head
    if x.dtype.kind == "b":
        return f"{head} true={int(np.count_nonzero(x))}"
    values = np.abs(x) if x.dtype.kind == "c" else x
    notes = []
    if values.dtype.kind == "f":
        finite = np.isfinite(values)
        nan = int(np.count_nonzero(np.isnan(values)))
        inf = values.size - int(np.count_nonzero(finite)) - nan
        notes = [f"nan={nan}"] * bool(nan) + [f"inf={inf}"] * bool(inf)
        if nan or inf:
            values = values[finite]
    if values.size:
        label = "|x| " if x.dtype.kind == "c" else ""
        notes.insert(0, f"{label}min={values.min():.4g} max={values.max():.4g} "
                        f"mean={values.mean(dtype=np.float64):.4g}")
    return " ".join([head] + notes)


def _summary(x, depth: int = 0) -> str:
    """A one-line description of a state: arrays by dtype, shape and
    statistics, containers entry by entry (a few), scalars by value."""
    if isinstance(x, np.ndarray):
        return _array_summary(x)
    if hasattr(x, "shape") and hasattr(x, "dtype"):  # JAX / torch: no device transfer
        return f"{type(x).__name__} {x.dtype}[{', '.join(str(d) for d in x.shape)}]"
    if depth > 3:
        return "..."
    if isinstance(x, dict):
        items = [f"{k!r}: {_summary(v, depth + 1)}" for k, v in list(x.items())[:_SUMMARY_ITEMS]]
        return "{" + ", ".join(items + ["..."] * (len(x) > _SUMMARY_ITEMS)) + "}"
    if isinstance(x, (list, tuple)):
        items = [_summary(v, depth + 1) for v in x[:_SUMMARY_ITEMS]]
        text = ", ".join(items + ["..."] * (len(x) > _SUMMARY_ITEMS))
        return f"[{text}]" if isinstance(x, list) else f"({text})"
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        fields = dataclasses.fields(x)
        items = [f"{f.name}={_summary(getattr(x, f.name), depth + 1)}"
                 for f in fields[:_SUMMARY_ITEMS]]
        return f"{type(x).__name__}({', '.join(items + ['...'] * (len(fields) > _SUMMARY_ITEMS))})"
    text = repr(x)
    return text if len(text) <= 60 else f"<{type(x).__name__}>"


# ---------------------------------------------------------------------------
# state signatures: catch a solver returning the wrong shape at the step it
# happens, for a few microseconds a step
# ---------------------------------------------------------------------------

def _signature(state) -> Any:
    """The structure, shapes and dtypes of a state (values ignored)."""
    if isinstance(state, np.ndarray):
        return ("array", state.shape, state.dtype.str)
    if hasattr(state, "shape") and hasattr(state, "dtype"):  # jax / torch arrays
        try:
            dtype = np.dtype(state.dtype).str
        except TypeError:
            dtype = str(state.dtype)
        return ("array", tuple(state.shape), dtype)
    if isinstance(state, dict):
        return ("dict", tuple((k, _signature(v)) for k, v in state.items()))
    if isinstance(state, (list, tuple)):
        return (type(state), tuple(_signature(v) for v in state))
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return (type(state), tuple((f.name, _signature(getattr(state, f.name)))
                                   for f in dataclasses.fields(state)))
    return (type(state),)


def _matcher(sig) -> Callable[[Any], bool]:
    """``match(state) -> bool``: whether ``_signature(state) == sig``,
    without building the signature.

    ``_signature`` builds nested tuples and asks ``dataclasses.fields`` at
    every level, a few microseconds a node, twice per time step.  The
    matcher compares the same things in place: types, keys and lengths, and
    per numpy array its shape and dtype.  It answers exactly what the
    comparison would, so a mismatch is still found at the step it happens
    (and described from the full signatures)."""
    kind = sig[0]
    if kind == "array":
        shape, dstr = sig[1], sig[2]
        dtypes = []  # dtype objects seen with this dtype.str: an identity check

        def match_array(x):
            if type(x) is np.ndarray:
                if x.shape != shape:
                    return False
                dtype = x.dtype
                for seen in dtypes:
                    if dtype is seen:
                        return True
                if dtype.str != dstr:
                    return False
                if len(dtypes) < 4:
                    dtypes.append(dtype)
                return True
            return _signature(x) == sig  # JAX / torch arrays
        return match_array
    if kind == "dict":
        pairs = tuple((k, _matcher(v)) for k, v in sig[1])

        def match_dict(x):
            if type(x) is not dict:
                return _signature(x) == sig
            if len(x) != len(pairs):
                return False
            for (k, v), (key, match) in zip(x.items(), pairs):
                if not (k == key and match(v)):
                    return False
            return True
        return match_dict
    cls = kind
    if len(sig) == 1:  # a type _signature does not look into
        return lambda x: _signature(x) == sig
    if issubclass(cls, (list, tuple)):
        subs = tuple(_matcher(v) for v in sig[1])

        def match_seq(x):
            if type(x) is not cls or len(x) != len(subs):
                return False
            for v, match in zip(x, subs):
                if not match(v):
                    return False
            return True
        return match_seq
    names = tuple(name for name, _ in sig[1])
    subs = tuple(_matcher(v) for _, v in sig[1])

    def match_fields(x):
        if type(x) is not cls:
            return False
        for name, match in zip(names, subs):
            if not match(getattr(x, name)):
                return False
        return True
    return match_fields


def _describe_mismatch(got, want, path="state") -> str:
    if got == want:
        return ""
    if got[0] == "array" and want[0] == "array":
        return (f"{path} is an array of shape {got[1]} and dtype {got[2]}, "
                f"expected shape {want[1]} and dtype {want[2]}")
    if got[0] != want[0]:
        gname = got[0] if isinstance(got[0], str) else got[0].__name__
        wname = want[0] if isinstance(want[0], str) else want[0].__name__
        return f"{path} is a {gname}, expected a {wname}"
    if len(got) > 1 and len(got[1]) != len(want[1]):
        return f"{path} has {len(got[1])} entries, expected {len(want[1])}"
    for i, (g, w) in enumerate(zip(got[1], want[1])):
        if got[0] == "dict" or dataclasses.is_dataclass(got[0]):
            if g[0] != w[0]:
                return f"{path} has key {g[0]!r} where {w[0]!r} was expected"
            sub = _describe_mismatch(g[1], w[1], f"{path}[{g[0]!r}]")
        else:
            sub = _describe_mismatch(g, w, f"{path}[{i}]")
        if sub:
            return sub
    return f"{path} differs in structure"


def _copy_state(state):
    """An independent copy of a state of arrays, containers and scalars."""
    from .state import flatten, unflatten

    leaves, spec = flatten(state)
    return unflatten(spec, [np.array(leaf, copy=True) for leaf in leaves])


def _seed_mismatch(got, want, path: str) -> str:
    """How an adjoint seed's signature `got` fails to fit the state's
    `want`, or ``""``.

    The adjoint's form is the solver's to define (it may leave out parts of
    the state that carry no derivative, or be a different object), so only
    what mirrors the state is compared: an array where the state has an
    array must have its shape (dtypes may differ; a scalar fits a 0-d
    array), a dict where the state has a dict its keys, a list or tuple
    where the state has one its length; then the parts, recursively.
    """
    gk, wk = got[0], want[0]
    if wk == "array" and gk == "array":
        return "" if got[1] == want[1] else f"{path} has shape {got[1]}, expected {want[1]}"
    if wk == "dict" and gk == "dict":
        have, need = dict(got[1]), dict(want[1])
        if have.keys() != need.keys():
            extra = sorted(map(repr, have.keys() - need.keys()))
            missing = sorted(map(repr, need.keys() - have.keys()))
            return (f"{path} has keys {', '.join(extra) or '(none extra)'} where the state has "
                    f"{', '.join(missing) or '(none missing)'}")
        for key, sub in need.items():
            text = _seed_mismatch(have[key], sub, f"{path}[{key!r}]")
            if text:
                return text
        return ""
    if isinstance(wk, type) and issubclass(wk, (list, tuple)) and gk is wk:
        if len(got[1]) != len(want[1]):
            return f"{path} has {len(got[1])} entries, expected {len(want[1])}"
        for i, (g, w) in enumerate(zip(got[1], want[1])):
            text = _seed_mismatch(g, w, f"{path}[{i}]")
            if text:
                return text
        return ""
    if isinstance(wk, type) and gk is wk and len(want) > 1:  # the same dataclass
        for (name, g), (_, w) in zip(got[1], want[1]):
            text = _seed_mismatch(g, w, f"{path}.{name}")
            if text:
                return text
    return ""


def _check_seed(adj, state_signature, path: str) -> None:
    """A :class:`StateMismatchError` if the adjoint seed does not fit the state."""
    text = _seed_mismatch(_signature(adj), state_signature, path)
    if text:
        raise StateMismatchError(
            f"the adjoint seed does not fit the state: {text} (as in u_0). adj_final is "
            "lambda_n = dJ/du_n and has the structure and shapes of the final state u_n: "
            "build it like the state (e.g. np.zeros_like(u_n) for an array), or pass a "
            "callable adj_final(u_n) -> lambda_n"
        )


def _first_nonfinite(x, path: str):
    """``(path, count, size)`` of the first leaf of `x` holding nan or inf, or ``None``."""
    if isinstance(x, (float, complex)):
        return None if cmath.isfinite(x) else (path, 1, 1)
    if isinstance(x, np.ndarray) or (hasattr(x, "shape") and hasattr(x, "dtype")):
        a = np.asarray(x)
        if a.dtype.kind not in "fc":
            return None
        ok = np.isfinite(a)
        if ok.all():
            return None
        return (path, int(a.size - np.count_nonzero(ok)), int(a.size))
    if isinstance(x, dict):
        items = ((f"{path}[{k!r}]", v) for k, v in x.items())
    elif isinstance(x, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(x))
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        items = ((f"{path}.{f.name}", getattr(x, f.name)) for f in dataclasses.fields(x))
    else:
        return None
    for sub_path, value in items:
        found = _first_nonfinite(value, sub_path)
        if found is not None:
            return found
    return None


def _check_finite(x, kind: str, step: int | None) -> None:
    """:class:`NonFiniteError` if `x` (a state or an adjoint) holds nan or inf."""
    root = "adjoint" if kind in ("adjoint", "seed") else "state"
    found = _first_nonfinite(x, root)
    if found is None:
        return
    path, count, size = found
    what = {"forward": f"forward step {step} returned a state u_{step + 1}" if step is not None
            else "", "adjoint": f"adjoint step {step} returned an adjoint lambda_{step}",
            "initial": "the initial state u_0", "seed": "the adjoint seed adj_final"}[kind]
    raise NonFiniteError(
        f"{what} that is not finite: {path} holds {count} nan/inf value(s) of {size}. This is "
        "the first non-finite one of the run; check the step's stability (time step, CFL "
        "condition), its inputs and its divisions",
        kind=kind, step=step, path=path)


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
            forward = self.solver.forward
            matches = self.matches
            finite = self.check_finite
            self.where = "the solver's forward step {0}"
            for i in range(a, b):
                self.at = i
                u = forward(u, i)
                if check and not matches(u):
                    self._mismatch(u, f"forward step {i}")
                if finite:
                    _check_finite(u, "forward", i)
        self.t_forward += time.perf_counter() - t0
        self.forward_steps += b - a
        self.u = u
        if b == self.n and self.final_state is None:
            # The sweep reached u_n (Online does): keep it before a Load
            # restores into these buffers.
            self.final_state = self.copy(u)

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

    def reverse(self, i):
        if i == self.n - 1:
            self._seed(i)
        self.where, self.at = "the solver's adjoint step {0}", i
        t0 = time.perf_counter()
        adj = self.solver.adjoint(self.u, self.adj, i)
        self.t_adjoint += time.perf_counter() - t0
        if self.check and not self.adj_matches(adj):
            sig = _signature(adj)
            if sig != self.adj_signature:
                raise StateMismatchError(
                    f"adjoint step {i} returned an adjoint whose "
                    f"{_describe_mismatch(sig, self.adj_signature, 'adjoint')} (as in "
                    "adj_final). An adjoint step must return lambda_i with the structure, "
                    "shapes and dtypes of lambda_{i+1}"
                )
        if self.check_finite:
            _check_finite(adj, "adjoint", i)
        self.adj = adj
        self.spare, self.u = self.u, None

    # -- the table ---------------------------------------------------------
    def handlers(self) -> dict:
        """``{kind: handler(a, b, level, dst)}``: one dictionary lookup an
        action, instead of a chain of comparisons."""
        return {
            int(ActionKind.ADVANCE): lambda a, b, level, dst: self.advance(a, b),
            int(ActionKind.SAVE): lambda a, b, level, dst: self.save(a, level),
            int(ActionKind.LOAD): lambda a, b, level, dst: self.load(a, level),
            int(ActionKind.DELETE): lambda a, b, level, dst: self.delete(a, level),
            int(ActionKind.MOVE): lambda a, b, level, dst: self.move(a, level, dst),
            int(ActionKind.REVERSE): lambda a, b, level, dst: self.reverse(a),
        }

    def run_table(self, table: np.ndarray, offset: int = 0):
        """Execute the rows of ``table`` (``offset``: index of its first row in
        the whole schedule, for messages)."""
        handlers = self.handlers()
        for start in range(0, len(table), _CHUNK):
            chunk = table[start : start + _CHUNK]
            rows = zip(chunk["kind"].tolist(), chunk["a"].tolist(), chunk["b"].tolist(),
                       chunk["level"].tolist(), chunk["dst"].tolist())
            for index, (kind, a, b, level, dst) in enumerate(rows, offset + start):
                self.index = index
                handler = handlers.get(kind)
                if handler is None:
                    raise ValueError(f"unknown action kind {kind} in the schedule table")
                handler(a, b, level, dst)
            if self.bar is not None:
                self.bar.update(len(chunk))


def _state_nbytes(state) -> int:
    from .state import flatten

    leaves, _ = flatten(state)
    return sum(leaf.nbytes for leaf in leaves)


def _default_store(schedule: Schedule, stats: ScheduleStats, u0, solver):
    """One memory tier per level, each sized to the schedule's peak slots."""
    from .storage import MemoryTier, TieredStore

    on_save = getattr(solver, "on_save", None)
    nbytes = _state_nbytes(on_save(u0, 0) if on_save is not None else u0)
    tiers = [MemoryTier(capacity_bytes=max(peak, 1) * nbytes) for peak in stats.peak_slots]
    plan = io_plan(schedule) if schedule.table is not None else None
    return TieredStore(tiers, plan=plan)


def _progress(total, enabled):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="action", desc="vlcc adjoint")


def run_adjoint(
    solver: Solver,
    schedule: Schedule,
    u0,
    adj_final,
    store=None,
    progress: bool = False,
    *,
    stop: Callable[[Any, int], bool] | None = None,
    max_steps: int | None = None,
    check: bool = True,
    check_finite: bool = False,
    comm=None,
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

    **Returns:** an :class:`AdjointResult`; ``result.adjoint`` is
    ``lambda_0``.

    **Raises:** :class:`StateMismatchError` naming the step whose output has
    the wrong shape or dtype, or the part of `adj_final` that does not fit
    the state; :class:`NonFiniteError` (with `check_finite`); any exception
    of the solver or the store, unchanged, with a note naming the step and
    the schedule action.
    """
    if comm is not None:
        if _spmd_runner is None:
            raise RuntimeError(
                "run_adjoint(..., comm=...) runs on every rank of the communicator through an "
                "SPMD integration, and none is loaded: import vlcc_adjoint.mpi first (it "
                "registers itself; pip install 'vlcc-adjoint[mpi]'), or call "
                "vlcc_adjoint.mpi.run_adjoint directly"
            )
        return _spmd_runner(solver, schedule, u0, adj_final, store, progress, comm=comm,
                            stop=stop, max_steps=max_steps, check=check,
                            check_finite=check_finite)
    online = isinstance(schedule, Online) and schedule.n_steps is None
    if online:
        if stop is None:
            raise ValueError(
                "an Online schedule without steps runs until a stop criterion holds: pass "
                "stop=lambda state, step: ... (or give Online its number of steps)"
            )
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    elif not isinstance(schedule, Schedule):
        raise TypeError(
            f"schedule must be a vlcc_adjoint.schedules.Schedule (Revolve, Multistage, ...), "
            f"got {type(schedule).__name__}"
        )
    elif stop is not None:
        raise ValueError(
            "stop= only applies to an Online schedule without a step count; this schedule "
            f"has {schedule.n_steps} steps"
        )
    if not hasattr(solver, "forward") or not hasattr(solver, "adjoint"):
        raise TypeError(
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

    t_start = time.perf_counter()
    stats = None if online else simulate(schedule)
    own_store = store is None
    if own_store:
        if online:
            from .storage import MemoryTier, TieredStore

            store = TieredStore([MemoryTier(
                capacity_bytes=schedule.snapshots * _state_nbytes(u0))])
        else:
            store = _default_store(schedule, stats, u0, solver)
    total = None if online else len(schedule.table)
    bar = _progress(total, progress)
    run = _Run(solver, store, None if online else schedule.n_steps, adj_final, check, bar,
               check_finite)
    run.u = u0
    run.schedule = schedule
    run.signature = signature
    run.matches = _matcher(run.signature)
    run.index = -1
    try:
        if online:
            schedule, stats = _run_online(run, schedule, stop, max_steps)
        else:
            run.run_table(schedule.table)
        run.where, run.at = "flushing the store", ()
        t0 = time.perf_counter()
        store.wait()
        run.t_store += time.perf_counter() - t0
        store_stats = store.stats()
    except BaseException as error:
        where = f"vlcc_adjoint.run_adjoint: while {run.where_text()}"
        if run.index >= 0:
            action = run.schedule[run.index]
            where += f" (action {run.index} of the schedule: {action!r})"
        error.add_note(where)
        _close_after_error(store, error)
        raise
    finally:
        if bar is not None:
            bar.close()
    store.close()
    if run.final_state is None:  # pragma: no cover - every schedule ends with Reverse(0)
        raise RuntimeError("the schedule never reached the last adjoint step")
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
                raise RuntimeError(
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
    run.run_table(full.table[full.reverse_start:], offset=full.reverse_start)
    return full, simulate(full)
