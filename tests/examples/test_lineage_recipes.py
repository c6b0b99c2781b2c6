"""The lineage recipes in examples/lineage_*.py run and show what they claim."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time

import numpy as np

from vlcc_adjoint.cli import main as vlcc
from vlcc_adjoint.lineage import History

EXAMPLES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples"
)


def recipe(name: str):
    spec = importlib.util.spec_from_file_location(
        f"lineage_{name}", os.path.join(EXAMPLES, f"lineage_{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_restart_after_sigkill_reaches_the_bitwise_identical_final_state(tmp_path):
    path = tmp_path / "heat.vlcc"
    cmd = [
        sys.executable,
        os.path.join(EXAMPLES, "lineage_restart.py"),
        str(path),
        "--steps",
        "300",
        "--every",
        "10",
        "--n",
        "48",
    ]
    proc = subprocess.Popen(cmd + ["--delay", "0.01"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:  # wait until a few versions are durable, then kill -9 mid-run
        assert time.monotonic() < deadline and proc.poll() is None
        if (path / "zarr.json").exists():
            with History(path, mode="r") as h:
                if len(h) >= 5:
                    break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    with History(path, mode="r") as h:
        killed_at = h.version("main").meta["step"]
    assert 0 < killed_at < 300

    resumed = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert f"resumed from step {killed_at}" in resumed
    with History(path, mode="r") as h:
        final = h.load("main")
        assert h.version("main").meta["step"] == 300 and "final-300" in h.tags
        steps = [v.meta["step"] for v in h.log()]
    assert steps == sorted(set(steps), reverse=True)  # one linear history, no step twice

    reference = recipe("restart").run(tmp_path / "ref.vlcc", 300, every=10, n=48, quiet=True)
    assert final["step"] == reference["step"] == 300
    assert final["u"].tobytes() == reference["u"].tobytes()


def test_suspend_export_import_and_copy_resume_bitwise(tmp_path):
    result = recipe("migrate").main(
        ["--steps", "80", "--every", "10", "--n", "24", "--dir", str(tmp_path)]
    )
    assert result["identical"]
    assert result["export/import"] == result["copy"] == result["uninterrupted"]
    assert result["steps in the moved history"] == list(range(10, 90, 10))


def test_replay_from_a_stored_version_is_bitwise_faithful():
    result = recipe("replay").main(
        ["--steps", "100", "--every", "20", "--n", "400", "--from-step", "40", "--to-step", "80"]
    )
    assert result["bitwise"] and result["equal"]
    assert result["replayed steps"] == 40
    assert "(HEAD -> replay)" in result["log"] and "|/" in result["log"]


def test_reproducibility_reports_the_first_divergent_step():
    result = recipe("reproducibility").main(
        [
            "--steps",
            "600",
            "--every",
            "25",
            "--inject",
            "100",
            "--eps",
            "1e-10",
            "--rtol",
            "1e-6",
            "--atol",
            "1e-9",
        ]
    )
    assert result["first_bitwise_difference"] == 100  # the step of the perturbation
    step, leaf, max_abs = result["first_beyond_tolerance"]
    assert 100 < step <= 600 and leaf == "state['x']" and max_abs > 1e-9
    rows = {s: (d, eq, bit) for s, d, eq, bit in result["rows"]}
    assert all(rows[s][2] for s in rows if s < 100)  # identical before the injection


def test_training_backtracks_and_branches_with_a_smaller_rate(tmp_path, capsys):
    repo = str(tmp_path / "mlp.vlcc")
    result = recipe("training").main(["--repo", repo, "--epochs", "40"])
    assert result["diverged"]
    assert result["diverged_loss"] > 4 * result["good_loss"]
    assert result["final_loss"] < result["good_loss"]
    assert result["branches"] == ["lr-0.05", "main"]
    assert "|/" in result["drawing"] and "(HEAD -> lr-0.05)" in result["drawing"]
    assert "tag: best-before-divergence" in result["drawing"]
    capsys.readouterr()
    assert vlcc(["log", repo]) == 0
    out = capsys.readouterr().out
    assert "lr-0.05" in out and "(main)" in out
    with History(repo, mode="r") as h:  # after the recipe's gc
        assert result["good"] in {v.id for v in h.log(all=True)}
        assert np.isfinite(h.load("lr-0.05")["params"]["w1"]).all()
