"""Traces: what an interpreter of a schedule did, comparable across interpreters.

A schedule is read by :func:`~vlcc_adjoint.schedules.simulate` (symbolic),
run by the action machine (:mod:`~vlcc_adjoint.schedules.machine`: the
Python executor :func:`vlcc_adjoint.execute.run_adjoint` is its client) and
by the JAX backward pass of :func:`vlcc_adjoint.jax.checkpointed_scan`
(compiled).  All follow the rules of :mod:`~vlcc_adjoint.schedules.actions`;
a :class:`Trace` records what one of them did on a solver whose state is its
own step counter, and :func:`table_trace` is the trace the rules prescribe,
obtained by running the machine with a client that records.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import VlccRuntimeError
from ._schedule import Schedule
from ._simulate import simulate
from .machine import Machine

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


class _Recorder:
    """A client of the machine that records what it is told: the Advances,
    the adjoint steps with the state in hand at each (the state an
    interpreter following the rules holds), and the reads and writes per
    level."""

    def __init__(self, levels: int):
        self.advances: list[tuple[int, int]] = []
        self.reverse_steps: list[int] = []
        self.reverse_states: list[int] = []
        self.reads = [0] * levels
        self.writes = [0] * levels
        self.current = 0  # u_0 in hand

    def advance(self, start: int, stop: int) -> None:
        self.advances.append((start, stop))
        self.current = stop

    def save(self, step: int, level: int) -> None:
        self.writes[level] += 1

    def load(self, step: int, level: int) -> None:
        self.reads[level] += 1
        self.current = step

    def delete(self, step: int, level: int) -> None:
        pass

    def move(self, step: int, src: int, dst: int) -> None:
        self.reads[src] += 1
        self.writes[dst] += 1

    def reverse(self, step: int) -> None:
        self.reverse_steps.append(step)
        self.reverse_states.append(self.current)
        self.current = -1  # consumed


def table_trace(schedule: Schedule) -> Trace:
    """The trace the rules of :mod:`~vlcc_adjoint.schedules.actions` prescribe.

    Validates the table with :func:`simulate`, then runs it through the
    action machine (:class:`~vlcc_adjoint.schedules.Machine`) with a client
    that records every ``Advance(a, b)`` as steps ``a .. b - 1``, every
    ``Reverse`` with the state the rules put in hand for it, and the reads
    and writes per level, which must be the ones :func:`simulate` counted
    (two readings of one table, checked against each other).
    """
    stats = simulate(schedule)
    recorder = _Recorder(len(schedule.levels))
    Machine(schedule, recorder).run()
    if tuple(recorder.reads) != stats.reads or tuple(recorder.writes) != stats.writes:
        raise VlccRuntimeError(
            f"the action machine and simulate read {schedule!r} differently: reads "
            f"{tuple(recorder.reads)} vs {stats.reads}, writes {tuple(recorder.writes)} vs "
            f"{stats.writes}; this is a bug in vlcc_adjoint.schedules, please report it"
        )
    spans = np.array(recorder.advances, np.int64).reshape(-1, 2)
    lengths = spans[:, 1] - spans[:, 0]
    starts = np.repeat(spans[:, 0], lengths)
    offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return Trace(
        starts + offsets,
        np.array(recorder.reverse_steps, np.int64),
        stats.reads,
        stats.writes,
        reverse_states=np.array(recorder.reverse_states, np.int64),
    )
