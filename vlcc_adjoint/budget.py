"""Memory-budget mode: pick the schedule and the storage levels for the user.

A user knows how much memory and disk a run may use; :func:`plan` turns
those budgets into a schedule, and a store to run it with:

1. slots: ``m = memory_bytes // state_bytes`` states fit in memory and
   ``d = disk_bytes // state_bytes`` on disk;
2. costs, in units of one forward step: the forward and adjoint step
   times, the memory save / restore and the disk write / read times of one
   state, measured by a short calibration run (steps of the solver over a
   window of wall time, records saved to and restored from the store's
   memory level and a temporary zarr tier), or given; they are rounded to
   a grid of powers of ``2^(1/4)`` so that timing noise does not change
   the schedule;
3. candidates, each replayed by :func:`~vlcc_adjoint.schedules.simulate`
   under the same cost model: ``StoreAll`` when memory holds every state,
   ``Revolve(n, m)`` on memory alone, ``Multistage(n, [m, d])`` over memory
   and disk; the least predicted time wins.

The decision and the numbers behind it are kept in :attr:`BudgetPlan.explain`.

With ``gradient_rtol``, the memory level of :meth:`BudgetPlan.make_store`
holds lossy checkpoints (``CompressedMemoryTier(ErrorBounded(...))``) whose
bound ``run_adjoint(..., gradient_rtol=budget_plan.gradient_rtol)`` chooses
from the gradient's error budget (:mod:`vlcc_adjoint._error_budget`).  The
slots are still counted at the uncompressed state size: the ratio the
budget allows is known only after the pilot runs, so the lossy level makes
the plan's memory budget a bound that is kept with room to spare, not more
slots.  The disk level stays lossless.
The exact two-level dynamic program costs ``O(n (m + 1) (d + 1))`` time and
memory; beyond a few hundred million states the disk slots offered to it are
capped (a schedule with fewer disk slots is still valid, just not proven
optimal for the larger budget), and the explanation says so.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from .errors import VlccValueError
from .schedules import Level, Multistage, Revolve, Schedule, StoreAll, simulate
from .state import Structure, state_nbytes

if TYPE_CHECKING:
    from .storage import Tier, TieredStore

__all__ = ["BudgetPlan", "SolveProgress", "plan", "slots_within"]

#: Largest ``n * (m + 1) * (d + 1)`` handed to the exact two-level program.
MAX_MULTISTAGE_STATES = 3 * 10**7

#: Bytes of metadata a disk record costs per leaf, beyond its data.
DISK_RECORD_OVERHEAD = 4096


@dataclasses.dataclass(frozen=True)
class BudgetPlan:
    """The schedule :func:`plan` chose, and why.

    Not an :class:`~vlcc_adjoint.schedules.IOPlan` (the list of future
    reads and writes that ``TieredStore(plan=)`` takes):
    :meth:`make_store` builds the store for :attr:`schedule`, with its
    IOPlan, or ``io_plan(budget_plan.schedule)`` gives the IOPlan itself.

    **Attributes:**

    - `schedule`: the chosen schedule.
    - `memory_slots`, `disk_slots`: states that fit in each budget.
    - `state_bytes`: bytes of one stored state.
    - `step_seconds`, `write_seconds`, `read_seconds`, `copy_seconds`: the
      costs measured or given (disk write / read of one state, memory copy
      of one state); `adjoint_cost`: an adjoint step in forward steps.  The
      schedule is chosen, and its time predicted, with these rounded by
      :func:`round_cost`.
    - `predicted_seconds`: the schedule's predicted run time.
    - `candidates`: ``{name: predicted seconds}`` of every schedule weighed.
    - `explain`: the decision in words.
    - `gradient_rtol`: the gradient-error budget the memory level is lossy
      for (pass it on to :func:`~vlcc_adjoint.run_adjoint`), or ``None``.
    """

    schedule: Schedule
    memory_bytes: int
    disk_bytes: int
    memory_slots: int
    disk_slots: int
    state_bytes: int
    step_seconds: float
    write_seconds: float
    read_seconds: float
    copy_seconds: float
    adjoint_cost: float
    predicted_seconds: float
    candidates: dict
    explain: str
    gradient_rtol: float | None = None

    def make_store(
        self, path: str | os.PathLike | None = None, **store_options: Any
    ) -> TieredStore:
        """A :class:`~vlcc_adjoint.storage.TieredStore` for :attr:`schedule`:
        a memory tier of `memory_bytes` (error-bounded compressed memory
        with :attr:`gradient_rtol`; its bound is set by ``run_adjoint(...,
        gradient_rtol=...)``) and, for a two-level schedule, a
        :class:`~vlcc_adjoint.storage.ZarrTier` of `disk_bytes`, with the
        schedule's I/O plan for prefetching.

        **Arguments:**

        - `path`: the zarr store's directory; it and the records in it stay
          after the run.  Default (``None``): a new temporary directory
          (``vlcc-disk-*`` in the system's temporary directory), which the
          store removes, with everything in it, when it is closed
          (``run_adjoint`` closes the store it is given); a store that is
          never closed leaves it to the interpreter's exit, with a
          ``ResourceWarning``.
        - `store_options`: passed on to ``TieredStore`` (with a disk level,
          `staging_bytes` and `prefetch_bytes` default to two states and one
          state, which the memory budget pays for).  With
          ``close_tiers=False`` the caller closes the tiers, and the
          temporary directory goes with the zarr tier's ``close()``.
        """
        from .schedules import io_plan
        from .storage import MemoryTier, TieredStore, ZarrTier

        capacity = self.memory_slots * self.state_bytes
        tiers: list[Tier]
        if self.gradient_rtol is None:
            tiers = [MemoryTier(capacity_bytes=capacity)]
        else:
            from .storage import CompressedMemoryTier
            from .storage.codecs import ErrorBounded

            # An encoded record is at most a few headers larger than the state
            # (a leaf that does not compress is stored exactly).
            tiers = [
                CompressedMemoryTier(
                    ErrorBounded(1e-3),
                    capacity_bytes=capacity + self.memory_slots * DISK_RECORD_OVERHEAD,
                )
            ]
        if len(self.schedule.levels) > 1:
            if path is None:
                tiers.append(_temporary_zarr_tier(self.disk_bytes))
            else:
                tiers.append(ZarrTier(path, capacity_bytes=self.disk_bytes))
            # The memory budget also pays for two states being written behind
            # the computation and one being read ahead of it.  Free capture
            # buffers are kept for reuse only within the store's total of
            # memory capacity + staging + read cache (TieredStore bounds its
            # pool by it), so reusing them does not break the budget.
            store_options.setdefault("staging_bytes", 2 * self.state_bytes)
            store_options.setdefault("prefetch_bytes", self.state_bytes)
        return TieredStore(tiers, plan=io_plan(self.schedule), **store_options)

    def __str__(self) -> str:
        return self.explain


def _temporary_zarr_tier(capacity_bytes: int) -> Tier:
    """A :class:`~vlcc_adjoint.storage.ZarrTier` in a new temporary directory
    of its own, which its ``close()`` removes with everything in it.

    The directory is a :class:`tempfile.TemporaryDirectory`: removed by
    ``close()`` after the tier has released it, or, for a tier never closed,
    by the directory object's finalizer at the interpreter's exit (with a
    ``ResourceWarning`` naming it).  The records are scratch: once the tier
    is closed they are gone, unlike a ZarrTier's at a path of the caller's.
    """
    from .storage import ZarrTier

    class TemporaryZarrTier(ZarrTier):
        def __init__(self, scratch: tempfile.TemporaryDirectory, capacity: int):
            self.scratch = scratch
            super().__init__(scratch.name, capacity_bytes=capacity)

        def close(self) -> None:
            try:
                super().close()
            finally:
                self.scratch.cleanup()

    scratch = tempfile.TemporaryDirectory(prefix="vlcc-disk-")
    try:
        return TemporaryZarrTier(scratch, capacity_bytes)
    except BaseException:
        scratch.cleanup()
        raise


def slots_within(
    memory_bytes: int, disk_bytes: int, state_bytes: int, leaves: int = 4
) -> tuple[int, int, int]:
    """The checkpoint slots :func:`plan` finds in a memory and a disk budget.

    A disk record also carries its zarr metadata (:data:`DISK_RECORD_OVERHEAD`
    bytes a leaf, and one more for the record), and with a disk level three
    states of the memory budget are the asynchronous store's buffers (two
    being written behind the computation, one read ahead of it).

    **Arguments:**

    - `memory_bytes`, `disk_bytes`: the budgets.
    - `state_bytes`: bytes of one state.
    - `leaves`: arrays in one state.

    **Returns:** ``(m, d, reserve)``: memory checkpoint slots (``< 1``: the
    budget holds none), disk slots, and the states reserved as buffers.
    """
    d = int(disk_bytes // (state_bytes + DISK_RECORD_OVERHEAD * (leaves + 1)))
    reserve = 3 if d > 0 else 0
    return int(memory_bytes // state_bytes) - reserve, d, reserve


#: Wall time each step calibration samples (forward, adjoint): on a machine
#: shared with other work, a few steps timed alone see an idle core, while
#: the run sees the machine's load; a window of several scheduler time
#: slices sees it too.  The mean over the window is the estimate.
CALIBRATION_SECONDS = 0.2

#: Costs are rounded to this grid, in units of the forward step (powers of
#: ``2^(1/4)``: at most 9% off), before a schedule is chosen, so that timing
#: noise well inside a grid cell does not change the schedule.
COST_GRID = 4


def round_cost(ratio: float) -> float:
    """`ratio` rounded to the nearest power of ``2^(1/COST_GRID)`` (0 stays 0)."""
    if ratio <= 0.0:
        return 0.0
    return float(2.0 ** (round(COST_GRID * np.log2(ratio)) / COST_GRID))


def _time_steps(
    solver, u0, steps: int, max_steps: int, adj_final=None, seconds: float = CALIBRATION_SECONDS
) -> tuple[float, float | None]:
    """Mean seconds of one forward step and of one adjoint step.

    Forward steps run on a copy of `u0` (the first one, which may compile,
    untimed) until `seconds` have passed, at least `steps` and at most
    `max_steps` of them (``n``: a solver may index its data by step).  With
    `adj_final` (``lambda_n`` or a callable of ``u_n``), adjoint steps
    ``k-1, k-2, ...`` then run from ``adj_final(u_k)`` with ``u_k`` in hand,
    the same way.  Their side effects (a solver accumulating a gradient)
    happen: reset them before the run.

    **Returns:** ``(forward seconds, adjoint seconds or None)``.
    """
    from ._run import copy_state

    copy = getattr(solver, "copy", None) or copy_state
    state = copy(u0)
    state = solver.forward(state, 0)  # compile / warm up, untimed
    k, t0 = 1, time.perf_counter()
    while k < max_steps and (k <= steps or time.perf_counter() - t0 < seconds):
        state = solver.forward(state, k)
        k += 1
    forward = (time.perf_counter() - t0) / max(k - 1, 1) if k > 1 else None
    if forward is None:  # a one-step loop: time that step
        t0 = time.perf_counter()
        solver.forward(copy(u0), 0)
        forward = time.perf_counter() - t0
    if adj_final is None:
        return forward, None
    adj = adj_final(state) if callable(adj_final) else copy(adj_final)
    adj = solver.adjoint(state, adj, k - 1)  # warm up, untimed
    i, t0 = k - 2, time.perf_counter()
    done = 0
    while i >= 0 and (done < steps or time.perf_counter() - t0 < seconds):
        adj = solver.adjoint(state, adj, i)
        i -= 1
        done += 1
    if done == 0:
        t0 = time.perf_counter()
        solver.adjoint(state, adj, 0)
        return forward, time.perf_counter() - t0
    return forward, (time.perf_counter() - t0) / done


#: Bytes of records the memory calibration cycles through (at most the
#: memory budget's slots): enough that they are not all in the core's caches.
CALIBRATION_BYTES = 64 << 20


def _time_memory(u0, state_bytes: int, slots: int, solver=None) -> float:
    """Seconds one memory save or restore costs, measured through the store.

    A bare ``np.copyto`` of one state into one buffer, timed five times,
    measures a copy whose source and destination are both in the core's
    caches after the first round: on a shared 2-core machine, a
    1 MiB state copied in 40-45 us, while the same saves and restores in a
    run (each leaf copied with its checksum, into or out of a record that
    was written long ago, plus the store's bookkeeping) took 110-130 us per
    state, so ``plan`` predicted the memory level at a third of its cost.
    Here the store itself is timed, built as :meth:`BudgetPlan.make_store`
    builds its memory level: ``save`` of a state like `u0` into `k`
    records, ``load`` of each back (into the state in place if the solver
    restores in place, as :func:`~vlcc_adjoint.run_adjoint` then does), and
    ``delete``, cycling through ``k = min(slots, CALIBRATION_BYTES //
    state_bytes)`` records (at least 2), as many as the run may keep (the
    budget pays for them), so the copies meet memory as cold as in the run.
    Three rounds; the first also allocates the buffers, the median is kept.

    **Returns:** the mean of one ``save`` (with its ``delete``) and one
    ``load``, the price of one memory write or read in the cost model.
    """
    from ._run import copy_state
    from .storage import MemoryTier, TieredStore

    if u0 is not None:
        state = copy_state(u0)
        nbytes = state_nbytes(state)
    else:
        state = np.ones(max(state_bytes // 8, 1))
        nbytes = state.nbytes
    k = max(2, min(slots, 256, CALIBRATION_BYTES // max(nbytes, 1)))
    in_place = bool(getattr(solver, "restore_in_place", False)) and u0 is not None
    store = TieredStore([MemoryTier(capacity_bytes=k * nbytes)], workers=0)
    rounds = []
    try:
        for _ in range(3):
            t0 = time.perf_counter()
            for j in range(k):
                store.save(j, state)
            for j in range(k):
                if in_place:
                    store.load(j, out=state)
                else:
                    state = store.load(j)
            for j in range(k):
                store.delete(j)
            rounds.append((time.perf_counter() - t0) / (2 * k))  # k saves (+ deletes), k loads
    finally:
        store.close()
    return float(np.median(rounds))


def _time_disk(
    nbytes: int, path=None, seconds: float = CALIBRATION_SECONDS, rounds: tuple[int, int] = (3, 16)
) -> tuple[float, float]:
    """Seconds to write and to read back one record of `nbytes` on a zarr tier.

    Records are written and read back, each once, for `seconds` of wall
    time, at least ``rounds[0]`` and at most ``rounds[1]`` of them; the
    medians are kept (one slow round - a directory created, a page-cache
    flush - does not stand for the run).
    """
    from .storage import ZarrTier, make_record

    rng = np.random.default_rng(0)
    data = rng.standard_normal(max(nbytes // 8, 1))
    with tempfile.TemporaryDirectory(prefix="vlcc-calibrate-", dir=path) as tmp:
        tier = ZarrTier(tmp)
        record = make_record({"calibration": True}, [data])
        writes, reads = [], []
        start = time.perf_counter()
        k = 0
        while k < rounds[0] or (k < rounds[1] and time.perf_counter() - start < seconds):
            t0 = time.perf_counter()
            tier.put(f"c{k}", record)
            writes.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            tier.get(f"c{k}")
            reads.append(time.perf_counter() - t0)
            k += 1
        tier.close()
    return float(np.median(writes)), float(np.median(reads))


#: A solve estimated to take longer than this many seconds says so, with how to
#: plan faster, and then shows its progress; a shorter one stays quiet.
LONG_SOLVE_SECONDS = 10.0

#: Seconds a solve runs before its duration is estimated, and the window its
#: rate is measured over (the most recent seconds: the first lengths of the
#: Multistage program are cheaper than the rest, so the rate from the start
#: would promise too little time).
ESTIMATE_AFTER_SECONDS = 2.0
RATE_WINDOW_SECONDS = 1.0

#: Seconds between two progress lines where no bar can be drawn (not a terminal).
PROGRESS_LINE_SECONDS = 10.0


def _duration(seconds: float) -> str:
    """``seconds`` in words a person reads at a glance: 40 s, 2.5 min, 1.2 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class SolveProgress:
    """Shows how far a long schedule solve has come: a `progress` callable of
    :class:`~vlcc_adjoint.schedules.Multistage`, called with ``(done,
    total)`` lengths from a helper thread while the solve runs.

    A short solve stays quiet.  After :data:`ESTIMATE_AFTER_SECONDS`, the
    time left is estimated from the rate over the last
    :data:`RATE_WINDOW_SECONDS`; when the whole solve will take longer than
    :data:`LONG_SOLVE_SECONDS`, one line says what is being solved, about how
    long it will take, that Ctrl-C stops it, and how to plan faster
    (`advice`); then a ``tqdm`` bar on `stream` shows the progress where
    `stream` is a terminal, or a line every :data:`PROGRESS_LINE_SECONDS`
    says how far it is and how long is left; the end says how long it took.

    **Arguments:**

    - `what`: what is being solved, as the lines name it.
    - `advice`: how to make such a request faster (a clause after "to plan
      faster, ").
    - `say`: where the lines go (default: `stream`, one line each).
    - `stream`: the bar's stream (default: standard error); the bar is
      drawn only where it is a terminal and `say` is not given.
    - `clock`: seconds, from any origin (default: ``time.perf_counter``).
    """

    def __init__(
        self,
        what: str,
        advice: str,
        say: Callable[[str], None] | None = None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.what = what
        self.advice = advice
        self.stream = sys.stderr if stream is None else stream
        self.say = say or self._print
        isatty = getattr(self.stream, "isatty", None)
        self.use_bar = say is None and callable(isatty) and bool(isatty())
        self.clock = clock
        self.start = clock()
        self.samples: list[tuple[float, int]] = []  # (seconds, done) over the rate window
        self.announced = False
        self.decided = False  # whether the estimate has been made
        self.last_line = 0.0
        self.bar: Any = None

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def _left(self, now: float, done: int, total: int) -> float | None:
        """Seconds left at the recent rate (None: no progress seen yet)."""
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW_SECONDS:
            self.samples.pop(0)
        t0, d0 = self.samples[0]
        if done <= d0 or now <= t0:
            return None
        return (total - done) * (now - t0) / (done - d0)

    def __call__(self, done: int, total: int) -> None:
        now = self.clock() - self.start
        left = self._left(now, done, total)
        if done >= total:
            if self.bar is not None:
                self.bar.update(total - self.bar.n)
            self.close()
            if self.announced:
                self.announced = False
                self.say(f"{self.what}: solved in {_duration(now)}")
            return
        if not self.decided:
            if now < ESTIMATE_AFTER_SECONDS or left is None:
                return
            self.decided = True
            if now + left <= LONG_SOLVE_SECONDS:
                return
            self.announced = True
            self.say(
                f"{self.what} will take about {_duration(now + left)} ({done:,} of {total:,} "
                f"lengths solved in {_duration(now)}; Ctrl-C stops it); to plan faster, "
                f"{self.advice}"
            )
            if self.use_bar:
                from tqdm.auto import tqdm

                self.bar = tqdm(
                    total=total, initial=done, unit="length", desc=self.what, file=self.stream
                )
            self.last_line = now
            return
        if not self.announced:
            return
        if self.bar is not None:
            self.bar.update(done - self.bar.n)
        elif now - self.last_line >= PROGRESS_LINE_SECONDS:
            self.last_line = now
            about = f", about {_duration(left)} left" if left is not None else ""
            self.say(f"{self.what}: {done:,} of {total:,} lengths ({done / total:.0%}){about}")

    def close(self) -> None:
        """Close the bar, if one is drawn (after a solve that was interrupted
        too: call it in a ``finally``)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def plan(
    steps: int,
    memory_bytes: int,
    disk_bytes: int = 0,
    *,
    state_bytes: int | None = None,
    solver: Any = None,
    u0: Any = None,
    step_seconds: float | None = None,
    write_seconds: float | None = None,
    read_seconds: float | None = None,
    copy_seconds: float | None = None,
    adjoint_cost: float | None = None,
    adj_final: Any = None,
    disk_path: str | os.PathLike | None = None,
    calibration_steps: int = 3,
    verbose: bool | Callable[[str], None] = False,
    gradient_rtol: float | None = None,
    progress: bool | Callable[[int, int], None] = True,
) -> BudgetPlan:
    """Choose a schedule for `steps` steps within memory and disk budgets.

    **Arguments:**

    - `steps`: forward steps ``n``.
    - `memory_bytes`, `disk_bytes`: what checkpoints may occupy in memory
      and on disk (``0``: no disk).
    - `state_bytes`: bytes of one state; default: measured from `u0`.
    - `solver`, `u0`: a solver and its initial state, to measure the step
      time (a few steps on a copy of `u0`) unless `step_seconds` is given.
    - `step_seconds`, `write_seconds`, `read_seconds`: costs, if known;
      missing disk costs are measured on a temporary zarr tier in
      `disk_path` (default: the system's temporary directory).
    - `copy_seconds`: the cost of one memory save or restore (a copy of
      the state, with its checksum); default: measured through a
      :class:`~vlcc_adjoint.storage.TieredStore` built like
      :meth:`BudgetPlan.make_store`'s memory level, on as many records as
      the run may keep.  For a cheap step (a stencil on a large grid) a
      copy costs about as much as a step, so memory traffic is part of the
      cost model too.
    - `adjoint_cost`: an adjoint step's time in forward steps; default:
      measured when `adj_final` is given, else 1.
    - `adj_final`: ``lambda_n`` or a callable ``adj_final(u_n)``, as for
      :func:`~vlcc_adjoint.run_adjoint`: with it, adjoint steps are timed
      too (after the forward steps, from the state they reach).  They have
      their side effects: reset a gradient the solver accumulates before
      the run.
    - `calibration_steps`: the least steps timed each way; they run for
      :data:`CALIBRATION_SECONDS` of wall time each (at most `steps`).
    - `verbose`: print what is being calibrated, as it starts (or hand
      each line to `verbose`, if it is a callable).
    - `gradient_rtol`: a budget on the gradient's relative error, in
      (0, 1): :meth:`BudgetPlan.make_store` then makes the memory level
      lossy (error-bounded compression); run with
      ``run_adjoint(..., store=bp.make_store(),
      gradient_rtol=bp.gradient_rtol)``, which chooses its bound.
    - `progress`: the exact two-level program can take minutes (its time
      grows with `steps` and faster than the disk slots).  ``True``
      (default): a solve that will take longer than
      :data:`LONG_SOLVE_SECONDS` says so after a few seconds, with how to
      plan faster, and shows its progress (:class:`SolveProgress`: a bar on
      standard error where it is a terminal, else lines; through `verbose`
      when it is a callable); ``False``: nothing is shown; a callable:
      ``progress(done, total)``, called from a helper thread while the
      program runs (see :class:`~vlcc_adjoint.schedules.Multistage`).
      Ctrl-C stops the solve promptly with ``KeyboardInterrupt``.

    Measured costs are rounded to powers of ``2^(1/4)`` forward steps
    (:func:`round_cost`) before the schedule is chosen and its time
    predicted, so that the same budgets on the same machine give the same
    schedule despite timing noise (unless a cost sits at the edge of a grid
    cell).

    **Returns:** a :class:`BudgetPlan`; ``.schedule`` to run,
    ``.make_store()`` to run it with, ``.explain`` for the reasons.  A
    BudgetPlan is a choice of schedule and budget, not the
    :class:`~vlcc_adjoint.schedules.IOPlan` that
    ``TieredStore(plan=)`` takes: pass ``.make_store()`` as the store, or
    ``io_plan(budget_plan.schedule)`` to a store built by hand.
    """
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise VlccValueError(f"steps must be an integer >= 1, got {steps!r}")
    if gradient_rtol is not None:
        from ._error_budget import check_rtol

        gradient_rtol = check_rtol(gradient_rtol)
    for name, value in (("memory_bytes", memory_bytes), ("disk_bytes", disk_bytes)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise VlccValueError(f"{name} must be an integer number of bytes >= 0, got {value!r}")
    n = int(steps)
    if state_bytes is None:
        if u0 is None:
            raise VlccValueError("plan needs the size of a state: pass state_bytes= or u0=")
        state_bytes = state_nbytes(u0)
    if state_bytes < 1:
        raise VlccValueError(f"state_bytes must be >= 1, got {state_bytes}")
    leaves = len(Structure.of(u0).infos) if u0 is not None else 4
    m, d, reserve = slots_within(memory_bytes, disk_bytes, state_bytes, leaves)
    if m < 1:
        raise VlccValueError(
            f"memory_bytes={memory_bytes} holds no state of {state_bytes} bytes; a schedule "
            f"needs at least one state in memory (four with a disk level: one to keep, two "
            f"being written, one read ahead): give memory_bytes >= {(1 + reserve) * state_bytes}"
        )
    if callable(verbose):

        def say(text):
            verbose(f"plan: {text}")
    elif verbose:

        def say(text):
            print(f"plan: {text}", flush=True)
    else:

        def say(text):
            pass

    measure_adjoint = adjoint_cost is None and adj_final is not None
    if step_seconds is None or measure_adjoint:
        if solver is None or u0 is None:
            raise VlccValueError(
                "plan needs the step time: pass step_seconds=, or solver= and u0= to measure it"
            )
        say(
            f"timing forward{' and adjoint' if measure_adjoint else ''} steps of the solver "
            f"(about {CALIBRATION_SECONDS:g} s each way, on a copy of u0)"
        )
        forward, backward = _time_steps(
            solver, u0, max(1, calibration_steps), n, adj_final if measure_adjoint else None
        )
        if step_seconds is None:
            step_seconds = forward
        if backward is not None:  # timed when measure_adjoint
            adjoint_cost = backward / max(float(step_seconds), 1e-9)
    step_seconds = max(float(step_seconds), 1e-9)
    adjoint_measured = measure_adjoint
    adjoint_cost = 1.0 if adjoint_cost is None else float(adjoint_cost)
    if d > 0 and (write_seconds is None or read_seconds is None):
        say(
            f"timing a disk write and read of one state ({state_bytes:,} bytes) on a temporary "
            f"zarr store in {disk_path or tempfile.gettempdir()}"
        )
        w, r = _time_disk(state_bytes, disk_path)
        write_seconds = w if write_seconds is None else write_seconds
        read_seconds = r if read_seconds is None else read_seconds
    write_seconds = float(write_seconds or 0.0)
    read_seconds = float(read_seconds or 0.0)
    if copy_seconds is None:
        say(f"timing memory saves and restores of the state through the store ({m} slots)")
        copy_seconds = _time_memory(u0, state_bytes, m, solver=solver)
    copy_seconds = float(copy_seconds)
    # The cost model, in forward steps, on a coarse grid: timing noise inside
    # a grid cell does not change the schedule (module docstring).
    copy_cost = round_cost(copy_seconds / step_seconds)
    # A disk write or read does a memory save's or restore's work too (the
    # record is copied, checksummed, verified) and then the file's: a timing
    # that says otherwise (a read served from the page cache while the copy
    # timing met a busy core) is noise, floored at the memory cost.
    write_cost = max(round_cost(write_seconds / step_seconds), copy_cost) if d > 0 else 0.0
    read_cost = max(round_cost(read_seconds / step_seconds), copy_cost) if d > 0 else 0.0
    adjoint_model = round_cost(adjoint_cost)

    notes = [
        f"a state is {state_bytes:,} bytes: memory holds {m} checkpoints"
        + (f" (+ {reserve} I/O buffers), disk {d}" if d else ""),
        f"one adjoint step takes {adjoint_cost:.2f} forward steps"
        + (
            " (measured)"
            if adjoint_measured
            else " (assumed; pass adj_final= to measure it)"
            if adj_final is None
            else ""
        ),
        f"one forward step takes {step_seconds:.3g} s, a memory save or restore of the state "
        f"{copy_seconds:.3g} s ({copy_seconds / step_seconds:.2f} steps)"
        + (
            f"; one disk write {write_seconds:.3g} s, one read {read_seconds:.3g} s "
            f"({write_seconds / step_seconds:.2f} and {read_seconds / step_seconds:.2f} steps)"
            if d > 0
            else ""
        ),
    ]
    notes.append(
        f"costs rounded to the 2^(1/4) grid, in forward steps: adjoint "
        f"{adjoint_model:.3g}, memory {copy_cost:.3g}"
        + (f", disk write {write_cost:.3g}, read {read_cost:.3g}" if d > 0 else "")
    )
    candidates: dict[str, tuple[Schedule, float]] = {}

    costs = [(copy_cost, copy_cost), (write_cost, read_cost)]

    def weigh(name, schedule):
        # One cost model for every candidate, whatever costs it was planned with.
        stats = simulate(schedule)
        steps_worth = stats.forward_count + n * adjoint_model
        for k, (w, r) in enumerate(costs[: len(stats.writes)]):
            steps_worth += stats.writes[k] * w + stats.reads[k] * r
        candidates[name] = (schedule, steps_worth * step_seconds)

    if m >= n - 1:
        weigh(f"StoreAll({n})", StoreAll(n))
    else:
        weigh(f"Revolve({n}, {m})", Revolve(n, m))
        if d > 0:
            disk = d
            while disk > 1 and n * (m + 1) * (disk + 1) > MAX_MULTISTAGE_STATES:
                disk //= 2
            if disk < d:
                notes.append(
                    f"the exact two-level program was offered {disk} of the {d} disk "
                    "slots, to keep planning fast"
                )
            levels = [Level(m, copy_cost, copy_cost), Level(disk, write_cost, read_cost)]
            name = f"Multistage({n}, memory {m} + disk {disk})"
            say(f"solving the two-level schedule: {name}")
            reporter: SolveProgress | None = None
            report: Callable[[int, int], None] | None = None
            if callable(progress):
                report = progress
            elif progress:
                report = reporter = SolveProgress(
                    f"plan: solving {name}",
                    "give a smaller disk_bytes (fewer disk slots) or fewer steps, or "
                    "disk_bytes=0 (Revolve on memory alone, planned at once)",
                    say=(lambda line: verbose(line)) if callable(verbose) else None,
                )
            started = time.perf_counter()
            try:
                two_level = Multistage(
                    n, levels, forward_cost=1.0, adjoint_cost=adjoint_model, progress=report
                )
            finally:
                if reporter is not None:
                    reporter.close()
            notes.append(f"{name} was solved in {time.perf_counter() - started:.3g} s")
            weigh(name, two_level)
    best = min(candidates, key=lambda k: candidates[k][1])
    schedule, predicted = candidates[best]
    for name, (_, seconds) in candidates.items():
        notes.append(f"{name}: predicted {seconds:.3g} s" + ("  <- chosen" if name == best else ""))
    if m >= n - 1:
        notes.append("memory holds every state, so nothing is recomputed")
    if gradient_rtol is not None:
        notes.append(
            f"the memory level stores lossy checkpoints: pass gradient_rtol="
            f"{gradient_rtol:g} to run_adjoint, which chooses their error bound "
            "(slots are counted uncompressed, so the memory budget holds with room "
            "to spare)"
        )
    return BudgetPlan(
        schedule=schedule,
        memory_bytes=int(memory_bytes),
        disk_bytes=int(disk_bytes),
        memory_slots=m,
        disk_slots=d,
        state_bytes=int(state_bytes),
        step_seconds=step_seconds,
        write_seconds=write_seconds,
        read_seconds=read_seconds,
        copy_seconds=copy_seconds,
        adjoint_cost=adjoint_cost,
        predicted_seconds=predicted,
        candidates={k: v[1] for k, v in candidates.items()},
        explain="\n".join(notes),
        gradient_rtol=gradient_rtol,
    )
