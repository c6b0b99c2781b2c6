"""Traces: what an interpreter of a schedule did, comparable across interpreters.

A schedule has three interpreters: :func:`~vlcc_adjoint.schedules.simulate`
(symbolic), :func:`vlcc_adjoint.execute.run_adjoint` (Python callbacks) and
the JAX backward pass of :func:`vlcc_adjoint.jax.checkpointed_scan`
(compiled).  All follow the rules of :mod:`~vlcc_adjoint.schedules.actions`;
a :class:`Trace` records what one of them did on a solver whose state is its
own step counter, and :func:`table_trace` is the trace the rules prescribe.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._schedule import Schedule
from ._simulate import simulate
from .actions import ActionKind

__all__ = ["Trace", "table_trace"]


@dataclasses.dataclass(frozen=True)
class Trace:
    """The observable behaviour of one run of a schedule.

    Every interpreter of a schedule (``simulate``, the Python executor, the
    JAX backward pass) must produce the same trace for the same table.

    **Attributes:**

    - `forward_steps`: the step index ``i`` of every forward evaluation
      ``u_i -> u_{i+1}`` outside adjoint steps, in the order they ran.
    - `reverse_steps`: the adjoint steps in the order they ran.
    - `reads`, `writes`: Loads / Saves per storage level.
    - `reverse_states`: optional; for each adjoint step, the index ``j`` of
      the state ``u_j`` the interpreter actually had in hand (observed by
      running a solver whose state is its own step counter).  The rules
      require ``reverse_states == reverse_steps``.
    """

    forward_steps: np.ndarray
    reverse_steps: np.ndarray
    reads: tuple[int, ...]
    writes: tuple[int, ...]
    reverse_states: np.ndarray | None = None

    @property
    def forward_count(self) -> int:
        return int(len(self.forward_steps))

    def assert_equal(self, other: Trace) -> None:
        """Raise ``AssertionError`` naming the first difference from `other`."""
        for name in ("forward_steps", "reverse_steps", "reverse_states"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine is None or theirs is None:
                continue
            mine, theirs = np.asarray(mine), np.asarray(theirs)
            if len(mine) != len(theirs) or np.any(mine != theirs):
                diff = next(
                    (i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y),
                    min(len(mine), len(theirs)),
                )
                raise AssertionError(
                    f"traces differ in {name} at position {diff}: "
                    f"{mine[diff : diff + 5].tolist()} vs {theirs[diff : diff + 5].tolist()} "
                    f"(lengths {len(mine)} and {len(theirs)})"
                )
        if tuple(self.reads) != tuple(other.reads) or tuple(self.writes) != tuple(other.writes):
            raise AssertionError(
                f"traces differ in reads/writes: {self.reads}/{self.writes} vs "
                f"{other.reads}/{other.writes}"
            )


def table_trace(schedule: Schedule) -> Trace:
    """The trace the rules of :mod:`~vlcc_adjoint.schedules.actions` prescribe.

    Expands every ``Advance(a, b)`` into steps ``a .. b - 1`` and lists the
    ``Reverse`` steps in table order; reads and writes per level come from
    :func:`simulate`, which also validates the table.
    """
    stats = simulate(schedule)
    t = schedule.table
    adv = t[t["kind"] == ActionKind.ADVANCE]
    lengths = (adv["b"] - adv["a"]).astype(np.int64)
    starts = np.repeat(adv["a"].astype(np.int64), lengths)
    offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    forward_steps = starts + offsets
    reverse_steps = t["a"][t["kind"] == ActionKind.REVERSE].astype(np.int64)
    return Trace(
        forward_steps, reverse_steps, stats.reads, stats.writes, reverse_states=reverse_steps.copy()
    )
