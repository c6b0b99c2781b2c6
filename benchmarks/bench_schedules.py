"""Benchmark: how long schedule *generation* takes, and how much memory it needs.

Reproduce::

    pip install -e ".[test,bench]"
    python benchmarks/bench_schedules.py --quick          # a few minutes
    python benchmarks/bench_schedules.py                  # full: ~10-15 minutes
    python benchmarks/bench_schedules.py --out DIR        # results elsewhere

Writes ``DIR/bench_schedules.json`` (every number below, plus each repeat's
time) and ``DIR/bench_schedules.png`` (median generation time vs ``n``,
log-log, one line per tool and ``c`` / configuration). ``DIR`` defaults to
``$TMPDIR/vlcc-bench-results/``.

What is timed (nothing executes a schedule; only the action list is built):

* Revolve, ``n`` in 1e3..1e7, ``c`` in 10, 100 slots (``u_0``'s included):

  - ``ours``: ``vlcc_adjoint.schedules.Revolve(n, c)`` (builds the table);
  - ``ours.stats``: ``.stats()`` on that schedule (a symbolic replay),
    timed separately from the construction;
  - ``pyrevolve core``: pyrevolve 2.2.8's C++ revolve driven call by call
    (``_peer_schedules.pyrevolve_actions``) with its per-call stdout grabber
    bypassed, i.e. C++ plus the Cython glue;
  - ``pyrevolve shipped``: the same, grabber left in (pyrevolve as shipped);
  - ``cs.Revolve``: checkpoint_schedules 1.0.4 ``Revolve`` (pure Python,
    slow): only (n, c) = (1000, 10), (2000, 10), (1000, 100); these are
    never skipped by prediction, only killed at 2.25 times ``--cap``.

  On every (n, c) where both ran, the forward count of ours
  (``stats().forward_count``) and pyrevolve's (sum of ``advance`` lengths,
  ``_peer_schedules.pyrevolve_forward_count``) are checked to be equal to
  each other and to ``binomial_forward_count(n, c)``.

* Multistage, ``n`` in 1e3, 1e4, 1e5, two configurations:

  - A: ``[Level(3), Level(4, 10, 10)]``, forward_cost 3, adjoint_cost 1;
  - B: ``[Level(10), Level(20, 5, 5)]``, forward_cost 1, adjoint_cost 1;

  tools ``ours`` (``Multistage``), ``cs.HRevolve(n, ram, disk, uf, ub, wd,
  rd)`` as shipped, ``cs.HRevolve fixed`` (A only: 1.0.4 passes uf/ub swapped
  to its DP, which only matters when uf != ub; ``tests/schedules/cs_referee.py`` undoes
  it) and ``cs.DiskRevolve(n, ram, ...)`` (RAM slots plus *unbounded* disk: a
  different, less constrained problem, so its time may be below ours). The
  ``pred`` note is each schedule's predicted time under our cost model
  (``Schedule.stats().predicted_time`` for ours, which equals
  ``Multistage.optimal_time``; ``tests/schedules/cs_referee.py``'s count +
  ``n * adjoint_cost`` for the peers).

* Cold first calls (``benchmarks/_cold_start.py``, JSON key ``cold_start``):
  ``import vlcc_adjoint`` + the first ``Revolve(n, 10)``, ``.stats()`` and
  ``io_plan(...)`` in a fresh process each, n in 1e2..1e5, with numba's cache
  as it is and with an empty one (a fresh install), beside pyrevolve's
  import + first schedule; median, min and max over ``--cold-repeats``
  processes, and the warm median of further calls in the same process.
  ``--only cold`` runs this part alone; ``--cold-root DIR`` times another
  checkout (before/after).

* Memory (``benchmarks/_schedule_memory.py``, JSON key ``memory``): the
  peak resident set size (``ru_maxrss``) of a fresh process, as growth over
  its baseline after the imports and every kernel loaded, after each phase:
  building ``Revolve(n, c)`` (c = 10, 100; n in 1e5..1e7) or Multistage A
  and B (n in 1e4, 1e5), reading all its ``blocks()``, ``stats()``,
  ``io_plan``, reading the plan through ``plan.windows()``, and building the
  plan's arrays (n <= 1e6); with each phase's wall time and the bytes the
  schedule object holds (``held_MiB``).  ``--only memory`` runs this part
  alone; ``--memory-root DIR`` measures another checkout (before/after).

``--quick``: Revolve at n = 1e3, 1e4 only, cs.Revolve at (500, 10) only,
Multistage at n = 300 only, cold first calls at n = 1e2..1e4, memory at
n = 1e5, 1e6 (Revolve) and 1e4 (Multistage); at most 3 repeats within 5 s
per case.

``--update-results`` writes ``benchmarks/results/bench_schedules.json``
instead of ``--out``; with ``--only`` it replaces only that part of the
file (the rows of that problem, or the ``cold_start`` or ``memory`` list)
and records the partial run under ``meta.partial_updates``.

Protocol. Every (size, tool) runs in a fresh Python subprocess: imports, then
a warm-up call on a tiny size (for ours after
:func:`vlcc_adjoint.schedules.load_kernels`, so that numba's kernels run at
every size instead of their Python functions (``py_func``) for small work: the warm-up
compiles them or loads them from numba's on-disk cache; its time is
``first_s``), then timed
repeats at the real size with ``time.perf_counter`` (up to 7, fewer when they
add up past ``--budget`` seconds; 1 when a single run exceeds it), then one
more run under ``tracemalloc`` for the memory peak. A separate subprocess with
an empty ``NUMBA_CACHE_DIR`` measures the true cold compile time of our
kernels (printed as "compile"). Runs predicted (from the two previous sizes of
the same line) to exceed ``--cap`` seconds (``--ms-cap`` for our Multistage)
are skipped; any run still going at 1.5 times the cap is killed and reported
as a timeout.

Columns of the printed table:

* ``problem``: ``Revolve c=<slots>`` or ``Multistage A|B``; ``n``: steps.
* ``tool``: see above.  ``reps``: timed repeats behind the median.
* ``median_s``: median generation time in seconds (wall, perf_counter).
* ``first_s``: the warm-up call in the same process: numba
  compilation / cache load for ours, ~0 for the peers.
* ``peer/ours``: ``median_s`` of this tool divided by ours on the same
  problem and ``n`` (>1: ours is faster); for ``ours.stats`` it is stats
  time / construction time.
* ``trace_MiB``: ``tracemalloc`` peak during one generation: every Python
  allocation, numpy buffers (numpy reports them to tracemalloc) and numba
  arrays (numba 0.68's runtime allocates through the Python allocator, so
  they are traced too). The C++ memory of pyrevolve is *not* visible.
* ``rss+_MiB``: growth of the subprocess's peak resident set size during the
  timed repeats (``ru_maxrss`` after minus before): catches what tracemalloc
  cannot (pyrevolve's C++ heap), includes allocator slack.
* ``table_MiB``: ``table.nbytes`` of our schedule, to compare with
  ``trace_MiB``: our peak is the table plus O(c + r) words of stack (plus
  the 8 (n+1) L P byte cost table ``F`` for Multistage).
* ``note``: forward-count check (Revolve) or predicted time (Multistage), or
  why a run was skipped.
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")

import argparse
import gc
import json
import math
import platform
import queue
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MiB = 2.0**20
TAG = "@@BENCH "

CONFIGS = {
    "A": dict(levels=[(3, 0.0, 0.0), (4, 10.0, 10.0)], forward_cost=3.0, adjoint_cost=1.0),
    "B": dict(levels=[(10, 0.0, 0.0), (20, 5.0, 5.0)], forward_cost=1.0, adjoint_cost=1.0),
}

# Exponent of n used to predict the next size's time before two sizes exist.
DEFAULT_EXPONENT = {
    "ours": 1.1,
    "ours.stats": 1.1,
    "pyrevolve core": 1.1,
    "pyrevolve shipped": 1.1,
    "cs.Revolve": 2.0,
    "cs.HRevolve": 2.0,
    "cs.HRevolve fixed": 2.0,
    "cs.DiskRevolve": 2.0,
}


# ---------------------------------------------------------------------------
# worker side: runs in a fresh subprocess, reports on stdout
# ---------------------------------------------------------------------------


def _say(kind, payload=None):
    sys.stdout.write(TAG + kind + " " + json.dumps(payload) + "\n")
    sys.stdout.flush()


def _maxrss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _levels(cfg):
    from vlcc_adjoint.schedules import Level

    return [Level(*lv) for lv in CONFIGS[cfg]["levels"]]


def _referee():
    sys.path.insert(0, str(ROOT / "tests"))
    import cs_referee

    return cs_referee


def _repeat(fn, rmax, budget, on_first=None, keep=False):
    """Time ``fn()`` up to ``rmax`` times, stopping before the total would
    pass ``budget`` seconds (at least once). With ``keep`` returns
    ``(times, last result)``; a result is freed before the next run starts,
    so runs never overlap in memory."""
    times = []
    total = 0.0
    while True:
        t0 = time.perf_counter()
        obj = fn()
        t = time.perf_counter() - t0
        times.append(t)
        total += t
        if on_first is not None and len(times) == 1:
            on_first(t)
        if len(times) >= rmax or total + t > budget:
            return (times, obj) if keep else times
        obj = None


def _traced(fn):
    """``(result, traced peak bytes, traced bytes still held by the result)``."""
    gc.collect()
    tracemalloc.start()
    try:
        obj = fn()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return obj, peak, current


def _row(spec, times, first_s, rss_delta, **extra):
    row = dict(
        spec_id=spec["id"],
        status="ok",
        times_s=times,
        repeats=len(times),
        median_s=statistics.median(times),
        first_s=first_s,
        rss_delta_bytes=rss_delta,
    )
    row.update(extra)
    return row


def _worker_revolve(spec):
    n, c, tool = spec["n"], spec["c"], spec["tool"]
    rmax, budget, mem_cap = spec["rmax"], spec["budget"], spec["mem_cap"]
    first = lambda t: _say("FIRST", t)  # noqa: E731
    rows = []
    if tool == "ours":
        from vlcc_adjoint.schedules import Revolve, load_kernels

        # The compiled kernels, not their Python functions for small work
        # (schedules/_jit.py): the timed calls measure what a process that
        # keeps building schedules runs.  A new process's first call is the
        # cold part's.
        t0 = time.perf_counter()
        load_kernels()
        Revolve(10, 3)
        first_build = time.perf_counter() - t0
        t0 = time.perf_counter()
        Revolve(10, 3).stats()
        first_stats = time.perf_counter() - t0
        rss0 = _maxrss()
        _say("STARTED")
        times = _repeat(lambda: Revolve(n, c), rmax, budget, first)
        rss_build = _maxrss() - rss0
        sched, peak, held = _traced(lambda: Revolve(n, c))
        nbytes, rows_ = int(sched.table.nbytes), len(sched.table)

        def replay():  # stats() is memoised on its schedule: each call replays anew
            sched.__dict__.pop("_simulated", None)
            return sched.stats()

        rss1 = _maxrss()
        stimes = _repeat(replay, rmax, budget)
        rss_stats = _maxrss() - rss1
        stats, speak, _ = _traced(replay)
        rows.append(
            _row(
                spec,
                times,
                first_build,
                rss_build,
                tool="ours",
                peak_traced_bytes=peak,
                held_traced_bytes=held,
                table_nbytes=nbytes,
                table_rows=rows_,
                forward_count=int(stats.forward_count),
            )
        )
        rows.append(
            _row(
                spec,
                stimes,
                first_stats,
                rss_stats,
                tool="ours.stats",
                peak_traced_bytes=speak,
                forward_count=int(stats.forward_count),
            )
        )
        return rows

    import _peer_schedules as peers

    if tool in ("pyrevolve core", "pyrevolve shipped"):
        bypass = tool == "pyrevolve core"
        fn = lambda: peers.pyrevolve_actions(n, c, bypass)  # noqa: E731
        t0 = time.perf_counter()
        peers.pyrevolve_actions(10, 3, bypass)
    elif tool == "cs.Revolve":
        fn = lambda: peers.checkpoint_schedules_actions(n, c)  # noqa: E731
        t0 = time.perf_counter()
        peers.checkpoint_schedules_actions(10, 3)
    else:
        raise ValueError(tool)
    first_s = time.perf_counter() - t0
    rss0 = _maxrss()
    _say("STARTED")
    times = _repeat(fn, rmax, budget, first)
    rss = _maxrss() - rss0
    extra = dict(tool=tool, actions=None, peak_traced_bytes=None)
    med = statistics.median(times)
    if med * 3 <= mem_cap:  # tracemalloc slows pure-Python code down
        extra["actions"], extra["peak_traced_bytes"], _ = _traced(fn)
    else:
        extra["note"] = f"tracemalloc run skipped (run {med:.0f} s)"
    if spec.get("verify"):
        extra["forward_count"] = int(peers.pyrevolve_forward_count(n, c, True))
    rows.append(_row(spec, times, first_s, rss, **extra))
    return rows


def _worker_multistage(spec):
    n, cfg, tool = spec["n"], spec["config"], spec["tool"]
    rmax, budget, mem_cap = spec["rmax"], spec["budget"], spec["mem_cap"]
    conf = CONFIGS[cfg]
    fc, ac = conf["forward_cost"], conf["adjoint_cost"]
    (ram, _, _), (disk, wd, rd) = conf["levels"]
    first = lambda t: _say("FIRST", t)  # noqa: E731
    if tool == "ours":
        import numpy as np

        from vlcc_adjoint.schedules import Multistage

        levels = _levels(cfg)
        fn = lambda: Multistage(n, levels, fc, ac)  # noqa: E731
        t0 = time.perf_counter()
        Multistage(10, levels, fc, ac).stats()
        first_s = time.perf_counter() - t0
        rss0 = _maxrss()
        _say("STARTED")
        times, last = _repeat(fn, rmax, budget, first, keep=True)
        rss = _maxrss() - rss0
        med = statistics.median(times)
        slots = np.array([min(lv.slots, max(n - 1, 1)) for lv in levels])
        extra = dict(tool=tool, F_bytes=int(8 * (n + 1) * len(levels) * np.prod(slots + 1)))
        if med <= 3 * mem_cap:  # numba code: tracemalloc costs little here
            last = None
            sched, extra["peak_traced_bytes"], extra["held_traced_bytes"] = _traced(fn)
        else:
            sched = last
            extra["peak_traced_bytes"] = None
            extra["note"] = f"tracemalloc run skipped (run {med:.0f} s)"
        st = sched.stats()
        extra.update(
            table_nbytes=int(sched.table.nbytes),
            table_rows=len(sched.table),
            predicted_time=float(st.predicted_time),
            optimal_time=float(sched.optimal_time),
            forward_count=int(st.forward_count),
        )
        return [_row(spec, times, first_s, rss, **extra)]

    import contextlib

    import _peer_schedules as peers

    ref = _referee()
    if tool == "cs.HRevolve":
        ctx = contextlib.nullcontext
        gen = lambda m: peers.hrevolve_actions(m, ram, disk, fc, ac, wd, rd)  # noqa: E731
        pred = lambda: ref.cs_hrevolve(n, ram, disk, fc, ac, wd, rd)  # noqa: E731
    elif tool == "cs.HRevolve fixed":
        ctx = ref._hopt_uf_ub_fixed
        gen = lambda m: peers.hrevolve_actions(m, ram, disk, fc, ac, wd, rd)  # noqa: E731
        pred = lambda: ref.cs_hrevolve(n, ram, disk, fc, ac, wd, rd, fix_uf_ub_swap=True)  # noqa: E731
    elif tool == "cs.DiskRevolve":
        ctx = contextlib.nullcontext
        gen = lambda m: peers.disk_revolve_actions(m, ram, fc, ac, wd, rd)  # noqa: E731
        pred = lambda: ref.cs_disk_revolve(n, ram, fc, ac, wd, rd)  # noqa: E731
    else:
        raise ValueError(tool)

    def fn():
        with ctx():
            return gen(n)

    t0 = time.perf_counter()
    with ctx():
        gen(10)
    first_s = time.perf_counter() - t0
    rss0 = _maxrss()
    _say("STARTED")
    times = _repeat(fn, rmax, budget, first)
    rss = _maxrss() - rss0
    med = statistics.median(times)
    extra = dict(tool=tool, peak_traced_bytes=None)
    if med * 3 <= mem_cap:
        extra["actions"], extra["peak_traced_bytes"], _ = _traced(fn)
    else:
        extra["note"] = f"tracemalloc run skipped (run {med:.0f} s)"
    res = pred()
    extra.update(
        predicted_time=float(res["time"] + n * ac),
        forward_count=int(res["forward"]),
        peak_slots=[res["peak"][0], res["peak"][1]],
    )
    return [_row(spec, times, first_s, rss, **extra)]


def _worker_compile(spec):
    """Cold numba compilation (run with an empty NUMBA_CACHE_DIR)."""
    out = {"numba_cache_dir": os.environ.get("NUMBA_CACHE_DIR")}
    t0 = time.perf_counter()
    from vlcc_adjoint.schedules import Multistage, Revolve, load_kernels

    out["import_s"] = time.perf_counter() - t0
    load_kernels()  # the kernels at every size, so they compile here
    for name, fn in [
        ("Revolve(10, 3)", lambda: Revolve(10, 3)),
        ("Revolve(10, 3).stats()", lambda: Revolve(10, 3).stats()),
        ("Multistage(10, A)", lambda: Multistage(10, _levels("A"), 3.0, 1.0)),
    ]:
        t0 = time.perf_counter()
        fn()
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        fn()
        out[name] = {"first_s": cold, "second_s": time.perf_counter() - t0}
    return out


def worker_main(spec):
    sys.path.insert(0, str(HERE))
    if spec["kind"] == "compile":
        _say("STARTED")
        _say("FIRST", 0)
        result = _worker_compile(spec)
    elif spec["kind"] == "revolve":
        result = _worker_revolve(spec)
    else:
        result = _worker_multistage(spec)
    _say("RESULT", result)


# ---------------------------------------------------------------------------
# parent side
# ---------------------------------------------------------------------------


def run_worker(spec, cap, env=None, startup_s=300.0):
    """Run one case in a subprocess. The first timed run gets ``1.5 cap``
    seconds, the rest (more repeats, tracemalloc, checks) a budget scaled by
    it. Returns the worker's result, or a dict with status timeout / error."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
    lines = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    phase = "startup"
    deadline = time.monotonic() + startup_s
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.05, deadline - time.monotonic()))
            except queue.Empty:
                proc.kill()
                proc.wait()
                limit = {"startup": startup_s, "first run": 1.5 * cap}.get(phase, None)
                return {
                    "status": "timeout",
                    "phase": phase,
                    "note": f"killed in {phase}" + (f" after {limit:.0f} s" if limit else ""),
                }
            if line is None:
                rc = proc.wait()
                return {"status": "error", "note": f"worker exited rc={rc} in {phase}"}
            if not line.startswith(TAG):
                continue
            kind, _, payload = line[len(TAG) :].partition(" ")
            payload = json.loads(payload)
            if kind == "STARTED":
                phase = "first run"
                deadline = time.monotonic() + 1.5 * cap
            elif kind == "FIRST":
                phase = "rest"
                deadline = time.monotonic() + spec.get("budget", 0) + 6 * payload + 120
            elif kind == "RESULT":
                proc.wait()
                return {"status": "ok", "result": payload}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class Runner:
    def __init__(self, args):
        self.args = args
        self.rows = []
        self.history = {}  # line key -> [(n, median_s or None)]
        self.counter = 0

    def predict(self, key, tool, n):
        pts = self.history.get(key, [])
        if pts and pts[-1][1] is None:
            return math.inf
        if not pts:
            return 0.0
        n1, t1 = pts[-1]
        p = DEFAULT_EXPONENT.get(tool, 1.5)
        if len(pts) >= 2 and pts[-2][1] and pts[-2][1] > 1e-3:
            n0, t0 = pts[-2]
            p = min(3.0, max(1.0, math.log(t1 / t0) / math.log(n1 / n0)))
        return t1 * (n / n1) ** p

    def case(self, kind, tool, n, cap, *, c=None, config=None, verify=False, predict=True):
        key = (kind, tool, c, config)
        base = dict(problem=kind, tool=tool, n=n, c=c, config=config)
        label = f"{kind} {tool} n={n} " + (f"c={c}" if c else f"config={config}")
        pred = self.predict(key, tool, n) if predict else 0.0
        if pred > cap:
            why = (
                "a smaller size was skipped or timed out"
                if math.isinf(pred)
                else f"predicted {pred:.0f} s > cap {cap:.0f} s"
            )
            print(f"  skip {label}: {why}", flush=True)
            self.rows.append(
                dict(
                    base,
                    status="skipped",
                    note=f"skipped: {why}",
                    predicted_s=None if math.isinf(pred) else pred,
                )
            )
            self.history.setdefault(key, []).append((n, None))
            if tool == "ours" and kind == "revolve":
                self.rows.append(
                    dict(base, tool="ours.stats", status="skipped", note=f"skipped: {why}")
                )
            return
        self.counter += 1
        spec = dict(
            kind=kind,
            tool=tool,
            n=n,
            c=c,
            config=config,
            verify=verify,
            rmax=self.args.repeats,
            budget=self.args.budget,
            mem_cap=self.args.mem_cap,
            id=self.counter,
        )
        t0 = time.perf_counter()
        print(f"  run  {label} ...", end="", flush=True)
        out = run_worker(spec, cap)
        wall = time.perf_counter() - t0
        if out["status"] != "ok":
            print(f" {out['status']}: {out['note']} ({wall:.0f} s)", flush=True)
            self.rows.append(dict(base, status=out["status"], note=out["note"]))
            self.history.setdefault(key, []).append((n, None))
            if tool == "ours" and kind == "revolve":
                self.rows.append(
                    dict(base, tool="ours.stats", status=out["status"], note=out["note"])
                )
            return
        for r in out["result"]:
            r.pop("spec_id", None)
            self.rows.append(dict(base, **r))
        med = out["result"][0]["median_s"]
        print(f" median {med:.4g} s x{out['result'][0]['repeats']} ({wall:.0f} s)", flush=True)
        self.history.setdefault(key, []).append((n, med))


