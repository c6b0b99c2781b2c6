"""benchmarks/gpu/run_gpu.py runs end to end at its tiny size (on CPU here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_script_runs_tiny_and_writes_its_results(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu" / "run_gpu.py"),
            "--tiny",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((tmp_path / "gpu_results.json").read_text())
    case = result["scan"]["results"]["cases"][0]
    assert case["n"] == 40 and "ours K=4 segments" in case["contenders"]
    for name, c in case["contenders"].items():
        assert c["grad_rel_err"] < 1e-4, name
    ooc = result["out_of_core"]["results"]["out_of_core"]
    assert ooc["reference"]["grad_rel_err_vs_lax_scan"] < 1e-4
    assert ooc["reference"]["writes"][2] > 0  # the reference run spilled to disk
    assert ooc["large"]["io"]["loads"] > 0
    assert not any((tmp_path / "ooc").glob("vlcc-ooc-*"))  # the disk level was removed
