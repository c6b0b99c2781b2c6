"""Benchmark: the executor's own cost per action, on a state so small that
the solver and the store cost next to nothing.

Reproduce::

    . .venv/bin/activate
    python benchmarks/bench_executor.py                   # ~1 minute (2 rounds)
    python benchmarks/bench_executor.py --steps 20000     # a smoke run
    # before/after: another version of the package, side by side
    mkdir -p /tmp/vlcc_orig && git archive <commit> vlcc_adjoint | tar -x -C /tmp/vlcc_orig
    python benchmarks/bench_executor.py --baseline /tmp/vlcc_orig

A state of 8 float64 values, ``Revolve(n, c)`` (default ``n = 10^5``,
``c = 10``), and a solver whose steps are one small numpy expression each
(``u * 0.999 + 0.001``; the adjoint ``lam * 0.999``).  Four quantities,
each timed as a whole in a fresh interpreter of its own (after a warm-up of
the same code on ``Revolve(200, c)``): a run measured in a process that has
just made two 400k-action runs is slowed by what they left behind (a larger
heap, colder caches), which would flatter the ratios:

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
other work disturbs far less.  With ``--baseline DIR`` (a directory
holding another ``vlcc_adjoint`` package) each round also times that
version's ("before") ``run_adjoint`` and dict-store run next to this tree's
("after"); the bare loop and the calls alone run the same code in either
version and are timed once a round.  Each round runs its interpreters in an
order rotated by one from the last, and the ratios are ratios of medians.
``_executor_instructions.py`` counts the instructions of the same
quantities, each in its own interpreter too.  Writes
``bench_executor.json`` to ``--out`` (default:
``$TMPDIR/vlcc-bench-results/``, outside the source tree, as every
benchmark), keeping the claims of a results file it rewrites.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import claims  # noqa: E402  (benchmarks/claims.py)


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


MEASURES = ("run_adjoint", "dict_store", "bare_loop", "calls_only")
"""The measured quantities, each timed in a fresh interpreter of its own."""

VERSIONED = ("run_adjoint", "dict_store")
"""The quantities that depend on the package's version; the other two (the
bare loop and the solver calls alone) run the same code with any version and
are measured once per round, with this tree."""


def bare_loop(solver, table, u0, lam_n, kinds):
    """The floor: the same solver calls as ``run_adjoint`` makes, from a plain
    Python loop over the schedule's table, snapshots kept as ``u.copy()`` in a
    dict.  ``kinds`` is the :class:`ActionKind` enum.

    **Returns:** the adjoint at step 0."""
    rows = zip(table["kind"].tolist(), table["a"].tolist(), table["b"].tolist())
    held, u, lam = {}, u0, lam_n
    forward, adjoint = solver.forward, solver.adjoint
    advance, save, load, delete, reverse = (
        kinds.ADVANCE,
        kinds.SAVE,
        kinds.LOAD,
        kinds.DELETE,
        kinds.REVERSE,
    )
    for kind, a, b in rows:
        if kind == advance:
            for i in range(a, b):
                u = forward(u, i)
        elif kind == save:
            held[a] = u.copy()
        elif kind == load:
            u = held[a].copy()
        elif kind == delete:
            del held[a]
        elif kind == reverse:
            lam = adjoint(u, lam, a)
    return lam


def calls_only(solver, steps, n_forward, u0, lam_n):
    """The solver calls alone, in one loop: ``n_forward`` forward steps and
    ``steps`` adjoint steps, no snapshots at all.

    **Returns:** the last adjoint."""
    forward, adjoint = solver.forward, solver.adjoint
    u = u0
    for i in range(n_forward):
        u = forward(u, i % steps)
    lam = lam_n
    for i in range(steps - 1, -1, -1):
        lam = adjoint(u0, lam, i)
    return lam


def measure(what: str, steps: int, slots: int) -> dict:
    """Run one quantity ``what`` (one of :data:`MEASURES`) of
    ``Revolve(steps, slots)`` in this interpreter, after a warm-up of the
    same code on ``Revolve(200, slots)`` (imports, first calls, caches), and
    time it alone: nothing else ran at scale in this process before it.

    **Returns:** ``{"seconds", "cpu_seconds", "adjoint", ...}``: wall and CPU
    (``time.process_time``, every thread) seconds, and the adjoint it computed
    (a list of floats; the parent checks that the runs agree)."""
    import vlcc_adjoint
    from vlcc_adjoint import run_adjoint
    from vlcc_adjoint.schedules import ActionKind, Revolve

    solver = TinySolver()
    schedule = Revolve(steps, slots)
    table = schedule.table
    u0 = np.linspace(0.0, 1.0, 8)
    lam_n = np.ones(8)
    n_forward = int(schedule.stats().forward_count)

    def once(sched, n_fwd):
        if what == "run_adjoint":
            return run_adjoint(solver, sched, u0, lam_n).adjoint
        if what == "dict_store":
            return run_adjoint(solver, sched, u0, lam_n, store=DictStore()).adjoint
        if what == "bare_loop":
            return bare_loop(solver, sched.table, u0, lam_n, ActionKind)
        if what == "calls_only":
            return calls_only(solver, sched.n_steps, n_fwd, u0, lam_n)
        raise ValueError(f"unknown quantity {what!r}; one of {MEASURES}")

    warm = Revolve(200, slots)
    once(warm, int(warm.stats().forward_count))  # warm-up: imports, first calls
    t0, c0 = time.perf_counter(), time.process_time()
    lam = once(schedule, n_forward)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "package": vlcc_adjoint.__file__,
        "what": what,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "adjoint": np.asarray(lam).tolist(),
        "actions": int(len(table)),
        "forward_count": n_forward,
    }


def run_child(what: str, version: str, baseline: str | None, args) -> dict:
    """Time ``what`` in a fresh interpreter that imports the ``version``
    package (``before``: the one in ``baseline``; ``after``: this tree)."""
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
        what,
        "--steps",
        str(args.steps),
        "--slots",
        str(args.slots),
    ]
    load0 = os.getloadavg()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the {version} {what} run failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(version=version, loadavg_before=load0, loadavg_after=os.getloadavg())
    return result


def jobs(versions: list[str], rnd: int) -> list[tuple[str, str]]:
    """Round ``rnd``'s runs, ``(quantity, version)``: the versioned quantities
    for each version, the others once, in an order rotated by one each round
    (so no quantity always runs first, or always right after another)."""
    listed = [(w, v) for w in VERSIONED for v in versions]
    listed += [(w, "after") for w in MEASURES if w not in VERSIONED]
    shift = rnd % len(listed)
    return listed[shift:] + listed[:shift]


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
    parser.add_argument("--child", choices=MEASURES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.update_results:
        args.out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    if args.child:
        print(json.dumps(measure(args.child, args.steps, args.slots)))
        return

    versions = ["before", "after"] if args.baseline else ["after"]
    runs: dict[str, list[dict]] = {v: [] for v in versions}
    for rnd in range(args.rounds):
        got = {v: {} for v in versions}
        for what, v in jobs(versions, rnd):
            got[v][what] = run_child(what, v, args.baseline, args)
        for v in versions:  # the version-independent quantities serve every version
            got[v].update({w: got["after"][w] for w in MEASURES if w not in VERSIONED})
        for v in versions:
            r = got[v]
            adjoints = {w: r[w]["adjoint"] for w in MEASURES if w != "calls_only"}
            if any(lam != adjoints["bare_loop"] for lam in adjoints.values()):
                raise AssertionError(f"the {v} runs disagree on the adjoint: {adjoints}")
            row = {"actions": r["run_adjoint"]["actions"]}
            row["forward_count"] = r["run_adjoint"]["forward_count"]
            row["package"] = r["run_adjoint"]["package"]
            for w in MEASURES:
                row[w] = r[w]["seconds"]
                row[w + "_cpu"] = r[w]["cpu_seconds"]
                row[w + "_loadavg"] = r[w]["loadavg_before"]
            row["version"] = v
            runs[v].append(row)
            print(
                f"round {rnd + 1}/{args.rounds} {v:6s} run_adjoint {row['run_adjoint']:.2f} s, "
                f"dict store {row['dict_store']:.2f} s, bare loop {row['bare_loop']:.2f} s "
                f"(CPU {row['run_adjoint_cpu']:.2f}, {row['dict_store_cpu']:.2f}, "
                f"{row['bare_loop_cpu']:.2f} s), load {row['run_adjoint_loadavg'][0]:.2f}",
                flush=True,
            )

    actions = runs[versions[0]][0]["actions"]
    print(
        f"\nRevolve({args.steps}, {args.slots}): {actions} actions, "
        f"{runs[versions[0]][0]['forward_count']} forward steps; 8-float state; "
        f"median of {args.rounds} rounds ({args.clock} seconds), each quantity "
        "in its own interpreter"
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
    records = claims.tracked(Path(out))  # the claims of the file this run rewrites
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
    claims.attach(Path(out), ["bench_executor.json"], records)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
