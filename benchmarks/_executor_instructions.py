"""The executor's own cost per action in instructions, which a machine
shared with other work does not disturb: ``valgrind --tool=callgrind``
counts the instructions of ``bench_executor.py``'s own measurements of
``run_adjoint`` and of the bare loop (the same solver calls from a plain
loop over the table, snapshots kept as copies in a dict), each in its own
interpreter as the benchmark runs them (``bench_executor.py --child
QUANTITY``), at ``n`` and ``n / 10`` steps of ``Revolve(n, c)``; the
differences between the two sizes remove the interpreter's start-up, the
imports and the warm-up.

Reported: the instructions of ``run_adjoint`` as a multiple of the bare
loop's, and the instructions per action above it.  With ``--baseline
DIR`` (a directory holding another ``vlcc_adjoint`` package) its
``run_adjoint`` is counted too (the bare loop is the same code for both).
Writes ``executor_instructions.json`` to ``--out`` (default
``$TMPDIR/vlcc-bench-results``).

Reproduce::

    python benchmarks/_executor_instructions.py --steps 20000
    mkdir -p /tmp/vlcc_orig && git archive <commit> vlcc_adjoint | tar -x -C /tmp/vlcc_orig
    python benchmarks/_executor_instructions.py --steps 20000 --baseline /tmp/vlcc_orig
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def count(package: str, mode: str, steps: int, slots: int) -> int:
    """Instructions callgrind collects for one child run of
    ``bench_executor.py --child mode`` (``mode``: ``run_adjoint`` or
    ``bare_loop``), the benchmark's own measurement in its own interpreter."""
    env = dict(os.environ, PYTHONPATH=package)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={os.path.join(tmp, 'out')}",
            sys.executable,
            os.path.join(HERE, "bench_executor.py"),
            "--child",
            mode,
            "--steps",
            str(steps),
            "--slots",
            str(slots),
        ]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run failed ({mode}, {steps}):\n{proc.stderr[-3000:]}")
    return int(found.group(1))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20_000, help="time steps n (20000)")
    parser.add_argument("--slots", type=int, default=10, help="Revolve snapshots c (10)")
    parser.add_argument("--baseline", help="a directory holding another vlcc_adjoint package")
    parser.add_argument(
        "--out",
        default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results"),
        help="folder for executor_instructions.json (default: $TMPDIR/vlcc-bench-results)",
    )
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    small, large = args.steps // 10, args.steps
    sys.path.insert(0, ROOT)
    from vlcc_adjoint.schedules import Revolve

    actions = len(Revolve(large, args.slots).table) - len(Revolve(small, args.slots).table)
    packages = {"after": ROOT}
    if args.baseline:
        packages["before"] = args.baseline
    delta = {}
    for mode, what in (("bare", "bare_loop"), ("run", "run_adjoint")):
        for version, package in packages.items():
            if mode == "bare" and version == "before":
                continue  # the bare loop does not depend on the version
            n = {s: count(package, what, s, args.slots) for s in (small, large)}
            delta[f"{mode} {version}" if mode == "run" else mode] = n[large] - n[small]
            print(f"{mode:4s} {version:6s} {n[small]:>14,d} {n[large]:>14,d}", flush=True)
    summary = {}
    for version in packages:
        run = delta[f"run {version}"]
        summary[version] = {
            "x_bare": run / delta["bare"],
            "instructions_per_action_over_bare": (run - delta["bare"]) / actions,
        }
        print(
            f"{version}: run_adjoint {summary[version]['x_bare']:.2f}x the bare loop's "
            f"instructions, {summary[version]['instructions_per_action_over_bare']:,.0f} "
            "per action above it"
        )
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "executor_instructions.json")
    with open(path, "w") as fh:
        json.dump(
            {
                "benchmark": "executor_instructions",
                "steps": [small, large],
                "slots": args.slots,
                "actions": actions,
                "baseline": args.baseline,
                "instructions": delta,
                "summary": summary,
            },
            fh,
            indent=1,
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
