"""Benchmark: a Devito FWI gradient checkpointed by vlcc against Devito + pyrevolve.

Reproduce::

    . .venv/bin/activate
    pip install devito            # the lead's `devito` extra; pyrevolve: `bench` extra
    python benchmarks/bench_devito.py --quick       # 151x151, 600 samples: ~1 min
    python benchmarks/bench_devito.py               # 301x301, 1500 samples: ~5 min

Writes ``DIR/bench_devito.json`` (``DIR`` defaults to ``$TMPDIR/vlcc-bench-results/``)
with every repeat, the medians, the paired ratios and the machine, and
``DIR/bench_devito.png`` (wall and CPU seconds per method), and prints a
table.

The problem is ``examples/devito_fwi.py`` (2-D acoustic, 2nd order in time,
4th in space, damped border, Ricker source, a line of receivers) at a bigger
size.  Every method computes the same gradient with the same compiled
operators (buffered ``u``: 3 time levels) and the same number of snapshots
``c`` (pyrevolve's default for ``n`` steps unless ``--snapshots``):

* ``pyrevolve``: ``devito.Revolver`` (pyrevolve's CRevolve, NumpyStorage);
* ``vlcc``: ``vlcc_adjoint.devito.Revolver``, the drop-in (Revolve, memory
  store); it reads the gradient operator's code, sees that it reads only
  ``u[t]`` and so skips pyrevolve's forward step before each reverse step;
* ``vlcc recompute``: the same with ``recompute=True``, i.e. pyrevolve's
  sequence of operator calls: the difference to ``pyrevolve`` is the
  executor and the store, not the schedule;
* ``pyrevolve, m snapshots``: half the memory;
* ``vlcc multistage``: ``DevitoSolver.run`` with ``Multistage`` over memory
  (``m = max(4, c // 2)`` slots, the same memory) and a zarr disk tier (``c`` slots,
  costs measured by a budget plan), prefetching ``TieredStore``;
* ``store-all``: Devito with ``u`` saved at every step (``save=nt``): no
  recomputation, ``nt`` wavefields in memory; the floor.

Each timed call is a whole gradient: building the Revolver (its schedule),
the forward sweep, the residual, the reverse sweep.  Methods run
interleaved in rotating order, repeat after repeat, after one untimed
warm-up round (numba planners, page faults), so the machine's drift (a
shared 2-core VM) hits all alike; the ``ratio`` columns are the median over
rounds of ``time / time(pyrevolve)`` in the same round (the JSON also has
the ratio of medians).  Wall time and process CPU time (all threads: the
store's workers count) are both recorded; on a machine shared with other
jobs the CPU time is the steadier of the two.  Operator iterations are counted in one untimed run
per method through counting wrappers.  ``DEVITO_LANGUAGE=C``: one thread per
operator, as every method alike.
"""

from __future__ import annotations

import os

