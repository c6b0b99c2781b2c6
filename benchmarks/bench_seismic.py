"""Benchmark: the seismic FWI gradient checkpointed by vlcc-adjoint, pyrevolve and store-all.

Reproduce::

    . .venv/bin/activate                       # pyrevolve 2.2.8: the `bench` extra
    python benchmarks/bench_seismic.py --quick # 256x256, 1000 steps, 3 rounds: ~1.5-3 min
    python benchmarks/bench_seismic.py         # 512x512, 2000 steps, 5 rounds: ~10-25 min

Writes ``DIR/bench_seismic.json`` (``DIR`` defaults to ``$TMPDIR/vlcc-bench-results/``:
the machine, the versions, every repeat with its load average, medians,
min/max, paired ratios, peak memory, unit costs and predictions) and
``DIR/bench_seismic.png`` (seconds per gradient, peers next to ours; our
measured time split into its parts against the model's prediction), and
prints the tables.

The problem
-----------
:class:`vlcc_adjoint._examples.seismic.SeismicProblem`: 2-D acoustic
wave equation, 4th order in space, leapfrog in time, damping sponge, a
Ricker source and a line of receivers; serial numba kernels for the
forward (``forward_many``) and the exact discrete adjoint (``adjoint``,
which also accumulates the velocity gradient).  A state ``u_k`` is two
``nz x nx`` float64 fields, ``(u_{k-1}, u_k)``: 4 MiB at 512x512.  Every
method below computes the same gradient with the same kernels, in the same
order of operations, and is checked against the store-all gradient
(bitwise: ``rel diff`` is ``max |g - g_ref| / max |g_ref|``).

What is compared (three cases, one process, interleaved rounds)
---------------------------------------------------------------
1. Same snapshots ``c`` (``--snapshots``, default 32):

   * ``pyrevolve``: pyrevolve's C++ Revolve (``pyrevolve.Revolver``:
     ``CRevolve`` + ``NumpyStorage``) driving the kernels through its
     ``Operator.apply(t_start, t_end)`` and ``Checkpoint.get_data``
     interfaces (``benchmarks/_seismic_peers.py``), as shipped: each
     adjoint step re-runs its forward step first (Revolve's "taped" step,
     which Devito's gradient needs), ``n - 1`` extra forward steps;
   * ``pyrevolve untaped``: the same, with ``apply_reverse`` overridden to
     skip that step (this adjoint reads only ``u_i``): the strongest
     pyrevolve for this solver, with exactly our forward count;
   * ``vlcc Revolve``: ``run_adjoint(problem, Revolve(n, c), ...)`` with
     the default store (a memory tier sized by the schedule, plan-driven).

   Both sides evaluate ``t(n, c) + 1`` forward steps outside adjoint steps
   (Griewank's optimum, plus the step to ``u_n``): checked.

2. Memory-starved (``--mem-snapshots`` ``c_mem``, default 10, fewer than
   case 1's): ``pyrevolve`` / ``pyrevolve untaped`` with ``c_mem``
   snapshots, against ``vlcc Multistage``: ``plan(n, memory_bytes=c_mem *
   state_bytes, disk_bytes=d * state, solver=problem, u0=u0)`` and its
   ``make_store()`` (memory tier + ``ZarrTier`` on ``--dir``, prefetch
   on).  The same memory: plan spends 3 of the ``c_mem`` states on the
   store's I/O buffers (2 staging, 1 read-ahead) and keeps ``c_mem - 3``
   checkpoints in memory, ``d`` (``--disk-snapshots``) on disk.

3. Against store-everything in memory: ``store-all``,
   ``problem.reference_gradient()``: one forward sweep appending a copy of
   every field ``u_k`` (the only field an adjoint step reads: ``(nt + 1)
   nz nx`` floats, 4.2 GB at full size) to a list, then the reverse loop.
   It beats ``store-all (executor)``, ``run_adjoint(StoreAll(n))`` with an
   unbounded memory tier (two fields a state, so twice the memory, and the
   store's per-call work; run in every round when it needs at most 2 GiB,
   as with ``--quick``, else only with ``--store-all-executor``), so it is
   the baseline.  Against it: ``vlcc
   10% memory``, a budget plan with ``memory_bytes = --fraction`` (10%) of
   the store-all list's bytes and a zarr disk tier, ``make_store()``
   (prefetch on).  Reported: time ratio, peak memory ratio (measured), and
   the stall share, in two definitions:

   * ``stall (executor)``: ``AdjointResult.stall_seconds``, all the time
     ``run_adjoint`` spent inside store calls (save, load, delete, move,
     the final flush), the capture copies and the copies back into the
     solver's arrays included: everything that is not a solver call;
   * ``stall (store)``: ``StoreStats.stall_seconds``, the time those calls
     were blocked waiting for storage (staging room, a read not yet
     prefetched, a pending write): the copies excluded.

4. Predicted against measured, for each of our runs: the run's schedule
   replayed by ``simulate`` with measured unit costs, ``F t_f + n t_a +
   sum_k (writes_k w_k + reads_k r_k)`` (``F`` forward steps, ``n``
   adjoint steps; ``w``, ``r`` the memory copy and the disk write / read
   of one state as calibrated by ``plan``), against the wall time, and the
   measured time split the same way (forward, adjoint, store calls, the
   executor's own remainder) to show where the model is off.  ``t_f``,
   ``t_a``: ``pred*``, ``m/p*`` (the target) use the run's own mean forward
   and adjoint step times (``AdjointResult.forward_seconds /
   forward_steps``, ``adjoint_seconds / n``: every schedule runs the same
   adjoint steps, and the step cost varies along the trajectory, see
   below), so what remains is the model's error outside the solver (store
   calls, executor); ``pred s``, ``m/p`` use a block of steps timed right
   before and right after the run (the load moves within a round).  A
   block is not a representative step: steps ~100-500 of this problem run
   2-4x slower than late ones (the decaying precursor ahead of the
   wavefront goes through denormal floats).  ``planned`` is
   ``simulate(schedule).predicted_time`` with the costs the schedule was
   planned with (``adjoint_cost = 1``), times ``t_f``.

Method
------
Round 0 is a warm-up, not kept in the medians: every method runs once
with ``tracemalloc`` on and a thread sampling RSS every 5 ms; it gives
the peak memory of each method (``peak traced``: numpy and Python
allocations during the run; ``peak RSS``: growth of the resident set) and
the reference gradient.  Then ``--repeats`` rounds; in a round the
methods of a case run back to back (so the runs compared are close in
time), the order of the cases and the order within each case rotated
every round; store-all runs once per round; before every run the load
average is recorded.  ``ratio`` is the median over rounds of the run's
time divided by the time of its case's peer in the same round (case 1 and
2: ``pyrevolve untaped``, the faster pyrevolve; case 3: ``store-all``);
``r(min)``, the fastest run over the peer's fastest (the least disturbed
runs: other jobs only ever add time).  Timed: a whole gradient, from an
initial state to ``problem.gradient``, including pyrevolve's
``Revolver`` construction (its CRevolve runs the schedule once to
compute a ratio) and our ``Revolve(n, c)`` table and store.  Not timed:
``plan()`` (calibration and the Multistage dynamic program), which is
done once per budget and reused by every gradient of an inversion (our
schedules are tables): its seconds are reported.

Shared 2-core VM: other jobs run too.  Compare ratios from one round, not
absolute seconds across runs; the load average of every run is in the
JSON, and so is the process CPU time (all threads, the store's workers
included), which time-slicing with other jobs inflates less than the wall
time.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

_MiB = 1 << 20


# ---------------------------------------------------------------------------
# measurement helpers
# ---------------------------------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


class _RssSampler:
    """Peak resident set size while a block runs, sampled every `period` s."""

    def __init__(self, period: float = 0.005):
        self.period = period
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self):
        self.base = _rss_bytes()
        self.peak = self.base
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self):
        while not self._stop.wait(self.period):
            self.peak = max(self.peak, _rss_bytes())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())
        return False

    @property
    def delta(self) -> int:
        return self.peak - self.base


def _unit_costs(problem, reps: int = 3, steps: int = 40) -> dict:
    """Seconds of one forward and one adjoint step (medians of `reps` blocks
    of `steps` steps on a developed wavefield), and of a state copy."""
    from vlcc_adjoint._examples.seismic import WaveState

    s = problem.initial_state()
    start = min(max(200, steps), problem.nt - steps - 1)
    problem.forward_many(s, 0, start)
    fwd, adj = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        problem.forward_many(s, start, start + steps)
        fwd.append((time.perf_counter() - t0) / steps)
        s = problem.initial_state()
        problem.forward_many(s, 0, start)
    lam = problem.final_adjoint(s)
    lam = WaveState(lam.prev + 1e-3 * s.prev, lam.curr + 1e-3 * s.curr)
    for _ in range(reps):
        t0 = time.perf_counter()
        for i in range(start, start - steps, -1):
            lam = problem.adjoint(s, lam, i)
        adj.append((time.perf_counter() - t0) / steps)
    problem.reset_gradient()
    a, b = np.ones(2 * problem.nz * problem.nx), np.empty(2 * problem.nz * problem.nx)
    np.copyto(b, a)
    cp = []
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        cp.append(time.perf_counter() - t0)
    return {
        "forward_step_s": statistics.median(fwd),
        "adjoint_step_s": statistics.median(adj),
        "copy_state_s": statistics.median(cp),
    }


def _predict(schedule, costs: dict, budget) -> dict:
    """The run time of `schedule` by ``simulate``, in seconds, with measured
    unit costs (the model of ``vlcc_adjoint.schedules.simulate``), split
    into its terms; and the prediction with the schedule's own costs."""
    from vlcc_adjoint.schedules import Level, Schedule, simulate

    t_f, t_a = costs["forward_step_s"], costs["adjoint_step_s"]
    copy = budget.copy_seconds
    rw = [(copy, copy), (budget.write_seconds, budget.read_seconds)]
    levels = [
        Level(lv.slots, rw[min(k, 1)][0] / t_f, rw[min(k, 1)][1] / t_f)
        for k, lv in enumerate(schedule.levels)
    ]
    priced = Schedule(
        schedule.table, schedule.n_steps, levels, forward_cost=1.0, adjoint_cost=t_a / t_f
    )
    stats = simulate(priced)
    # run_adjoint evaluates u_n once more when the schedule never reaches it.
    extra = 1
    io = [
        (stats.writes[k] * rw[min(k, 1)][0], stats.reads[k] * rw[min(k, 1)][1])
        for k in range(len(levels))
    ]
    return {
        "predicted_s": (stats.predicted_time + extra) * t_f,
        "forward_s": (stats.forward_count + extra) * t_f,
        "adjoint_s": stats.adjoint_count * t_a,
        "io_s": sum(w + r for w, r in io),
        "io_per_level_s": io,
        "as_planned_s": simulate(schedule).predicted_time * t_f,
        "forward_count": stats.forward_count,
        "writes": stats.writes,
        "reads": stats.reads,
    }


