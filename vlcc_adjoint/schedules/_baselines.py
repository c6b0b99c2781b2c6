"""Baseline schedules: store every state, or checkpoint periodically.

``StoreAll(n)`` keeps ``u_0 .. u_{n-2}`` (``u_{n-1}`` is in hand when the
backward pass starts): ``n - 1`` forward steps, ``n - 1`` slots.

``Periodic(n, every)`` is the checkpointing most solvers ship by hand: the
forward sweep stores ``u_0, u_k, u_2k, ...`` (``k = every``) on ``level``; the
backward pass reverses the segments last to first, each by recomputing it
from its checkpoint while storing its interior states on ``buffer_level``.
With ``q = ceil(n / k)`` segments it costs

    forward count = (n - 1) + (q - 1) (k - 1),

``q`` slots on ``level`` and ``k - 2`` on ``buffer_level`` (one level
holding both when they coincide): about ``2 n`` steps with
``O(n / k + k)`` memory, against Revolve's ``r n`` with ``c`` slots.
"""

from __future__ import annotations

from ._jit import PythonBudget, njit
from ._revolve import build_table, put_row
from ._schedule import Level, Schedule, check_positive_int
from .actions import ADVANCE, DELETE, LOAD, REVERSE, SAVE

__all__ = ["Periodic", "StoreAll"]

#: Steps of baseline tables emitted by the kernels' Python functions per
#: process before the compiled kernels take over (ski rental, :mod:`._jit`;
#: priced as Revolve's ``_python_steps``).
_python_steps = PythonBudget(40_000)


@njit(cache=True, nogil=True)
def _emit_segment_store_all(out, pos, write, s, e, in_hand, level, buffer):
    """Reverse steps ``e - 1 .. s`` from ``u_s`` (stored on ``level``),
    storing ``u_{s+1} .. u_{e-2}`` on ``buffer`` on the way."""
    if not in_hand:
        pos = put_row(out, pos, write, LOAD, s, -1, level)
    for i in range(s + 1, e):
        pos = put_row(out, pos, write, ADVANCE, i - 1, i, -1)
        if i < e - 1:
            pos = put_row(out, pos, write, SAVE, i, -1, buffer)
    if e - 1 == s:
        # One-step segment: its base is the state in hand.
        pos = put_row(out, pos, write, DELETE, s, -1, level)
    pos = put_row(out, pos, write, REVERSE, e - 1, -1, -1)
    for i in range(e - 2, s - 1, -1):
        lv = level if i == s else buffer
        pos = put_row(out, pos, write, LOAD, i, -1, lv)
        pos = put_row(out, pos, write, DELETE, i, -1, lv)
        pos = put_row(out, pos, write, REVERSE, i, -1, -1)
    return pos


@njit(cache=True, nogil=True)
def _emit_periodic(out, write, n, k, level, buffer):
    pos = 0
    last = ((n - 1) // k) * k  # base of the last segment
    for s in range(0, last + 1, k):
        if s > 0:
            pos = put_row(out, pos, write, ADVANCE, s - k, s, -1)
        pos = put_row(out, pos, write, SAVE, s, -1, level)
    # The last segment is reversed straight from the forward sweep.
    pos = _emit_segment_store_all(out, pos, write, last, n, True, level, buffer)
    for s in range(last - k, -1, -k):
        pos = _emit_segment_store_all(out, pos, write, s, s + k, False, level, buffer)
    return pos


def _check_level(value, name: str) -> int:
    return check_positive_int(value, name, minimum=0)


class StoreAll(Schedule):
    """Store every state the backward pass needs, on one level.

    **Arguments:**

    - `steps`: the number of forward steps ``n`` (>= 1).
    - `level`: the storage level that holds the states (default 0).

    ``n - 1`` forward steps (the least possible), ``n - 1`` slots.
    """

    def __init__(self, steps: int, level: int = 0):
        n = check_positive_int(steps, "steps")
        self.level = _check_level(level, "level")
        levels = [Level(None) for _ in range(self.level + 1)]
        # One segment holding everything: Periodic with every = n.
        python = _python_steps.take(n, _emit_periodic)
        table = build_table(_emit_periodic, n, n, self.level, self.level, python=python)
        super().__init__(table, n, levels)

    def _params(self) -> str:
        return f"steps={self.n_steps}, level={self.level}"


class Periodic(Schedule):
    """Checkpoint every ``every``-th state; reverse each segment from its copy.

    **Arguments:**

    - `steps`: the number of forward steps ``n`` (>= 1).
    - `every`: the checkpoint period ``k`` (>= 1; ``k >= n`` stores all).
    - `level`: the level of the periodic checkpoints (default 0).
    - `buffer_level`: the level of the states stored while a segment is
      reversed (default 0, the fastest).

    Forward count ``(n - 1) + (ceil(n / k) - 1) (k - 1)`` (module docstring).
    """

    def __init__(self, steps: int, every: int, level: int = 0, buffer_level: int = 0):
        n = check_positive_int(steps, "steps")
        k = check_positive_int(every, "every")
        self.every = k
        self.level = _check_level(level, "level")
        self.buffer_level = _check_level(buffer_level, "buffer_level")
        levels = [Level(None) for _ in range(max(self.level, self.buffer_level) + 1)]
        python = _python_steps.take(n, _emit_periodic)
        table = build_table(
            _emit_periodic, n, min(k, n), self.level, self.buffer_level, python=python
        )
        super().__init__(table, n, levels)

    def _params(self) -> str:
        return f"steps={self.n_steps}, every={self.every}, level={self.level}"
