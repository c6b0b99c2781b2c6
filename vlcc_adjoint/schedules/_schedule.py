"""The :class:`Schedule` base class and the cost model of storage levels."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence

import numpy as np

from ..errors import VlccIndexError, VlccValueError
from . import _chunks
from ._chunks import ChunkedTable
from ._simulate import ScheduleStats, simulate
from .actions import ACTION_DTYPE, Action, action_from_row

__all__ = ["Level", "Schedule", "check_positive_int"]

#: Schedules address at most this many storage levels (a bit mask per step).
MAX_LEVELS = 8


def check_positive_int(value, name: str, minimum: int = 1) -> int:
    """``value`` as an ``int`` >= ``minimum``, or a ``ValueError`` saying so."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise VlccValueError(
            f"{name} must be an integer >= {minimum}, got {value!r} of type {type(value).__name__}"
        )
    if value < minimum:
        raise VlccValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return int(value)


def check_cost(value, name: str) -> float:
    """``value`` as a finite float >= 0, or a ``ValueError`` saying so."""
    try:
        cost = float(value)
    except (TypeError, ValueError):
        raise VlccValueError(f"{name} must be a finite number >= 0, got {value!r}") from None
    if not math.isfinite(cost) or cost < 0:
        raise VlccValueError(f"{name} must be a finite number >= 0, got {value!r}")
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

    A schedule either holds its table (a numpy structured array of
    :data:`~vlcc_adjoint.schedules.actions.ACTION_DTYPE`), or, like
    :class:`~vlcc_adjoint.schedules.Revolve` and
    :class:`~vlcc_adjoint.schedules.Multistage` at large ``n``, the state of
    the recursion that emits it, from which any block of rows is produced on
    demand (:mod:`._chunks`: one emitter state per 65,536 rows instead of 19
    bytes per row).  :meth:`blocks` is the way to read a schedule in bounded
    memory, and every interpreter reads it so; :attr:`table` materialises the
    whole table on first access (``O(len(schedule))`` memory, 19 bytes an
    action, kept from then on) for inspection, slicing and plotting.
    Iterating yields action objects, one at a time.

    **Attributes:**

    - `table`: the actions, one row each (materialised on first access).
    - `n_steps`: the number of forward steps ``n``.
    - `levels`: the storage levels the schedule was planned for.
    - `forward_cost`, `adjoint_cost`: time of one forward / adjoint step.
    """

    n_steps: int
    levels: tuple[Level, ...]
    forward_cost: float
    adjoint_cost: float

    def __init__(
        self,
        table: np.ndarray | ChunkedTable,
        n_steps: int,
        levels: Sequence[Level] = (Level(None),),
        forward_cost: float = 1.0,
        adjoint_cost: float = 1.0,
    ):
        if isinstance(table, ChunkedTable):
            self._source = table
        else:
            table = np.asarray(table)
            if table.dtype != ACTION_DTYPE:
                raise VlccValueError(
                    f"a schedule table must have dtype ACTION_DTYPE, got {table.dtype}; "
                    "build it with vlcc_adjoint.schedules.actions_to_table"
                )
            table.flags.writeable = False
            self.table = table
        if not 1 <= len(levels) <= MAX_LEVELS:
            raise VlccValueError(f"a schedule has 1 to {MAX_LEVELS} levels, got {len(levels)}")
        self.n_steps = check_positive_int(n_steps, "steps")
        self.levels = tuple(levels)
        self.forward_cost = check_cost(forward_cost, "forward_cost")
        self.adjoint_cost = check_cost(adjoint_cost, "adjoint_cost")

    @property
    def table(self) -> np.ndarray:
        """The whole table, read-only; built from the blocks on first access."""
        table = self.__dict__.get("table")
        if table is None:
            source = self.__dict__.get("_source")
            if source is None:
                raise AttributeError(f"{type(self).__name__} has no table")
            table = _chunks.concatenate([source.chunk(k) for k in range(source.chunks)])
            table.flags.writeable = False
            self.__dict__["table"] = table
        return table

    @table.setter
    def table(self, value: np.ndarray) -> None:
        self.__dict__["table"] = value
        self.__dict__.pop("_simulated", None)  # simulate's statistics were of the old rows

    @property
    def materialised(self) -> bool:
        """Whether the whole table is held in memory (:attr:`table`)."""
        return self.__dict__.get("table") is not None

    def chunk_starts(self) -> np.ndarray:
        """The first row of each of the schedule's chunks, then its length.

        Chunks are the units in which a schedule produces its rows (about
        65,536 each); :meth:`chunk` returns one, in any order.
        """
        source = self.__dict__.get("_source")
        if source is not None:
            return source.starts
        m = len(self.table)
        return np.append(np.arange(0, m, _chunks.CHUNK_ROWS, dtype=np.int64), np.int64(m))

    def chunk(self, k: int) -> np.ndarray:
        """Rows ``chunk_starts()[k] .. chunk_starts()[k + 1] - 1``, read-only."""
        source = self.__dict__.get("_source")
        if source is not None:
            if self.materialised:
                return self.table[source.starts[k] : source.starts[k + 1]]
            return source.chunk(k)
        size = _chunks.CHUNK_ROWS
        return self.table[k * size : (k + 1) * size]

    def __iter__(self) -> Iterator[Action]:
        for block in self.blocks():
            for row in block:
                yield action_from_row(row)

    def blocks(self, rows: int = 1 << 16, start: int = 0) -> Iterator[np.ndarray]:
        """The table from row `start` on, as consecutive read-only blocks of
        at most `rows` rows each (same dtype as :attr:`table`).

        Interpreters consume a schedule this way: a schedule that produces its
        rows in chunks never holds its whole table, and its blocks are views
        of one chunk each (a block ends where a chunk does), the same rows as
        :attr:`table`'s, byte for byte.

        **Arguments:**

        - `rows`: the largest block (>= 1).
        - `start`: the first row (>= 0); ``blocks(start=s)`` yields
          ``table[s:]``.
        """
        rows = check_positive_int(rows, "rows")
        start = check_positive_int(start, "start", minimum=0)
        if self.materialised:
            table = self.table
            for first in range(start, len(table), rows):
                yield table[first : first + rows]
            return
        for piece in self._pieces(start):
            for first in range(0, len(piece), rows):
                yield piece[first : first + rows]

    def _pieces(self, start: int) -> Iterator[np.ndarray]:
        starts = self.chunk_starts()
        if start >= starts[-1]:
            return
        k = int(np.searchsorted(starts, start, side="right")) - 1
        yield self.chunk(k)[start - int(starts[k]) :]
        for j in range(k + 1, len(starts) - 1):
            yield self.chunk(j)

    def __len__(self) -> int:
        source = self.__dict__.get("_source")
        if source is None or self.materialised:
            return len(self.table)
        return len(source)

    def __getitem__(self, index):
        if self.materialised:
            if isinstance(index, slice):
                return [action_from_row(row) for row in self.table[index]]
            return action_from_row(self.table[index])
        m = len(self)
        if isinstance(index, slice):
            first, stop, step = index.indices(m)
            if step != 1:
                return [action_from_row(row) for row in self.table[index]]
            if stop <= first:
                return []
            out = []
            for block in self.blocks(rows=stop - first, start=first):
                out.extend(action_from_row(row) for row in block[: stop - first - len(out)])
                if len(out) == stop - first:
                    break
            return out
        i = int(index)
        if i < 0:
            i += m
        if not 0 <= i < m:
            raise VlccIndexError(f"action index {index} is out of range for {m} actions")
        return action_from_row(next(self.blocks(rows=1, start=i))[0])

    def stats(self) -> ScheduleStats:
        """Replay the schedule symbolically: see :func:`simulate`."""
        return simulate(self)

    def _params(self) -> str:
        return f"steps={self.n_steps}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._params()}, actions={len(self)})"