# ---------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="256x256, 1000 steps, 3 rounds")
    parser.add_argument("--n", type=int, default=None, help="grid points per side")
    parser.add_argument("--nt", type=int, default=None, help="time steps")
    parser.add_argument("--snapshots", type=int, default=32, help="case 1: c for both")
    parser.add_argument(
        "--mem-snapshots", type=int, default=10, help="case 2: states that fit in memory (c_mem)"
    )
    parser.add_argument(
        "--disk-snapshots",
        type=int,
        default=None,
        help="case 2: disk slots offered to plan() (64; --quick: 32)",
    )
    parser.add_argument(
        "--fraction",
        type=float,
        default=0.10,
        help="case 3: memory budget as a fraction of store-all's",
    )
    parser.add_argument(
        "--fraction-disk-snapshots",
        type=int,
        default=None,
        help="case 3: disk slots offered to plan() (24; --quick: 12); the "
        "exact two-level program costs O(n m d)",
    )
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--store-all-executor",
        choices=("auto", "rounds", "warmup", "off"),
        default="auto",
        help="run_adjoint(StoreAll(n)): in every round, "
        "in the warm-up only, or not (auto: rounds when it needs <= 2 GiB)",
    )
    parser.add_argument(
        "--no-store-all", action="store_true", help="skip the store-everything runs (case 3)"
    )
    parser.add_argument("--dir", default=None, help="directory for the zarr tiers")
    parser.add_argument(
        "--out", default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results")
    )
    args = parser.parse_args(argv)
    size = args.n or (256 if args.quick else 512)
    nt = args.nt or (1000 if args.quick else 2000)
    repeats = args.repeats or (3 if args.quick else 5)
    if args.disk_snapshots is None:
        args.disk_snapshots = 32 if args.quick else 64
    if args.fraction_disk_snapshots is None:
        args.fraction_disk_snapshots = 12 if args.quick else 24

    import numba
    import pyrevolve
    from _seismic_peers import PyrevolveSeismic

    import vlcc_adjoint
    from vlcc_adjoint import plan, run_adjoint
    from vlcc_adjoint._examples.seismic import SeismicProblem
    from vlcc_adjoint.schedules import Revolve, StoreAll, binomial_forward_count

    t_setup = time.perf_counter()
    load_start = os.getloadavg()
    problem = SeismicProblem(nx=size, nz=size, nt=nt)
    problem.d_obs  # noqa: B018 - the observed data (and the kernels compiled)
    n = problem.nt
    c, c_mem = args.snapshots, args.mem_snapshots
    u0 = problem.initial_state()
    state_bytes = u0.prev.nbytes + u0.curr.nbytes
    store_all_bytes = (nt + 1) * size * size * 8  # reference_gradient's list of fields
    record_bytes = state_bytes + 4096 * 3  # plan() counts zarr metadata per record
    tmp = tempfile.TemporaryDirectory(prefix="vlcc-bench-seismic-", dir=args.dir)
    Revolve(8, 2)  # load the numba planners
    print(
        f"{problem}\nstate {state_bytes / _MiB:.1f} MiB, store-all list "
        f"{store_all_bytes / 2**30:.2f} GiB; pyrevolve {pyrevolve.__version__}, "
        f"numba {numba.__version__}; setup {time.perf_counter() - t_setup:.1f} s",
        flush=True,
    )

    # The budget plans (not timed per gradient: done once per budget).
    plans, plan_seconds = {}, {}
    t0 = time.perf_counter()
    plans["starved"] = plan(
        n,
        memory_bytes=c_mem * state_bytes,
        disk_bytes=args.disk_snapshots * record_bytes,
        solver=problem,
        u0=u0,
        disk_path=tmp.name,
    )
    plan_seconds["starved"] = time.perf_counter() - t0
    print(
        f"\nplan, case 2 ({plan_seconds['starved']:.1f} s):\n{plans['starved'].explain}", flush=True
    )
    if not args.no_store_all:
        t0 = time.perf_counter()
        # The budget: the fraction of store-all's list, less our own live arrays
        # beyond store-all's (the adjoint state and the state in hand: 2 states),
        # so that the whole process grows by at most that fraction of store-all's.
        budget3 = int(args.fraction * store_all_bytes) - 2 * state_bytes
        plans["fraction"] = plan(
            n,
            memory_bytes=budget3,
            disk_bytes=args.fraction_disk_snapshots * record_bytes,
            solver=problem,
            u0=u0,
            disk_path=tmp.name,
        )
        plan_seconds["fraction"] = time.perf_counter() - t0
        print(
            f"\nplan, case 3 ({plan_seconds['fraction']:.1f} s):\n{plans['fraction'].explain}",
            flush=True,
        )

    run_no = iter(range(10**6))

    def store_for(key):
        def make(schedule):
            path = os.path.join(tmp.name, f"run{next(run_no)}")
            return plans[key].make_store(path=path)

        return make

    # ----------------------------------------------------------- methods
    # name -> (case, kind, callable returning (gradient, info))
    def pyrev(snapshots, taped):
        peer = PyrevolveSeismic(problem, snapshots, taped=taped)

        def run():
            g = peer.run()
            return g, dict(peer.counts)

        return run

    def vlcc(make_schedule, make_store=None):
        def run():
            problem.reset_gradient()
            schedule = make_schedule()
            store = make_store(schedule) if make_store else None
            res = run_adjoint(
                problem, schedule, problem.initial_state(), problem.final_adjoint, store=store
            )
            st = res.store_stats
            info = {
                "forward_steps": res.forward_steps,
                "schedule_forward_count": res.schedule_stats.forward_count,
                "adjoint_steps": res.schedule_stats.adjoint_count,
                "forward_seconds": res.forward_seconds,
                "adjoint_seconds": res.adjoint_seconds,
                "stall_seconds_executor": res.stall_seconds,
                "stall_seconds_store": st.stall_seconds,
                "flush_seconds": st.flush_seconds,
                "capture_seconds": st.capture_seconds,
                "io_seconds": st.io_seconds,
                "hidden_io_fraction": st.hidden_fraction,
                "run_adjoint_wall_seconds": res.wall_seconds,
                "writes": res.schedule_stats.writes,
                "reads": res.schedule_stats.reads,
                "prefetch_hits": st.prefetch_hits,
                "prefetch_late": st.prefetch_late,
                "prefetch_misses": st.prefetch_misses,
                "staged_hits": st.staged_hits,
                "peak_staging_bytes": st.peak_staging_bytes,
                "peak_cache_bytes": st.peak_cache_bytes,
            }
            run.schedule = schedule
            return problem.gradient, info

        return run

    starved = plans["starved"]
    m2, d2 = starved.memory_slots, starved.disk_slots
    methods = {
        f"pyrevolve (c={c})": ("1", "peer", pyrev(c, True)),
        f"pyrevolve untaped (c={c})": ("1", "peer*", pyrev(c, False)),
        f"vlcc Revolve (c={c})": ("1", "ours", vlcc(lambda: Revolve(n, c))),
        f"pyrevolve (c={c_mem})": ("2", "peer", pyrev(c_mem, True)),
        f"pyrevolve untaped (c={c_mem})": ("2", "peer*", pyrev(c_mem, False)),
        f"vlcc plan {type(starved.schedule).__name__} ({m2} mem + 3 buf + {d2} disk)": (
            "2",
            "ours",
            vlcc(lambda: starved.schedule, store_for("starved")),
        ),
    }
    if not args.no_store_all:
        frac = plans["fraction"]
        methods["store-all (list)"] = (
            "3",
            "peer*",
            lambda: (problem.reference_gradient(), {"forward_steps": n}),
        )
        methods[
            f"vlcc {100 * args.fraction:.0f}% memory plan "
            f"{type(frac.schedule).__name__} ({frac.memory_slots} mem + "
            f"{frac.disk_slots} disk)"
        ] = ("3", "ours", vlcc(lambda: frac.schedule, store_for("fraction")))
    # run_adjoint(StoreAll(n)) with an unbounded memory tier: two fields a
    # state, so twice store-all's list.  In every round when that is small
    # (--quick), else once in the warm-up round, or not at all.
    exec_mode = args.store_all_executor
    if exec_mode == "auto":
        exec_mode = "rounds" if 2 * store_all_bytes <= 2 * 2**30 else "off"
    if args.no_store_all:
        exec_mode = "off"
    storeall_exec = None
    if exec_mode != "off":
        if _mem_available() > 1.6 * 2 * store_all_bytes:
            storeall_exec = "store-all (executor)"
            methods[storeall_exec] = ("3", "alt", vlcc(lambda: StoreAll(n)))
        else:
            print(
                f"(skipping store-all (executor): {2 * store_all_bytes / 2**30:.1f} GiB "
                f"needed, {_mem_available() / 2**30:.1f} GiB available)"
            )
    names = [k for k in methods if k != storeall_exec or exec_mode == "rounds"]
    peer_of = {
        case: next(k for k, v in methods.items() if v[0] == case and v[1] == "peer*")
        for case in {v[0] for v in methods.values()}
    }

    # ----------------------------------------------------------- warm-up
    print("\nround 0 (warm-up, tracemalloc + RSS sampling on; not in the medians)", flush=True)
    memory, warmup, reference = {}, {}, None
    warm_names = list(methods)
    for name in warm_names:
        if (
            methods[name][0] == "3"
            and _mem_available() < 1.3 * store_all_bytes
            and "store-all" in name
        ):
            print(f"  {name}: skipped, memory too tight")
            continue
        gc.collect()
        tracemalloc.start()
        load = os.getloadavg()
        with _RssSampler() as rss:
            t0 = time.perf_counter()
            g, info = methods[name][2]()
            wall = time.perf_counter() - t0
        peak_traced = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        g = np.array(g)
        if reference is None and name == "store-all (list)":
            reference = g
        memory[name] = {"peak_traced_bytes": peak_traced, "peak_rss_delta_bytes": rss.delta}
        warmup[name] = {"seconds": wall, "loadavg": load, "info": info, "gradient": g}
        print(
            f"  {name}: {wall:.2f} s, peak traced {peak_traced / _MiB:.0f} MiB, "
            f"peak RSS +{rss.delta / _MiB:.0f} MiB (load {load[0]:.2f})",
            flush=True,
        )
        del g, info
        gc.collect()
    if reference is None:
        reference = warmup[names[1]]["gradient"]
    ref_scale = float(np.max(np.abs(reference)))
    for w in warmup.values():
        w["rel_diff"] = float(np.max(np.abs(w["gradient"] - reference)) / ref_scale)
        w["bitwise_equal"] = bool(np.array_equal(w["gradient"], reference))
        del w["gradient"]
    if storeall_exec and storeall_exec not in names:
        methods.pop(storeall_exec)
    else:
        storeall_exec = None  # in the rounds: reported like the others

    # ----------------------------------------------------------- rounds
    rounds, unit_costs = [], []
    calib_steps = max(20, int(2e7 // (size * size)))  # ~30 ms of forward steps
    cases = sorted({methods[k][0] for k in names})
    for r in range(1, repeats + 1):
        # A case's methods run back to back (the pairs compared are minutes
        # apart at most, whatever the load does meanwhile); the order of the
        # cases and the order within each case rotate every round.
        case_order = cases[r % len(cases) :] + cases[: r % len(cases)]
        order = []
        for case in case_order:
            group = [k for k in names if methods[k][0] == case]
            order += group[r % len(group) :] + group[: r % len(group)]
        this, round_costs = {}, []
        for name in order:
            ours = methods[name][1] == "ours"
            if ours:  # unit costs measured right before and right after the run
                before = _unit_costs(problem, reps=1, steps=calib_steps)
            gc.collect()
            load = os.getloadavg()
            t0, c0 = time.perf_counter(), time.process_time()
            g, info = methods[name][2]()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            rec = {
                "seconds": wall,
                "cpu_seconds": cpu,
                "loadavg": load,
                "info": info,
                "rel_diff": float(np.max(np.abs(g - reference)) / ref_scale),
                "bitwise_equal": bool(np.array_equal(g, reference)),
            }
            del g
            if ours:
                after = _unit_costs(problem, reps=1, steps=calib_steps)
                costs = {k: 0.5 * (before[k] + after[k]) for k in before}
                round_costs.append(costs)
                schedule = methods[name][2].schedule
                budget = plans["fraction"] if methods[name][0] == "3" else starved
                rec["unit_costs"] = {"before": before, "after": after}
                rec["prediction"] = _predict(schedule, costs, budget)
                # The same model with the run's own step times: what is left
                # is the model's error on everything but the solver.
                own = {
                    "forward_step_s": info["forward_seconds"] / info["forward_steps"],
                    "adjoint_step_s": info["adjoint_seconds"] / info["adjoint_steps"],
                }
                rec["prediction_own_steps"] = _predict(schedule, own, budget)
            this[name] = rec
        costs = {k: statistics.median(c[k] for c in round_costs) for k in round_costs[0]}
        unit_costs.append(costs)
        rounds.append({"unit_costs": costs, "runs": this})
        print(
            f"round {r}: t_f {1e3 * costs['forward_step_s']:.3f} ms, "
            f"t_a {1e3 * costs['adjoint_step_s']:.3f} ms; "
            + ", ".join(f"{k} {v['seconds']:.2f} s" for k, v in this.items()),
            flush=True,
        )
    tmp.cleanup()

    # ----------------------------------------------------------- summary
    rows = {}
    for name in names:
        case, kind = methods[name][0], methods[name][1]
        secs = [rd["runs"][name]["seconds"] for rd in rounds]
        cpus = [rd["runs"][name]["cpu_seconds"] for rd in rounds]
        peer = peer_of[case]
        row = {
            "case": case,
            "kind": kind,
            "seconds": secs,
            "median_s": statistics.median(secs),
            "min_s": min(secs),
            "max_s": max(secs),
            "cpu_seconds": cpus,
            "median_cpu_s": statistics.median(cpus),
            "loadavg": [rd["runs"][name]["loadavg"] for rd in rounds],
            "peer": peer,
            "ratio_to_peer_paired": statistics.median(
                rd["runs"][name]["seconds"] / rd["runs"][peer]["seconds"] for rd in rounds
            ),
            "ratio_to_peer_min_max": [
                min(rd["runs"][name]["seconds"] / rd["runs"][peer]["seconds"] for rd in rounds),
                max(rd["runs"][name]["seconds"] / rd["runs"][peer]["seconds"] for rd in rounds),
            ],
            "cpu_ratio_to_peer_paired": statistics.median(
                rd["runs"][name]["cpu_seconds"] / rd["runs"][peer]["cpu_seconds"] for rd in rounds
            ),
            "ratio_of_medians": statistics.median(secs)
            / statistics.median([rd["runs"][peer]["seconds"] for rd in rounds]),
            # the least disturbed run of each: robust to additive noise from other jobs
            "ratio_of_mins": min(secs) / min(rd["runs"][peer]["seconds"] for rd in rounds),
            "rel_diff": max(rd["runs"][name]["rel_diff"] for rd in rounds),
            "bitwise_equal": all(rd["runs"][name]["bitwise_equal"] for rd in rounds),
            "info": rounds[-1]["runs"][name]["info"],
            "memory": memory.get(name),
        }
        infos = [rd["runs"][name]["info"] for rd in rounds]
        if kind == "ours":
            row["split"] = _split(
                [
                    (
                        rd["runs"][name]["seconds"],
                        i["forward_seconds"],
                        i["adjoint_seconds"],
                        i["stall_seconds_executor"],
                        sum(i["writes"]) + sum(i["reads"]),
                    )
                    for rd, i in zip(rounds, infos)
                ]
            )
        elif "store_seconds" in infos[0]:
            row["split"] = _split(
                [
                    (
                        rd["runs"][name]["seconds"],
                        i["forward_seconds"],
                        i["reverse_seconds"],
                        i["store_seconds"],
                        i["store_ops"],
                    )
                    for rd, i in zip(rounds, infos)
                ]
            )
        if kind == "ours":
            preds = [rd["runs"][name]["prediction"] for rd in rounds]
            infos = [rd["runs"][name]["info"] for rd in rounds]
            ratios = [
                rd["runs"][name]["seconds"] / rd["runs"][name]["prediction"]["predicted_s"]
                for rd in rounds
            ]
            own = [
                rd["runs"][name]["seconds"]
                / rd["runs"][name]["prediction_own_steps"]["predicted_s"]
                for rd in rounds
            ]
            owns = [rd["runs"][name]["prediction_own_steps"] for rd in rounds]
            row["prediction"] = {
                "median_measured_over_predicted_own_steps": statistics.median(own),
                "measured_over_predicted_own_steps": own,
                "median_predicted_own_steps_s": statistics.median(p["predicted_s"] for p in owns),
                "io_predicted_s": statistics.median(p["io_s"] for p in owns),
                "measured_over_predicted": ratios,
                "median_measured_over_predicted": statistics.median(ratios),
                "median_predicted_s": statistics.median(p["predicted_s"] for p in preds),
                "median_as_planned_s": statistics.median(p["as_planned_s"] for p in preds),
                "terms_predicted_s": {
                    k: statistics.median(p[k] for p in preds)
                    for k in ("forward_s", "adjoint_s", "io_s")
                },
                "terms_predicted_own_steps_s": {
                    k: statistics.median(p[k] for p in owns)
                    for k in ("forward_s", "adjoint_s", "io_s")
                },
                "terms_measured_s": {
                    "forward_s": statistics.median(i["forward_seconds"] for i in infos),
                    "adjoint_s": statistics.median(i["adjoint_seconds"] for i in infos),
                    "store_calls_s": statistics.median(i["stall_seconds_executor"] for i in infos),
                    "executor_other_s": statistics.median(
                        rd["runs"][name]["seconds"]
                        - i["forward_seconds"]
                        - i["adjoint_seconds"]
                        - i["stall_seconds_executor"]
                        for rd, i in zip(rounds, infos)
                    ),
                },
                "last": preds[-1],
            }
            row["stall_share_executor"] = statistics.median(
                i["stall_seconds_executor"] / rd["runs"][name]["seconds"]
                for rd, i in zip(rounds, infos)
            )
            row["stall_share_store"] = statistics.median(
                i["stall_seconds_store"] / rd["runs"][name]["seconds"]
                for rd, i in zip(rounds, infos)
            )
        rows[name] = row

    # forward counts against Griewank's optimum
    checks = {}
    for case, snaps in (("1", c), ("2", c_mem)):
        opt = binomial_forward_count(n, snaps)
        for name in names:
            if methods[name][0] != case:
                continue
            info = rows[name]["info"]
            if methods[name][1] == "ours" and case == "1":
                checks[name] = {
                    "t(n,c)": opt,
                    "schedule_forward_count": info["schedule_forward_count"],
                    "forward_steps": info["forward_steps"],
                    "equal": info["schedule_forward_count"] == opt,
                }
            elif methods[name][1] != "ours":
                checks[name] = {
                    "t(n,c)": opt,
                    "advances": info["advances"],
                    "taped": info["taped"],
                    "forward_steps": info["forward_steps"],
                    "equal": info["advances"] == opt + 1,
                }

    _print_tables(rows, names, checks, memory, warmup, n, c, c_mem, storeall_exec)

    targets = _targets(rows, names, memory, args.fraction, peer_of)
    print("\ntargets:")
    for k, v in targets.items():
        print(f"  {'MET   ' if v['met'] else 'MISSED'} {k}: {v['detail']}")

    result = {
        "benchmark": "bench_seismic",
        "command": "python benchmarks/bench_seismic.py" + (" --quick" if args.quick else ""),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "problem": {
            "grid": [size, size],
            "steps": n,
            "repr": repr(problem),
            "state_bytes": state_bytes,
            "store_all_bytes": store_all_bytes,
            "snapshots": c,
            "mem_snapshots": c_mem,
            "disk_snapshots_offered": args.disk_snapshots,
            "fraction": args.fraction,
            "fraction_disk_snapshots_offered": args.fraction_disk_snapshots,
        },
        "plans": {
            k: {
                "schedule": repr(p.schedule),
                "memory_slots": p.memory_slots,
                "disk_slots": p.disk_slots,
                "memory_bytes": p.memory_bytes,
                "disk_bytes": p.disk_bytes,
                "step_seconds": p.step_seconds,
                "write_seconds": p.write_seconds,
                "read_seconds": p.read_seconds,
                "copy_seconds": p.copy_seconds,
                "predicted_seconds": p.predicted_seconds,
                "candidates": p.candidates,
                "explain": p.explain,
                "plan_seconds": plan_seconds[k],
            }
            for k, p in plans.items()
        },
        "repeats": repeats,
        "quick": args.quick,
        "methods": rows,
        "forward_count_checks": checks,
        "targets": targets,
        "warmup": warmup,
        "memory": memory,
        "unit_costs": unit_costs,
        "rounds": [
            {
                "unit_costs": rd["unit_costs"],
                "runs": {k: {kk: vv for kk, vv in v.items()} for k, v in rd["runs"].items()},
            }
            for rd in rounds
        ],
        "machine": {**_machine(), "loadavg_start": load_start},
        "versions": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "numba": numba.__version__,
            "pyrevolve": pyrevolve.__version__,
            "vlcc_adjoint": vlcc_adjoint.__version__,
            "git": _git(),
        },
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_seismic.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=_jsonable)
    print(f"wrote {path}")
    try:
        _plot(rows, names, result["problem"], os.path.join(args.out, "bench_seismic.png"))
    except ImportError:
        pass
    return result


def _split(samples) -> dict:
    """Medians of (wall, forward, reverse, store, store ops) over rounds."""
    wall, fwd, rev, store, ops = zip(*samples)
    other = [w - f - r - st for w, f, r, st in zip(wall, fwd, rev, store)]
    return {
        "forward_s": statistics.median(fwd),
        "reverse_s": statistics.median(rev),
        "store_s": statistics.median(store),
        "other_s": statistics.median(other),
        "store_ops": int(statistics.median(ops)),
    }


def _jsonable(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def _machine() -> dict:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), ""
            )
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            total = int(f.readline().split()[1]) * 1024
    except OSError:
        total = None
    return {
        "platform": platform.platform(),
        "cpu": model,
        "cpus": os.cpu_count(),
        "memory_bytes": total,
        "loadavg_end": os.getloadavg(),
    }


