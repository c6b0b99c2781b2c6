"""Run every benchmark of the project, one after the other, and index the results.

Reproduce::

    pip install -e ".[test,bench]"
    python benchmarks/run_all.py --quick        # every benchmark at its quick size
    python benchmarks/run_all.py --full         # the sizes the paper quotes (about an hour on two cores)
    python benchmarks/run_all.py --quick --only codecs tiers
    python benchmarks/run_all.py --quick --out DIR
    python benchmarks/run_all.py --full --update-results   # rewrite benchmarks/results/
    python benchmarks/run_all.py --full --out DIR --resume  # go on with a stopped run
    vlcc bench --quick                          # the same, from a source checkout

Where the results go: ``--out DIR``, by default ``$TMPDIR/vlcc-bench-results/``
(``/tmp/vlcc-bench-results/`` without ``TMPDIR``), outside the source tree,
so a run never changes a tracked file.  The results the paper and the README
quote live in ``benchmarks/results/``; only ``--update-results`` writes there
(and ``--out`` pointing into it without that flag is refused).

Each benchmark runs in a fresh Python process (``benchmarks/bench_<name>.py
--quick|(full) --out DIR``), compares our code with its peer tool side by
side in that one run, and writes ``DIR/bench_<name>.json`` (and a PNG where
it draws one).  This script adds ``DIR/run_all.json``: the machine, the
source commit (and whether the tree had changes), the versions of every
compared package, the load average before and after each benchmark, its
wall time, exit status and the files it wrote; it is rewritten after each
benchmark, so a stopped run leaves what it did, and ``--resume`` keeps the
clean runs of an earlier ``run_all.json`` of the same commit and size and
runs the rest (a full run takes about an hour on two cores).  Benchmarks run one at a time
because the machines are small and shared; a failing benchmark is reported
and the others still run.  Progress goes to stdout,
one line when a benchmark starts (``[i/N] bench_<name> ...``) and one when
it ends (its status, its wall time and the time since the run started).

The claims the README and the paper make about a result are records in
the results files (``"claims"``, see ``benchmarks/claims.py``); a run
copies them from ``benchmarks/results/`` into the files it rewrites, so
their values and verdicts follow the new measurements.

The benchmarks that write only JSON get their figure from
``benchmarks/figures.py`` right after they ran cleanly; the run's record in
``run_all.json`` says so under ``"figure"`` (``{"status": 0, "path": ...}``).
A figure that cannot be drawn is recorded there with its error
(``"status": "failed"``) and counts as a failed run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

import claims  # noqa: E402  (benchmarks/claims.py)
from figures import FIGURES, default_out, draw  # noqa: E402  (benchmarks/figures.py)

#: name -> extra arguments at (quick, full) size.  Order: foundations first.
BENCHMARKS = {
    "schedules": (["--quick"], ["--cap", "120"]),  # the peers at n = 10^4 take about a minute
    "multistage": (["--n", "1000", "10000", "--repeats", "1", "--only-new"], []),
    "codecs": (["--quick"], []),
    "tiers": (["--quick"], []),
    "store_calls": (["--quick"], []),
    "overlap": (["--quick"], []),
    "seismic": (["--quick"], []),
    "devito": (["--quick"], []),
    "jax": (["--quick"], []),
    "mpi": (["--quick"], []),
    "lineage": (["--quick"], []),
    "torch": (["--quick"], []),
    "error_budget": (["--quick"], []),
    "lineage_delta": (["--mb", "8"], []),
    "dcp": (["--quick"], ["--train-repeats", "5"]),
    "executor": (["--steps", "20000", "--rounds", "1"], ["--rounds", "3"]),
    "capi": (["--quick"], []),
    "mpi_lineage": (["--quick"], []),
    "training": (["--quick"], []),
    "jax_ooc": (
        ["--out-of-core", "--skip-scan", "--ooc-grid", "128", "--ooc-steps", "400"],
        ["--out-of-core", "--skip-scan"],
    ),
}

#: benchmarks run by another benchmark's script (with the arguments above)
SCRIPTS = {"jax_ooc": "bench_jax.py"}

PACKAGES = [
    "vlcc-adjoint",
    "numpy",
    "numba",
    "zarr",
    "blosc2",
    "xxhash",
    "networkx",
    "jax",
    "jaxlib",
    "equinox",
    "devito",
    "pyrevolve",
    "checkpoint-schedules",
    "zfpy",
    "pysz",
    "torch",
    "deepspeed",
    "mpi4py",
    "mpich",
    "icechunk",
]


def machine() -> dict:
    """Where the numbers were measured."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "source": source(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "packages": versions,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def source() -> dict:
    """The commit of the source tree, and whether it has changes (``git``)."""

    def git(*args):
        done = subprocess.run(["git", *args], cwd=HERE.parent, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "changed": None if status is None else bool(status)}


