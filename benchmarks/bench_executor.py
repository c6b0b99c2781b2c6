"""Benchmark: the executor's own cost per action, on a state so small that
the solver and the store cost next to nothing.

Reproduce::

    . .venv/bin/activate
    python benchmarks/bench_executor.py                   # ~30 s (2 rounds)
    python benchmarks/bench_executor.py --steps 20000     # a smoke run
    # before/after: another version of the package, side by side
    mkdir -p /tmp/vlcc_orig && git archive <commit> vlcc_adjoint | tar -x -C /tmp/vlcc_orig
    python benchmarks/bench_executor.py --baseline /tmp/vlcc_orig

A state of 8 float64 values, ``Revolve(n, c)`` (default ``n = 10^5``,
``c = 10``), and a solver whose steps are one small numpy expression each
(``u * 0.999 + 0.001``; the adjoint ``lam * 0.999``).  Three runs of the
same schedule, each timed as a whole:

- ``run_adjoint``: :func:`vlcc_adjoint.run_adjoint` with its default store
  (memory tiers, checksums, the io plan) and structure checks on;
- ``dict store``: the same ``run_adjoint`` with :class:`DictStore`, a
  store that only copies into and out of a dict: the executor's own cost
  without the store's (checksums, plan, pool);
- ``bare loop``: the floor, a plain Python loop over the schedule's actions
  that makes the *same solver calls* (``forward`` per step, ``adjoint`` per
  ``Reverse``) and keeps snapshots as ``u.copy()`` in a dict;
- ``calls only``: the solver calls alone, in one loop (forward count +
  ``n`` adjoint calls), no snapshots at all.

Reported: seconds (median over ``--rounds`` rounds) and ``run_adjoint``'s
time (with the default store, and with the dict store) as a multiple of
each floor, plus the per-action overhead
``(run_adjoint - bare loop) / actions``, in wall time or, with ``--clock
cpu``, in the child's CPU time (``time.process_time``: every thread of the
process, the store's background work included), which a machine shared with
other work disturbs far less.  Every measurement runs in a fresh
interpreter; with ``--baseline DIR`` (a directory holding another
``vlcc_adjoint`` package) the rounds alternate between that version
("before") and this tree ("after"), in alternating order, and the ratios are
ratios of medians.  Writes ``bench_executor.json`` to ``--out`` (default:
``$TMPDIR/vlcc-bench-results/``, outside the source tree, as every benchmark).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class TinySolver:
    """Steps of one numpy expression on an 8-float state (new arrays each step)."""

    def forward(self, u, step):
        return u * 0.999 + 0.001

    def adjoint(self, u, lam, step):
        return lam * 0.999


class DictStore:
    """The least a store can do: ``save`` keeps a copy, ``load`` returns one."""

    def __init__(self):
        self.held = {}

    def save(self, step, state, level=0):
        self.held[step, level] = state.copy()

    def load(self, step, level=0, out=None, copy=True):
        return self.held[step, level].copy()

    def delete(self, step, level=0):
        del self.held[step, level]

    def move(self, step, src, dst):
        self.held[step, dst] = self.held.pop((step, src))

    def wait(self):
        pass

    def stats(self):
        return None

    def close(self):
        pass


def child(steps: int, slots: int) -> dict:
    import vlcc_adjoint
    from vlcc_adjoint import run_adjoint
    from vlcc_adjoint.schedules import ActionKind, Revolve

    solver = TinySolver()
    schedule = Revolve(steps, slots)
    table = schedule.table
    u0 = np.linspace(0.0, 1.0, 8)
    lam_n = np.ones(8)
    run_adjoint(solver, Revolve(200, slots), u0, lam_n)  # warm-up: imports, first calls

    t0, c0 = time.perf_counter(), time.process_time()
    result = run_adjoint(solver, schedule, u0, lam_n)
    t_run, c_run = time.perf_counter() - t0, time.process_time() - c0

    t0, c0 = time.perf_counter(), time.process_time()
    run_adjoint(solver, schedule, u0, lam_n, store=DictStore())
    t_dict, c_dict = time.perf_counter() - t0, time.process_time() - c0

    # The floor: the same solver calls from a plain loop over the table.
    t0, c0 = time.perf_counter(), time.process_time()
    rows = zip(table["kind"].tolist(), table["a"].tolist(), table["b"].tolist())
    held, u, lam = {}, u0, lam_n
    forward, adjoint = solver.forward, solver.adjoint
    for kind, a, b in rows:
        if kind == ActionKind.ADVANCE:
            for i in range(a, b):
                u = forward(u, i)
        elif kind == ActionKind.SAVE:
            held[a] = u.copy()
        elif kind == ActionKind.LOAD:
            u = held[a].copy()
        elif kind == ActionKind.DELETE:
            del held[a]
        elif kind == ActionKind.REVERSE:
            lam = adjoint(u, lam, a)
    t_bare, c_bare = time.perf_counter() - t0, time.process_time() - c0
    if not np.array_equal(lam, result.adjoint):
        raise AssertionError("the bare loop and run_adjoint disagree")

    # The solver calls alone.
    n_forward = int(schedule.stats().forward_count)
    t0, c0 = time.perf_counter(), time.process_time()
    u = u0
    for i in range(n_forward):
        u = forward(u, i % steps)
    lam = lam_n
    for i in range(steps - 1, -1, -1):
        lam = adjoint(u0, lam, i)
    t_calls, c_calls = time.perf_counter() - t0, time.process_time() - c0
    return {
        "package": vlcc_adjoint.__file__,
        "run_adjoint": t_run,
        "dict_store": t_dict,
        "bare_loop": t_bare,
        "calls_only": t_calls,
        "run_adjoint_cpu": c_run,
        "dict_store_cpu": c_dict,
        "bare_loop_cpu": c_bare,
        "calls_only_cpu": c_calls,
        "actions": int(len(table)),
        "forward_count": n_forward,
    }


def run_child(version: str, baseline: str | None, args) -> dict:
    path = baseline if version == "before" else ROOT
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [path] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        ),
    )
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        "--steps",
        str(args.steps),
        "--slots",
        str(args.slots),
    ]
    load0 = os.getloadavg()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the {version} run failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(version=version, loadavg_before=load0, loadavg_after=os.getloadavg())
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100_000, help="time steps n (10^5)")
    parser.add_argument("--slots", type=int, default=10, help="Revolve snapshots c (10)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (2)")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="the clock of the summary: wall time (default), or the child's CPU time "
        "(time.process_time, all its threads): steadier on a machine shared with other work",
    )
    parser.add_argument(
        "--baseline",
        help="a directory holding another vlcc_adjoint package "
        "(the 'before' version), run side by side with this tree",
    )
    parser.add_argument(
        "--out",
        default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results"),
        help="folder for bench_executor.json (default: $TMPDIR/vlcc-bench-results)",
    )
    parser.add_argument(
        "--update-results",
        action="store_true",
        help="write bench_executor.json into benchmarks/results/ (the tracked results)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.update_results:
        args.out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    if args.child:
        print(json.dumps(child(args.steps, args.slots)))
        return

    versions = ["before", "after"] if args.baseline else ["after"]
    runs = {v: [] for v in versions}
    for rnd in range(args.rounds):
        for v in versions if rnd % 2 == 0 else versions[::-1]:
            r = run_child(v, args.baseline, args)
            runs[v].append(r)
            print(
                f"round {rnd + 1}/{args.rounds} {v:6s} run_adjoint {r['run_adjoint']:.2f} s, "
                f"dict store {r['dict_store']:.2f} s, bare loop {r['bare_loop']:.2f} s "
                f"(CPU {r['run_adjoint_cpu']:.2f}, {r['dict_store_cpu']:.2f}, "
                f"{r['bare_loop_cpu']:.2f} s), load {r['loadavg_before'][0]:.2f}",
                flush=True,
            )

    actions = runs[versions[0]][0]["actions"]
    print(
        f"\nRevolve({args.steps}, {args.slots}): {actions} actions, "
        f"{runs[versions[0]][0]['forward_count']} forward steps; 8-float state; "
        f"median of {args.rounds} rounds ({args.clock} seconds)"
    )
    head = (
        f"{'version':8s} {'run_adjoint':>12s} {'dict store':>11s} {'bare loop':>10s} "
        f"{'calls only':>11s} {'x bare':>7s} {'dict x bare':>12s} {'x calls':>8s} "
        f"{'us/action over bare':>20s}"
    )
    print(head)
    print("-" * len(head))
    summary = {}
    clock = "" if args.clock == "wall" else "_cpu"
    for v in versions:
        med = {
            k: float(np.median([r[k + clock] for r in runs[v]]))
            for k in ("run_adjoint", "dict_store", "bare_loop", "calls_only")
        }
        med["clock"] = args.clock
        med["x_bare"] = med["run_adjoint"] / med["bare_loop"]
        med["dict_x_bare"] = med["dict_store"] / med["bare_loop"]
        med["x_calls"] = med["run_adjoint"] / med["calls_only"]
        med["us_per_action_over_bare"] = (med["run_adjoint"] - med["bare_loop"]) / actions * 1e6
        summary[v] = med
        print(
            f"{v:8s} {med['run_adjoint']:12.2f} {med['dict_store']:11.2f} "
            f"{med['bare_loop']:10.2f} {med['calls_only']:11.2f} {med['x_bare']:7.2f} "
            f"{med['dict_x_bare']:12.2f} {med['x_calls']:8.2f} "
            f"{med['us_per_action_over_bare']:20.2f}"
        )
    if args.baseline:
        ratio = summary["before"]["run_adjoint"] / summary["after"]["run_adjoint"]
        print(f"run_adjoint before / after: {ratio:.2f}x")

    out = args.out
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "bench_executor.json")
    with open(path, "w") as fh:
        json.dump(
            {
                "benchmark": "bench_executor",
                "argv": sys.argv[1:],
                "steps": args.steps,
                "slots": args.slots,
                "rounds": args.rounds,
                "baseline": args.baseline,
                "machine": {
                    "platform": platform.platform(),
                    "python": platform.python_version(),
                    "cpus": os.cpu_count(),
                },
                "summary": summary,
                "runs": runs,
            },
            fh,
            indent=1,
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
