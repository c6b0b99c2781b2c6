"""Generate complete Revolve schedules with peer tools, for timing benchmarks.

Each function builds a fresh scheduler object and runs it to the end,
with no operator, no real state and no storage: what gets timed is only
how long each tool takes to produce its action sequence.

* pyrevolve: the compiled C++ revolve core (``pyrevolve.crevolve.CRevolve``),
  driven directly by ``revolve()`` calls. Its ``snapshots`` count
  *includes* the initial state u_0: the first action is always
  ``takeshot`` at capo 0, into slot 0.
  ``pyrevolve.schedulers.CRevolve`` (the Python wrapper) is skipped on
  purpose: its constructor runs the whole schedule once, building Python
  ``CAction`` objects, then builds a second C++ object.
* checkpoint_schedules: ``checkpoint_schedules.Revolve(n, snapshots)``
  iterated up to ``EndReverse``. Its constructor already builds the whole
  H-Revolve operation list (pure Python), and that cost is included.
  Its ``snapshots`` (``snapshots_in_ram``) count also includes u_0.
  ``HRevolve`` (RAM + disk slots) and ``DiskRevolve`` (RAM slots,
  unbounded disk) are driven the same way, constructor included.

Action counts differ between the tools and cannot be compared one to one.
pyrevolve gives advance/takeshot/restore/firstrun/youturn/terminate;
checkpoint_schedules gives Forward/Reverse/Copy/Move/EndForward/EndReverse.
"""

import contextlib
import time
import tracemalloc

import pyrevolve.crevolve as _cr
from checkpoint_schedules import DiskRevolve, EndReverse, Forward, HRevolve, Revolve

_ADVANCE = _cr.Action.advance
_TERMINATE = _cr.Action.terminate


@contextlib.contextmanager
def _grabber(bypass):
    """pyrevolve 2.2.8 wraps every ``CRevolve.revolve()`` call in
    ``with OutputGrabber():`` (a new pipe, dup/dup2 of fd 1, a write and a
    read: ~10.5 of the ~11 us a call costs). With ``bypass`` the module
    global ``crevolve.OutputGrabber`` is swapped for ``nullcontext`` for the
    duration, which leaves only the C++ revolve and the Cython glue."""
    saved = _cr.OutputGrabber
    if bypass:
        _cr.OutputGrabber = contextlib.nullcontext
    try:
        yield
    finally:
        _cr.OutputGrabber = saved


def pyrevolve_actions(n, snapshots, bypass_grabber=False):
    """Number of actions the C++ revolve returns for ``n`` steps and
    ``snapshots`` snapshots, counting every action up to and including
    ``terminate``.

    The time covers building one ``crevolve.CRevolve(snapshots, n, None)``
    and making every ``revolve()`` call until it returns ``terminate``.
    Each CRevolve keeps its own state, so a new one is built on every
    call: a finished object cannot be run again. ``bypass_grabber``: see
    ``_grabber``; the default times pyrevolve as shipped.
    """
    with _grabber(bypass_grabber):
        step = _cr.CRevolve(snapshots, n, None).revolve
        count = 1
        while step() is not _TERMINATE:  # errors raise RevolveError
            count += 1
    return count


def pyrevolve_forward_count(n, snapshots, bypass_grabber=False):
    """Number of forward steps taken by ``advance`` actions (sum of
    ``capo - oldcapo``), for ``n`` steps and ``snapshots`` snapshots.

    ``firstrun``/``youturn`` are not counted: each one stands for a taped
    forward step plus its adjoint step, n in all, so the total number of
    forward-step evaluations is this count plus ``n``. The count equals
    ``crevolve.numforw(n, snapshots)``.
    """
    with _grabber(bypass_grabber):
        r = _cr.CRevolve(snapshots, n, None)
        step = r.revolve
        fwd = 0
        a = step()
        while a is not _TERMINATE:
            if a is _ADVANCE:
                fwd += r.capo - r.oldcapo
            a = step()
    return fwd


def checkpoint_schedules_actions(n, snapshots):
    """Number of actions in ``checkpoint_schedules.Revolve(n, snapshots)``,
    counting every action up to and including ``EndReverse``.

    The time covers the constructor (which builds the full H-Revolve
    operation list) and the iteration that turns it into actions.
    """
    count = 0
    for action in Revolve(n, snapshots):
        count += 1
        if isinstance(action, EndReverse):
            break
    return count


def checkpoint_schedules_forward_count(n, snapshots):
    """Sum of ``n1 - n0`` over the ``Forward`` actions, the final taped
    steps included (compare with ``pyrevolve_forward_count(...) + n``)."""
    fwd = 0
    for action in Revolve(n, snapshots):
        if isinstance(action, Forward):
            fwd += action.n1 - action.n0
        elif isinstance(action, EndReverse):
            break
    return fwd


def hrevolve_actions(n, ram, disk, uf=1.0, ub=1.0, wd=2.0, rd=2.0):
    """Number of actions in ``checkpoint_schedules.HRevolve(n, ram, disk,
    uf, ub, wd, rd)`` up to and including ``EndReverse`` (constructor, which
    runs the pure-Python H-Revolve dynamic program, included). As shipped in
    1.0.4 it passes ``uf``/``ub`` swapped to its DP (see
    ``tests/schedules/cs_referee.py``); that does not change its running time."""
    count = 0
    for action in HRevolve(n, ram, disk, uf=uf, ub=ub, wd=wd, rd=rd):
        count += 1
        if isinstance(action, EndReverse):
            break
    return count


def disk_revolve_actions(n, ram, uf=1.0, ub=1.0, wd=2.0, rd=2.0):
    """Number of actions in ``checkpoint_schedules.DiskRevolve(n, ram, uf,
    ub, wd, rd)`` (``ram`` RAM slots, unbounded disk) up to and including
    ``EndReverse``, constructor included."""
    count = 0
    for action in DiskRevolve(n, ram, uf=uf, ub=ub, wd=wd, rd=rd):
        count += 1
        if isinstance(action, EndReverse):
            break
    return count


def measure(fn, n, snapshots, memory=True, **kw):
    """Return ``(result, process_time_s, peak_bytes)`` for
    ``fn(n, snapshots, **kw)``.

    The time comes from a run with tracemalloc off; the peak then comes
    from a second run with tracemalloc on, if ``memory`` is set (otherwise
    it is None). tracemalloc only sees Python allocations, so the C++
    revolve's own memory is not counted.
    """
    t0 = time.process_time()
    result = fn(n, snapshots, **kw)
    elapsed = time.process_time() - t0
    peak = None
    if memory:
        tracemalloc.start()
        try:
            fn(n, snapshots, **kw)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    return result, elapsed, peak


if __name__ == "__main__":
    P, CS = pyrevolve_actions, checkpoint_schedules_actions
    cases = [
        (P, 1000, 10),
        (P, 10**4, 100),
        (P, 10**5, 100),
        (P, 10**6, 100),
        (CS, 1000, 10),
        (CS, 2000, 10),
    ]
    for fn, n, c in cases:
        for kw in [{}, {"bypass_grabber": True}] if fn is P else [{}]:
            res, t, peak = measure(fn, n, c, memory=n <= 10**5, **kw)
            print(
                f"{fn.__name__} {kw or ''} n={n} c={c} actions={res} "
                f"process_time={t:.4f}s peak={peak}B"
            )