def resumable(out: Path, quick: bool, here: dict) -> dict:
    """The clean runs of an earlier ``run_all.json`` in `out` that a run of
    this source tree at this size may keep: name -> record.  Only a run of
    the same commit, without changes on either side, qualifies."""
    path = out / "run_all.json"
    if not path.is_file() or here["commit"] is None or here["changed"] is not False:
        return {}
    try:
        earlier = json.loads(path.read_text())
        if earlier["quick"] != quick or earlier["machine"]["source"] != here:
            return {}
        return {
            run["name"]: run
            for run in earlier["runs"]
            if run["status"] == 0 and run.get("figure", {}).get("status", 0) == 0
        }
    except (ValueError, KeyError, TypeError):
        return {}


def run_one(name: str, args: list[str], out: Path, timeout: float) -> dict:
    """Run ``bench_<name>.py`` in a fresh interpreter; what it did and wrote."""
    script = HERE / SCRIPTS.get(name, f"bench_{name}.py")
    before = {p.name: p.stat().st_mtime for p in out.glob("*") if p.is_file()}
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    env = dict(os.environ, NUMBA_THREADING_LAYER="workqueue")
    try:
        proc = subprocess.run(
            [sys.executable, str(script), *args, "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        status, tail = proc.returncode, (proc.stdout[-3000:] + proc.stderr[-2000:])
    except subprocess.TimeoutExpired as error:
        status, tail = "timeout", str(error)[-2000:]
    wall = time.perf_counter() - t0
    written = sorted(
        p.name for p in out.glob("*") if p.is_file() and before.get(p.name) != p.stat().st_mtime
    )
    return {
        "name": name,
        "args": args,
        "status": status,
        "wall_seconds": wall,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "written": written,
        "output_tail": tail,
    }


def draw_figure(record: dict, out: Path) -> bool:
    """Draw the figure of a benchmark that ran cleanly and writes no PNG itself.

    Adds ``record["figure"]``; returns False if drawing failed (the error is
    in the record, not swallowed)."""
    name = record["name"]
    if name not in FIGURES or record["status"] != 0:
        return True
    try:
        path = draw(name, out)
    except Exception as error:  # any failure to draw is reported like a failed run
        record["figure"] = {"status": "failed", "error": f"{type(error).__name__}: {error}"}
        return False
    record["figure"] = {"status": 0, "path": path.name}
    record["written"] = sorted(set(record["written"]) | {path.name})
    return True


def _inside(path: Path, folder: Path) -> bool:
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def parse_args(argv=None, prog: str | None = None) -> argparse.Namespace:
    """The command line, with ``args.out`` resolved to the folder the run writes.

    **Arguments:**

    - `argv`: the arguments (default: ``sys.argv[1:]``).
    - `prog`: the program's name in ``--help`` and errors (``"vlcc bench"``
      when the ``vlcc`` command runs this; default: the script's name).

    **Returns:** the parsed arguments; ``args.out`` is ``--out``, or
    ``benchmarks/results/`` with ``--update-results``, or the default
    folder outside the source tree (:func:`figures.default_out`).
    """
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="every benchmark's quick size")
    size.add_argument(
        "--full", action="store_true", help="the full sizes (about an hour on two cores)"
    )
    parser.add_argument("--only", nargs="*", choices=sorted(BENCHMARKS), default=None)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"folder for the results (default: {default_out()}; outside the source tree)",
    )
    parser.add_argument(
        "--update-results",
        action="store_true",
        help="write into benchmarks/results/, the results the paper quotes",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the clean runs of an earlier run_all.json in the output "
        "folder made from this same commit (no local changes), at this size, "
        "and run the others",
    )
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds before one benchmark is stopped"
    )
    args = parser.parse_args(argv)
    if args.update_results and args.out is not None:
        parser.error(
            "--update-results writes benchmarks/results/; drop --out, or drop "
            "--update-results to write to --out"
        )
    if args.update_results:
        args.out = RESULTS
    elif args.out is None:
        args.out = default_out()
    elif _inside(args.out, RESULTS):
        parser.error(
            f"--out {args.out} is inside benchmarks/results/, the tracked results "
            "the paper quotes; pass --update-results to rewrite them, or choose "
            "another folder"
        )
    return args


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}"


