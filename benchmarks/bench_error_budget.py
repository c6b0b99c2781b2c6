"""Benchmark: lossy checkpoints under a gradient-error budget against fixed error bounds.

Reproduce (from the repository root)::

    . .venv/bin/activate
    python benchmarks/bench_error_budget.py --quick     # about 20 s
    python benchmarks/bench_error_budget.py             # about a minute
    python benchmarks/bench_error_budget.py --out DIR   # results elsewhere
    python benchmarks/bench_error_budget.py --update-results   # benchmarks/results/

Writes ``DIR/bench_error_budget.json`` (every run) and
``DIR/bench_error_budget.png`` (gradient error against compression ratio, one
panel per problem); ``DIR`` defaults to ``$TMPDIR/vlcc-bench-results/``.

Problems (``vlcc_adjoint._examples``), each under ``Revolve(n, c)`` with a
memory level ``CompressedMemoryTier(ErrorBounded(...))`` written
synchronously (every checkpoint is read back decoded):

* ``seismic``: 2-D acoustic FWI, the velocity gradient of a receiver misfit
  (``SeismicProblem``);
* ``burgers``: 1-D viscous Burgers, the gradient of a final-time misfit
  with respect to the initial condition (``BurgersProblem``).

For each problem:

* *fixed bounds*: ``ErrorBounded(eb)`` with an absolute ``eb`` from 1e-1
  to 1e-8 (both problems' states are of order one), as a user sets it
  today;
* *the controller*: ``run_adjoint(..., gradient_rtol=rtol)`` for ``rtol``
  in 1e-2 .. 1e-5: the bound it chose, its estimate, the runs it took;
* the lossless codec's ratio on the same checkpoints.

The referee of every error is the problem's store-everything gradient
(``reference_gradient``); the error is ``||g~ - g|| / ||g||``.

"Memory at equal accuracy": for each budget, the largest fixed bound that
meets it on *both* problems is the bound a user without the controller
could safely choose once for both; the controller's ratio on each problem
is compared with that bound's ratio there (checkpoint memory saved:
``1 - ratio_fixed / ratio_controller``), with the lossless codec's, and
with the best fixed bound for that problem alone, which only hindsight
(the exact gradient of every candidate) finds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE.parent))

from vlcc_adjoint import run_adjoint  # noqa: E402
from vlcc_adjoint._examples import BurgersProblem, SeismicProblem  # noqa: E402
from vlcc_adjoint.schedules import Revolve  # noqa: E402
from vlcc_adjoint.storage import CompressedMemoryTier, TieredStore  # noqa: E402
from vlcc_adjoint.storage.codecs import ErrorBounded, Lossless  # noqa: E402

FIXED = [1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8]
BUDGETS = [1e-2, 1e-3, 1e-4, 1e-5]


def _default_out() -> Path:
    return Path(os.environ.get("TMPDIR") or "/tmp") / "vlcc-bench-results"


def problems(quick: bool):
    """``{name: (problem, schedule, gradient reader, gradient_rtol kwargs)}``."""
    if quick:
        seismic, burgers = SeismicProblem(60, 60, 300), BurgersProblem(512)
    else:
        seismic, burgers = SeismicProblem(100, 100, 600), BurgersProblem(1024)
    return {
        "seismic": (
            seismic,
            Revolve(seismic.n_steps, max(4, seismic.n_steps // 20)),
            lambda r: seismic.gradient,
            dict(gradient=lambda: seismic.gradient),
        ),
        "burgers": (
            burgers,
            Revolve(burgers.n_steps, max(4, burgers.n_steps // 20)),
            lambda r: r.adjoint,
            {},
        ),
    }


def _run_fixed(p, schedule, read, codec):
    tier = CompressedMemoryTier(codec)
    if hasattr(p, "reset_gradient"):
        p.reset_gradient()
    t0 = time.perf_counter()
    result = run_adjoint(
        p, schedule, p.initial_state(), p.final_adjoint, store=TieredStore([tier], workers=0)
    )
    seconds = time.perf_counter() - t0
    raw, enc = tier.bytes_put
    return np.array(read(result), dtype=np.float64), raw / enc, seconds


def measure(name, p, schedule, read, budget_kwargs):
    exact = np.array(p.reference_gradient(), dtype=np.float64)
    norm = float(np.linalg.norm(exact))
    rows = []
    _, lossless_ratio, single = _run_fixed(p, schedule, read, Lossless())
    rows.append(
        dict(
            problem=name,
            kind="lossless",
            bound=0.0,
            error=0.0,
            ratio=lossless_ratio,
            seconds=single,
        )
    )
    for eb in FIXED:
        g, ratio, seconds = _run_fixed(p, schedule, read, ErrorBounded(eb))
        rows.append(
            dict(
                problem=name,
                kind="fixed",
                bound=eb,
                error=float(np.linalg.norm(g - exact)) / norm,
                ratio=ratio,
                seconds=seconds,
            )
        )
    for rtol in BUDGETS:
        t0 = time.perf_counter()
        result = run_adjoint(
            p, schedule, p.initial_state(), p.final_adjoint, gradient_rtol=rtol, **budget_kwargs
        )
        seconds = time.perf_counter() - t0
        g = np.array(read(result), dtype=np.float64)
        report = result.error_budget
        rows.append(
            dict(
                problem=name,
                kind="budget",
                rtol=rtol,
                bound=report.bound,
                error=float(np.linalg.norm(g - exact)) / norm,
                estimate=report.error_estimate,
                ratio=report.compression_ratio,
                sensitivity=report.sensitivity,
                runs=len(report.runs),
                run_bounds=[r.bound for r in report.runs],
                seconds=seconds,
                cost_in_runs=seconds / single,
            )
        )
    return rows


def summarise(rows):
    """Per budget: the safe fixed bound for both problems, and what the
    controller saves against it."""
    lines, table = [], []
    names = sorted({r["problem"] for r in rows})
    for rtol in BUDGETS:
        safe = [
            eb
            for eb in FIXED
            if all(r["error"] <= rtol for r in rows if r["kind"] == "fixed" and r["bound"] == eb)
        ]
        eb = max(safe) if safe else None
        for name in names:
            ctrl = next(
                r
                for r in rows
                if r["kind"] == "budget" and r["problem"] == name and r["rtol"] == rtol
            )
            fixed = next(
                (
                    r
                    for r in rows
                    if r["kind"] == "fixed" and r["problem"] == name and r["bound"] == eb
                ),
                None,
            )
            # the best fixed bound for this problem alone, known only in hindsight
            # (it needs the exact gradient of every candidate)
            oracle = max(
                (
                    r
                    for r in rows
                    if r["kind"] == "fixed" and r["problem"] == name and r["error"] <= rtol
                ),
                key=lambda r: r["ratio"],
                default=None,
            )
            lossless = next(r for r in rows if r["kind"] == "lossless" and r["problem"] == name)
            entry = dict(
                rtol=rtol,
                problem=name,
                safe_fixed_bound=eb,
                hindsight_bound=None if oracle is None else oracle["bound"],
                hindsight_ratio=None if oracle is None else oracle["ratio"],
                lossless_ratio=lossless["ratio"],
                memory_saved_vs_lossless=1.0 - lossless["ratio"] / ctrl["ratio"],
                fixed_ratio=None if fixed is None else fixed["ratio"],
                fixed_error=None if fixed is None else fixed["error"],
                budget_ratio=ctrl["ratio"],
                budget_error=ctrl["error"],
                budget_within=ctrl["error"] <= rtol,
                memory_saved=None if fixed is None else 1.0 - fixed["ratio"] / ctrl["ratio"],
            )
            table.append(entry)
            saved = (
                "n/a" if entry["memory_saved"] is None else f"{100 * entry['memory_saved']:.0f}%"
            )
            fixed_text = (
                "no fixed bound meets it"
                if fixed is None
                else f"fixed eb={eb:g}: ratio {fixed['ratio']:.1f}, error {fixed['error']:.2e}"
            )
            hindsight = (
                "none" if oracle is None else f"eb={oracle['bound']:g}: ratio {oracle['ratio']:.1f}"
            )
            lines.append(
                f"rtol {rtol:g} {name:8s} controller: ratio {ctrl['ratio']:.1f}, error "
                f"{ctrl['error']:.2e} (bound {ctrl['bound']:.2e}, {ctrl['runs']} runs, "
                f"{ctrl['cost_in_runs']:.1f}x one run); safe for both, {fixed_text}; "
                f"memory saved {saved}; best in hindsight {hindsight}; "
                f"vs lossless ({lossless['ratio']:.2f}): "
                f"{100 * entry['memory_saved_vs_lossless']:.0f}% saved"
            )
    return lines, table


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["seismic", "burgers"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, name in zip(axes, names):
        fixed = [r for r in rows if r["problem"] == name and r["kind"] == "fixed"]
        ax.loglog(
            [r["ratio"] for r in fixed],
            [max(r["error"], 1e-12) for r in fixed],
            "o-",
            color="0.5",
            label="fixed absolute bound",
        )
        for r in fixed:
            ax.annotate(
                f"{r['bound']:g}",
                (r["ratio"], max(r["error"], 1e-12)),
                fontsize=7,
                textcoords="offset points",
                xytext=(3, 3),
                color="0.4",
            )
        ctrl = [r for r in rows if r["problem"] == name and r["kind"] == "budget"]
        for i, r in enumerate(ctrl):
            color = f"C{i}"
            ax.axhline(r["rtol"], color=color, lw=0.8, ls="--")
            ax.loglog(
                [r["ratio"]],
                [max(r["error"], 1e-12)],
                "*",
                ms=13,
                color=color,
                label=f"gradient_rtol={r['rtol']:g}",
            )
        lossless = next(r for r in rows if r["problem"] == name and r["kind"] == "lossless")
        ax.axvline(lossless["ratio"], color="k", lw=0.8, ls=":", label="lossless codec")
        ax.set_xlabel("compression ratio of the checkpoints")
        ax.set_ylabel("gradient relative L2 error")
        ax.set_title(name)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Fixed error bounds vs the gradient-error budget (dashed: the budgets)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller problems")
    parser.add_argument(
        "--out",
        type=Path,
        default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results"),
        help="folder for the results",
    )
    parser.add_argument(
        "--update-results",
        action="store_true",
        help="write into benchmarks/results/, the results the paper quotes",
    )
    args = parser.parse_args(argv)
    explicit = args.out != Path(_default_out())
    if args.update_results and explicit:
        parser.error("--update-results writes benchmarks/results/; drop --out")
    if args.update_results:
        out = RESULTS
    else:
        out = args.out
        if out.resolve() == RESULTS.resolve() or RESULTS.resolve() in out.resolve().parents:
            parser.error(
                "--out is inside benchmarks/results/; pass --update-results to "
                "rewrite the tracked results"
            )
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    load_before = os.getloadavg()
    rows = []
    sizes = {}
    for name, (p, schedule, read, kwargs) in problems(args.quick).items():
        sizes[name] = dict(
            problem=repr(p), schedule=f"Revolve({schedule.n_steps}, {schedule.snapshots})"
        )
        rows.extend(measure(name, p, schedule, read, kwargs))
        print(f"{name}: done ({time.perf_counter() - t0:.0f} s)", flush=True)
    for r in rows:
        extra = (
            f" rtol {r['rtol']:g} est {r['estimate']:.2e} runs {r['runs']}"
            if r["kind"] == "budget"
            else ""
        )
        print(
            f"{r['problem']:8s} {r['kind']:8s} bound {r['bound']:9.2e} error {r['error']:9.2e} "
            f"ratio {r['ratio']:6.2f}{extra}"
        )
    lines, table = summarise(rows)
    print()
    for line in lines:
        print(line)
    meta = dict(
        quick=args.quick,
        sizes=sizes,
        fixed_bounds=FIXED,
        budgets=BUDGETS,
        load_before=load_before,
        load_after=os.getloadavg(),
        cpu_count=os.cpu_count(),
        platform=platform.platform(),
        python=platform.python_version(),
        numpy=np.__version__,
        seconds=time.perf_counter() - t0,
        summary=lines,
    )
    with open(out / "bench_error_budget.json", "w") as f:
        json.dump(dict(meta=meta, rows=rows, equal_accuracy=table), f, indent=1)
    plot(rows, out / "bench_error_budget.png")
    print(
        f"wrote {out / 'bench_error_budget.json'} and {out / 'bench_error_budget.png'} "
        f"in {meta['seconds']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
