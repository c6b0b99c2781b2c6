"""The future I/O of a schedule: the input of prefetching and eviction.

A schedule is known before it runs, so every read of every storage level is
known too.  :func:`io_plan` turns the action table into, per level, the
ordered list of reads (``Load``, and the source side of ``Move``) with the
action index at which each is needed, and per stored *record* (one ``Save``
or ``Move`` into a level, up to its ``Delete`` or move away) the action
indices of its first and last read and of its end.

Two consumers, two access patterns, both O(1) or O(k):

* a prefetcher asks "the next ``k`` reads of level ``j`` after action ``i``":
  one ``searchsorted`` on the sorted read indices, then a slice
  (:meth:`LevelIO.next_reads`); a cursor that only moves forward makes it
  ``O(k)``;
* a Belady cache (evict the record needed farthest in the future; Belady,
  IBM Syst. J. 5(2), 1966) needs each record's next use after every read:
  ``next_read_of_record`` links each read to the next read of the same
  record, so the update after a read is one array lookup.

The scan is a numba kernel (:func:`scan_rows`), run as its own Python
function for short tables so that a small schedule never waits for numba to
load (:mod:`._jit`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import numpy as np

from ..errors import VlccValueError
from ._interrupt import call_kernel
from ._jit import PythonBudget, njit
from ._plan_windows import PlanWindow, plan_windows
from ._schedule import Schedule
from ._simulate import THREADED_ROWS, ScheduleStats, simulate
from .actions import DELETE, LOAD, MOVE, SAVE

__all__ = ["IOPlan", "LevelIO", "io_plan"]

#: One row per stored record.
RECORD_DTYPE = np.dtype(
    [
        ("step", np.int64),  # the state u_step
        ("level", np.int8),  # where it is stored
        ("start", np.int64),  # action index of its Save (or Move into the level)
        ("end", np.int64),  # action index of its Delete / Move away; len(table) if kept
        ("first_read", np.int64),  # action index of its first read, -1 if never read
        ("last_read", np.int64),  # action index of its last read, -1 if never read
        ("reads", np.int64),  # how many times it is read
    ]
)


@dataclasses.dataclass(frozen=True)
class LevelIO:
    """The reads of one storage level, in the order the schedule needs them.

    **Attributes** (arrays of equal length, sorted by ``index``):

    - `index`: the action index of each read.
    - `step`: the state it reads.
    - `record`: the row of :attr:`IOPlan.records` it reads.
    - `next_read_of_record`: the position in these arrays of the next read of
      the same record, or -1 if this is its last read.
    """

    level: int
    index: np.ndarray
    step: np.ndarray
    record: np.ndarray
    next_read_of_record: np.ndarray

    def __len__(self) -> int:
        return len(self.index)

    def position(self, after: int) -> int:
        """The position of the first read at an action index ``>= after``."""
        return int(np.searchsorted(self.index, after, side="left"))

    def next_reads(self, after: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(action indices, steps)`` of the next ``k`` reads at or after ``after``."""
        i = self.position(after)
        return self.index[i : i + k], self.step[i : i + k]


