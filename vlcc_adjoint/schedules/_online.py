"""Online checkpointing: the number of steps is known only when the loop stops.

The forward sweep must decide what to keep while ``n`` is unknown, so the
decision at ``u_i`` may depend on ``i`` alone.  The scheme here is dynamic
checkpointing by period doubling, in the family of Wang, Moin & Iaccarino
(SIAM J. Sci. Comput. 31(4), 2009) and Stumm & Walther (SIAM J. Sci.
Comput. 32(2), 2010), chosen for a simple, provable repetition bound:

*Forward sweep.*  At most ``p = ceil(c / 2)`` of the ``c`` slots hold
checkpoints; the other ``c - p`` are kept free for the backward pass.
Checkpoints sit at the multiples of a period ``d`` (initially 1).  When
``u_i`` falls on a multiple of ``d`` and all ``p`` slots are taken, the
checkpoints at odd multiples of ``d`` are deleted and ``d`` doubles; ``u_i``
is then stored if it is a multiple of the new period.  Thinning happens at
``i = p d``, so when the sweep stops at ``u_n`` the period satisfies
``d <= max(1, 2 n / p)`` and the checkpoints ``0 = s_0 < ... < s_{q-1}``
(``q <= p``) cut ``[0, n]`` into segments of at most ``d`` steps.

*Backward pass.*  Segment ``j`` (from the last to the first) is reversed by
Revolve from ``u_{s_j}`` with ``c - j`` slots: its own base, the free ones,
and those released by the segments already reversed.

*Bound.*  The sweep costs ``n`` forward steps (the loop runs until it has
``u_n`` in hand to test its stop criterion).  Each segment of ``l <= d`` steps
with ``c_j >= c - p + 1`` slots costs at most ``t(l, c - p + 1)`` of
DESIGN.md's binomial ``t``, at most ``r l`` for the least ``r`` with
``C(c - p + 1 + r, r) >= d``.  Hence

    forward count <= n (1 + r),     C(c - p + 1 + r, r) >= 2 n / p,

every state is recomputed at most ``r + 1`` times, and with ``c >= 2`` the
repetition number grows like that of the offline optimum for half the slots
and four times the steps.  :meth:`Online.forward_bound` evaluates the bound;
the tests check every schedule against it and against simulate.
"""

from __future__ import annotations

import warnings
from math import comb

import numpy as np

from ..errors import VlccTypeError, VlccValueError
from ._jit import PythonBudget, njit
from ._revolve import build_table, copy_row, emit_segment, put_row
from ._schedule import Level, Schedule, check_positive_int
from .actions import ACTION_DTYPE, ADVANCE, DELETE, SAVE, action_from_row

__all__ = ["Online"]

#: Steps of Online schedules decided by the kernels' Python functions per
#: process before the compiled kernels take over (ski rental, :mod:`._jit`;
#: priced as Revolve's ``_python_steps``).
_python_steps = PythonBudget(40_000)