def main(argv=None, prog: str | None = None) -> int:
    """Run the benchmarks the command line asks for.

    **Arguments:** `argv` and `prog` as for :func:`parse_args`.

    **Returns:** 0 if every benchmark ran cleanly, 1 if one failed, and
    argparse's status (2 for a usage error, printed; 0 for ``--help``) when
    the command line ends the run, so a caller such as ``vlcc bench`` can
    return it without catching ``SystemExit``.
    """
    try:
        args = parse_args(argv, prog)
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 2
    args.out.mkdir(parents=True, exist_ok=True)
    names = args.only or list(BENCHMARKS)
    command = prog or "python benchmarks/run_all.py"
    index = {
        "command": " ".join([command, *(sys.argv[1:] if argv is None else argv)]),
        "quick": not args.full,
        "out": str(args.out),
        "machine": machine(),
        "runs": [],
    }
    print(
        f"writing to {args.out}"
        + (" (benchmarks/results/, the tracked results)" if args.update_results else ""),
        flush=True,
    )
    kept = resumable(args.out, index["quick"], index["machine"]["source"]) if args.resume else {}
    if args.resume:
        print(
            f"resuming: {len(kept)} clean runs of this commit kept"
            + (f" ({', '.join(n for n in names if n in kept)})" if kept else ""),
            flush=True,
        )
    failed = 0
    start = time.perf_counter()
    records = claims.tracked()  # before a run with --update-results rewrites the files
    for i, name in enumerate(names, 1):
        quick, full = BENCHMARKS[name]
        tag = f"[{i}/{len(names)}] bench_{name}"
        if name in kept:
            index["runs"].append(kept[name])
            print(
                f"{tag} kept from the earlier run ({kept[name]['wall_seconds']:.0f} s)", flush=True
            )
            continue
        print(f"{tag} ... (run time {_clock(time.perf_counter() - start)})", flush=True)
        record = run_one(name, full if args.full else quick, args.out, args.timeout)
        index["runs"].append(record)
        claims.attach(args.out, record["written"], records)
        drawn = draw_figure(record, args.out)
        ok = record["status"] == 0 and drawn
        failed += not ok
        status = (
            "ok"
            if ok
            else f"FAILED ({record['status']})"
            if record["status"] != 0
            else "FAILED (figure)"
        )
        print(
            f"{tag} {status} in {record['wall_seconds']:.0f} s (run time "
            f"{_clock(time.perf_counter() - start)}), load {record['load_before'][0]:.1f} -> "
            f"{record['load_after'][0]:.1f}; wrote {', '.join(record['written']) or 'nothing'}",
            flush=True,
        )
        if record["status"] != 0:
            print(record["output_tail"], flush=True)
        if not drawn:
            print(f"   figure: {record['figure']['error']}", flush=True)
        (args.out / "run_all.json").write_text(json.dumps(index, indent=1))  # so far
    index["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    (args.out / "run_all.json").write_text(json.dumps(index, indent=1))
    print(
        f"wrote {args.out / 'run_all.json'}; {len(names) - failed} of {len(names)} ran "
        f"cleanly in {_clock(time.perf_counter() - start)}; results in {args.out}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
