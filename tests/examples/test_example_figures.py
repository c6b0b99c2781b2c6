"""The examples' figures label their axes and give every image a colour bar.

Each example runs in a fresh interpreter at a small size, with
``matplotlib.figure.Figure.savefig`` wrapped to write, next to each figure,
what its axes show (titles, axis labels, colour bars and their labels).
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"

PROBE = r"""
import json, runpy, sys
import matplotlib
matplotlib.use("Agg")
from matplotlib.figure import Figure

real = Figure.savefig

def savefig(self, path, *args, **kwargs):
    axes = []
    for ax in self.axes:
        if ax.get_label() == "<colorbar>":
            continue
        axes.append({
            "title": ax.get_title(),
            "xlabel": ax.get_xlabel(),
            "ylabel": ax.get_ylabel(),
            "images": len(ax.images),
            "colorbar_labels": [
                im.colorbar.ax.get_ylabel() if im.colorbar is not None else None
                for im in ax.images
            ],
        })
    with open(str(path) + ".json", "w") as f:
        json.dump(axes, f)
    return real(self, path, *args, **kwargs)

Figure.savefig = savefig
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

CASES = [
    ("jax_wave.py", "jax", ["--grid", "32", "--steps", "60", "--snapshots", "4", "--plot"]),
    ("devito_fwi.py", "devito", ["--nx", "41", "--nz", "41", "--nt", "60", "--png"]),
    ("seismic_fwi.py", None, ["--nx", "40", "--nz", "30", "--nt", "60", "--png"]),
    ("cfd_burgers.py", None, ["--cells", "48", "--t-final", "0.05", "--png"]),
]


@pytest.mark.parametrize("script, needs, argv", CASES, ids=[c[0] for c in CASES])
def test_figures_label_their_axes_and_colour_bars(script, needs, argv, tmp_path):
    if needs and importlib.util.find_spec(needs) is None:
        pytest.skip(f"{script} needs {needs}")
    figure = tmp_path / "figure.png"
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(EXAMPLES / script), *argv, str(figure)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    axes = json.loads((tmp_path / "figure.png.json").read_text())
    assert axes
    for ax in axes:
        assert ax["title"] and ax["xlabel"] and ax["ylabel"], ax
        assert all(ax["colorbar_labels"]), ax  # every image has a labelled colour bar
    if script != "cfd_burgers.py":
        assert any(ax["images"] for ax in axes)
