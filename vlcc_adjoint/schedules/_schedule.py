"""The :class:`Schedule` base class and the cost model of storage levels."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .actions import ACTION_DTYPE, Action, action_from_row

if TYPE_CHECKING:
    from ._simulate import ScheduleStats

__all__ = ["Level", "Schedule", "check_positive_int"]

#: Schedules address at most this many storage levels (a bit mask per step).
MAX_LEVELS = 8


def check_positive_int(value, name: str, minimum: int = 1) -> int:
    """``value`` as an ``int`` >= ``minimum``, or a ``ValueError`` saying so."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(
            f"{name} must be an integer >= {minimum}, got {value!r} "
            f"of type {type(value).__name__}"
        )
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return int(value)


def check_cost(value, name: str) -> float:
    """``value`` as a finite float >= 0, or a ``ValueError`` saying so."""
    try:
        cost = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}") from None
    if not math.isfinite(cost) or cost < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return cost


@dataclasses.dataclass(frozen=True)
class Level:
    """One storage level of the hierarchy and its cost model.

    **Arguments:**

    - `slots`: how many checkpoints the level holds at once (>= 1), or
      ``None`` for as many as the schedule needs.
    - `write_cost`, `read_cost`: time of one ``Save`` to / ``Load`` from this
      level, in the unit of the schedule's ``forward_cost``.
    """

    slots: int | None
    write_cost: float = 0.0
    read_cost: float = 0.0

    def __post_init__(self):
        if self.slots is not None:
            object.__setattr__(self, "slots", check_positive_int(self.slots, "Level.slots"))
        object.__setattr__(self, "write_cost", check_cost(self.write_cost, "Level.write_cost"))
        object.__setattr__(self, "read_cost", check_cost(self.read_cost, "Level.read_cost"))


class Schedule:
    """A checkpoint schedule: a table of actions for ``n_steps`` steps.

    Subclasses build :attr:`table` (a numpy structured array of
    :data:`~vlcc_adjoint.schedules.actions.ACTION_DTYPE`) in their
    constructor. Iterating yields action objects, one at a time, so that a
    table of ten million rows costs no Python objects until it is read.

    **Attributes:**

    - `table`: the actions, one row each.
    - `n_steps`: the number of forward steps ``n``.
    - `levels`: the storage levels the schedule was planned for.
    - `forward_cost`, `adjoint_cost`: time of one forward / adjoint step.
    """

    table: np.ndarray
    n_steps: int
    levels: tuple[Level, ...]
    forward_cost: float
    adjoint_cost: float

    def __init__(
        self,
        table: np.ndarray,
        n_steps: int,
        levels: Sequence[Level] = (Level(None),),
        forward_cost: float = 1.0,
        adjoint_cost: float = 1.0,
    ):
        table = np.asarray(table)
        if table.dtype != ACTION_DTYPE:
            raise ValueError(
                f"a schedule table must have dtype ACTION_DTYPE, got {table.dtype}; "
                "build it with vlcc_adjoint.schedules.actions_to_table"
            )
        if not 1 <= len(levels) <= MAX_LEVELS:
            raise ValueError(f"a schedule has 1 to {MAX_LEVELS} levels, got {len(levels)}")
        self.table = table
        self.table.flags.writeable = False
        self.n_steps = check_positive_int(n_steps, "steps")
        self.levels = tuple(levels)
        self.forward_cost = check_cost(forward_cost, "forward_cost")
        self.adjoint_cost = check_cost(adjoint_cost, "adjoint_cost")

    def __iter__(self) -> Iterator[Action]:
        for row in self.table:
            yield action_from_row(row)

    def blocks(self, rows: int = 1 << 16, start: int = 0) -> Iterator[np.ndarray]:
        """The table from row `start` on, as consecutive read-only blocks of at
        most `rows` rows each (same dtype as :attr:`table`).

        Interpreters consume a schedule this way, so that a schedule which
        produces its actions in blocks never needs its whole table at once.

        **Arguments:**

        - `rows`: the largest block (>= 1).
        - `start`: the first row (>= 0); ``blocks(start=s)`` yields
          ``table[s:]``.
        """
        rows = check_positive_int(rows, "rows")
        start = check_positive_int(start, "start", minimum=0)
        table = self.table
        for first in range(start, len(table), rows):
            yield table[first : first + rows]

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [action_from_row(row) for row in self.table[index]]
        return action_from_row(self.table[index])

    def stats(self) -> ScheduleStats:
        """Replay the schedule symbolically: see :func:`simulate`."""
        from ._simulate import simulate

        return simulate(self)

    def _params(self) -> str:
        return f"steps={self.n_steps}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._params()}, actions={len(self.table)})"