def _ours(rows, r):
    for o in rows:
        if (
            o["problem"] == r["problem"]
            and o["n"] == r["n"]
            and o["c"] == r["c"]
            and o["config"] == r["config"]
            and o["tool"] == "ours"
            and o["status"] == "ok"
        ):
            return o
    return None


def postprocess(rows):
    from vlcc_adjoint.schedules import binomial_forward_count

    checks = []
    for r in rows:
        if r["status"] != "ok":
            continue
        o = _ours(rows, r)
        r["ratio_vs_ours"] = (
            (r["median_s"] / o["median_s"])
            if o and r["tool"] != "ours"
            else (1.0 if r["tool"] == "ours" else None)
        )
        if r["problem"] == "revolve" and r["tool"] == "pyrevolve core" and "forward_count" in r:
            t = binomial_forward_count(r["n"], r["c"])
            ours_f = o.get("forward_count") if o else None
            ok = ours_f == r["forward_count"] == t
            checks.append(
                dict(
                    n=r["n"],
                    c=r["c"],
                    ours=ours_f,
                    pyrevolve=r["forward_count"],
                    binomial=t,
                    agree=ok,
                )
            )
            note = f"fwd {r['forward_count']} {'== ours == t(n,c)' if ok else 'MISMATCH'}"
            r["note"] = (r.get("note", "") + "; " + note).strip("; ")
            if o is not None:
                o["forward_check"] = ok
        if r["problem"] == "revolve" and r["tool"] == "ours" and "forward_count" in r:
            t = binomial_forward_count(r["n"], r["c"])
            r.setdefault(
                "note",
                f"fwd {r['forward_count']}"
                + (" == t(n,c)" if r["forward_count"] == t else f" != t(n,c)={t}"),
            )
        if r["problem"] == "multistage" and r.get("predicted_time") is not None:
            note = f"pred {r['predicted_time']:.6g}"
            if o and o.get("predicted_time") and r["tool"] != "ours":
                note += f" ({r['predicted_time'] / o['predicted_time']:.4f}x ours)"
            if r["tool"] == "ours" and abs(r["predicted_time"] - r["optimal_time"]) > 1e-9 * max(
                1.0, r["optimal_time"]
            ):
                note += f" != optimal_time {r['optimal_time']:.6g}"
            if r["tool"] == "ours" and r.get("F_bytes"):
                note += f", F table {r['F_bytes'] / MiB:.2f} MiB"
            if r.get("peak_slots"):
                note += f", peak slots ram/disk {r['peak_slots'][0]}/{r['peak_slots'][1]}"
            r["note"] = (r.get("note", "") + "; " + note).strip("; ") if r.get("note") else note
    return checks


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_table(rows, compile_info):
    head = (
        f"{'problem':<15} {'n':>9} {'tool':<18} {'reps':>4} {'median_s':>10} {'first_s':>8} "
        f"{'peer/ours':>9} {'trace_MiB':>9} {'rss+_MiB':>8} {'table_MiB':>9}  note"
    )
    print()
    print(head)
    print("-" * len(head))
    last = None
    for r in rows:
        prob = f"Revolve c={r['c']}" if r["problem"] == "revolve" else f"Multistage {r['config']}"
        if last is not None and (prob, r["n"]) != last:
            print()
        last = (prob, r["n"])
        ok = r["status"] == "ok"
        peak = r.get("peak_traced_bytes")
        rss = r.get("rss_delta_bytes")
        tb = r.get("table_nbytes")
        print(
            f"{prob:<15} {r['n']:>9} {r['tool']:<18} {_fmt(r.get('repeats'), 'd'):>4} "
            f"{_fmt(r.get('median_s') if ok else None, '.4g'):>10} "
            f"{_fmt(r.get('first_s'), '.3f'):>8} {_fmt(r.get('ratio_vs_ours'), '.3g'):>9} "
            f"{_fmt(None if peak is None else peak / MiB, '.2f'):>9} "
            f"{_fmt(None if rss is None else rss / MiB, '.1f'):>8} "
            f"{_fmt(None if tb is None else tb / MiB, '.2f'):>9}  {r.get('note', '')}"
        )
    if compile_info:
        print("\ncold numba compile (empty NUMBA_CACHE_DIR), first vs second call in seconds:")
        for k, v in compile_info.items():
            if isinstance(v, dict):
                print(f"  {k:<24} first {v['first_s']:.3f}  second {v['second_s']:.5f}")
        print(
            f"  import vlcc_adjoint.schedules: {compile_info.get('import_s', float('nan')):.3f} s"
        )


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    colors = {}
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, problem, var, styles in [
        (axes[0], "revolve", "c", {10: "-", 100: "--"}),
        (axes[1], "multistage", "config", {"A": "-", "B": "--"}),
    ]:
        lines = {}
        for r in rows:
            if r["problem"] == problem and r["status"] == "ok":
                lines.setdefault((r["tool"], r[var]), []).append((r["n"], r["median_s"]))
        for (tool, v), pts in sorted(lines.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
            pts.sort()
            color = colors.setdefault(tool, palette[len(colors) % len(palette)])
            ax.loglog(
                [p[0] for p in pts],
                [p[1] for p in pts],
                styles.get(v, ":"),
                marker="o",
                color=color,
                label=f"{tool}, {var}={v}",
            )
        ax.set_xlabel("n (steps)")
        ax.set_ylabel("generation time, median [s]")
        ax.set_title(
            "Revolve(n, c)"
            if problem == "revolve"
            else "Multistage A: [3, (4,10,10)] fwd 3;  B: [10, (20,5,5)] fwd 1"
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes only (a few minutes)")
    ap.add_argument(
        "--out",
        default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results"),
        help="results directory",
    )
    ap.add_argument(
        "--cap",
        type=float,
        default=60.0,
        help="skip peer runs predicted above this many seconds; kill at 1.5x",
    )
    ap.add_argument("--ms-cap", type=float, default=180.0, help="the same for our Multistage")
    ap.add_argument("--repeats", type=int, default=None, help="max timed repeats (7; quick 3)")
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds of timed repeats per case before stopping (20; quick 5)",
    )
    ap.add_argument(
        "--mem-cap",
        type=float,
        default=None,
        help="skip the extra tracemalloc run of a peer whose run takes more than "
        "a third of this (s); ours: more than 3 times this (30; quick 5)",
    )
    ap.add_argument("--only", choices=["revolve", "multistage", "cold", "memory"], default=None)
    ap.add_argument(
        "--memory-sizes",
        default=None,
        help="comma-separated n of Revolve in the memory part (1e5..1e7; quick 1e5, 1e6)",
    )
    ap.add_argument(
        "--memory-root",
        default=str(ROOT),
        help="source tree whose vlcc_adjoint the memory part imports",
    )
    ap.add_argument(
        "--update-results",
        action="store_true",
        help="write benchmarks/results/bench_schedules.json (with --only: only that part of it)",
    )
    ap.add_argument(
        "--cold-sizes",
        default=None,
        help="comma-separated n of the cold first-call part (1e2..1e5; quick 1e2..1e4)",
    )
    ap.add_argument(
        "--cold-repeats",
        type=int,
        default=5,
        help="fresh processes per cold case (median, min, max over them)",
    )
    ap.add_argument(
        "--cold-root",
        default=str(ROOT),
        help="source tree whose vlcc_adjoint the cold part imports (another "
        "checkout gives before/after numbers)",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main(json.loads(args.worker))
        return
    args.repeats = args.repeats or (3 if args.quick else 7)
    args.budget = args.budget or (5.0 if args.quick else 20.0)
    if args.mem_cap is None:
        args.mem_cap = 5.0 if args.quick else 30.0
    out = ROOT / "benchmarks" / "results" if args.update_results else Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()

    if args.only in ("cold", "memory"):
        compile_info = {"skipped": f"--only {args.only}"}
    else:
        print("cold numba compile ...", flush=True)
        cache = tempfile.mkdtemp(prefix="bench_numba_cache_")
        try:
            res = run_worker(
                dict(kind="compile", id=0, budget=600.0),
                cap=600.0,
                env=dict(os.environ, NUMBA_CACHE_DIR=cache),
            )
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        compile_info = res.get("result") if res["status"] == "ok" else {"error": res["note"]}

    runner = Runner(args)
    sizes = [10**3, 10**4] if args.quick else [10**3, 10**4, 10**5, 10**6, 10**7]
    if args.only in (None, "revolve"):
        print("Revolve:", flush=True)
        cs_cases = [(500, 10)] if args.quick else [(1000, 10), (2000, 10), (1000, 100)]
        for c in (10, 100):
            for n in sizes:
                runner.case("revolve", "ours", n, args.cap, c=c)
                runner.case("revolve", "pyrevolve core", n, args.cap, c=c, verify=True)
                runner.case("revolve", "pyrevolve shipped", n, args.cap, c=c)
            for n_cs, c_cs in cs_cases:  # explicitly chosen sizes: no skip, killed at 2.25 cap
                if c_cs == c:
                    if n_cs not in sizes:  # ours at the same size, for the ratio
                        runner.case("revolve", "ours", n_cs, args.cap, c=c, predict=False)
                    runner.case("revolve", "cs.Revolve", n_cs, 1.5 * args.cap, c=c, predict=False)
    if args.only in (None, "multistage"):
        print("Multistage:", flush=True)
        ms_sizes = [300] if args.quick else [10**3, 10**4, 10**5]
        for cfg in ("A", "B"):
            peers = ["cs.HRevolve", "cs.DiskRevolve"]
            c = CONFIGS[cfg]
            if c["forward_cost"] != c["adjoint_cost"]:
                peers.insert(1, "cs.HRevolve fixed")
            for n in ms_sizes:
                runner.case("multistage", "ours", n, args.ms_cap, config=cfg)
                for tool in peers:
                    runner.case("multistage", tool, n, args.cap, config=cfg)

    cold = []
    if args.only in (None, "cold"):
        import _cold_start

        cold_sizes = (
            [int(float(x)) for x in args.cold_sizes.split(",")]
            if args.cold_sizes
            else [10**2, 10**3, 10**4]
            if args.quick
            else [10**2, 10**3, 10**4, 10**5]
        )
        print(
            f"Cold first calls (fresh process each; median [min, max] of "
            f"{args.cold_repeats}; c = 10; warm: median of up to 5 more calls in that "
            f"process, within 1 s):"
        )
        print(_cold_start.HEADER, flush=True)
        cold = _cold_start.measure(
            cold_sizes,
            c=10,
            repeats=args.cold_repeats,
            root=args.cold_root,
            say=lambda line: print(line, flush=True),
        )

    memory = []
    if args.only in (None, "memory"):
        memory = _memory_part(args)

    rows = runner.rows
    checks = postprocess(rows)
    if rows:
        print_table(rows, compile_info)
    if checks:
        bad = [ch for ch in checks if not ch["agree"]]
        print(
            f"\nforward counts ours == pyrevolve == t(n, c): "
            f"{len(checks) - len(bad)}/{len(checks)} sizes agree"
            + (f"; MISMATCH {bad}" if bad else "")
        )
    import checkpoint_schedules
    import numba
    import numpy

    meta = dict(
        command=" ".join(
            [Path(sys.executable).name, "benchmarks/bench_schedules.py"] + (argv or sys.argv[1:])
        ),
        quick=args.quick,
        cap_s=args.cap,
        ms_cap_s=args.ms_cap,
        repeats_max=args.repeats,
        budget_s=args.budget,
        mem_cap_s=args.mem_cap,
        python=platform.python_version(),
        numba=numba.__version__,
        numpy=numpy.__version__,
        checkpoint_schedules=getattr(checkpoint_schedules, "__version__", "1.0.4?"),
        pyrevolve=_version("pyrevolve"),
        cpu_count=os.cpu_count(),
        machine=platform.machine(),
        numba_threading_layer=os.environ.get("NUMBA_THREADING_LAYER"),
        configs=CONFIGS,
        source_sha256=_sources(),
        wall_s=time.perf_counter() - t_start,
        started=time.strftime("%Y-%m-%d %H:%M:%S"),
    )
    result = dict(
        meta=meta,
        compile=compile_info,
        rows=rows,
        forward_checks=checks,
        cold_start=cold,
        memory=memory,
    )
    if args.only is not None and (out / "bench_schedules.json").exists():
        result = _merge(json.loads((out / "bench_schedules.json").read_text()), result, args.only)
    with open(out / "bench_schedules.json", "w") as f:
        json.dump(result, f, indent=1)
    written = [out / "bench_schedules.json"]
    if rows and not (args.update_results and args.only):  # a partial update keeps the figure
        plot(rows, out / "bench_schedules.png")
        written.append(out / "bench_schedules.png")
    print(f"\nwrote {' and '.join(map(str, written))} ({meta['wall_s']:.0f} s)")


def _memory_part(args):
    """The memory section (module docstring): one fresh process per case."""
    import _schedule_memory

    sizes = (
        [int(float(x)) for x in args.memory_sizes.split(",")]
        if args.memory_sizes
        else [10**5, 10**6]
        if args.quick
        else [10**5, 10**6, 10**7]
    )
    cases = []
    for c in (10, 100):
        for n in sizes:
            cases.append((f"Revolve c={c}", "revolve", n, dict(c=c, arrays=n <= 10**6)))
    for cfg in ("A", "B"):
        conf = CONFIGS[cfg]
        for n in [10**4] if args.quick else [10**4, 10**5]:
            if cfg == "B" and n > 10**4:
                continue  # minutes of dynamic program (bench_multistage.py times it)
            cases.append(
                (
                    f"Multistage {cfg}",
                    "multistage",
                    n,
                    dict(levels=conf["levels"], fwd=conf["forward_cost"], adj=conf["adjoint_cost"]),
                )
            )
    print(
        f"Memory (fresh process each; peak RSS growth in MiB over the process after its "
        f"imports and kernels, and seconds, after each phase; root {args.memory_root}):"
    )
    print(_schedule_memory.HEADER, flush=True)
    return _schedule_memory.measure(
        cases, args.memory_root, say=lambda line: print(line, flush=True)
    )


def _merge(old, new, only):
    """`old` results with the part `only` replaced by `new`'s."""
    merged = dict(old)
    if only in ("revolve", "multistage"):
        merged["rows"] = [r for r in old.get("rows", []) if r["problem"] != only] + new["rows"]
        if only == "revolve":
            merged["forward_checks"] = new["forward_checks"]
    else:
        merged[{"cold": "cold_start", "memory": "memory"}[only]] = new[
            {"cold": "cold_start", "memory": "memory"}[only]
        ]
    meta = dict(old.get("meta", {}))
    meta.setdefault("partial_updates", []).append(
        dict(
            only=only,
            command=new["meta"]["command"],
            started=new["meta"]["started"],
            wall_s=new["meta"]["wall_s"],
            source_sha256=new["meta"]["source_sha256"],
        )
    )
    merged["meta"] = meta
    return merged


def _sources():
    """sha256 (first 16 hex digits) of the schedule sources benchmarked: the
    package changes under this benchmark, so results name what they timed."""
    import hashlib

    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        for p in sorted((ROOT / "vlcc_adjoint" / "schedules").glob("*.py"))
    }


def _version(dist):
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001
        return None


if __name__ == "__main__":
    main()
