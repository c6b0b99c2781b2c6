"""The I/O plan of a schedule, window by window, in bounded memory.

:class:`~vlcc_adjoint.schedules.IOPlan`'s arrays hold one row per record,
per read and per action: ``O(len(schedule))`` memory, hundreds of megabytes
at ``n = 10^7``.  A store that follows the plan needs far less at any one
time: the I/O actions just ahead of it, and for each the action index of
the next read of the record it touches (the priority of prefetching, and
the key of Belady's eviction: evict the record needed farthest in the
future; Belady, IBM Syst. J. 5(2), 1966).  :func:`plan_windows` gives
exactly that, one :class:`PlanWindow` per chunk of the schedule
(:meth:`Schedule.chunk`), in order.

How, in bounded memory.  A record's identity (its number, in the order
records are written) is known looking back, its next read only looking
ahead; both pass through a chunk boundary only in the records *live* at it,
at most the schedule's slots.  So two passes over the chunks, one forward
and one backward, each carrying a small hash map keyed by ``(step,
level)``, keep at every chunk boundary a snapshot of their map: forwards,
the record number each live ``(step, level)`` holds and how many records
were written before; backwards, the next read of each live record at or
after the boundary.  A window is then one chunk regenerated and scanned
twice, from its two snapshots.  Memory: ``O(slots)`` words per chunk
boundary (2.4 MB for ``Revolve(10**7, 100)``), time ``O(len)`` per pass.

Schedules with unbounded slots (``StoreAll``) keep ``O(n)`` records live;
for them, and for short schedules (no numba for a small plan, :mod:`._jit`),
the windows are cut from the plan's arrays instead, which the tests check
give the same windows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from ..errors import VlccValueError
from ._jit import njit
from .actions import DELETE, LOAD, MOVE, SAVE

__all__ = ["PlanWindow", "plan_windows"]

#: Plans of at most this many actions are windowed from their arrays.
SMALL_ROWS = 200_000
#: Snapshot entries (live records times chunks) above which the windows are
#: cut from the plan's arrays (``O(len)`` memory either way).
MAX_SNAPSHOT_ENTRIES = 1 << 22


@dataclasses.dataclass(frozen=True)
class PlanWindow:
    """The I/O actions of schedule actions ``start .. stop - 1``.

    **Attributes** (arrays of equal length, one entry per ``Save``,
    ``Load``, ``Delete`` or ``Move``, in schedule order):

    - `index`: its action index.
    - `kind`: its :class:`~vlcc_adjoint.schedules.ActionKind`.
    - `step`, `level`, `dst`: the step, the level it reads or writes (a
      ``Move``'s source) and a ``Move``'s destination (-1 otherwise).
    - `record`: the record it touches, numbered as :attr:`IOPlan.records`
      (a ``Move``'s new record on `dst`), as :attr:`IOPlan.record_of_action`.
    - `source`: a ``Move``'s record on `level` (which it reads and ends);
      -1 otherwise.
    - `next_read`: the action index of the next read of `record` after this
      action (after a ``Save`` or ``Move``: the record's first read), -1 if
      there is none (always after a ``Delete``).
    """

    start: int
    stop: int
    index: np.ndarray
    kind: np.ndarray
    step: np.ndarray
    level: np.ndarray
    dst: np.ndarray
    record: np.ndarray
    source: np.ndarray
    next_read: np.ndarray

    def __len__(self) -> int:
        return len(self.index)

    def reads(self, level: int) -> tuple[np.ndarray, np.ndarray]:
        """``(action indices, records)`` of this window's reads of `level`
        (``Load`` s and ``Move`` sources), in order."""
        load = (self.kind == LOAD) & (self.level == level)
        move = (self.kind == MOVE) & (self.level == level)
        sel = load | move
        return self.index[sel], np.where(move[sel], self.source[sel], self.record[sel])


# -- a hash map of (step, level) keys, open addressing with linear probing ----


@njit(cache=True, nogil=True, inline="always")
def _home(key, mask):
    h = key * np.int64(-7046029254386353131)  # Fibonacci hashing
    return (h ^ (h >> 29)) & mask


@njit(cache=True, nogil=True)
def _get(keys, vals, key):
    """The value of `key`, or -1 if absent."""
    mask = keys.shape[0] - 1
    i = _home(key, mask)
    while True:
        k = keys[i]
        if k == key:
            return vals[i]
        if k == -1:
            return -1
        i = (i + 1) & mask


@njit(cache=True, nogil=True)
def _set(keys, vals, key, val):
    mask = keys.shape[0] - 1
    i = _home(key, mask)
    while keys[i] != -1 and keys[i] != key:
        i = (i + 1) & mask
    keys[i] = key
    vals[i] = val


@njit(cache=True, nogil=True)
def _delete(keys, vals, key):
    """Remove `key` (if present), shifting back the entries probed past it
    (Knuth, TAOCP vol. 3, 6.4, Algorithm R), so no tombstones accumulate."""
    mask = keys.shape[0] - 1
    i = _home(key, mask)
    while keys[i] != key:
        if keys[i] == -1:
            return
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        if keys[j] == -1:
            break
        h = _home(keys[j], mask)
        # The entry at j stays when its home lies cyclically in (i, j].
        if (i < h <= j) if i <= j else (h > i or h <= j):
            continue
        keys[i] = keys[j]
        vals[i] = vals[j]
        i = j
    keys[i] = -1


@njit(cache=True, nogil=True)
def _restore(keys, vals, ks, vs):
    keys[:] = -1
    for e in range(ks.shape[0]):
        _set(keys, vals, ks[e], vs[e])


# -- the passes -----------------------------------------------------------------


@njit(cache=True, nogil=True)
def _forward(kind, a, level, dst, keys, vals, count, out_record, out_source):
    """Record numbers through one chunk: ``(step, level) -> record`` in
    ``keys/vals``, ``count[0]`` records written so far; with `out_record`
    non-empty, each I/O action's record (and a Move's source) in order."""
    q = 0
    write = out_record.shape[0] > 0
    for t in range(kind.shape[0]):
        k = kind[t]
        if k != SAVE and k != LOAD and k != DELETE and k != MOVE:
            continue
        key = a[t] * 8 + level[t]
        src = -1
        if k == SAVE:
            r = count[0]
            count[0] += 1
            _set(keys, vals, key, r)
        elif k == LOAD:
            r = _get(keys, vals, key)
        elif k == DELETE:
            r = _get(keys, vals, key)
            _delete(keys, vals, key)
        else:  # MOVE
            src = _get(keys, vals, key)
            _delete(keys, vals, key)
            r = count[0]
            count[0] += 1
            _set(keys, vals, a[t] * 8 + dst[t], r)
        if write:
            out_record[q] = r
            out_source[q] = src
        q += 1


@njit(cache=True, nogil=True)
def _backward(kind, a, level, dst, offset, keys, vals, out_next):
    """Next reads through one chunk, last row first: ``(step, level) ->``
    the next read of the record live there; with `out_next` non-empty, each
    I/O action's next read, written from the end."""
    q = out_next.shape[0]
    write = q > 0
    for t in range(kind.shape[0] - 1, -1, -1):
        k = kind[t]
        if k != SAVE and k != LOAD and k != DELETE and k != MOVE:
            continue
        i = offset + t
        key = a[t] * 8 + level[t]
        if k == SAVE:  # the record's first read, and before it no record
            nxt = _get(keys, vals, key)
            _delete(keys, vals, key)
        elif k == LOAD:
            nxt = _get(keys, vals, key)
            _set(keys, vals, key, i)
        elif k == DELETE:  # before it the record lives, read no more
            nxt = -1
            _set(keys, vals, key, -1)
        else:  # MOVE: starts the record on dst, reads and ends the one on level
            dkey = a[t] * 8 + dst[t]
            nxt = _get(keys, vals, dkey)
            _delete(keys, vals, dkey)
            _set(keys, vals, key, i)
        if write:
            q -= 1
            out_next[q] = nxt


def _snapshot(keys, vals):
    live = keys != -1
    return keys[live].copy(), vals[live].copy()


class _Snapshots:
    """Both passes' maps at every chunk boundary (module docstring)."""

    def __init__(self, schedule, live: int):
        cap = 1 << max(4, int(2 * live + 2).bit_length())
        self.cap = cap
        keys = np.full(cap, -1, np.int64)
        vals = np.empty(cap, np.int64)
        count = np.zeros(1, np.int64)
        none = np.empty(0, np.int64)
        starts = schedule.chunk_starts()
        chunks = len(starts) - 1
        self.fwd: list[tuple[np.ndarray, np.ndarray]] = []
        self.counts: list[int] = []
        for k in range(chunks):
            self.fwd.append(_snapshot(keys, vals))
            self.counts.append(int(count[0]))
            c = schedule.chunk(k)
            _forward(c["kind"], c["a"], c["level"], c["dst"], keys, vals, count, none, none)
        keys[:] = -1
        backwards = []
        for k in range(chunks - 1, -1, -1):
            backwards.append(_snapshot(keys, vals))  # the map at the end of chunk k
            c = schedule.chunk(k)
            _backward(c["kind"], c["a"], c["level"], c["dst"], int(starts[k]), keys, vals, none)
        self.bwd = backwards[::-1]

    @property
    def nbytes(self) -> int:
        return sum(x.nbytes + y.nbytes for x, y in self.fwd + self.bwd)


def _window_streamed(schedule, snaps: _Snapshots, k: int) -> PlanWindow:
    starts = schedule.chunk_starts()
    c = schedule.chunk(k)
    start = int(starts[k])
    kind = c["kind"]
    sel = np.flatnonzero((kind == SAVE) | (kind == LOAD) | (kind == DELETE) | (kind == MOVE))
    m = len(sel)
    record = np.empty(m, np.int64)
    source = np.empty(m, np.int64)
    nxt = np.empty(m, np.int64)
    keys = np.empty(snaps.cap, np.int64)
    vals = np.empty(snaps.cap, np.int64)
    _restore(keys, vals, *snaps.fwd[k])
    count = np.array([snaps.counts[k]], np.int64)
    if m:
        _forward(kind, c["a"], c["level"], c["dst"], keys, vals, count, record, source)
        _restore(keys, vals, *snaps.bwd[k])
        _backward(kind, c["a"], c["level"], c["dst"], start, keys, vals, nxt)
    rows = c[sel]
    return PlanWindow(
        start,
        start + len(c),
        sel.astype(np.int64) + start,
        rows["kind"].copy(),
        rows["a"].copy(),
        rows["level"].copy(),
        rows["dst"].copy(),
        record,
        source,
        nxt,
    )


def _window_from_arrays(plan, schedule, k: int, next_of_action: np.ndarray) -> PlanWindow:
    starts = schedule.chunk_starts()
    c = schedule.chunk(k)
    start = int(starts[k])
    kind = c["kind"]
    sel = np.flatnonzero((kind == SAVE) | (kind == LOAD) | (kind == DELETE) | (kind == MOVE))
    index = sel.astype(np.int64) + start
    rows = c[sel]
    record = plan.record_of_action[index].copy()
    source = np.full(len(sel), -1, np.int64)
    for p in np.flatnonzero(rows["kind"] == MOVE):
        # A Move's source record is the one its source level reads at it.
        lv = plan.levels[int(rows["level"][p])]
        source[p] = lv.record[lv.position(int(index[p]))]
    return PlanWindow(
        start,
        start + len(c),
        index,
        rows["kind"].copy(),
        rows["a"].copy(),
        rows["level"].copy(),
        rows["dst"].copy(),
        record,
        source,
        next_of_action[index].copy(),
    )


def _next_of_action(plan, m: int) -> np.ndarray:
    """For every action, the next read after it of the record it touches
    (:attr:`PlanWindow.next_read`)."""
    out = np.full(m, -1, np.int64)
    for lv in plan.levels:  # a read: the next read of the same record
        chain = lv.next_read_of_record
        out[lv.index] = np.where(chain >= 0, lv.index[np.maximum(chain, 0)], -1)
    recs = plan.records  # a Save or Move: its record's first read
    out[recs["start"]] = recs["first_read"]
    return out  # a Delete: -1


def plan_windows(plan, start: int = 0, streamed: bool | None = None) -> Iterator[PlanWindow]:
    """The windows of `plan` (an :class:`IOPlan` of a schedule), from the one
    holding action `start` on.

    `streamed` forces the bounded-memory passes (``True``) or the plan's
    arrays (``False``); ``None`` chooses as the module docstring says.
    """
    schedule = plan.schedule
    if schedule is None:
        raise VlccValueError(
            "this IOPlan was built from arrays, without its schedule; "
            "use io_plan(schedule) for windows"
        )
    starts = schedule.chunk_starts()
    m = int(starts[-1])
    chunks = len(starts) - 1
    if streamed is None:
        stats = schedule.stats()
        live = sum(stats.peak_slots)
        streamed = (
            not plan.materialised and m > SMALL_ROWS and live * chunks <= MAX_SNAPSHOT_ENTRIES
        )
    first = max(0, int(np.searchsorted(starts, start, side="right")) - 1)
    if streamed:
        snaps = plan._windows
        if snaps is None:
            snaps = plan._windows = _Snapshots(schedule, sum(schedule.stats().peak_slots))
        for k in range(first, chunks):
            yield _window_streamed(schedule, snaps, k)
        return
    next_of_action = _next_of_action(plan, m)
    for k in range(first, chunks):
        yield _window_from_arrays(plan, schedule, k, next_of_action)