class IOPlan:
    """Everything a store needs to know ahead about a schedule's I/O.

    **Attributes** (built from the schedule on first access, in
    ``O(len(schedule) + n L)`` memory, and kept; :meth:`windows` reads the
    same plan in bounded memory):

    - `levels`: one :class:`LevelIO` per storage level.
    - `records`: one row per stored record (:data:`RECORD_DTYPE`), in the
      order they are written.
    - `record_of_action`: for each action that writes or reads a level, the
      record it touches (the destination record for a ``Move``); -1 for
      ``Advance`` and ``Reverse``.
    - `n_levels`: the number of storage levels (without building anything).
    - `schedule`: the schedule planned for (``None`` for a plan built from
      arrays).
    """

    def __init__(
        self,
        levels: list | None = None,
        records: np.ndarray | None = None,
        record_of_action: np.ndarray | None = None,
        *,
        schedule: Schedule | None = None,
        stats: ScheduleStats | None = None,
    ) -> None:
        self.schedule = schedule
        self._stats = stats  # the schedule's, when known: spares _build a replay
        self._arrays: tuple[tuple[LevelIO, ...], np.ndarray, np.ndarray] | None
        if schedule is None:
            if levels is None or records is None or record_of_action is None:
                raise VlccValueError(
                    "IOPlan takes its arrays (levels, records, record_of_action) or a "
                    "schedule=...; build a schedule's plan with io_plan(schedule)"
                )
            self._arrays = (tuple(levels), records, record_of_action)
            self.n_levels = len(self._arrays[0])
        else:
            self._arrays = None
            self.n_levels = len(schedule.levels)
        self._lock = threading.Lock()
        self._windows = None

    @property
    def materialised(self) -> bool:
        """Whether the per-record and per-read arrays are built."""
        return self._arrays is not None

    def _get(self):
        if self._arrays is None:
            with self._lock:
                if self._arrays is None:
                    self._arrays = _build(self.schedule, self._stats)
        return self._arrays

    @property
    def levels(self) -> tuple[LevelIO, ...]:
        return self._get()[0]

    @property
    def records(self) -> np.ndarray:
        return self._get()[1]

    @property
    def record_of_action(self) -> np.ndarray:
        return self._get()[2]

    def next_use(self, record: int, after: int) -> int:
        """The action index of ``record``'s first read at or after ``after``,
        or -1 if it is never read again (a walk along the record's reads)."""
        row = self.records[record]
        if row["last_read"] < after:
            return -1
        lv = self.levels[int(row["level"])]
        q = lv.position(int(row["first_read"]))
        while lv.index[q] < after:
            q = lv.next_read_of_record[q]
        return int(lv.index[q])

    def windows(self, start: int = 0) -> Iterator[PlanWindow]:
        """The plan as consecutive :class:`PlanWindow` s, one per chunk of
        the schedule (about 65,536 actions), from the one holding action
        `start` on: see :mod:`._plan_windows`."""
        return plan_windows(self, start)

    def __repr__(self) -> str:
        state = "built" if self.materialised else "not built"
        return f"IOPlan({self.n_levels} levels, {state}, schedule={self.schedule!r})"


@njit(cache=True, nogil=True)
def scan_rows(
    kind,
    a,
    level,
    dst,
    offset,
    stride,
    live,
    rec_step,
    rec_level,
    rec_start,
    rec_end,
    rec_first,
    rec_last,
    rec_reads,
    rec_of_action,
    read_action,
    read_record,
    count,
):
    """Scan one block of rows (the first at action index `offset`), carrying
    ``live`` (the record level ``k`` holds for step ``s`` at ``live[k *
    stride + s]``, -1 for none) and ``count = [records, reads]`` from block
    to block; ``rec_of_action`` covers the whole table.

    The one scan: compiled by numba for long tables, run as its own Python
    function on lists for short ones (:func:`scan_pieces`); it indexes its
    arguments element by element for that.
    """
    nrec = count[0]
    nread = count[1]
    for t in range(len(kind)):
        i = offset + t
        k = kind[t]
        s = a[t]
        if k == SAVE or k == MOVE:  # a new record: the Save's, or the Move's on dst
            lv = level[t]
            if k == MOVE:
                src = live[lv * stride + s]
                read_action[nread] = i
                read_record[nread] = src
                nread += 1
                if rec_first[src] < 0:
                    rec_first[src] = i
                rec_last[src] = i
                rec_reads[src] += 1
                rec_end[src] = i
                live[lv * stride + s] = -1
                lv = dst[t]
            rec_step[nrec] = s
            rec_level[nrec] = lv
            rec_start[nrec] = i
            live[lv * stride + s] = nrec
            rec_of_action[i] = nrec
            nrec += 1
        elif k == LOAD:
            r = live[level[t] * stride + s]
            read_action[nread] = i
            read_record[nread] = r
            nread += 1
            if rec_first[r] < 0:
                rec_first[r] = i
            rec_last[r] = i
            rec_reads[r] += 1
            rec_of_action[i] = r
        elif k == DELETE:
            r = live[level[t] * stride + s]
            rec_end[r] = i
            live[level[t] * stride + s] = -1
            rec_of_action[i] = r
    count[0] = nrec
    count[1] = nread


@njit(cache=True, nogil=True)
def link_reads(read_record, nread, nxt, last_seen):
    """Link each of the first `nread` reads to the next read of the same
    record (``nxt``, -1 for a record's last read), scanning backwards;
    ``last_seen`` holds -1 for every record on entry."""
    for q in range(nread - 1, -1, -1):
        r = read_record[q]
        nxt[q] = last_seen[r]
        last_seen[r] = q


#: The columns of a table the scan reads, in the order it takes them.
COLUMNS = ("kind", "a", "level", "dst")