def _git() -> dict:
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "vlcc_adjoint"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.split("\n")
        diff = subprocess.run(
            ["git", "-C", str(ROOT), "diff", "HEAD", "--", "vlcc_adjoint"],
            capture_output=True,
            timeout=10,
        ).stdout
        return {
            "head": head,
            "library_changes_uncommitted": [d for d in dirty if d],
            "library_diff_sha1": hashlib.sha1(diff).hexdigest(),
        }
    except (OSError, subprocess.SubprocessError):
        return {}


def _print_tables(rows, names, checks, memory, warmup, n, c, c_mem, storeall_exec):
    print(
        f"\n{'case':4s} {'method':58s} {'median s':>8s} {'min':>6s} {'max':>6s} "
        f"{'ratio':>6s} {'r(min)':>6s} {'cpu s':>6s} {'ratio':>6s} {'fwd steps':>9s} "
        f"{'peak MiB':>8s} {'rel diff':>8s}"
    )
    for name in names:
        row = rows[name]
        mem = memory.get(name)
        peak = f"{mem['peak_traced_bytes'] / _MiB:8.0f}" if mem else f"{'-':>8s}"
        print(
            f"{row['case']:4s} {name:58s} {row['median_s']:8.2f} {row['min_s']:6.2f} "
            f"{row['max_s']:6.2f} {row['ratio_to_peer_paired']:6.3f} "
            f"{row['ratio_of_mins']:6.3f} {row['median_cpu_s']:6.2f} "
            f"{row['cpu_ratio_to_peer_paired']:6.3f} "
            f"{row['info']['forward_steps']:9d} {peak} {row['rel_diff']:8.1e}"
        )
    if storeall_exec and storeall_exec in warmup:
        w = warmup[storeall_exec]
        ws = warmup.get("store-all (list)")
        print(
            f"3    {storeall_exec + ' [warm-up only]':58s} {w['seconds']:8.2f} "
            f"{'':6s} {'':6s} {w['seconds'] / ws['seconds'] if ws else float('nan'):6.3f} "
            f"{'':6s} {'':6s} {'':6s} {w['info']['forward_steps']:9d} "
            f"{memory[storeall_exec]['peak_traced_bytes'] / _MiB:8.0f} {w['rel_diff']:8.1e}"
        )
    print(
        "ratio: median over rounds of (wall or CPU) time / that of the case's peer in the "
        "same round (cases 1-2: pyrevolve untaped; 3: store-all (list)); r(min): fastest "
        "run / the peer's fastest run; CPU: process time, "
        "all threads; peak: traced, warm-up round; [warm-up only]: both under tracemalloc"
    )

    print(f"\nforward steps against t(n, c) (n = {n}):")
    for name, ck in checks.items():
        extra = (
            f"advances {ck['advances']} (= t + 1: {ck['equal']}), taped {ck['taped']}"
            if "advances" in ck
            else f"schedule {ck['schedule_forward_count']} (= t: {ck['equal']}), "
            f"evaluated {ck['forward_steps']} (+1: u_n)"
        )
        print(f"  {name:40s} t(n,c) = {ck['t(n,c)']}: {extra}")

    print(
        f"\n{'time split (medians)':58s} {'wall s':>7s} {'fwd s':>6s} {'rev s':>6s} "
        f"{'store s':>7s} {'other':>6s} {'ops':>6s} {'us/op':>7s}"
    )
    for name in names:
        sp = rows[name].get("split")
        if not sp:
            continue
        print(
            f"{name:58s} {rows[name]['median_s']:7.2f} {sp['forward_s']:6.2f} "
            f"{sp['reverse_s']:6.2f} {sp['store_s']:7.2f} {sp['other_s']:6.2f} "
            f"{sp['store_ops']:6d} {1e6 * sp['store_s'] / max(sp['store_ops'], 1):7.0f}"
        )
    print(
        "fwd: forward advances; rev: adjoint steps (pyrevolve taped: with their forward "
        "step); store: time in the checkpoint store's calls (ours: run_adjoint's store "
        "calls, copies included; pyrevolve: takeshot + restore); ops: states saved + "
        "loaded; us/op: store time per state saved or loaded"
    )

    print(
        f"\n{'ours':58s} {'meas s':>7s} {'pred*':>6s} {'m/p*':>6s} {'store m/p':>11s} "
        f"{'other':>6s} {'pred s':>6s} {'m/p':>6s} {'fwd m/p':>9s} {'adj m/p':>9s} "
        f"{'planned':>7s} {'stall ex':>8s} {'stall st':>8s}"
    )
    for name in names:
        row = rows[name]
        if row["kind"] != "ours":
            continue
        p = row["prediction"]
        tm, tp = p["terms_measured_s"], p["terms_predicted_s"]
        print(
            f"{name:58s} {row['median_s']:7.2f} {p['median_predicted_own_steps_s']:6.2f} "
            f"{p['median_measured_over_predicted_own_steps']:6.3f} "
            f"{tm['store_calls_s']:5.2f}/{p['io_predicted_s']:5.2f} "
            f"{tm['executor_other_s']:6.2f} {p['median_predicted_s']:6.2f} "
            f"{p['median_measured_over_predicted']:6.3f} "
            f"{tm['forward_s']:4.2f}/{tp['forward_s']:4.2f} "
            f"{tm['adjoint_s']:4.2f}/{tp['adjoint_s']:4.2f} "
            f"{p['median_as_planned_s']:7.2f} "
            f"{100 * row['stall_share_executor']:7.1f}% {100 * row['stall_share_store']:7.1f}%"
        )
    print(
        "pred*, m/p*: simulate with the run's own mean forward / adjoint step times and "
        "plan's copy / disk costs, measured / predicted; store: time in store calls vs the "
        "model's I/O term; other: wall minus solver and store calls (not in the model); "
        "pred s, m/p: the same with t_f, t_a timed over a block of steps around the run "
        "(steps ~100-500 of this problem run 2-4x slower: denormals in the wavefront's "
        "decaying precursor, so a block is not a representative step); planned: "
        "simulate(schedule) with its own costs x t_f; stall ex/st: "
        "AdjointResult.stall_seconds / StoreStats.stall_seconds as a share of the wall time"
    )


