"""The README's tour runs as written, and computes what it says."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from vlcc_adjoint.schedules import binomial_forward_count

README = Path(__file__).resolve().parents[2] / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_the_tour_has_its_two_examples():
    assert len(_blocks()) == 2


def test_schedules_example_counts_the_binomial_optimum(capsys):
    namespace: dict = {}
    exec(compile(_blocks()[0], "README.md (schedules)", "exec"), namespace)
    assert namespace["simulate"](namespace["s"]).forward_count == binomial_forward_count(10_000, 50)
    stats = namespace["m"].stats()
    assert stats.predicted_time == namespace["m"].optimal_time
    assert str(stats.predicted_time) in capsys.readouterr().out


def test_adjoint_example_gives_the_gradient_of_half_the_squared_final_state(capsys):
    namespace: dict = {}
    exec(compile(_blocks()[1], "README.md (run an adjoint)", "exec"), namespace)
    gradient, u0 = namespace["result"].adjoint, namespace["u0"]

    def J(u):
        for _ in range(5000):
            u = u + 1e-4 * np.sin(u)
        return 0.5 * float(u @ u)

    # A gradient worth checking: O(1), not a vanishing sensitivity.
    assert 0.5 < np.abs(gradient).max() < 10
    printed = [
        float(x) for x in re.findall(r"[-+]?\d+\.\d*(?:e[-+]?\d+)?", capsys.readouterr().out)
    ]
    np.testing.assert_allclose(printed, gradient[::250], atol=1e-3)
    comment = re.search(r"about ([\d., ]+)$", _blocks()[1], flags=re.M)[1]
    np.testing.assert_allclose([float(x) for x in comment.split(",")], gradient[::250], atol=0.006)

    # Taylor test along a random direction: central differences, O(h^2) error.
    direction = np.random.default_rng(0).standard_normal(u0.shape)
    h = 1e-5
    finite_difference = (J(u0 + h * direction) - J(u0 - h * direction)) / (2 * h)
    assert np.isclose(gradient @ direction, finite_difference, rtol=1e-6)


def test_the_readme_opens_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert lines[:6] == [
        "# vlcc-adjoint",
        "",
        "```bash",
        "pip install -e . && vlcc demo                              # install, run the main job",
        'pip install -e ".[test]" && python -m pytest -q tests      # install, run the tests',
        "```",
    ]


def test_every_vlcc_command_the_readme_names_exists():
    from vlcc_adjoint.cli import main

    named = set(re.findall(r"`vlcc (\w+)", README.read_text()))
    assert {"demo", "plan", "log", "diff", "show", "gc", "inspect", "export", "import"} <= named
    for command in sorted(named - {"bench"}):
        try:
            main([command, "--help"])
        except SystemExit as exit_info:
            assert exit_info.code == 0, command
        else:
            raise AssertionError(f"vlcc {command} --help did not print its help")


def test_every_example_the_readme_names_exists():
    root = README.parent
    named = set(re.findall(r"`(\w+\.py)`", README.read_text()))
    assert named, "the README points to no example"
    for name in named:
        assert (root / "examples" / name).is_file(), name
    assert {p.name for p in (root / "examples").glob("*.py")} <= named
