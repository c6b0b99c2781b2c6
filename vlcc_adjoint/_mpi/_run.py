"""SPMD run_adjoint: every rank interprets the same schedule on its partition.

The serial interpreter (:func:`vlcc_adjoint.execute.run_adjoint`) already
does everything a rank needs: the schedule is global (the same steps are
saved, loaded and recomputed everywhere) and each rank's store holds its
own blocks.  What SPMD adds, around that interpreter:

1. **The schedule check.**  Before the first step, every rank hashes its
   schedule (class, step count, levels, the whole action table: xxh3-64)
   and the hashes are all-gathered; ranks holding different schedules (a
   snapshot count computed from rank-local memory, a different ``n``) would
   otherwise deadlock in their first mismatched collective.  A mismatch is
   a :class:`ScheduleMismatchError` on every rank, naming which ranks hold
   which schedule.
2. **Failure propagation.**  The run runs under a
   :class:`~vlcc_adjoint.mpi.Guard`: before every solver call the rank
   checks the error channel, every collective wait watches it, and an
   exception on any rank is sent to all (then ``MPI_Abort`` as the last
   resort).  See :mod:`._comm`.
3. **A collective end.**  With a :class:`~vlcc_adjoint.mpi.DistributedStore`
   the run ends with its final commit (every rank's records persisted, or
   the same error everywhere); then the run statistics are reduced across
   ranks (:class:`ReducedStats`: the slowest rank's times, total bytes).
4. **Online schedules** stop when the user's criterion holds; the criterion
   is evaluated on every rank and its results compared (a criterion of
   rank-local data that differs between ranks is an error, not a hang).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import xxhash

from ..errors import VlccTypeError, VlccValueError
from ..execute import AdjointResult, register_spmd
from ..schedules import Schedule
from ._comm import AgreedError, Guard
from ._store import DistributedStore
from ._zarr import SharedZarrTier

if TYPE_CHECKING:
    from ..solver import Solver
    from ..storage import TieredStore

__all__ = [
    "DistributedAdjointResult",
    "ReducedStats",
    "ScheduleMismatchError",
    "run_adjoint",
    "schedule_fingerprint",
]


class ScheduleMismatchError(AgreedError, ValueError):
    """The ranks of an SPMD run hold different schedules (raised on every rank)."""


@dataclasses.dataclass(frozen=True)
class ReducedStats:
    """Run statistics reduced over the ranks of an SPMD run.

    **Attributes:**

    - `nranks`.
    - `wall_seconds_max`, `forward_seconds_max`, `adjoint_seconds_max`:
      the slowest rank's times.
    - `stall_seconds_max`, `stall_seconds_mean`: time ranks waited in
      store calls (the run waits for its slowest rank: the max matters).
    - `comm_wait_seconds_max`: time waiting for other ranks in the guard
      (halo exchanges through :class:`~vlcc_adjoint.mpi.HaloExchange`,
      collectives).
    - `commit_seconds_max`: time in collective commits (flush included).
    - `bytes_written`, `bytes_read`: per level, summed over ranks
      (uncompressed; the tiers' ``bytes_in``/``bytes_out``).
    - `records_committed`: records published to shared levels.
    """

    nranks: int
    wall_seconds_max: float
    forward_seconds_max: float
    adjoint_seconds_max: float
    stall_seconds_max: float
    stall_seconds_mean: float
    comm_wait_seconds_max: float
    commit_seconds_max: float
    bytes_written: tuple[int, ...]
    bytes_read: tuple[int, ...]
    records_committed: int

    @property
    def total_bytes_written(self) -> int:
        return sum(self.bytes_written)

    @property
    def total_bytes_read(self) -> int:
        return sum(self.bytes_read)


@dataclasses.dataclass(frozen=True, repr=False)
class DistributedAdjointResult(AdjointResult):
    """:class:`~vlcc_adjoint.execute.AdjointResult` of one rank, plus `rank`,
    `nranks` and `reduced` (:class:`ReducedStats` over all ranks).  The
    per-rank fields (``adjoint``, ``final_state``, ``store_stats``, times)
    are this rank's."""

    rank: int = 0
    nranks: int = 1
    reduced: ReducedStats | None = None


def schedule_fingerprint(schedule: Schedule) -> int:
    """xxh3-64 of a schedule: class, steps, levels, costs and action table."""
    h = xxhash.xxh3_64()
    h.update(type(schedule).__name__.encode())
    h.update(
        repr(
            (
                schedule.n_steps,
                getattr(schedule, "snapshots", None),
                tuple(getattr(schedule, "levels", ()) or ()),
                getattr(schedule, "forward_cost", None),
                getattr(schedule, "adjoint_cost", None),
            )
        ).encode()
    )
    # The rows block by block: a schedule produced in chunks is never
    # materialised whole just to be compared.
    if isinstance(schedule, Schedule) and schedule.n_steps is not None:
        for block in schedule.blocks():
            h.update(np.ascontiguousarray(block).data.cast("B"))
    return h.intdigest()


def _check_schedule(guard: Guard, schedule) -> None:
    fp = schedule_fingerprint(schedule)
    mine = np.array([fp & 0xFFFFFFFF, fp >> 32], np.int64)
    every = guard.allgather(mine, "comparing the ranks' schedules")
    values = [int(lo) | (int(hi) << 32) for lo, hi in every]
    if len(set(values)) == 1:
        return
    groups: dict[int, list[int]] = {}
    for r, v in enumerate(values):
        groups.setdefault(v, []).append(r)
    described = "; ".join(f"ranks {ranks} hold schedule {v:016x}" for v, ranks in groups.items())
    raise ScheduleMismatchError(
        f"the ranks hold different schedules ({described}; this rank: {schedule!r}); build the "
        "schedule from values every rank shares (n, snapshot counts from a reduced memory "
        "budget), not from rank-local ones"
    )


class _GuardedSolver:
    """The solver, checking the error channel before every step."""

    def __init__(self, solver, guard: Guard):
        self._solver = solver
        self._guard = guard
        many = getattr(solver, "forward_many", None)
        if many is not None:

            def forward_many(state, start, stop):
                guard.check()
                return many(state, start, stop)

            self.forward_many = forward_many

    def forward(self, state, step):
        self._guard.check()
        return self._solver.forward(state, step)

    def adjoint(self, state, adj, step):
        self._guard.check()
        return self._solver.adjoint(state, adj, step)

    def __getattr__(self, name):
        return getattr(self._solver, name)


class _Borrowed:
    """The DistributedStore, lent to the serial interpreter without its
    ``close`` (the SPMD run closes it: collectively on success, locally on
    failure)."""

    def __init__(self, store):
        self._store = store

    def close(self, *args, **kwargs) -> None:
        pass

    def __getattr__(self, name):
        return getattr(self._store, name)


def _agreed_stop(stop, guard: Guard):
    def agreed(state, step):
        local = 1 if stop(state, step) else 0
        m = guard.allreduce(
            np.array([local, -local], np.int64), "min", "evaluating the stop criterion"
        )
        if m[0] != -m[1]:
            raise AgreedError(
                f"the stop criterion is true on some ranks and false on others at step {step}; "
                "make it collective (e.g. compare a residual reduced with comm.allreduce)"
            )
        return bool(m[0])

    return agreed


def _reduce(
    guard: Guard, result: AdjointResult, commit_seconds: float, committed: int, nlevels: int
) -> ReducedStats:
    st = result.store_stats
    tiers = getattr(st, "tiers", ()) or ()
    written = np.zeros(nlevels, np.int64)
    read = np.zeros(nlevels, np.int64)
    for t in tiers:
        if t.level < nlevels:
            written[t.level] = t.bytes_in
            read[t.level] = t.bytes_out
    what = "reducing the run statistics"
    times = np.array(
        [
            result.wall_seconds,
            result.forward_seconds,
            result.adjoint_seconds,
            result.stall_seconds,
            guard.wait_seconds,
            commit_seconds,
        ]
    )
    tmax = guard.allreduce(times, "max", what)
    sums = guard.allreduce(
        np.concatenate([[result.stall_seconds], written.astype(float), read.astype(float)]),
        "sum",
        what,
    )
    return ReducedStats(
        nranks=guard.size,
        wall_seconds_max=float(tmax[0]),
        forward_seconds_max=float(tmax[1]),
        adjoint_seconds_max=float(tmax[2]),
        stall_seconds_max=float(tmax[3]),
        stall_seconds_mean=float(sums[0]) / guard.size,
        comm_wait_seconds_max=float(tmax[4]),
        commit_seconds_max=float(tmax[5]),
        bytes_written=tuple(int(x) for x in sums[1 : 1 + nlevels]),
        bytes_read=tuple(int(x) for x in sums[1 + nlevels :]),
        records_committed=committed,
    )


def run_adjoint(
    solver: Solver,
    schedule: Schedule,
    u0: Any,
    adj_final: Any,
    store: DistributedStore | TieredStore | None = None,
    progress: bool = False,
    *,
    comm: Any,
    stop: Callable[[Any, int], bool] | None = None,
    max_steps: int | None = None,
    check: bool = True,
    check_finite: bool = False,
    timeout: float | None = 600.0,
    abort_after: float | None = None,
) -> DistributedAdjointResult:
    """:func:`vlcc_adjoint.execute.run_adjoint` on every rank of `comm` (SPMD).

    Every rank calls it with the same `schedule` and its own partition:
    `solver` advances this rank's block (exchanging halos with its
    neighbours, e.g. with :class:`~vlcc_adjoint.mpi.HaloExchange`), `u0`
    and `adj_final` are this rank's, `store` is this rank's (a
    :class:`~vlcc_adjoint.mpi.DistributedStore` for a shared persistent
    level; ``None``: memory tiers sized by the schedule, per rank).

    **Arguments:** as ``execute.run_adjoint``, plus

    - `comm`: the mpi4py communicator of the run (collective over it).
    - `timeout`: the most seconds any wait for other ranks may last (the
      store's own when `store` is a ``DistributedStore``).
    - `abort_after`: after a failure, how long to wait for every rank to
      acknowledge it before ``MPI_Abort`` (see :class:`~vlcc_adjoint.mpi.Guard`).

    **Returns:** a :class:`DistributedAdjointResult` (this rank's
    ``lambda_0`` block and statistics, and ``reduced``: over all ranks).

    **Raises:** on every rank, within a bounded time, when any rank fails:
    that rank raises its own exception; the others
    :class:`~vlcc_adjoint.mpi.RankFailedError` naming it (or, for failures
    decided together, the same :class:`~vlcc_adjoint.mpi.AgreedError`,
    e.g. :class:`ScheduleMismatchError`).
    """
    from ..execute import run_adjoint as serial_run

    shared: DistributedStore | None = None
    lent: TieredStore | None
    if isinstance(store, DistributedStore):
        if store.comm.py2f() != comm.py2f():
            raise VlccValueError(
                "the DistributedStore was built on another communicator than comm; "
                "build it on the run's communicator"
            )
        shared, guard = store, store.guard
        # The executor calls a DistributedStore as it calls a TieredStore (its
        # per-rank store does the work); the SPMD run closes it, not the executor.
        lent = cast("TieredStore", _Borrowed(store))
    else:
        if any(isinstance(t, SharedZarrTier) for t in getattr(store, "tiers", ())):
            raise VlccTypeError(
                "a SharedZarrTier level needs the collective commit of a DistributedStore: "
                "pass DistributedStore(comm, tiers, plan) instead of a TieredStore"
            )
        guard = Guard(comm, timeout, abort_after)
        lent = store
    with guard.active():
        try:
            _check_schedule(guard, schedule)
            adj = adj_final
            if callable(adj_final):

                def guarded(u):
                    guard.check()
                    return adj_final(u)

                adj = guarded
            result = serial_run(
                _GuardedSolver(solver, guard),
                schedule,
                u0,
                adj,
                store=lent,
                progress=progress and guard.rank == 0,
                stop=None if stop is None else _agreed_stop(stop, guard),
                max_steps=max_steps,
                check=check,
                check_finite=check_finite,
            )
            commit_seconds, committed = 0.0, 0
            if shared is not None:
                shared.finish()
                commit_seconds, committed = shared.commit_seconds, len(shared.committed)
            nlevels = len(getattr(result.store_stats, "tiers", ()) or ())
            reduced = _reduce(guard, result, commit_seconds, committed, nlevels)
        except BaseException as error:
            guard.fail(error)
            if shared is not None:
                try:
                    shared.close(collective=False)
                except Exception as close_error:
                    error.add_note(f"closing the DistributedStore also failed: {close_error!r}")
            raise
    guard.close()
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(AdjointResult)}
    return DistributedAdjointResult(**fields, rank=guard.rank, nranks=guard.size, reduced=reduced)


# ``vlcc_adjoint.run_adjoint(..., comm=comm)`` hands SPMD runs to this module.
register_spmd(run_adjoint)