def _targets(rows, names, memory, fraction, peer_of) -> dict:
    out = {}
    ours = {row["case"]: (name, row) for name, row in rows.items() if row["kind"] == "ours"}
    if "1" in ours:
        name, row = ours["1"]
        taped = next(k for k in names if rows[k]["case"] == "1" and rows[k]["kind"] == "peer")
        r_taped = statistics.median(a / b for a, b in zip(row["seconds"], rows[taped]["seconds"]))
        r = row["ratio_to_peer_paired"]
        out["1: vlcc Revolve no slower than pyrevolve, same c"] = {
            "met": r <= 1.0,
            "detail": f"{r:.3f}x pyrevolve untaped, {r_taped:.3f}x pyrevolve as shipped "
            f"(paired medians; <= 1 wanted); fastest runs {row['ratio_of_mins']:.3f}x, "
            f"CPU {row['cpu_ratio_to_peer_paired']:.3f}x pyrevolve untaped",
        }
    if "2" in ours:
        name, row = ours["2"]
        r = row["ratio_to_peer_paired"]
        out["2: memory + disk strictly better than pyrevolve with c_mem"] = {
            "met": r < 1.0,
            "detail": f"{r:.3f}x pyrevolve untaped (c_mem) (< 1 wanted); "
            "per-round range "
            f"{row['ratio_to_peer_min_max'][0]:.3f}-"
            f"{row['ratio_to_peer_min_max'][1]:.3f}; fastest runs "
            f"{row['ratio_of_mins']:.3f}x, CPU "
            f"{row['cpu_ratio_to_peer_paired']:.3f}x",
        }
    if "3" in ours:
        name, row = ours["3"]
        r = row["ratio_to_peer_paired"]
        out["3a: within 1.2x of store-all"] = {
            "met": r <= 1.2,
            "detail": f"{r:.3f}x store-all (list); fastest runs "
            f"{row['ratio_of_mins']:.3f}x, CPU "
            f"{row['cpu_ratio_to_peer_paired']:.3f}x",
        }
        base = memory.get(peer_of["3"])
        mine = memory.get(name)
        if base and mine:
            m = mine["peak_traced_bytes"] / base["peak_traced_bytes"]
            m_rss = mine["peak_rss_delta_bytes"] / max(base["peak_rss_delta_bytes"], 1)
            out["3b: at most 10% of store-all's memory"] = {
                "met": m <= fraction,
                "detail": f"peak traced {100 * m:.1f}%, peak RSS growth {100 * m_rss:.1f}%",
            }
        out["3c: stall under 10% of total"] = {
            "met": row["stall_share_store"] < 0.1 and row["stall_share_executor"] < 0.1,
            "detail": f"executor (store calls, copies included) "
            f"{100 * row['stall_share_executor']:.1f}%, store (blocked waiting) "
            f"{100 * row['stall_share_store']:.1f}%",
        }
    for case, (name, row) in sorted(ours.items()):
        q = row["prediction"]["median_measured_over_predicted"]
        q2 = row["prediction"]["median_measured_over_predicted_own_steps"]
        out[f"4: predicted within 20%, case {case}"] = {
            "met": abs(q2 - 1) <= 0.2,
            "detail": f"measured / predicted {q2:.3f} with the run's own mean step times; "
            f"{q:.3f} with step times from a block timed around the run, whose "
            f"errors partly cancel ({name})",
        }
    return out


