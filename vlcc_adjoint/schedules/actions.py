"""The action vocabulary of checkpoint schedules, and its one semantics.

A schedule is a flat sequence of actions over states ``u_0 .. u_n``.  Forward
step ``i`` maps ``u_i -> u_{i+1}``; adjoint step ``i`` maps
``lambda_{i+1} -> lambda_i`` and needs ``u_i``.  Every reader of a
schedule (:func:`vlcc_adjoint.schedules.simulate`, which checks a table
against these rules; the action machine,
:class:`vlcc_adjoint.schedules.Machine`, which runs it against a client: the
Python executor, torch, the JAX host session; the compiled JAX backward
pass) follows the rules written here and nowhere else.

The machine that runs a schedule holds

* ``current``: the step of the forward state in hand, or nothing;
* for every storage level ``k`` a set of stored steps, at most ``slots[k]``;
* ``next_adjoint``: the adjoint step owed next, starting at ``n - 1``.

It starts with ``current = 0`` (``u_0`` in hand), empty levels and
``next_adjoint = n - 1``, and must end with ``next_adjoint = -1``.

=====================  =====================================================
action                 precondition -> effect
=====================  =====================================================
``Advance(a, b)``      ``current == a < b <= n`` -> ``current = b``;
                       costs ``b - a`` forward steps.
``Save(i, k)``         ``current == i``, ``i`` not in level ``k``, level
                       ``k`` has a free slot -> ``i`` stored in ``k``;
                       ``current`` unchanged.
``Load(i, k)``         ``i`` stored in ``k`` -> ``current = i``; the record
                       stays stored.
``Delete(i, k)``       ``i`` stored in ``k`` -> the record is gone.
``Move(i, k, d)``      ``i`` stored in ``k``, not in ``d``, ``d`` has a free
                       slot -> ``i`` stored in ``d`` and no longer in ``k``;
                       ``current`` unchanged (one read of ``k``, one write
                       of ``d``).
``Reverse(i)``         ``current == i == next_adjoint`` -> the adjoint step
                       ``i`` runs, ``next_adjoint = i - 1`` and nothing is
                       in hand any more (the solver may have consumed it).
=====================  =====================================================

The *forward count* of a schedule is the sum of ``b - a`` over its
``Advance`` actions: forward evaluations outside adjoint steps, the quantity
Griewank's binomial bound ``t(n, c)`` is about.

In a table (:data:`ACTION_DTYPE`) an action is one row of five fields:
``kind`` (an :class:`ActionKind`), ``a`` and ``b`` (steps), ``level`` and
``dst`` (levels); unused fields hold ``-1``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable

import numpy as np

from ..errors import VlccTypeError, VlccValueError

__all__ = [
    "ACTION_DTYPE",
    "ADVANCE",
    "DELETE",
    "LOAD",
    "MOVE",
    "REVERSE",
    "SAVE",
    "Action",
    "ActionKind",
    "Advance",
    "Delete",
    "Load",
    "Move",
    "Reverse",
    "FIELDS",
    "Save",
    "action_from_row",
    "actions_to_table",
    "make_action",
    "table_to_actions",
]


# The action kinds, named once.  Module-level ints, so that numba kernels
# read them as globals (numba freezes a global int into the compiled code as a
# constant: ``k == SAVE`` compiles to ``k == 1``), and plain Python compares
# them at the speed of a literal; :class:`ActionKind` is built from them.

#: ``kind`` of an ``Advance(a, b)`` row.
ADVANCE = 0
#: ``kind`` of a ``Save(i, k)`` row.
SAVE = 1
#: ``kind`` of a ``Load(i, k)`` row.
LOAD = 2
#: ``kind`` of a ``Delete(i, k)`` row.
DELETE = 3
#: ``kind`` of a ``Move(i, k, d)`` row.
MOVE = 4
#: ``kind`` of a ``Reverse(i)`` row.
REVERSE = 5


class ActionKind(enum.IntEnum):
    """The ``kind`` code of an action row: the module constants
    :data:`ADVANCE`, :data:`SAVE`, :data:`LOAD`, :data:`DELETE`,
    :data:`MOVE` and :data:`REVERSE` as an enumeration (``ActionKind.SAVE ==
    SAVE``)."""

    ADVANCE = ADVANCE
    SAVE = SAVE
    LOAD = LOAD
    DELETE = DELETE
    MOVE = MOVE
    REVERSE = REVERSE


#: Row layout of ``Schedule.table``: packed, 19 bytes an action.
ACTION_DTYPE = np.dtype([("kind", "u1"), ("a", "i8"), ("b", "i8"), ("level", "i1"), ("dst", "i1")])


@dataclasses.dataclass(frozen=True, slots=True)
class Advance:
    """Run forward steps ``start .. stop - 1``: ``u_start -> u_stop``."""

    start: int
    stop: int

    def row(self) -> tuple:
        return (ADVANCE, self.start, self.stop, -1, -1)


@dataclasses.dataclass(frozen=True, slots=True)
class Save:
    """Store the state in hand, ``u_step``, on storage level ``level``."""

    step: int
    level: int = 0

    def row(self) -> tuple:
        return (SAVE, self.step, -1, self.level, -1)


@dataclasses.dataclass(frozen=True, slots=True)
class Load:
    """Put the stored ``u_step`` of level ``level`` in hand (it stays stored)."""

    step: int
    level: int = 0

    def row(self) -> tuple:
        return (LOAD, self.step, -1, self.level, -1)


@dataclasses.dataclass(frozen=True, slots=True)
class Delete:
    """Free the record of ``u_step`` on level ``level``."""

    step: int
    level: int = 0

    def row(self) -> tuple:
        return (DELETE, self.step, -1, self.level, -1)


@dataclasses.dataclass(frozen=True, slots=True)
class Move:
    """Relocate the record of ``u_step`` from level ``src`` to level ``dst``."""

    step: int
    src: int
    dst: int

    def row(self) -> tuple:
        return (MOVE, self.step, -1, self.src, self.dst)


@dataclasses.dataclass(frozen=True, slots=True)
class Reverse:
    """Adjoint step ``step``: ``lambda_{step+1} -> lambda_step``, using ``u_step``."""

    step: int

    def row(self) -> tuple:
        return (REVERSE, self.step, -1, -1, -1)


#: Any one of the six actions (the type of an element of a schedule).
Action = Advance | Save | Load | Delete | Move | Reverse


#: The fields of a row, in order (the names of :data:`ACTION_DTYPE`).
FIELDS = ("kind", "a", "b", "level", "dst")


def action_from_row(row: np.void) -> Action:
    """The action object of one table row."""
    kind, a, b, level, dst = (int(row[f]) for f in FIELDS)
    return make_action(kind, a, b, level, dst)


def make_action(kind: int, a: int, b: int, level: int, dst: int) -> Action:
    """The action object of a row given by its five fields."""
    if kind == ADVANCE:
        return Advance(a, b)
    if kind == SAVE:
        return Save(a, level)
    if kind == LOAD:
        return Load(a, level)
    if kind == DELETE:
        return Delete(a, level)
    if kind == MOVE:
        return Move(a, level, dst)
    if kind == REVERSE:
        return Reverse(a)
    raise VlccValueError(f"unknown action kind {kind}; expected one of {list(ActionKind)}")


def actions_to_table(actions: Iterable[Action]) -> np.ndarray:
    """Pack an iterable of action objects into a table of :data:`ACTION_DTYPE`."""
    rows = []
    for action in actions:
        try:
            rows.append(action.row())
        except AttributeError:
            raise VlccTypeError(
                f"{action!r} is not a schedule action; use Advance, Save, Load, "
                "Delete, Move or Reverse"
            ) from None
    return np.array(rows, dtype=ACTION_DTYPE)


def table_to_actions(table: np.ndarray) -> list[Action]:
    """Unpack a table into action objects (one Python object per row)."""
    return [action_from_row(row) for row in table]
