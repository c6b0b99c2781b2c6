"""The action machine: the one loop that runs a schedule's table.

Every interpreter of a schedule that calls back into the world (the Python
executor :func:`vlcc_adjoint.execute.run_adjoint`, the torch drop-ins, the
JAX host session, the C and Fortran interface, :func:`table_trace`) runs its
rows through :class:`Machine` and supplies only what each action *does*, as
a client object (:class:`ActionClient`):

=====================  ====================================================
row                    the client's method called
=====================  ====================================================
``Advance(a, b)``      ``client.advance(a, b)``
``Save(i, k)``         ``client.save(i, k)``
``Load(i, k)``         ``client.load(i, k)``
``Delete(i, k)``       ``client.delete(i, k)``
``Move(i, k, d)``      ``client.move(i, k, d)``
``Reverse(i)``         ``client.reverse(i)``
=====================  ====================================================

What the actions mean, their preconditions and effects, is written once in
:mod:`vlcc_adjoint.schedules.actions`; :func:`~vlcc_adjoint.schedules.simulate`
checks a table against those rules once, before a run, and the machine then
trusts it: it dispatches, it does not re-check.  Pure: no I/O, no threads,
nothing but :mod:`vlcc_adjoint.schedules`.

Two modes, one loop
-------------------

*Push* (:meth:`Machine.run`): the machine calls the client for every row,
in order; the call returns when the rows are done.  The executor works so.

*Pull*, or reverse communication (iterating the machine): the kinds named
in ``returns`` are not called but handed back to the caller, one row at a
time, as ``(kind, a, b, level, dst)``; the machine performs every other row
through its client before it answers.  This is revolve's calling convention
(Griewank & Walther, Algorithm 799, ACM TOMS 26(1), 2000): the solver owns
the time loop and asks "what next?", and the checkpointing engine does its
saves, loads and deletes itself, on memory the solver has registered with
it, answering only with what the solver must compute: with ``returns=(ADVANCE,
REVERSE)``, ``next(machine)`` is ``vlcc_run_next(run, &action)`` of the C
interface; the first ``REVERSE`` (of step ``n - 1``) is revolve's
``firsturn`` (the C interface's TURN), later ones its ``youturn``, and the
end of the iteration its ``terminate`` (DONE).  Push mode is the pull loop
with nothing to hand back, so both modes share one semantics by
construction, not by a test that keeps two loops equal.

Design for speed.  The rows are read through :meth:`Schedule.blocks`
(bounded memory: one block of at most 65,536 rows at a time, however long
the schedule) and converted to Python ints a block at a time
(``tolist``), and the kinds are tested in the order of their frequency in
a schedule, each branch one call of a method bound once per run: about a
tenth of a microsecond per action on top of the client's own work.  The
index of the row being run is kept in a local variable and stored only when
a row fails or is handed back (:attr:`Machine.index`), so an error can be
reported as "action 17 of the schedule: Save(3, 0)" (:meth:`Machine.describe`)
without a store per action.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from ..errors import VlccRuntimeError, VlccTypeError, VlccValueError
from ._schedule import Schedule, check_positive_int
from .actions import (
    ADVANCE,
    DELETE,
    LOAD,
    MOVE,
    REVERSE,
    SAVE,
    Action,
    ActionKind,
    make_action,
)

__all__ = ["BLOCK_ROWS", "ActionClient", "Machine", "Row", "perform"]

#: Rows converted to Python ints at a time (one chunk of a generated schedule).
BLOCK_ROWS = 1 << 16

#: A row handed to the caller in pull mode: ``(kind, a, b, level, dst)``.
Row = tuple[int, int, int, int, int]

#: The client's method for each kind, in the order the loop holds them.
_METHODS = {
    ADVANCE: "advance",
    SAVE: "save",
    LOAD: "load",
    DELETE: "delete",
    MOVE: "move",
    REVERSE: "reverse",
}


class ActionClient(Protocol):
    """What a :class:`Machine` calls, one method per action kind.

    The arguments are Python ints: steps (``0 .. n``) and storage levels.
    A client implements the methods of the kinds it is given; in pull mode
    the kinds handed back to the caller need none.
    """

    def advance(self, start: int, stop: int) -> None:
        """Forward steps ``start .. stop - 1`` from ``u_start`` in hand."""

    def save(self, step: int, level: int) -> None:
        """Store ``u_step``, the state in hand, on `level`."""

    def load(self, step: int, level: int) -> None:
        """Put the stored ``u_step`` of `level` in hand (it stays stored)."""

    def delete(self, step: int, level: int) -> None:
        """Free the record of ``u_step`` on `level`."""

    def move(self, step: int, src: int, dst: int) -> None:
        """Relocate the record of ``u_step`` from level `src` to `dst`."""

    def reverse(self, step: int) -> None:
        """Adjoint step `step`, with ``u_step`` in hand."""


class Machine:
    """Runs the rows of a schedule by kind against a client.

    **Arguments:**

    - `schedule`: the :class:`~vlcc_adjoint.schedules.Schedule` (valid:
      :func:`~vlcc_adjoint.schedules.simulate` accepts it).
    - `client`: an :class:`ActionClient`.
    - `start`, `stop`: run rows ``start .. stop - 1`` only (default: all),
      e.g. the forward sweep up to the first ``Reverse`` and, later, the
      rest.
    - `returns`: the action kinds handed back to the caller instead of
      called on the client (pull mode, module docstring); default none.
    - `progress`: called with the number of rows of each block once the
      block is done (a progress bar's ``update``).
    - `block_rows`: the most rows converted to Python ints at a time.

    **Attributes:**

    - `index`: the index in the schedule of the row last run, or being run
      when it failed, or last handed back; ``-1`` before the first.

    Push mode: :meth:`run`.  Pull mode: iterate the machine (``for kind, a,
    b, level, dst in machine``, or ``next(machine)``); each row of a kind in
    `returns` comes back once the rows before it are done.  A machine runs
    its rows once.
    """

    def __init__(
        self,
        schedule: Schedule,
        client: object,
        *,
        start: int = 0,
        stop: int | None = None,
        returns: Iterable[int] = (),
        progress: Callable[[int], object] | None = None,
        block_rows: int = BLOCK_ROWS,
    ):
        if not isinstance(schedule, Schedule):
            raise VlccTypeError(
                f"Machine runs a vlcc_adjoint.schedules.Schedule, got {type(schedule).__name__}"
            )
        m = len(schedule)
        self.schedule = schedule
        self.start = check_positive_int(start, "start", minimum=0)
        self.stop = m if stop is None else check_positive_int(stop, "stop", minimum=0)
        if not self.start <= self.stop <= m:
            raise VlccValueError(
                f"Machine rows start={self.start}, stop={self.stop} must satisfy "
                f"0 <= start <= stop <= {m}, the schedule's length"
            )
        self.returns = frozenset(_kind(kind) for kind in returns)
        self.handlers = tuple(
            None if kind in self.returns else _handler(client, kind) for kind in _METHODS
        )
        self.client = client
        self.progress = progress
        self.block_rows = check_positive_int(block_rows, "block_rows")
        self.index = -1
        self._rows: Iterator[Row] | None = None

    # -- the two modes -----------------------------------------------------------

    def run(self) -> None:
        """Push mode: run every row through the client; return when done."""
        for row in self:
            raise VlccRuntimeError(
                f"Machine.run was handed {make_action(*row)!r} to return to the caller "
                f"(returns={sorted(self.returns)}): iterate the machine instead"
            )

    def __iter__(self) -> Iterator[Row]:
        if self._rows is None:
            self._rows = _dispatch(self._blocks(), self.handlers, self.progress, self)
        return self._rows

    def __next__(self) -> Row:
        return next(iter(self))

    # -- what a failure names ----------------------------------------------------

    def action(self) -> Action | None:
        """The action at :attr:`index`, or ``None`` before the first."""
        return None if self.index < 0 else self.schedule[self.index]

    def describe(self) -> str:
        """``"action 17 of the schedule: Save(3, 0)"`` for :attr:`index`, or
        ``""`` before the first row."""
        action = self.action()
        return "" if action is None else f"action {self.index} of the schedule: {action!r}"

    # -- the loop ----------------------------------------------------------------

    def _blocks(self) -> Iterator[tuple[int, Iterator[tuple[int, int, int, int, int, int]]]]:
        """``(rows, iterator of (index, kind, a, b, level, dst))`` per block."""
        first, left = self.start, self.stop - self.start
        if left <= 0:
            return
        for block in self.schedule.blocks(rows=self.block_rows, start=first):
            if len(block) > left:
                block = block[:left]
            count = len(block)
            yield (
                count,
                zip(
                    range(first, first + count),
                    block["kind"].tolist(),
                    block["a"].tolist(),
                    block["b"].tolist(),
                    block["level"].tolist(),
                    block["dst"].tolist(),
                ),
            )
            first += count
            left -= count
            if left <= 0:
                return


def _dispatch(blocks, handlers, progress, owner) -> Iterator[Row]:
    """The one dispatch loop (module docstring): a generator that calls the
    handler of each row's kind, and yields the rows whose kind has none.

    `blocks` yields ``(rows, iterator of (index, kind, a, b, level, dst))``;
    `handlers` holds a callable or ``None`` per kind, in the order of
    ``_METHODS`` (ADVANCE, SAVE, LOAD, DELETE, MOVE, REVERSE); `progress` is called
    with each block's row count; ``owner.index`` receives the index of a row
    handed back, of the row that failed, and at the end of the last row."""
    advance, save, load, delete, move, reverse = handlers
    index = -1
    try:
        for count, rows in blocks:
            for index, kind, a, b, level, dst in rows:
                # Kinds in the order of their frequency in a schedule.
                if kind == ADVANCE:
                    if advance is None:
                        owner.index = index
                        yield kind, a, b, level, dst
                    else:
                        advance(a, b)
                elif kind == REVERSE:
                    if reverse is None:
                        owner.index = index
                        yield kind, a, b, level, dst
                    else:
                        reverse(a)
                elif kind == LOAD:
                    if load is None:
                        owner.index = index
                        yield kind, a, b, level, dst
                    else:
                        load(a, level)
                elif kind == SAVE:
                    if save is None:
                        owner.index = index
                        yield kind, a, b, level, dst
                    else:
                        save(a, level)
                elif kind == DELETE:
                    if delete is None:
                        owner.index = index
                        yield kind, a, b, level, dst
                    else:
                        delete(a, level)
                elif kind == MOVE:
                    if move is None:
                        owner.index = index
                        yield kind, a, b, level, dst
                    else:
                        move(a, level, dst)
                else:
                    raise VlccValueError(
                        f"unknown action kind {kind} in the schedule table; expected "
                        f"one of {[int(k) for k in ActionKind]} (validate it with simulate)"
                    )
            if progress is not None:
                progress(count)
    except BaseException:
        owner.index = index
        raise
    owner.index = index


def perform(client: object, actions: Iterable[Action]) -> None:
    """Run action objects that belong to no table (an
    :class:`~vlcc_adjoint.schedules.Online` sweep's ``capture(i)``, decided
    step by step) through the machine's loop against `client`, in push
    mode; their index is ``-1``."""
    rows = [(-1, *action.row()) for action in actions]
    if rows:
        handlers = tuple(_handler(client, kind) for kind in _METHODS)
        for _ in _dispatch([(len(rows), iter(rows))], handlers, None, _Index()):
            pass  # pragma: no cover - nothing is handed back in push mode


class _Index:
    """Where :func:`perform`'s loop leaves the index of its rows."""

    index = -1


def _kind(kind: int) -> int:
    """`kind` as an action kind's int, or a ``ValueError`` naming the kinds."""
    try:
        return int(ActionKind(kind))
    except (TypeError, ValueError):
        raise VlccValueError(
            f"{kind!r} is not an action kind; use {', '.join(k.name for k in ActionKind)} "
            "(vlcc_adjoint.schedules.ADVANCE, ...)"
        ) from None


def _handler(client: object, kind: int) -> Callable:
    """The client's bound method for `kind`, or, when it has none, a function
    that fails naming it (a client need implement only the kinds its
    schedules hold)."""
    name = _METHODS[kind]
    method = getattr(client, name, None)
    if method is not None:
        return method

    def missing(*args):
        what = ActionKind(kind).name
        raise VlccTypeError(
            f"{type(client).__name__} has no {name}() method, and the schedule has a {what} "
            f"action: implement {name}(), or hand {what} back to the caller "
            "(Machine(..., returns=...))"
        )

    return missing
