"""Every script in ``examples/`` runs, at a small size, and checks what it says.

Each runs in a fresh interpreter, exactly as a user would start it.
"""

import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def _run(script, *args, cwd):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout


def _agreements(out):
    return [float(x) for x in re.findall(r"max \|diff\| / max \|g\| = ([0-9.e+-]+)", out)]


def _taylor_rate(out):
    """The second-order rate the Taylor test judged by (none: it printed a failure)."""
    assert "FAILED" not in out, out
    return float(re.search(r"measurable\): second-order rate ([0-9.]+)", out).group(1))


def test_seismic_example_agrees_across_schedules_and_passes_a_taylor_test(tmp_path):
    out = _run(
        "seismic_fwi.py", "--nx", 70, "--nz", 70, "--nt", 250, "--snapshots", 6, cwd=tmp_path
    )
    assert "Multistage" in out and "StoreAll" in out
    assert _agreements(out) == [0.0, 0.0, 0.0]  # Multistage, StoreAll, reference vs Revolve
    assert abs(_taylor_rate(out) - 2) < 0.2
    assert (tmp_path / "seismic_gradient.png").exists()


def test_burgers_example_agrees_across_schedules_and_passes_a_taylor_test(tmp_path):
    out = _run("cfd_burgers.py", "--cells", 96, "--snapshots", 6, "--sensors", 4, cwd=tmp_path)
    assert _agreements(out) == [0.0, 0.0, 0.0]
    assert abs(_taylor_rate(out) - 2) < 0.2
    assert (tmp_path / "burgers_gradient.png").exists()


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax extra not installed")
def test_jax_wave_example_matches_lax_scan(tmp_path):
    out = _run(
        "jax_wave.py", "--grid", 32, "--steps", 300, "--snapshots", 6, "--check", cwd=tmp_path
    )
    diff = re.search(r"max relative gradient difference ([0-9.e+-]+)", out)
    assert diff and float(diff.group(1)) < 1e-4, out  # float32


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax extra not installed")
def test_jax_neural_ode_example_trains(tmp_path):
    out = _run("jax_neural_ode.py", "--steps", 100, "--iterations", 5, "--batch", 2, cwd=tmp_path)
    final = re.search(r"final loss ([0-9.e+-]+) \(from ([0-9.e+-]+)\)", out)
    assert final and float(final.group(1)) < float(final.group(2)), out


@pytest.mark.skipif(importlib.util.find_spec("devito") is None, reason="devito extra not installed")
def test_devito_example_equals_devitos_own_gradient(tmp_path):
    out = _run("devito_fwi.py", "--nx", 41, "--nz", 41, "--nt", 120, "--png", "", cwd=tmp_path)
    rows = re.findall(r"^(Devito|vlcc).*?\s+([0-9.]+)\s+([0-9.e+-]+)$", out, re.M)
    assert len(rows) == 4, out
    assert all(float(diff) <= 1e-5 for _, _, diff in rows), out  # float32