def scan_pieces(pieces, m, n, nlv, nsaves, nloads, python: bool):
    """Scan consecutive pieces of a table of `m` rows (a schedule of `n`
    steps on `nlv` levels, with `nsaves` records and `nloads` reads) with
    :func:`scan_rows` and link the reads with :func:`link_reads`: by their
    Python functions on lists (`python`), or by the compiled kernels on
    arrays.  Returns ``(records, reads, step, level, start, end,
    first_read, last_read, reads_per_record, record_of_action, read_action,
    read_record, next_read)``, arrays either way."""
    stride = n + 1

    def filled(size, value, dtype=np.int64):
        if python:
            return [value] * size
        return np.full(size, value, dtype)

    live = filled(nlv * stride, -1)
    step = filled(nsaves, 0)
    level = filled(nsaves, 0, np.int8)
    start = filled(nsaves, 0)
    end = filled(nsaves, m)
    first = filled(nsaves, -1)
    last = filled(nsaves, -1)
    reads = filled(nsaves, 0)
    rec_of_action = filled(m, -1)
    read_action = filled(nloads, 0)
    read_record = filled(nloads, 0)
    count = filled(2, 0)
    scan = scan_rows.python if python else scan_rows
    offset = 0
    for piece in pieces:
        columns = [piece[name] for name in COLUMNS]
        if python:
            columns = [column.tolist() for column in columns]
        scan(
            *columns,
            offset,
            stride,
            live,
            step,
            level,
            start,
            end,
            first,
            last,
            reads,
            rec_of_action,
            read_action,
            read_record,
            count,
        )
        offset += len(piece)
    nrec, nread = int(count[0]), int(count[1])
    nxt = filled(nread, -1)
    (link_reads.python if python else link_reads)(read_record, nread, nxt, filled(nrec, -1))
    out = [step, level, start, end, first, last, reads, rec_of_action, read_action, read_record]
    arrays = [np.asarray(x, np.int8 if x is level else np.int64) for x in out]
    return (nrec, nread, *arrays, np.asarray(nxt, np.int64))


#: Ski rental between the two runs of :func:`scan_rows` (as for
#: :func:`.simulate`'s replay): rows scanned by its Python function per
#: process before the compiled kernel takes over.
_python_rows = PythonBudget(200_000)


def io_plan(schedule: Schedule) -> IOPlan:
    """Derive the future reads and record lifetimes of `schedule`.

    **Arguments:**

    - `schedule`: a valid :class:`~vlcc_adjoint.schedules.Schedule` (the
      schedule is validated with :func:`simulate` first).

    **Returns:** an :class:`IOPlan`.  Its arrays are built on first access,
    ``O(len(schedule) + n L)`` time and memory, by one scan of the
    schedule's chunks (never its whole table); :meth:`IOPlan.windows` reads
    the same plan in bounded memory.
    """
    stats = simulate(schedule)  # io_plan trusts the table from here on
    return IOPlan(schedule=schedule, stats=stats)


def _build(schedule: Schedule, stats: ScheduleStats | None):
    """The arrays of :class:`IOPlan`: one scan of the schedule's chunks."""
    if stats is None:
        stats = simulate(schedule)
    m = len(schedule)
    nlv = len(schedule.levels)
    n = schedule.n_steps
    nsaves = int(sum(stats.writes))  # Saves and Moves (their destination)
    nloads = int(sum(stats.reads))  # Loads and Moves (their source)
    python = _python_rows.take(m, scan_rows)
    # On a worker thread: Ctrl-C-safe on long tables (_interrupt).
    out = call_kernel(
        scan_pieces,
        schedule.blocks(),
        m,
        n,
        nlv,
        nsaves,
        nloads,
        python,
        threaded=m > THREADED_ROWS and not python,
    )
    (
        nrec,
        nread,
        step,
        level,
        start,
        end,
        first,
        last,
        reads,
        rec_of_action,
        read_action,
        read_record,
        nxt,
    ) = out
    records = np.empty(nrec, RECORD_DTYPE)
    for name, column in (
        ("step", step),
        ("level", level),
        ("start", start),
        ("end", end),
        ("first_read", first),
        ("last_read", last),
        ("reads", reads),
    ):
        records[name] = column[:nrec]
    read_action = read_action[:nread]
    read_record = read_record[:nread]
    read_level = level[read_record]
    levels = []
    for lv in range(nlv):
        sel = np.flatnonzero(read_level == lv)
        # Positions in the global read list -> positions in this level's list.
        local = np.full(nread, -1, np.int64)
        local[sel] = np.arange(len(sel))
        glob_next = nxt[sel]
        levels.append(
            LevelIO(
                level=lv,
                index=read_action[sel],
                step=step[read_record[sel]],
                record=read_record[sel],
                next_read_of_record=np.where(glob_next >= 0, local[np.maximum(glob_next, 0)], -1),
            )
        )
    return tuple(levels), records, rec_of_action