os.environ.setdefault("DEVITO_LANGUAGE", "C")
os.environ.setdefault("DEVITO_ARCH", "gcc")
os.environ.setdefault("DEVITO_LOGGING", "WARNING")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _example():
    spec = importlib.util.spec_from_file_location("devito_fwi", ROOT / "examples" / "devito_fwi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Counting:
    """A pyrevolve-style operator that counts the time iterations it runs."""

    def __init__(self, inner):
        self.op = inner  # the adapters look through ``.op`` for the Devito code
        self.start_offset = inner.start_offset
        self.iterations = 0

    def apply(self, t_start, t_end):
        self.iterations += t_end - t_start
        self.op.apply(t_start=t_start, t_end=t_end)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="151x151, 600 samples, 2 repeats")
    parser.add_argument("--n", type=int, default=None, help="grid points per side")
    parser.add_argument("--nt", type=int, default=None, help="time samples (nt - 2 steps)")
    parser.add_argument(
        "--snapshots",
        type=int,
        default=None,
        help="snapshots for every method (default: pyrevolve's choice)",
    )
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--no-store-all",
        action="store_true",
        help="skip Devito's store-everything run (nt wavefields in memory)",
    )
    parser.add_argument(
        "--out", default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results")
    )
    args = parser.parse_args(argv)
    size = args.n or (151 if args.quick else 301)
    nt = args.nt or (600 if args.quick else 1500)
    repeats = args.repeats or (2 if args.quick else 3)

    import devito
    import pyrevolve
    from devito import CheckpointOperator, DevitoCheckpoint

    from vlcc_adjoint import Level, Multistage, Revolve, io_plan, plan
    from vlcc_adjoint.devito import Revolver as VlccRevolver
    from vlcc_adjoint.devito import default_snapshots
    from vlcc_adjoint.storage import MemoryTier, TieredStore, ZarrTier

    ex = _example()
    problem = ex.AcousticFWI(shape=(size, size), nbl=20, nt=nt)
    n = problem.steps
    c = args.snapshots or default_snapshots(n)
    compile_seconds = problem.compile(reference=not args.no_store_all)
    problem.observe()
    Revolve(8, 2)  # load the numba planners
    state_bytes = 2 * problem.u._data_allocated[0].nbytes
    print(
        f"Devito {devito.__version__}, pyrevolve {pyrevolve.__version__}: grid {size}x{size}, "
        f"{n} steps, {c} snapshots of {state_bytes / 2**20:.2f} MiB; "
        f"operators built in {compile_seconds:.1f} s"
    )

    fwd, u = problem.op("forward")
    grad_op, _ = problem.op("gradient")

    def wrappers(counting=False):
        problem._reset()
        fw = CheckpointOperator(fwd, u=u, src=problem.src, rec=problem.rec, dt=problem.dt)
        rv = CheckpointOperator(
            grad_op, u=u, v=problem.v, grad=problem.grad, residual=problem.residual, dt=problem.dt
        )
        return (_Counting(fw), _Counting(rv)) if counting else (fw, rv)

    def via_revolver(Revolver, counting=False, snapshots=c, **options):
        fw, rv = wrappers(counting)
        wrp = Revolver(DevitoCheckpoint([u]), fw, rv, snapshots, n, **options)
        wrp.apply_forward()
        problem._set_residual()
        wrp.apply_reverse()
        return np.array(problem.grad.data), (fw, rv)

    # Multistage: about half the snapshots in memory (a budget plan with a
    # disk level wants 4 at least), c on disk, costs measured.
    m = max(4, c // 2)
    t0 = time.perf_counter()
    problem.gradient_vlcc(Revolve(n, c))
    step_seconds = (time.perf_counter() - t0) / (3 * n)  # rough: ~3n operator iterations
    budget = plan(
        n, m * state_bytes, c * state_bytes, state_bytes=state_bytes, step_seconds=step_seconds
    )
    multistage = Multistage(
        n,
        [
            Level(m),
            Level(c, budget.write_seconds / step_seconds, budget.read_seconds / step_seconds),
        ],
    )
    tmp = tempfile.TemporaryDirectory(prefix="vlcc-bench-devito-")

    def via_multistage(counting=False):
        problem._reset()
        store = TieredStore(
            [MemoryTier(), ZarrTier(os.path.join(tmp.name, "s"))], plan=io_plan(multistage)
        )
        if not counting:
            return problem.gradient_vlcc(multistage, store)[0], None
        fw, rv = wrappers(True)
        from vlcc_adjoint.devito import DevitoSolver

        solver = DevitoSolver(fw, rv, [u])
        solver.run(n, multistage, store, before_reverse=problem._set_residual)
        return np.array(problem.grad.data), (fw, rv)

    methods = {
        "pyrevolve": lambda counting=False: via_revolver(devito.Revolver, counting),
        "vlcc": lambda counting=False: via_revolver(VlccRevolver, counting),
        "vlcc recompute": lambda counting=False: via_revolver(
            VlccRevolver, counting, recompute=True
        ),
        f"pyrevolve, {m} snapshots": lambda counting=False: via_revolver(
            devito.Revolver, counting, snapshots=m
        ),
        f"vlcc multistage ({m} mem + {c} disk)": via_multistage,
    }
    if not args.no_store_all:
        methods["store-all"] = lambda counting=False: (problem.gradient_store_all()[0], None)

    reference = None
    if not args.no_store_all:
        reference = methods["store-all"]()[0]
    names = list(methods)
    times = {name: [] for name in names}
    cpu = {name: [] for name in names}
    rounds, cpu_rounds = [], []
    for r in range(repeats + 1):  # round 0: warm-up, not kept
        order = names[r % len(names) :] + names[: r % len(names)]
        this, this_cpu = {}, {}
        for name in order:
            t0, c0 = time.perf_counter(), time.process_time()
            methods[name]()
            this[name] = time.perf_counter() - t0
            this_cpu[name] = time.process_time() - c0
        if r > 0:
            rounds.append(this)
            cpu_rounds.append(this_cpu)
            for name in names:
                times[name].append(this[name])
                cpu[name].append(this_cpu[name])
        print(
            f"round {r}{' (warm-up)' if r == 0 else ''}: "
            + ", ".join(f"{k} {v:.2f} s" for k, v in this.items()),
            flush=True,
        )

    # Untimed: agreement and operator iterations.
    rows = {}
    for name in names:
        grad, ops = methods[name](counting=True)
        if reference is None and name == "pyrevolve":
            reference = grad
        rel = float(np.max(np.abs(grad.astype(np.float64) - reference)) / np.max(np.abs(reference)))
        med = statistics.median(times[name])
        rows[name] = {
            "seconds": times[name],
            "median_s": med,
            "ratio_to_pyrevolve_paired": statistics.median(
                rd[name] / rd["pyrevolve"] for rd in rounds
            ),
            "ratio_of_medians": med / statistics.median(times["pyrevolve"]),
            "cpu_seconds": cpu[name],
            "median_cpu_s": statistics.median(cpu[name]),
            "cpu_ratio_to_pyrevolve_paired": statistics.median(
                rd[name] / rd["pyrevolve"] for rd in cpu_rounds
            ),
            "forward_iterations": ops[0].iterations if ops else n,
            "reverse_iterations": ops[1].iterations if ops else n,
            "rel_max_diff_to_reference": rel,
        }
    tmp.cleanup()

    print(
        f"\n{'method':36s} {'wall s':>7s} {'ratio':>6s} {'cpu s':>7s} {'ratio':>6s} "
        f"{'fwd iters':>9s} {'rev iters':>9s} {'rel diff':>8s}"
    )
    for name in names:
        row = rows[name]
        print(
            f"{name:36s} {row['median_s']:7.2f} {row['ratio_to_pyrevolve_paired']:6.3f} "
            f"{row['median_cpu_s']:7.2f} {row['cpu_ratio_to_pyrevolve_paired']:6.3f} "
            f"{row['forward_iterations']:9d} {row['reverse_iterations']:9d} "
            f"{row['rel_max_diff_to_reference']:8.1e}"
        )
    print(
        f"(reference: {'Devito store-all' if not args.no_store_all else 'pyrevolve'}; "
        "ratio: paired median of time / pyrevolve's)"
    )

    result = {
        "benchmark": "bench_devito",
        "problem": {
            "grid": [size, size],
            "nt": nt,
            "steps": n,
            "snapshots": c,
            "state_bytes": state_bytes,
            "space_order": problem.space_order,
            "multistage": {
                "memory_slots": m,
                "disk_slots": c,
                "write_seconds": budget.write_seconds,
                "read_seconds": budget.read_seconds,
            },
        },
        "reference": "store-all" if not args.no_store_all else "pyrevolve",
        "repeats": repeats,
        "quick": args.quick,
        "methods": rows,
        "rounds": rounds,
        "cpu_rounds": cpu_rounds,
        "compile_seconds": compile_seconds,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "devito": devito.__version__,
            "pyrevolve": pyrevolve.__version__,
            "numpy": np.__version__,
            "DEVITO_LANGUAGE": os.environ.get("DEVITO_LANGUAGE"),
            "DEVITO_ARCH": os.environ.get("DEVITO_ARCH"),
            "loadavg": os.getloadavg(),
        },
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_devito.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}")
    try:
        _plot(rows, result["problem"], os.path.join(args.out, "bench_devito.png"))
    except ImportError:
        pass
    return result


def _plot(rows, problem, path):
    """Median wall and CPU seconds per method, with every repeat as dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    y = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(names) + 1.4))
    ax.barh(y + 0.2, [rows[k]["median_s"] for k in names], 0.4, label="wall (median)")
    ax.barh(y - 0.2, [rows[k]["median_cpu_s"] for k in names], 0.4, label="CPU (median)")
    for i, k in enumerate(names):
        ax.plot(rows[k]["seconds"], [i + 0.2] * len(rows[k]["seconds"]), "k.", ms=3)
        ax.plot(rows[k]["cpu_seconds"], [i - 0.2] * len(rows[k]["cpu_seconds"]), "k.", ms=3)
    ax.set_yticks(y, [f"{k}\n{rows[k]['forward_iterations']} fwd iters" for k in names], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per gradient")
    grid = "x".join(map(str, problem["grid"]))
    ax.set_title(
        f"Devito FWI gradient, {grid}, {problem['steps']} steps, {problem['snapshots']} snapshots",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
