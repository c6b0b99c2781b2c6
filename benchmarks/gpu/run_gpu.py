"""The JAX benchmarks on a CUDA device, as one prepared script (< 8 minutes).

Runs, in order, each as a subprocess of ``benchmarks/bench_jax.py``:

1. the gradient comparison (``lax.scan``, nested remat, equinox, ours with
   and without segments) on the 2-D wave;
2. the out-of-core gradient: one ``TieredStore`` with the schedule's plan
   holds every level, the checkpoints on the device (tier 0, a
   ``DeviceTier``: the slots stay on the device), in host memory (a
   ``MemoryTier`` reached by ``io_callback``; the store's plan-driven
   read-ahead returns host arrays that JAX copies to the device) and on
   disk (a ``ZarrTier``), checked against ``lax.scan`` at a small size.

and writes ``OUT/gpu_results.json`` with the device, both results and the
wall time of each part.  ``--tiny`` runs both at a toy size (seconds, on
CPU too: what the test suite runs)::

    python benchmarks/gpu/run_gpu.py --out DIR            # on a CUDA machine
    python benchmarks/gpu/run_gpu.py --tiny --out DIR     # anywhere
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent / "bench_jax.py"

#: (bench_jax arguments of the scan comparison, of the out-of-core case)
SIZES = {
    "tiny": (
        ["--grid", "16", "--steps", "40", "--ks", "4", "--rounds", "1"],
        ["--ooc-grid", "16", "--ooc-steps", "60", "--ooc-ref", "16", "60", "--ooc-rss-gib", "8"],
    ),
    "gpu": (
        [
            "--grid",
            "512",
            "--steps",
            "2000",
            "--ks",
            "100",
            "10",
            "--rounds",
            "3",
            "--threads",
            "0",
        ],
        [
            "--ooc-grid",
            "2048",
            "--ooc-steps",
            "2000",
            "--ooc-ref",
            "256",
            "400",
            "--ooc-rss-gib",
            "16",
            "--threads",
            "0",
        ],
    ),
}


def _run(args, out: Path, timeout: float) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(BENCH), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(
            f"bench_jax.py {' '.join(args)} failed ({proc.returncode}):\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return {"args": args, "wall_s": wall, "stdout_tail": proc.stdout[-3000:]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="toy sizes (seconds; CPU is fine)")
    parser.add_argument(
        "--out",
        default=os.path.join(os.environ.get("TMPDIR") or "/tmp", "vlcc-bench-results", "gpu"),
    )
    parser.add_argument(
        "--budget-s", type=float, default=450.0, help="wall-clock limit for both parts together"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scan_args, ooc_args = SIZES["tiny" if args.tiny else "gpu"]
    import jax

    started = time.perf_counter()
    result = {"device": str(jax.devices()[0]), "backend": jax.default_backend(), "tiny": args.tiny}
    result["scan"] = _run(scan_args, out / "scan", args.budget_s * 0.5)
    result["scan"]["results"] = json.loads((out / "scan" / "bench_jax.json").read_text())
    left = args.budget_s - (time.perf_counter() - started)
    result["out_of_core"] = _run(
        ["--skip-scan", "--out-of-core", *ooc_args], out / "ooc", max(30.0, left)
    )
    result["out_of_core"]["results"] = json.loads((out / "ooc" / "bench_jax_ooc.json").read_text())
    result["wall_s"] = time.perf_counter() - started
    (out / "gpu_results.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'gpu_results.json'} ({result['wall_s']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
