"""Multistage: exact cost-optimal checkpointing over a storage hierarchy.

Cost model (the one :func:`simulate` predicts): a forward step costs
``forward_cost``, an adjoint step ``adjoint_cost``; a ``Save`` to level ``k``
costs ``write_cost[k]``, a ``Load`` from it ``read_cost[k]``; level ``k``
holds at most ``slots[k]`` states; ``Delete`` is free.  ``Multistage``
returns a schedule of least predicted time among **all** schedules built from
``Advance / Save / Load / Delete / Reverse`` under this model, for any number
of levels and any costs, ``forward_cost != adjoint_cost`` included.  This is
the problem of Stumm & Walther (multistage, 2009), Aupy, Herrmann, Hovland &
Robert (Disk-Revolve, 2016) and Herrmann & Pallez (H-Revolve, ACM TOMS
46(2), 2020); their algorithms are optimal within restricted classes or
cost ratios, this one over all schedules (checked against an exhaustive
search over every schedule in ``tests/schedules/test_multistage.py``).

The dynamic program.  Call a *segment* ``(l, k, A)`` the task "reverse
steps ``s + l - 1 .. s`` with ``u_s`` in hand and stored on level ``k``,
``A[j]`` further slots free on each level ``j``".  Adjoint steps run in
reverse, so once the first state after ``s`` that the segment stores,
``u_{s+m}`` on level ``j``, is saved, everything right of it is reversed
first, with ``u_{s+m}`` as base and one slot fewer on ``j``; then its slot
is free again and the rest, ``(m, k, A)``, restarts from a Load of ``u_s``.
A segment may also move its base to a faster level once (``Save`` there,
``Delete`` the old copy).  With ``F`` the least cost of a segment with its
base in hand:

    B(1, k, A) = 0
    B(l, k, A) = min( read[k] (l - 1) + fwd l (l - 1) / 2,              (no save)
                      min_{j: A_j > 0, 1 <= m < l}  fwd m + write[j]
                          + F(l - m, j, A - e_j) + read[k] + F(m, k, A) )
    F(l, k, A) = min( B(l, k, A),  min_{j != k, A_j > 0} write[j] + B(l, j, A - e_j + e_k) )

and the whole schedule costs ``min_j write[j] + F(n, j, S - e_j)`` (``u_0``
must be stored somewhere) plus ``n adjoint_cost``.  A chain of moves is never
better than one (same slots, more writes), so one move level suffices.  Only
*valid* states are computed: the base takes a slot of its own level, so
``A_k < slots[k]``; no split or move of a valid state leads to an invalid one.

Speed.  The work is the minimum over the split ``m``, for every length ``l``,
state ``(k, A)`` and save level ``j``: with ``g = (j, A - e_j)`` and ``h =
(k, A)``, ``f_l(m) = fwd m + F(l - m, g) + F(m, h)`` on ``1 <= m < l``.  It is
not convex (the slopes ``d(y) = F(y + 1) - F(y)`` of the cost functions rise
only on average: they wiggle between neighbouring values in long, periodic
patterns), and its minimum is often attained on a long flat stretch, where
no bound on ``f`` built from slope extremes can be tight.  Every step below
drops splits only with a proof that they are no better than one already
evaluated, so the minimum stays exact:

* *From the previous length.*  ``f_l(m) = f_{l-1}(m) + d_g(l - 1 - m) =
  f_{l-1}(m - 1) + fwd + d_h(m - 1)``, so with ``LB`` a lower bound of ``min
  f_{l-1}`` (the previous search's result) every ``m`` with ``d_g(l - 1 - m)
  >= best - LB`` or ``fwd + d_h(m - 1) >= best - LB`` is no better than
  ``best`` (found at the previous optimum and its successor).  Suffix
  minima of each cost function's slopes (a monotone stack, ``O(1)``
  amortised per length) turn this into a window ``[l - x_g, y_h]`` found by
  two binary searches; for most searches it is empty.
* *Periods.*  In a wide window, a period ``p`` of the slopes of ``g`` around
  the previous optimum (KMP on a sample, then certified by comparing slopes
  one by one, and extended as ``l`` grows) makes the ``p``-step difference
  ``F(x + p, g) - F(x, g)`` one constant ``S`` over a stretch; there
  ``f_l(m) = f_{l-p}(m) + S >= LB_{l-p} + S``, which drops the flat stretches
  whole (cf. the weak periodicity of optimal two-level schedules, Aupy &
  Herrmann, Optim. Methods Softw. 32(3), 2017; here it is not assumed,
  only used where the slopes are checked to be periodic).
* *Branch and bound* over what remains: on ``[lo, hi]`` a step ``m -> m + 1``
  changes ``f`` by ``fwd + d_h(m) - d_g(l - m - 1)``, within ``[-beta,
  gamma]`` from the slope extremes over the interval (kept per block of 32
  lengths, or as prefix maxima and suffix minima), so ``f >= max(f(lo) -
  beta (m - lo), f(hi) - gamma (hi - m))`` inside; short intervals are
  scanned.
* *Dominance.*  Saving on ``j`` is never better than saving on ``i``, or than
  moving the base to a faster level ``kt`` and saving there on ``i``, when
  ``c_j + min_x (F(x, g_j) - F(x, g_i)) [+ min_x (F(x, h) - F(x, t))] >=
  c_i`` with ``c`` the constant costs of the options: running minima of
  these differences, ``O(1)`` per length, skip such options (ties drop one
  side only).  States with no free slot are the no-save closed form.
* *Lattice.*  When all costs are multiples of one ``q = 2^-e`` and every sum
  stays exact in float64, costs lie on the lattice ``q Z``, and a lower
  bound above ``best - q / 2`` already proves ``>= best``.

With non-dyadic costs (``0.1``, ``1.3``) the proofs compare float sums, so
the optimum is exact up to the rounding of those sums (relative ``1e-15``);
with integer or dyadic costs the table is exact.  ``tests/schedules/test_multistage.py``
checks every entry of the table against a brute-force minimum over all
``m`` (up to ``n = 4000``), and the optimum against an exhaustive search over
all schedules for tiny ``n``.

Measured cost (CPU seconds of one run on a shared 2-core machine,
``benchmarks/bench_multistage.py``, side by side with the previous branch and
bound, whose bound ``fwd lo + F(l - hi) + F(lo)`` ignores slopes and degrades
to scanning most ``m`` of wide intervals; equal ``optimal_time`` throughout):

    configuration                               n = 10^3   10^4    10^5
    A: [3, (4, 10, 10)], fwd 3      previous       0.031   0.94    94.5
                                    now            0.011   0.11     1.15
    B: [10, (20, 5, 5)], fwd 1      previous       0.54    78    ~11000 (n^2.2)
                                    now            0.16    1.9     27

i.e. about ``n^1`` for A and ``n^1.2`` to ``n^1.4`` for B (the windows left
after the bounds widen slowly with ``n``; the rest is ``O(n L P)``
bookkeeping, bound by memory latency at large ``n``), and memory ``8 n L P``
bytes for ``F`` (``P = prod(slots + 1)``; 370 MB for B at ``10^5``) plus
``n L P / 2`` for the block extremes, all freed once the schedule is
built.  The schedule re-runs the splits along the optimal path and keeps one
decision per distinct segment of it, from which it produces its rows chunk
by chunk (:mod:`._multistage_emit`: a few kilobytes where the table would
take about 90 bytes a step).  The split search (the three steps above)
lives in :mod:`._multistage_split`; this module holds the dynamic program
and the dominance between levels.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import VlccValueError
from ._chunks import ChunkedTable
from ._interrupt import call_kernel, stop_flag
from ._jit import njit
from ._multistage_emit import Decisions, decide, digit
from ._multistage_split import BLOCK, DEPTH, PMAX, RETRY, SAMPLE, grow, split
from ._schedule import Level, Schedule, check_cost, check_positive_int

__all__ = ["Multistage"]


@njit(cache=True, nogil=True)
def _dominance(slots, strides, write, read, valid):
    """Which split options may make another one redundant, and through which
    pairs of cost functions.

    Option ``(s, j)``: state ``s = (k, A)`` saves on ``j``, total cost
    ``c = write[j] + read[k]`` plus ``fwd m + F(l - m, g) + F(m, s)`` with
    ``g = (j, A - e_j)``.  A dominator is another option of ``s`` (``H`` the
    same) or an option of ``s``'s base moved to a faster level ``kt``, state
    ``t``, whose cost includes the move, ``write[kt]``.  The option is redundant
    when ``c + min_x (F(x, g) - F(x, g')) + min_x (F(x, s) - F(x, t)) >= c'``
    over all lengths used; the pairs of functions whose running minimum of the
    difference is kept are ``pa[e] - pb[e]``.  Ties drop only the higher own
    option; moves only go to faster levels, so no two options drop each other.
    """
    L = slots.shape[0]
    S = valid.shape[0]
    P = S // L
    cap = S * L * (L * L + 1) + 1
    pa = np.empty(cap, np.int64)
    pb = np.empty(cap, np.int64)
    dom_start = np.zeros(S * L + 1, np.int64)
    dom_h = np.empty(cap, np.int64)
    dom_g = np.empty(cap, np.int64)
    dom_cost = np.empty(cap)
    dom_tie = np.empty(cap, np.bool_)
    npair = 0
    ne = 0
    for s in range(S):
        k = s // P
        a = s - k * P
        for j in range(L):
            dom_start[s * L + j] = ne
            if not valid[s] or digit(a, j, strides, slots) == 0:
                continue
            g = j * P + a - strides[j]
            for i in range(L):  # the same base, saving on i
                if i != j and digit(a, i, strides, slots) > 0:
                    pa[npair] = g
                    pb[npair] = i * P + a - strides[i]
                    dom_h[ne] = -1
                    dom_g[ne] = npair
                    dom_cost[ne] = write[i] + read[k]
                    dom_tie[ne] = i < j
                    npair += 1
                    ne += 1
            for kt in range(k):  # the base moved to a faster level kt, then saving on i
                if digit(a, kt, strides, slots) == 0:
                    continue
                at = a - strides[kt] + strides[k]
                t = kt * P + at
                pa[npair] = s
                pb[npair] = t
                ph = npair
                npair += 1
                for i in range(L):
                    if digit(at, i, strides, slots) > 0:
                        pa[npair] = g
                        pb[npair] = i * P + at - strides[i]
                        dom_h[ne] = ph
                        dom_g[ne] = npair
                        dom_cost[ne] = write[kt] + write[i] + read[kt]
                        dom_tie[ne] = True
                        npair += 1
                        ne += 1
    dom_start[S * L] = ne
    return (
        pa[:npair].copy(),
        pb[:npair].copy(),
        dom_start,
        dom_h[:ne].copy(),
        dom_g[:ne].copy(),
        dom_cost[:ne].copy(),
        dom_tie[:ne].copy(),
    )


@njit(cache=True, nogil=True)
def _solve(n, slots, write, read, fwd, qh, stop, progress=None):
    """The table ``F[k P + a, l]`` for ``l = 0 .. n`` and the slope summaries
    (:func:`._multistage_emit.decide` re-runs splits along the optimal path with them).  Returns
    early, with the table filled up to some ``l``, once ``stop[0] != 0``
    (:mod:`._interrupt`).  ``progress[0]``, when `progress` is given, is the
    length up to which the table is filled, for another thread to read while
    this runs (a compiled kernel cannot call Python): the work per length is about the same once the
    first few hundred lengths are done, so it measures how far the solve has
    come."""
    L = slots.shape[0]
    strides = np.empty(L, np.int64)
    P = 1
    for k in range(L):
        strides[k] = P
        P *= slots[k] + 1
    S = L * P
    F = np.zeros((S, n + 1))
    cap = min(max(n, 1), 64)
    rec = np.zeros((S, cap), np.int32)
    stk = np.zeros((S, cap), np.int32)
    recv = np.zeros((S, cap))
    stkv = np.zeros((S, cap))
    nrec = np.zeros(S, np.int64)
    ntop = np.zeros(S, np.int64)
    for k in range(L):
        nrec[k * P] = -1  # no free slot: F = read (l - 1) + fwd l (l - 1) / 2, d increases
    bmin = np.full((S, (n >> BLOCK) + 1), np.inf)
    bmax = np.full((S, (n >> BLOCK) + 1), -np.inf)
    B = np.empty(S)
    guesses = np.ones((S, L), np.int64)
    lbs = np.full((S, L), -np.inf)
    # A state whose own level has all its slots free holds its base nowhere:
    # no valid state refers to it (splits and moves keep a slot for the base).
    valid = np.empty(S, np.bool_)
    for s in range(S):
        k = s // P
        valid[s] = digit(s - k * P, k, strides, slots) < slots[k]
    pa, pb, dom_start, dom_h, dom_g, dom_cost, dom_tie = _dominance(
        slots, strides, write, read, valid
    )
    pmin = np.zeros(pa.shape[0])  # min over lengths x of F(x, pa) - F(x, pb); x = 1: 0
    work = np.empty((DEPTH, 2), np.int64)
    fwork = np.empty((DEPTH, 2))
    lbh = np.full((S * L, PMAX), -np.inf)  # lower bounds of the split minima at l - p
    cert = np.zeros((S * L, 4), np.int64)  # periods of the slopes of g: p, x1, x2, tried at
    cert[:, 3] = -RETRY
    iwork = np.empty(2 * SAMPLE + 2, np.int64)
    # moves of each base: to the state t for a write on level kt
    mv_start = np.zeros(S + 1, np.int64)
    mv_t = np.empty(S * L, np.int64)
    mv_w = np.empty(S * L)
    mv_faster = np.empty(S * L, np.bool_)
    ne = 0
    for s in range(S):
        mv_start[s] = ne
        k = s // P
        a = s - k * P
        if valid[s]:
            for kt in range(L):
                if kt != k and digit(a, kt, strides, slots) > 0:
                    mv_t[ne] = kt * P + a - strides[kt] + strides[k]
                    mv_w[ne] = write[kt]
                    mv_faster[ne] = kt < k
                    ne += 1
    mv_start[S] = ne
    free = np.empty((S, L), np.bool_)  # level j has a free slot in state s
    for s in range(S):
        for j in range(L):
            free[s, j] = valid[s] and digit(s % P, j, strides, slots) > 0
    for l in range(2, n + 1):
        if stop[0] != 0:
            break
        for s in range(S):
            if not valid[s]:
                continue
            k = s // P
            a = s - k * P
            best = read[k] * (l - 1) + fwd * l * (l - 1) / 2.0
            # Moves of the base to a faster level, whose B is known: a split of
            # this base need only be known to be no better.
            for e in range(mv_start[s], mv_start[s + 1]):
                if mv_faster[e]:
                    best = min(best, mv_w[e] + B[mv_t[e]])
            for j in range(L):
                if not free[s, j]:
                    continue
                c = write[j] + read[k]
                # Skip saving on j when another option, of this base or of the base
                # moved to a faster level, is no worse at every split m (module
                # docstring, "Dominance").
                dominated = False
                for e in range(dom_start[s * L + j], dom_start[s * L + j + 1]):
                    slack = c - dom_cost[e] + pmin[dom_g[e]]
                    if dom_h[e] >= 0:
                        slack += pmin[dom_h[e]]
                    if slack > 0.0 or (slack == 0.0 and dom_tie[e]):
                        dominated = True
                        break
                if dominated:
                    lbs[s, j] = -np.inf  # searched from scratch should it cease to be
                    lbh[s * L + j, l % PMAX] = -np.inf
                    continue
                v, m = split(
                    F,
                    rec,
                    recv,
                    nrec,
                    stk,
                    stkv,
                    ntop,
                    bmin,
                    bmax,
                    l,
                    s,
                    j * P + a - strides[j],
                    fwd,
                    best - c,
                    guesses[s, j],
                    lbs[s, j],
                    qh,
                    work,
                    fwork,
                    lbh,
                    cert,
                    s * L + j,
                    iwork,
                )
                lbs[s, j] = v
                lbh[s * L + j, l % PMAX] = v
                if m > 0:
                    guesses[s, j] = m
                    best = v + c
            B[s] = best
        for s in range(S):
            if valid[s]:
                best = B[s]
                for e in range(mv_start[s], mv_start[s + 1]):
                    best = min(best, mv_w[e] + B[mv_t[e]])
                F[s, l] = best
        for e in range(pa.shape[0]):
            pmin[e] = min(pmin[e], F[pa[e], l] - F[pb[e], l])
        if progress is not None:
            progress[0] = l  # the table is filled up to this length
        if l < n:  # slope d(l - 1) is needed from length l + 1 on
            need = 0
            for s in range(S):
                if nrec[s] >= 0:
                    need = max(need, nrec[s], ntop[s])
            if need >= rec.shape[1]:
                size = min(2 * rec.shape[1], n)
                rec = grow(rec, size)
                stk = grow(stk, size)
                recv = grow(recv, size)
                stkv = grow(stkv, size)
            # append the slope d(l - 1) to the summaries (inlined: a call with
            # this many arrays costs as much as the work)
            y = l - 1
            b = y >> BLOCK
            for s in range(S):
                if not valid[s]:
                    continue
                v = F[s, y + 1] - F[s, y]
                bmin[s, b] = min(bmin[s, b], v)
                bmax[s, b] = max(bmax[s, b], v)
                if nrec[s] < 0:
                    ntop[s] = y
                    continue
                c = nrec[s]
                if c == 0 or v > recv[s, c - 1]:
                    rec[s, c] = y
                    recv[s, c] = v
                    nrec[s] = c + 1
                t = ntop[s]
                while t > 0 and stkv[s, t - 1] >= v:
                    t -= 1
                stk[s, t] = y
                stkv[s, t] = v
                ntop[s] = t + 1
    return F, strides, rec, recv, nrec, stk, stkv, ntop, bmin, bmax


#: Seconds between two calls of a :class:`Multistage`'s `progress` callable.
PROGRESS_INTERVAL = 0.25


def _solve_watched(
    n: int, args: tuple, progress: Callable[[int, int], None] | None
) -> tuple[np.ndarray, ...]:
    """``_solve(n, *args)`` on a worker thread (Ctrl-C stops it cleanly, see
    :mod:`._interrupt`), with `progress` called while it runs.

    The kernel writes the length it has reached into a one-element array; a
    helper thread reads it every :data:`PROGRESS_INTERVAL` seconds and calls
    ``progress(done, n)`` (on that thread), and once more with ``done == n``
    when the table is complete.  An exception raised by `progress` stops the
    solve (through the kernel's stop flag) and is raised here once the kernel
    has returned: a caller's callable may cancel a solve that takes too long.
    """
    stop = stop_flag()
    if progress is None:
        return call_kernel(_solve, n, *args, stop, stop=stop)
    reached = np.zeros(1, np.int64)
    report = progress  # bound for the closure (mypy: not None)
    finished = threading.Event()
    failure: list[BaseException] = []

    def watch() -> None:
        while not finished.wait(PROGRESS_INTERVAL):
            try:
                report(int(reached[0]), n)
            except BaseException as error:  # raised on the caller's thread below
                failure.append(error)
                stop[0] = 1
                return

    watcher = threading.Thread(target=watch, name="vlcc-multistage-progress", daemon=True)
    watcher.start()
    try:
        result = call_kernel(_solve, n, *args, stop, reached, stop=stop)
    finally:
        finished.set()
        watcher.join()
    if failure:
        raise failure[0]
    progress(n, n)
    return result


def _quantum(n: int, values) -> float:
    """A ``q = 2**-e`` of which every cost is an exact multiple, with all sums of
    them exact in float64 up to the no-save cost of ``n`` steps; 0 if none."""
    top = max(values) * (n + 1) * (n + 1) + 1.0
    for e in range(0, 31):
        scale = 2.0**e
        if all(float(v * scale).is_integer() for v in values):
            return 1.0 / scale if top * scale < 2.0**52 else 0.0
    return 0.0


class Multistage(Schedule):
    """The least-time schedule over a hierarchy of storage levels.

    **Arguments:**

    - `steps`: the number of forward steps ``n`` (>= 1).
    - `levels`: one :class:`Level` per storage level, fastest first, each
      with a finite number of slots (>= 1).
    - `forward_cost`, `adjoint_cost`: time of one forward / adjoint step, in
      the unit of the levels' costs.
    - `max_table_bytes`: the largest cost table the dynamic program may
      allocate.
    - `progress`: ``progress(done, total)``, called about every
      :data:`PROGRESS_INTERVAL` seconds from a helper thread while the
      dynamic program runs (``done`` of ``total = steps`` lengths solved;
      the time per length is about constant past the first few hundred), and
      once with ``done == total``; it may raise to cancel the solve.  Nothing
      here prints: ``vlcc_adjoint.plan`` and ``vlcc plan`` show it
      (:class:`vlcc_adjoint.budget.SolveProgress`).

    **Optimality:** exact for the cost model in the module docstring, over all
    schedules of ``Advance / Save / Load / Delete / Reverse``;
    ``stats().predicted_time`` is that least time and :attr:`optimal_time`
    the dynamic program's value of it.

    **Cost:** measured in the module docstring (two levels at ``n = 10^5``
    in seconds to tens of seconds); the time grows with ``n`` and faster
    than ``P = prod(slots + 1)`` (many slots on a slow level take minutes);
    memory about ``8.5 n L P`` bytes; a ``ValueError`` is raised beforehand
    when that table would exceed `max_table_bytes`.  Ctrl-C stops the solve
    within a length and raises ``KeyboardInterrupt``.
    """

    def __init__(
        self,
        steps: int,
        levels: Sequence[Level],
        forward_cost: float = 1.0,
        adjoint_cost: float = 1.0,
        *,
        max_table_bytes: int = 4 * 2**30,
        progress: Callable[[int, int], None] | None = None,
    ):
        n = check_positive_int(steps, "steps")
        levels = tuple(levels)
        if not levels:
            raise VlccValueError(
                "Multistage needs at least one Level(slots, write_cost, read_cost)"
            )
        finite: list[int] = []  # each level's slots
        for i, level in enumerate(levels):
            if not isinstance(level, Level):
                raise VlccValueError(
                    f"levels[{i}] is {level!r}; give Level(slots, write_cost, read_cost)"
                )
            if level.slots is None:
                raise VlccValueError(
                    f"levels[{i}] has unbounded slots; Multistage plans for finite "
                    "slots (use StoreAll for unbounded storage)"
                )
            finite.append(level.slots)
        fwd = check_cost(forward_cost, "forward_cost")
        check_cost(adjoint_cost, "adjoint_cost")
        # No level needs more slots than there are states to store.
        slots = np.array([min(k, max(n - 1, 1)) for k in finite], np.int64)
        states = int(np.prod(slots + 1))
        # the cost table and the block extremes of its slopes
        table_bytes = (8 * (n + 1) + 16 * ((n >> BLOCK) + 1)) * len(levels) * states
        if table_bytes > max_table_bytes:
            raise VlccValueError(
                f"Multistage(steps={n}) over slots {slots.tolist()} needs a "
                f"{table_bytes / 2**30:.1f} GiB cost table; give fewer slots on the "
                "slow levels, fewer steps, or raise max_table_bytes"
            )
        write = np.array([lv.write_cost for lv in levels])
        read = np.array([lv.read_cost for lv in levels])
        q = _quantum(n, [fwd, *write, *read])
        F, strides, rec, recv, nrec, stk, stkv, ntop, bmin, bmax = _solve_watched(
            n, (slots, write, read, fwd, q / 2), progress
        )
        P = states
        full = int(np.sum(slots * strides))
        self.optimal_time = (
            float(
                min(
                    write[j] + F[j * P + full - strides[j], n]
                    for j in range(len(levels))
                    if slots[j] > 0
                )
            )
            + n * adjoint_cost
            if n > 1
            else n * adjoint_cost
        )
        # Keep one decision per distinct segment, not F nor the table: the
        # rows are regenerated from them chunk by chunk (:mod:`._chunks`).
        k0, keys, target, save, splits = call_kernel(
            decide,
            n,
            F,
            strides,
            slots,
            write,
            read,
            fwd,
            rec,
            recv,
            nrec,
            stk,
            stkv,
            ntop,
            bmin,
            bmax,
        )
        del F, rec, recv, stk, stkv, bmin, bmax
        self.decisions = Decisions(n, slots, strides, k0, keys, target, save, splits)
        super().__init__(
            ChunkedTable(self.decisions.fill, self.decisions.state), n, levels, fwd, adjoint_cost
        )

    def _params(self) -> str:
        return f"steps={self.n_steps}, levels={list(self.levels)}"