def _plot(rows, names, problem, path):
    """Left: seconds per gradient by case, peers next to ours (median bar,
    every round as a dot, min-max whisker).  Right: our measured time split
    into its parts against the model's terms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"peer": "#999999", "peer*": "#555555", "ours": "#1f77b4", "alt": "#bbbbbb"}
    fig, (ax, bx) = plt.subplots(
        1, 2, figsize=(15, 0.5 * len(names) + 2.6), gridspec_kw={"width_ratios": [3, 2]}
    )
    y = np.arange(len(names))
    med = [rows[k]["median_s"] for k in names]
    err = [
        [rows[k]["median_s"] - rows[k]["min_s"] for k in names],
        [rows[k]["max_s"] - rows[k]["median_s"] for k in names],
    ]
    ax.barh(y, med, 0.6, xerr=err, color=[colors[rows[k]["kind"]] for k in names], capsize=3)
    ax.plot(
        [rows[k]["median_cpu_s"] for k in names],
        y,
        ls="none",
        marker="o",
        mfc="white",
        mec="black",
        ms=5,
        label="CPU seconds (median, all threads)",
    )
    for i, k in enumerate(names):
        ax.plot(rows[k]["seconds"], [i] * len(rows[k]["seconds"]), "k.", ms=3)
        ax.text(
            rows[k]["max_s"],
            i,
            f"  {rows[k]['ratio_to_peer_paired']:.2f}x",
            va="center",
            fontsize=7,
        )
    ax.set_yticks(y, [f"[{rows[k]['case']}] {k}" for k in names], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per gradient (ratio: to the case's peer, paired)")
    grid = "x".join(map(str, problem["grid"]))
    ax.set_title(
        f"seismic FWI gradient, {grid}, {problem['steps']} steps "
        "(bar: median wall, whisker: min-max, dots: rounds)",
        fontsize=9,
    )
    ax.legend(fontsize=7, loc="lower right")

    ours = [k for k in names if rows[k]["kind"] == "ours"]
    yy = np.arange(len(ours))
    parts = [
        ("forward_s", "forward", "#1f77b4"),
        ("adjoint_s", "adjoint", "#ff7f0e"),
        ("store_calls_s", "store calls / I/O", "#2ca02c"),
        ("executor_other_s", "executor other", "#d62728"),
    ]
    left = np.zeros(len(ours))
    for key, label, col in parts:
        vals = np.array([rows[k]["prediction"]["terms_measured_s"][key] for k in ours])
        bx.barh(yy - 0.2, vals, 0.38, left=left, color=col, label=label)
        left += vals
    left = np.zeros(len(ours))
    for key, col in (("forward_s", "#1f77b4"), ("adjoint_s", "#ff7f0e"), ("io_s", "#2ca02c")):
        vals = np.array([rows[k]["prediction"]["terms_predicted_own_steps_s"][key] for k in ours])
        bx.barh(yy + 0.2, vals, 0.38, left=left, color=col, alpha=0.45, hatch="//")
        left += vals
    bx.set_yticks(
        yy,
        [f"[{rows[k]['case']}] {k.split(' (')[0]}\nmeasured / predicted (hatched)" for k in ours],
        fontsize=7,
    )
    bx.invert_yaxis()
    bx.set_xlabel("seconds (medians)")
    bx.legend(fontsize=7, loc="lower right")
    bx.set_title("ours: measured parts vs simulate() terms (run's own step times)", fontsize=10)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
