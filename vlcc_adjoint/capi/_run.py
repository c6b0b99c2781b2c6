"""An adjoint run under a schedule, driven by a C or Fortran time loop.

The program owns the time loop and asks "what next?" (revolve's reverse
communication: Griewank & Walther, *Algorithm 799: revolve*, ACM TOMS
26(1), 2000); :class:`Run` answers by pulling the schedule's rows through
the one action machine (:class:`vlcc_adjoint.schedules.Machine` with
``returns=(ADVANCE, REVERSE)``): the machine performs the saves, loads,
deletes and moves itself, through this object (its client), on the
protected regions, with the store's planned read-ahead and its tiers, and
hands back only what the program must compute.

The answers (``vlcc_run_next``), with the regions holding ``u_k`` before
each is carried out:

=========================  ==========================================================
answer                     the program ...
=========================  ==========================================================
``ADVANCE(from, to)``      regions hold ``u_from``: advance them to ``u_to``
``TURN(n, n)``             regions hold ``u_n``: initialise the adjoint
``REVERSE(i + 1, i)``      regions hold ``u_i``: apply the adjoint of step ``i``
``DONE``                   stop: the adjoint of step 0 was the last
=========================  ==========================================================

TURN comes once, before the first REVERSE (of step ``n - 1``), with the
final state ``u_n`` in the regions: right after the ADVANCE that reaches
step ``n`` when the schedule's forward sweep does, and otherwise (revolve's
sweep ends at ``u_{n-1}``, as the schedules never need ``u_n`` themselves)
the run keeps a copy of ``u_{n-1}``, answers ``ADVANCE(n - 1, n)`` and
TURN, and restores ``u_{n-1}`` before ``REVERSE(n, n - 1)``: the one extra
step that the Python executor also evaluates for the objective.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..errors import VlccRuntimeError
from ..schedules import ADVANCE, REVERSE, Machine, Schedule, io_plan, simulate
from ..storage import TieredStore
from ._config import RunConfig, parse_config
from ._header import constant
from ._regions import Regions

__all__ = ["CallOrderError", "Run"]

#: The answers' kinds, as ``vlcc.h`` numbers them.
C_ADVANCE = constant("VLCC_ADVANCE")
C_TURN = constant("VLCC_TURN")
C_REVERSE = constant("VLCC_REVERSE")


class CallOrderError(VlccRuntimeError):
    """A call of the C interface that its handle's state does not allow: a
    region protected once the run started, ``next`` without regions or
    after DONE, a call on a handle that is closed."""


class Run:
    """The Python side of a ``vlcc_run``: the regions, the store, and the
    answers to ``vlcc_run_next`` (module docstring).

    **Arguments:**

    - `config`: the parsed ``config_json`` (:func:`parse_config`).

    The schedule is checked once (:func:`~vlcc_adjoint.schedules.simulate`),
    here; the store is made when the run starts (the first
    :meth:`actions` row), once the regions are known.
    """

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.schedule: Schedule = config.schedule
        self.n = self.schedule.n_steps
        self.levels = len(simulate(self.schedule).peak_slots)
        self.regions = Regions()
        self.state = self.regions.state
        self.store: TieredStore | None = None
        self.machine: Machine | None = None
        self.started = False
        self.closed = False

    @classmethod
    def open(cls, config_json: str) -> Run:
        """The run that ``config_json`` describes (``vlcc_run_open``)."""
        return cls(parse_config(config_json))

    def protect(self, name: str, address: int, dtype: str, shape: Sequence[int]) -> None:
        """Add a region to the state (``vlcc_run_protect``; see
        :meth:`Regions.protect`); only before the first ``next``."""
        self._check_open()
        if self.started:
            raise CallOrderError(
                f"region {name!r} is protected after the run started; protect every "
                "region before the first vlcc_run_next"
            )
        self.regions.protect(name, address, dtype, shape)

    def actions(self) -> Iterator[tuple[int, int, int]]:
        """The answers to ``vlcc_run_next``, as ``(kind, from, to)`` with the
        kinds of ``vlcc.h``; the iteration ends where ``VLCC_DONE`` is
        answered (DONE itself is not yielded)."""
        self._check_open()
        if not self.regions:
            raise CallOrderError(
                "vlcc_run_next before any region is protected; protect the state's "
                "memory with vlcc_run_protect first"
            )
        self.started = True
        return self._answers()

    def _answers(self) -> Iterator[tuple[int, int, int]]:
        self.store = store = self.config.make_store(self.levels, io_plan(self.schedule))
        if self.config.reserve:
            store.reserve(self.state, self.config.reserve)
        n = self.n
        turned = False
        self.machine = machine = Machine(self.schedule, self, returns=(ADVANCE, REVERSE))
        try:
            for kind, a, b, _, _ in machine:
                if kind == ADVANCE:
                    yield C_ADVANCE, a, b
                    if b == n and not turned:
                        turned = True
                        yield C_TURN, n, n
                    continue
                if not turned:  # the first Reverse, of step n - 1: u_n first
                    kept = self.regions.copy()
                    yield C_ADVANCE, a, a + 1
                    turned = True
                    yield C_TURN, n, n
                    self.regions.fill(kept, f"the copy of u_{a}")
                    del kept
                yield C_REVERSE, a + 1, a
        except Exception as err:
            where = machine.describe()
            if where:
                err.add_note(f"(at {where})")
            raise

    # -- the machine's client: the rows the run performs itself ---------------------

    def save(self, step: int, level: int) -> None:
        """Copy the regions into the store as ``u_step`` on `level`."""
        assert self.store is not None
        self.store.save(step, self.state, level=level)

    def load(self, step: int, level: int) -> None:
        """Restore the stored ``u_step`` of `level` into the regions."""
        assert self.store is not None
        self.store.load(step, level=level, out=self.state)

    def delete(self, step: int, level: int) -> None:
        """Free the record of ``u_step`` on `level`."""
        assert self.store is not None
        self.store.delete(step, level=level)

    def move(self, step: int, src: int, dst: int) -> None:
        """Relocate the record of ``u_step`` from `src` to `dst`."""
        assert self.store is not None
        self.store.move(step, src, dst)

    # -- the end ------------------------------------------------------------------

    def close(self) -> None:
        """Flush and close the store and forget the regions (``vlcc_run_close``).
        Idempotent."""
        if self.closed:
            return
        self.closed = True
        store, self.store, self.machine = self.store, None, None
        self.regions.clear()
        if store is not None:
            store.close()

    def _check_open(self) -> None:
        if self.closed:
            raise CallOrderError("this run is closed; open a new one with vlcc_run_open")

    def __repr__(self) -> str:
        return (
            f"Run({self.schedule!r}, regions={list(self.state)}, "
            f"{'closed' if self.closed else 'started' if self.started else 'open'})"
        )
