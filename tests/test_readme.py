"""The README's tour runs as written, and computes what it says."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from vlcc_adjoint.schedules import binomial_forward_count

README = Path(__file__).resolve().parents[1] / "README.md"


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


def test_adjoint_example_gives_the_gradient_of_half_the_squared_final_state():
    namespace: dict = {}
    exec(compile(_blocks()[1], "README.md (run an adjoint)", "exec"), namespace)
    gradient, u0 = namespace["result"].adjoint, namespace["u0"]

    def J(u):
        for _ in range(5000):
            u = u + 0.01 * np.sin(u)
        return 0.5 * float(u @ u)

    # Taylor test along a random direction: central differences, O(h^2) error.
    direction = np.random.default_rng(0).standard_normal(u0.shape)
    h = 1e-5
    finite_difference = (J(u0 + h * direction) - J(u0 - h * direction)) / (2 * h)
    assert np.isclose(gradient @ direction, finite_difference, rtol=1e-6)
