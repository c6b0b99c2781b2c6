"""Benchmark: Multistage generation time, the current module against an older one.

Reproduce::

    python benchmarks/bench_multistage.py                       # A and B, n = 1e3, 1e4, 1e5
    python benchmarks/bench_multistage.py --n 1000 10000 --repeats 3
    python benchmarks/bench_multistage.py --old-rev 9660f89 --cap 600

The *old* implementation is ``vlcc_adjoint/schedules/_multistage.py`` as of
git revision ``--old-rev`` (default ``9660f89``, the branch-and-bound DP
before the split search was rewritten), or the file given by ``--old-file``.
It is imported as a stand-alone module next to the installed package, so both
run against the same ``_revolve`` / ``_schedule`` helpers.

Configurations (those of ``bench_schedules.py``):

* A: ``[Level(3), Level(4, 10, 10)]``, forward_cost 3, adjoint_cost 1;
* B: ``[Level(10), Level(20, 5, 5)]``, forward_cost 1, adjoint_cost 1.

Protocol.  Every (configuration, n, implementation, repeat) runs in a fresh
Python subprocess: import, one warm-up call at n = 20 (numba compilation, or
for the new module a cache load; not timed), then one timed ``Multistage(n, ...)`` (the dynamic
program and the table), reporting wall time (``perf_counter``), this
process's CPU time (``process_time``; less sensitive to other jobs on a
shared machine) and ``optimal_time``.  Old and new alternate, so both see the
same background load.  A run over ``--cap`` seconds is killed and reported
as ``> cap``; once an implementation is killed at some n it is not run at
larger n of the same configuration, nor where the power law through its two
previous sizes predicts more than ``--cap`` seconds (the table then shows
``~`` that prediction, in CPU seconds).  The two ``optimal_time`` values must be
equal (relative 1e-9) wherever both finished.  Results go to
``DIR/bench_multistage.json`` (``--out DIR``, default ``$TMPDIR/vlcc-bench-results/``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "A": ("[Level(3), Level(4, 10, 10)]", 3.0, 1.0),
    "B": ("[Level(10), Level(20, 5, 5)]", 1.0, 1.0),
}

WORKER = textwrap.dedent(
    """
    import sys, time, json, importlib.util
    which, path, n, levels, fwd, adj = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5]), float(sys.argv[6])
    from vlcc_adjoint.schedules import Level
    if which == "new":
        from vlcc_adjoint.schedules import Multistage
    else:
        import vlcc_adjoint.schedules as pkg
        spec = importlib.util.spec_from_file_location("vlcc_adjoint.schedules._multistage_old", path,
                                                      submodule_search_locations=None)
        mod = importlib.util.module_from_spec(spec)
        mod.__package__ = "vlcc_adjoint.schedules"
        spec.loader.exec_module(mod)
        Multistage = mod.Multistage
    levels = eval(levels)
    Multistage(20, levels, fwd, adj)
    w0, c0 = time.perf_counter(), time.process_time()
    m = Multistage(n, levels, fwd, adj)
    w1, c1 = time.perf_counter(), time.process_time()
    print(json.dumps(dict(wall=w1 - w0, cpu=c1 - c0, optimal_time=m.optimal_time, rows=len(m.table))))
    """
)


def _old_source(args) -> Path:
    if args.old_file:
        src = Path(args.old_file).read_text()
    else:
        src = subprocess.run(
            ["git", "show", f"{args.old_rev}:vlcc_adjoint/schedules/_multistage.py"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    # numba cannot reload its on-disk cache for a module imported from a file
    # path, so the old copy compiles in every run (in the untimed warm-up)
    src = src.replace("cache=True", "cache=False")
    path = Path(tempfile.gettempdir()) / f"vlcc_multistage_{args.old_rev}.py"
    if not path.exists() or path.read_text() != src:
        path.write_text(src)
    return path


def _run(which, old_path, n, cfg, cap):
    levels, fwd, adj = CONFIGS[cfg]
    cmd = [sys.executable, "-c", WORKER, which, str(old_path), str(n), levels, str(fwd), str(adj)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=cap, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        raise RuntimeError(f"{which} n={n} {cfg} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _predict(rows, cfg, which, n):
    """CPU seconds at ``n`` extrapolated from the last two sizes measured
    (a power law), or None."""
    done = [
        (r["n"], r[which]["cpu"])
        for r in rows
        if r["config"] == cfg and r[which] and r[which]["cpu"] > 0.05
    ]
    if len(done) < 2:
        return None
    (n1, t1), (n2, t2) = done[-2:]
    if n2 <= n1 or t2 <= 0:
        return None
    import math

    slope = max(1.0, math.log(t2 / t1) / math.log(n2 / n1))
    return t2 * (n / n2) ** slope


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--configs", nargs="+", default=["A", "B"], choices=sorted(CONFIGS))
    ap.add_argument("--repeats", type=int, default=3, help="runs per case (1 beyond 60 s)")
    ap.add_argument("--cap", type=float, default=900.0, help="seconds before a run is killed")
    ap.add_argument("--old-rev", default="9660f89")
    ap.add_argument("--old-file", default=None)
    ap.add_argument("--only-new", action="store_true")
    ap.add_argument(
        "--out", default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results")
    )
    args = ap.parse_args()
    old_path = _old_source(args)
    rows = []
    print(f"old: {old_path}   cpu count {os.cpu_count()}, load {os.getloadavg()}")
    print(
        f"{'cfg':>3} {'n':>7} | {'old wall':>9} {'old cpu':>9} | {'new wall':>9} {'new cpu':>9} |"
        f" {'speed-up (cpu)':>14} | optimal_time"
    )
    for cfg in args.configs:
        dead = {"old": False, "new": False}
        for n in args.n:
            runs = {"old": [], "new": []}
            predicted = {w: _predict(rows, cfg, w, n) for w in ("old", "new")}
            for r in range(args.repeats):
                for which in ("old", "new"):
                    if which == "old" and args.only_new:
                        continue
                    if predicted[which] is not None and predicted[which] > args.cap:
                        dead[which] = True  # the growth so far says it would be killed
                    if dead[which] or (r > 0 and runs[which] and runs[which][0]["wall"] > 60):
                        continue
                    res = _run(which, old_path, n, cfg, args.cap)
                    if res is None:
                        dead[which] = True
                    else:
                        runs[which].append(res)
            med = {}
            for which, rs in runs.items():
                med[which] = (
                    dict(
                        wall=statistics.median(x["wall"] for x in rs),
                        cpu=statistics.median(x["cpu"] for x in rs),
                        optimal_time=rs[0]["optimal_time"],
                        runs=rs,
                    )
                    if rs
                    else None
                )
            if med["old"] and med["new"]:
                a, b = med["old"]["optimal_time"], med["new"]["optimal_time"]
                assert abs(a - b) <= 1e-9 * max(1.0, abs(a)), (cfg, n, a, b)

            def fmt(m, key, which):
                if m:
                    return f"{m[key]:9.3f}"
                if which == "old" and args.only_new:
                    return f"{'-':>9}"
                p = predicted[which]
                return f"{f'~{p:.0f}' if p else '> cap':>9}"

            speed = (
                f"{med['old']['cpu'] / med['new']['cpu']:14.1f}"
                if med["old"] and med["new"]
                else f"{'-':>14}"
            )
            opt = (med["new"] or med["old"] or {}).get("optimal_time")
            if not med["old"] and predicted["old"] and med["new"]:
                speed = f"{'~%.0f' % (predicted['old'] / med['new']['cpu']):>14}"
            print(
                f"{cfg:>3} {n:>7} | {fmt(med['old'], 'wall', 'old')} {fmt(med['old'], 'cpu', 'old')} |"
                f" {fmt(med['new'], 'wall', 'new')} {fmt(med['new'], 'cpu', 'new')} | {speed} | {opt}",
                flush=True,
            )
            rows.append(
                dict(
                    config=cfg,
                    n=n,
                    old=med["old"],
                    new=med["new"],
                    cap=args.cap,
                    old_predicted_cpu=None if med["old"] else predicted["old"],
                )
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_multistage.json").write_text(
        json.dumps(
            dict(
                rows=rows,
                old=str(old_path),
                when=time.strftime("%Y-%m-%d %H:%M:%S"),
                load=os.getloadavg(),
            ),
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
