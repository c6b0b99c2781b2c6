"""The Taylor test behind ``vlcc demo``: passes correct gradients, fails wrong ones.

The verdict is a property of the remainders, so it is tested two ways: on
synthetic objectives whose curvature, cancellations and rounding are set
by hand (a grid of them, each with the true gradient and with wrong ones),
and on the demo's wave problem at a grid of small sizes and step counts,
with its true gradient and with the gradients of classic mistakes.
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

from vlcc_adjoint._examples.demo import _misfit_floor, _smooth_bump
from vlcc_adjoint._examples.seismic import SeismicProblem
from vlcc_adjoint._examples.taylor import ROUNDING, judge_remainders, taylor_check


def _cubic(m):
    # Strong higher-order terms: rates start well above 2 at large h.
    return float(np.sum(np.exp(3.0 * m)))


def _cubic_gradient(m):
    return 3.0 * np.exp(3.0 * m)


M = np.linspace(0.0, 0.5, 50)
DM = 1.0 + 0.5 * np.cos(np.arange(50.0))


# ------------------------------------------------------------ single cases


def test_a_correct_gradient_passes_despite_large_third_order_terms():
    check = taylor_check(_cubic, M, DM, _cubic_gradient(M), h0=1.0)
    assert check.rates1[0] > 2.2  # where the old fixed band |rate - 2| < 0.2 failed
    assert check.passed, check.failures
    assert abs(check.slope1 - 2) < 0.25 and abs(check.slope0 - 1) < 0.25


@pytest.mark.parametrize(
    "wrong",
    [
        lambda g: 1.05 * g,
        lambda g: g + 0.3 * np.abs(g).max() * np.random.default_rng(1).standard_normal(g.shape),
        lambda g: np.zeros_like(g),
        lambda g: -g,
    ],
)
def test_a_wrong_gradient_fails_and_says_which_criterion(wrong):
    check = taylor_check(_cubic, M, DM, wrong(_cubic_gradient(M)))
    assert not check.passed
    assert any("second-order remainder" in f for f in check.failures), check.failures
    assert abs(check.slope1 - 1) < 0.1  # the signature of a first-order error


def test_a_direction_that_does_not_see_the_first_order_change_is_a_caveat():
    # At a minimum <grad J, dm> = 0: r0 is O(h^2), and r1 checks only <g, dm> = 0.
    square = lambda m: float(np.sum(m**2))  # noqa: E731
    check = taylor_check(square, np.zeros(3), np.ones(3), np.zeros(3))
    assert check.passed, check.failures
    assert len(check.caveats) == 1 and "stationary along dm" in check.caveats[0]
    assert "<g, dm> is about 0" in check.caveats[0]
    # A gradient that predicts a first-order change there is still wrong.
    check = taylor_check(square, np.zeros(3), np.ones(3), np.full(3, 1e-3))
    assert not check.passed and "the gradient is wrong" in check.failures[0]


def test_a_change_slower_than_h_is_not_smooth():
    # |t|^(1/2) along dm: r0 shrinks at rate 1/2, no gradient fits.
    cusp = lambda m: float(np.sqrt(abs(m[0])))  # noqa: E731
    check = taylor_check(cusp, np.zeros(1), np.ones(1), np.zeros(1))
    assert not check.passed
    assert any("does not change smoothly" in f for f in check.failures), check.failures


def test_an_absolute_rounding_level_replaces_a_smaller_relative_one():
    # J vanishes at m but is computed from terms of size 1: its rounding (1e-12)
    # is not relative to |J|, and the caller's floor says where it starts.
    noise = lambda t: 1e-12 * (zlib.crc32(np.float64(t).tobytes()) / 2**31 - 1)  # noqa: E731
    J = lambda m: 1e-6 * (float(m[0]) + float(m[0]) ** 2) + noise(float(m[0]))  # noqa: E731
    g = np.array([1e-6])
    # Relative to |J| (about 1e-6 h), the rounding level sits below the noise.
    assert max(taylor_check(J, np.zeros(1), np.ones(1), g).floor) < 1e-12
    check = taylor_check(J, np.zeros(1), np.ones(1), g, floor=1e-10)
    assert check.passed, check.failures
    assert min(check.floor) == 1e-10
    assert check.r1[check.window[1]] > 1e-10  # judged where the noise is < 1% of r1
    wrong = taylor_check(J, np.zeros(1), np.ones(1), 1.5 * g, floor=1e-10)  # detectable
    assert not wrong.passed


def test_a_linear_objective_passes_only_its_exact_gradient():
    linear = lambda m: float(np.sum(3.0 * m))  # noqa: E731
    check = taylor_check(linear, M, DM, np.full_like(M, 3.0))
    assert check.passed and "rounding level at every h" in check.note
    assert len(check.h) == 2  # two steps at the rounding level end the test
    check = taylor_check(linear, M, DM, np.full_like(M, 3.003))
    assert not check.passed and "the gradient is wrong" in check.failures[0]


def test_the_steps_go_down_until_the_remainder_reaches_the_rounding_level():
    check = taylor_check(_cubic, M, DM, _cubic_gradient(M))
    r1, floor = np.array(check.r1), np.array(check.floor)
    assert np.all(r1[-2:] <= floor[-2:]) and np.all(r1[:-2] > floor[:-2])
    assert check.window == (len(check.h) - 6, len(check.h) - 3)
    # A wrong gradient's remainder stays above it: the test stops at max_halvings.
    check = taylor_check(_cubic, M, DM, 1.05 * _cubic_gradient(M), max_halvings=12)
    assert len(check.h) == 13 and check.window == (9, 12)


def test_a_cancellation_in_the_remainder_is_set_aside():
    # R1 = h^2 (1 - h / 0.01): zero at h = 0.01, rates 3.6 and 0.1 around it.
    h = 0.5 ** np.arange(1, 16)
    check = judge_remainders(h, 1.0, 1.0 + 2.0 * h + h**2 - 100.0 * h**3, 2.0, rounding=1e-14)
    assert min(check.rates1) < 1.0 and max(check.rates1) > 3.0
    assert check.passed, check.failures
    assert check.window == (11, 14)


# -------------------------------------------------- synthetic objectives


def _noise(t: float, level: float) -> float:
    """Rounding of a computed J: a fixed pseudo-random function of the point."""
    return level * (zlib.crc32(np.float64(t).tobytes()) / 2**31 - 1.0)


def _along(s, c2, c3, level, j0=1.0):
    """``J(m0 + t d) = j0 + s t + c2 t^2 + c3 t^3 + (rounding of relative size
    level)`` on R^3, with d = (1, 2, 2) (``|d|^2 = 9``)."""
    d = np.array([1.0, 2.0, 2.0])

    def J(m):
        t = float(np.dot(m, d)) / 9.0
        value = j0 + s * t + c2 * t**2 + c3 * t**3
        return value + _noise(t, level) * abs(j0)

    return J, d


def _gradient_with_slope(d, slope):
    return d * slope / float(np.dot(d, d))


SLOPES = (1.0, -0.3)
CURVATURES = (1.0, 1e-3, -1e-4, 0.0)
#: h* of the cancellation of c2 h^2 and c3 h^3 (None: c3 = 0; "cubic": c2 = 0)
CANCELLATIONS = (None, 0.2, 0.01, 1e-3)
LEVELS = (0.0, 1e-13, ROUNDING / 8)


def _grid():
    for s, c2, hstar, level in itertools.product(SLOPES, CURVATURES, CANCELLATIONS, LEVELS):
        c3 = 0.0 if hstar is None else (-c2 / hstar if c2 else 0.5)
        yield s, c2, c3, level


def test_correct_gradients_pass_on_a_grid_of_curvatures_cancellations_and_rounding():
    wrong_verdicts = []
    for s, c2, c3, level in _grid():
        J, d = _along(s, c2, c3, level)
        check = taylor_check(J, np.zeros(3), d, _gradient_with_slope(d, s))
        if not check.passed:
            wrong_verdicts.append(((s, c2, c3, level), check.failures, check.rates1))
    assert not wrong_verdicts, wrong_verdicts


@pytest.mark.parametrize("error", ["sign", "relative 1e-2", "relative 1e-4", "absolute"])
def test_wrong_gradients_fail_on_the_same_grid(error):
    missed = []
    for s, c2, c3, level in _grid():
        J, d = _along(s, c2, c3, level)
        # Detectable: an error of the directional derivative well above
        # 6 sqrt(rounding |J| |c2|) (the taylor module's estimate).
        floor = ROUNDING + level
        e = {
            "sign": -2.0 * s,
            "relative 1e-2": 1e-2 * s,
            "relative 1e-4": 1e-4 * s,
            "absolute": 30.0 * np.sqrt(floor * max(abs(c2), 1e-3)),
        }[error]
        check = taylor_check(J, np.zeros(3), d, _gradient_with_slope(d, s + e))
        wrong = "the gradient is wrong" in " ".join(check.failures)
        if not wrong:
            missed.append(((s, c2, c3, level, e), check.failures, check.note))
    assert not missed, missed


# ----------------------------------------------- the demo's wave problem

#: (nx, nz, steps): the smallest grid the CLI accepts, thin and square grids,
#: from a wave that never reaches the receivers to one that crosses the grid.
DEMO_SIZES = [
    (17, 17, 1),
    (17, 17, 30),
    (17, 17, 300),
    (40, 17, 200),
    (17, 40, 100),
    (40, 40, 5),
    (60, 60, 150),
    (100, 80, 400),
    (30, 80, 700),
    (300, 17, 50),
    (17, 300, 2000),
]

#: Sizes at which the background model fits the data to 1e-22 of their
#: energy: J is stationary along the bump, and the test can check only that
#: <g, dm> is about 0.
STATIONARY = [(17, 300, 2000)]


def _demo_check(p: SeismicProblem, g: np.ndarray):
    """The Taylor test as ``vlcc demo`` runs it."""
    return taylor_check(p.objective, p.v_background, _smooth_bump(p), g, floor=_misfit_floor(p))


@pytest.mark.parametrize("nx, nz, nt", DEMO_SIZES)
def test_the_demo_gradient_passes_at_every_size(nx, nz, nt):
    p = SeismicProblem(nx=nx, nz=nz, nt=nt)
    g = p.reference_gradient(p.v_background)
    check = _demo_check(p, g)
    assert check.passed, (check.failures, check.rates1)
    assert bool(check.caveats) == ((nx, nz, nt) in STATIONARY), check.caveats


def _mistakes(p: SeismicProblem, g: np.ndarray) -> dict[str, np.ndarray]:
    """Gradients of classic mistakes, each computed by the problem's own code."""
    v = p.v_background
    # The same problem over the first half of the steps: the gradient of a J
    # without the misfit terms of the record's second half.
    half = SeismicProblem(nx=p.nx, nz=p.nz, nt=p.nt // 2).reference_gradient(v)
    other = p.reference_gradient(p.v_true)
    p.set_model(v)
    return {
        "sign flipped": -g,
        "missing terms (the second half of the record)": half,
        "another model's gradient": other,
        "dJ/dc for dJ/dv (the chain rule forgotten)": g * v / (2.0 * p.squared_courant(v)),
        "off by 1%": 1.01 * g,
    }


@pytest.mark.parametrize(
    "nx, nz, nt", [s for s in DEMO_SIZES if s[2] >= 30 and s not in STATIONARY]
)
def test_wrong_demo_gradients_fail_at_every_size(nx, nz, nt):
    p = SeismicProblem(nx=nx, nz=nz, nt=nt)
    g = p.reference_gradient(p.v_background)
    passed = {}
    for name, wrong in _mistakes(p, g).items():
        check = _demo_check(p, wrong)
        if check.passed or "the gradient is wrong" not in " ".join(check.failures):
            passed[name] = (check.failures, check.note)
    assert not passed, passed


@pytest.mark.parametrize("memory_states, disk_states", [(1, 0), (4, 0), (4, 3), (6, 20)], ids=str)
def test_vlcc_demo_passes_under_every_budget(memory_states, disk_states):
    from vlcc_adjoint._examples.demo import vlcc_demo

    result = vlcc_demo(
        nx=40,
        nz=30,
        nt=120,
        memory_states=memory_states,
        disk_states=disk_states,
        png=None,
        out=lambda line: None,
    )
    assert result["passed"], result["taylor_failures"]
    assert result["agreement"] < 1e-10


def test_vlcc_demo_prints_which_criterion_failed(monkeypatch, capsys, tmp_path):
    from vlcc_adjoint._examples import demo
    from vlcc_adjoint.cli import main

    real = demo.taylor_check
    monkeypatch.setattr(
        demo, "taylor_check", lambda J, m, dm, g, **kw: real(J, m, dm, 1.05 * g, **kw)
    )
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "demo",
                "--nx",
                "60",
                "--nz",
                "60",
                "--steps",
                "150",
                "--memory-states",
                "6",
                "--disk-states",
                "0",
                "--png",
                "",
            ]
        )
        == 1
    )
    out = capsys.readouterr().out
    assert "FAILED: the second-order remainder shrinks at rate" in out
    assert "the gradient is wrong" in out
    assert "gradient check FAILED" in out
    assert "please report this failure" in out


def test_vlcc_demo_passes_with_the_true_gradient(capsys):
    from vlcc_adjoint._examples.demo import vlcc_demo

    result = vlcc_demo(nx=100, nz=80, nt=400, png=None, out=lambda line: None)
    assert result["passed"], result["taylor_failures"]
    assert result["agreement"] < 1e-10