@njit(cache=True, nogil=True)
def _online_step(i, state, ckpt, p, out, pos, write):
    """The forward-sweep decision at ``u_i`` (``i`` in increasing order).

    ``state = [period, count]``; ``ckpt[:count]`` the stored steps, sorted.
    Writes the Delete/Save rows due at ``u_i`` from ``pos`` on and returns
    the next position.  This one function drives both the tables and the
    step-by-step use in :meth:`Online.capture`.
    """
    d = state[0]
    count = state[1]
    if i % d == 0:
        if count == p:
            keep = 0
            for q in range(count):
                if (ckpt[q] // d) % 2 == 1:
                    pos = put_row(out, pos, write, DELETE, ckpt[q], -1, 0)
                else:
                    ckpt[keep] = ckpt[q]
                    keep += 1
            count = keep
            d *= 2
        if i % d == 0 and count < p:
            pos = put_row(out, pos, write, SAVE, i, -1, 0)
            ckpt[count] = i
            count += 1
    state[0] = d
    state[1] = count
    return pos


@njit(cache=True, nogil=True)
def _emit_online(out, write, n, c, p):
    state = np.array([1, 0], np.int64)
    ckpt = np.empty(p, np.int64)
    pos = 0
    run = 0  # start of the pending Advance
    for i in range(n):
        before = pos
        pos = _online_step(i, state, ckpt, p, out, pos, write)
        if pos != before and run < i:
            # Rows were due at u_i: the Advance up to it goes first.
            if write:
                for r in range(pos - 1, before - 1, -1):
                    copy_row(out, r, r + 1)
            pos = put_row(out, before, write, ADVANCE, run, i, -1) + (pos - before)
            run = i
    pos = put_row(out, pos, write, ADVANCE, run, n, -1)  # the sweep ends holding u_n
    reverse_start = pos
    count = state[1]
    for j in range(count - 1, -1, -1):
        s = ckpt[j]
        e = ckpt[j + 1] if j + 1 < count else n
        # More slots than interior states would only store and drop one.
        pos = emit_segment(out, pos, write, s, e - s, min(c - j, max(e - s - 1, 1)), False, 0)
    # The sentinel row records where the backward pass starts.
    return put_row(out, pos, write, ADVANCE, reverse_start, -1, -1)


def _arguments(args: tuple, steps, snapshots) -> tuple:
    """``(steps, snapshots)`` from the new order or, with a warning, the old.

    The new order is ``Online(steps=None, *, snapshots)``: at most one
    positional argument (the steps) and ``snapshots=`` as a keyword.  A
    call without ``snapshots=`` is the old order ``Online(snapshots,
    steps=None)``, read as it always was."""
    if snapshots is not None:
        if len(args) > 1 or (args and steps is not None):
            raise VlccTypeError(
                "Online takes (steps=None, *, snapshots): give steps once, positionally or "
                f"as a keyword, and snapshots as a keyword; got {len(args)} positional "
                "arguments"
            )
        return (args[0] if args else steps), snapshots
    if not args or len(args) > 2 or (len(args) == 2 and steps is not None):
        raise VlccTypeError(
            "Online needs snapshots: write Online(steps, snapshots=c), or Online(snapshots=c) "
            "when the number of steps is unknown"
        )
    old_steps = args[1] if len(args) == 2 else steps
    new = (
        f"Online({old_steps}, snapshots={args[0]})"
        if old_steps is not None
        else f"Online(snapshots={args[0]})"
    )
    warnings.warn(
        f"Online(snapshots, steps) is the old argument order; write {new}, in the order "
        "of Revolve(steps, snapshots)",
        DeprecationWarning,
        stacklevel=3,
    )
    return old_steps, args[0]


class Online(Schedule):
    """Checkpointing with ``snapshots`` slots when the step count is unknown.

    ``Online(steps, snapshots=c)``, in the order of every schedule
    constructor (``Revolve(steps, snapshots)``); ``Online(snapshots=c)``
    when the step count is unknown.

    **Arguments:**

    - `steps`: the step count, if known (for planning and testing), else
      ``None``.  Without it the object answers forward-sweep decisions
      (:meth:`capture`) and :meth:`stop` returns the complete schedule once
      the loop has ended.
    - `snapshots`: slots for stored states, ``u_0``'s included (>= 1);
      keyword-only.

    The old order ``Online(snapshots)``, ``Online(snapshots, steps)`` and
    ``Online(snapshots, steps=n)`` still works and warns
    (``DeprecationWarning``): a call with no ``snapshots=`` keyword is read
    in the old order.

    The complete schedule's forward part is exactly what :meth:`capture`
    decided step by step; :attr:`reverse_start` is the table index where the
    backward pass begins.  Repetition bound: see :meth:`forward_bound` and
    the module docstring.
    """

    def __init__(self, *args: int | None, steps: int | None = None, snapshots: int | None = None):
        steps, snapshots = _arguments(args, steps, snapshots)
        self.snapshots = check_positive_int(snapshots, "snapshots")
        self._p = (self.snapshots + 1) // 2
        self._state = np.array([1, 0], np.int64)
        self._ckpt = np.empty(self._p, np.int64)
        self._next = 0
        self.reverse_start: int | None = None
        if steps is None:
            # No step count until the sweep stops (.stop(n) is the schedule).
            vars(self)["n_steps"] = None
            self.levels = (Level(self.snapshots),)
            self.forward_cost = self.adjoint_cost = 1.0
            return
        n = check_positive_int(steps, "steps")
        python = _python_steps.take(n, _emit_online)
        rows = build_table(_emit_online, n, self.snapshots, self._p, python=python)
        self.reverse_start = int(rows[-1]["a"])
        super().__init__(rows[:-1], n, (Level(self.snapshots),))

    @property
    def table(self) -> np.ndarray:
        try:
            return self.__dict__["table"]
        except KeyError:
            raise AttributeError(
                "an Online schedule without `steps` has no table yet: drive the "
                "forward sweep with .capture(i), then call .stop(n) for the schedule"
            ) from None

    @table.setter
    def table(self, value: np.ndarray) -> None:
        self.__dict__["table"] = value
        self.__dict__.pop("_simulated", None)  # simulate's statistics were of the old rows

    def capture(self, step: int) -> list:
        """The ``Delete`` / ``Save`` actions due with ``u_step`` in hand.

        Call it for ``step = 0, 1, 2, ...`` in order during the forward sweep.
        """
        if step != self._next:
            raise VlccValueError(
                f"Online.capture takes the steps in order; expected step {self._next}, got {step}"
            )
        out = np.empty(self._p + 1, ACTION_DTYPE)
        decide = _online_step.python if _python_steps.take(1, _online_step) else _online_step
        pos = decide(step, self._state, self._ckpt, self._p, out, 0, True)
        self._next += 1
        return [action_from_row(row) for row in out[:pos]]

    def stop(self, steps: int) -> Online:
        """The complete schedule for a sweep that stopped holding ``u_steps``."""
        n = check_positive_int(steps, "steps")
        if self._next not in (0, n):
            raise VlccValueError(
                f"the forward sweep captured steps 0..{self._next - 1}, so it stops at "
                f"{self._next}, not {n}"
            )
        return Online(n, snapshots=self.snapshots)

    def forward_bound(self, steps: int) -> int:
        """The module docstring's bound ``n (1 + r)`` on the forward count."""
        n = check_positive_int(steps, "steps")
        free = self.snapshots - self._p + 1
        longest = max(1, -(-2 * n // self._p))
        r = 0
        while comb(free + r, r) < longest:
            r += 1
        return n * (1 + r)

    def _params(self) -> str:
        return f"steps={self.n_steps}, snapshots={self.snapshots}"
