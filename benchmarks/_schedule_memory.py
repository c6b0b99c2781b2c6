"""Peak memory of a schedule and its I/O plan, each case in a fresh interpreter.

What a run of ``n`` steps costs in memory before the first solver call: the
schedule, reading all of it, its replay and its I/O plan.  Each case starts a
new ``python -c`` that imports the schedules, loads every numba kernel on a
tiny schedule (so that numba's own memory is in the baseline, not in a
phase), records ``ru_maxrss`` (the peak resident set size, monotone), and
then runs the phases in order, recording after each the growth of the peak
over that baseline, and its wall time:

* ``build``: ``Revolve(n, c)`` or ``Multistage(n, levels, ...)``;
* ``blocks``: reading every row through ``schedule.blocks()`` (what
  ``run_adjoint`` does);
* ``stats``: ``schedule.stats()`` (``simulate``);
* ``io_plan``: ``io_plan(schedule)``;
* ``plan_windows``: reading the whole plan through ``plan.windows()`` (a
  store that consumes it in bounded memory; absent before it existed);
* ``plan_arrays``: ``plan.records``, ``plan.levels``,
  ``plan.record_of_action`` (today's store reads these: ``O(len)``; left
  out where the case says so, as at ``n = 10^7``).

``held_bytes`` is what the schedule object keeps after ``build``: its table,
or its chunk states (and Multistage's decisions).  ``--memory-root`` points
the cases at another checkout, for before/after numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

CODE = """
import gc, json, resource, time
import numpy as np
from vlcc_adjoint.schedules import Level, Multistage, Revolve, io_plan
from vlcc_adjoint.schedules import _io_plan, _revolve, _simulate
from vlcc_adjoint.schedules._jit import PythonBudget

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

# The compiled kernels, not their Python runs (a large schedule uses them).
_revolve._python_steps = PythonBudget(0)
_simulate._python_rows = PythonBudget(0)
_io_plan._python_rows = PythonBudget(0)

def make(n):
    if {kind!r} == "revolve":
        return Revolve(n, {c})
    return Multistage(n, [Level(*lv) for lv in {levels!r}], {fwd!r}, {adj!r})

def phases(s, record):
    t = time.perf_counter()
    rows = 0
    for block in s.blocks():
        rows += len(block)
    record("blocks", t)
    t = time.perf_counter()
    s.stats()
    record("stats", t)
    t = time.perf_counter()
    plan = io_plan(s)
    record("io_plan", t)
    if hasattr(plan, "windows"):
        t = time.perf_counter()
        from vlcc_adjoint.schedules import _plan_windows
        for w in _plan_windows.plan_windows(plan, streamed=True):
            pass
        record("plan_windows", t)
    if {arrays!r}:
        t = time.perf_counter()
        plan.records, plan.levels, plan.record_of_action
        record("plan_arrays", t)
    return rows

# Warm-up: every kernel loaded (or compiled) on a tiny schedule.
phases(make({warm}), lambda name, t: None)
gc.collect()
base = peak()
out = dict(baseline_bytes=base, phases=[])

def record(name, t):
    out["phases"].append(dict(phase=name, seconds=time.perf_counter() - t,
                              peak_growth_bytes=peak() - base))

t = time.perf_counter()
s = make({n})
record("build", t)
src = s.__dict__.get("_source")
if src is not None and not getattr(s, "materialised", True):
    held = src.nbytes
    decisions = getattr(s, "decisions", None)
    held += decisions.nbytes if decisions is not None else 0
else:
    held = s.table.nbytes
out["held_bytes"] = int(held)
out["rows"] = phases(s, record)
print("@@MEM " + json.dumps(out))
"""


def measure_case(
    kind: str,
    n: int,
    root: str,
    *,
    c: int = 100,
    levels=None,
    fwd: float = 1.0,
    adj: float = 1.0,
    arrays: bool = True,
    timeout: float = 600.0,
) -> dict:
    """One case in a fresh interpreter; the JSON the worker printed, or an error.
    `arrays`: also build the plan's arrays (``O(len)``: 2 GB at ``n = 10^7``)."""
    warm = 300 if kind == "revolve" else 40
    code = CODE.format(
        kind=kind,
        n=int(n),
        c=int(c),
        levels=levels,
        fwd=fwd,
        adj=adj,
        warm=warm,
        arrays=bool(arrays),
    )
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            cwd=root,
        )
    except subprocess.TimeoutExpired:
        return dict(status="timeout", note=f"killed after {timeout:.0f} s")
    for line in done.stdout.splitlines():
        if line.startswith("@@MEM "):
            return dict(status="ok", **json.loads(line[len("@@MEM ") :]))
    return dict(status="error", note=(done.stderr or "no output").strip().splitlines()[-1][:300])


HEADER = (
    f"{'schedule':<26} {'n':>9} {'held_MiB':>9} {'build':>14} {'blocks':>14} "
    f"{'stats':>14} {'io_plan':>14} {'windows':>14} {'plan_arrays':>14}"
)


def format_row(label: str, n: int, res: dict) -> str:
    """Peak growth in MiB (and seconds) after each phase."""
    if res["status"] != "ok":
        return f"{label:<26} {n:>9} {res['status']}: {res.get('note', '')}"
    by = {p["phase"]: p for p in res["phases"]}

    def cell(name):
        p = by.get(name)
        if p is None:
            return f"{'-':>14}"
        return f"{p['peak_growth_bytes'] / 2**20:>7.1f} {p['seconds']:>5.2f}s"

    return (
        f"{label:<26} {n:>9} {res['held_bytes'] / 2**20:>9.2f} {cell('build')} "
        f"{cell('blocks')} {cell('stats')} {cell('io_plan')} {cell('plan_windows')} "
        f"{cell('plan_arrays')}"
    )


def measure(cases, root: str, say=print) -> list[dict]:
    """Run `cases` (``(label, kind, n, options)``); print a row for each."""
    rows = []
    for label, kind, n, options in cases:
        res = measure_case(kind, n, root, **options)
        say(format_row(label, n, res))
        rows.append(dict(label=label, kind=kind, n=n, root=root, **options, **res))
    return rows
