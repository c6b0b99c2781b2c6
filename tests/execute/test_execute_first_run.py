"""What a first run of run_adjoint meets: a seed of the wrong shape, a state
that blows up, a result printed at the prompt; and the SPMD hook through
which an integration takes over ``run_adjoint(..., comm=...)``."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import numpy as np
import pytest

from vlcc_adjoint import timestep
from vlcc_adjoint.execute import (
    AdjointResult,
    NonFiniteError,
    StateMismatchError,
    register_spmd,
    run_adjoint,
)
from vlcc_adjoint.schedules import Revolve


def _linear(a=0.9):
    @timestep
    def step(u, i):
        return a * u + 0.01

    @step.adjoint
    def step_adjoint(u, lam, i):
        return a * lam

    return step


# -- the adjoint seed --------------------------------------------------------------


def test_a_seed_of_the_wrong_shape_is_refused_before_the_run_naming_both_shapes():
    calls = []

    @timestep
    def step(u, i):
        calls.append(i)
        return 0.9 * u

    @step.adjoint
    def step_adjoint(u, lam, i):
        return 0.9 * lam

    with pytest.raises(StateMismatchError) as info:
        run_adjoint(step, Revolve(5, 2), np.zeros(8), np.ones(3))
    message = str(info.value)
    assert "(3,)" in message and "(8,)" in message
    assert "zeros_like" in message  # the fix
    assert calls == []  # refused up front, not after the forward sweep


def test_a_seed_of_the_wrong_structure_is_refused():
    u0 = {"p": np.zeros(4), "v": np.zeros(4)}

    @timestep
    def dict_step(u, i):
        return {k: 0.9 * v for k, v in u.items()}

    @dict_step.adjoint
    def dict_adjoint(u, lam, i):
        return {k: 0.9 * v for k, v in lam.items()}

    with pytest.raises(StateMismatchError, match=r"adj_final.*'q'.*'v'"):
        run_adjoint(dict_step, Revolve(3, 2), u0, {"p": np.ones(4), "q": np.ones(4)})
    with pytest.raises(StateMismatchError, match=r"adj_final\['v'\].*\(5,\).*\(4,\)"):
        run_adjoint(dict_step, Revolve(3, 2), u0, {"p": np.ones(4), "v": np.ones(5)})
    with pytest.raises(StateMismatchError, match=r"adj_final\[1\].*\(2,\).*\(4,\)"):
        run_adjoint(_linear(), Revolve(3, 2), (np.zeros(4), np.zeros(4)), (np.ones(4), np.ones(2)))


def test_a_seed_the_solver_defines_in_another_form_is_left_to_it():
    """The adjoint need not mirror the state (parts without derivatives, a
    solver's own adjoint object): only what mirrors it is compared."""

    @timestep
    def step(u, i):
        return {"u": 0.5 * u["u"], "count": u["count"] + 1}

    @step.adjoint
    def step_adjoint(u, lam, i):
        return 0.5 * lam

    u0 = {"u": np.ones(3), "count": np.zeros(1, np.int64)}
    result = run_adjoint(step, Revolve(4, 2), u0, np.ones(3))
    np.testing.assert_allclose(result.adjoint, 0.5**4 * np.ones(3))


def test_a_callable_seed_returning_the_wrong_shape_is_named():
    step = _linear()
    with pytest.raises(StateMismatchError, match=r"adj_final\(u_n\).*\(2,\).*\(4,\)"):
        run_adjoint(step, Revolve(4, 2), np.zeros(4), lambda u: u[:2])


def test_a_seed_of_another_dtype_or_a_scalar_for_a_0d_state_is_accepted():
    step = _linear()
    result = run_adjoint(step, Revolve(4, 2), np.zeros(4, np.float32), np.ones(4))
    np.testing.assert_allclose(result.adjoint, 0.9**4 * np.ones(4))
    result = run_adjoint(step, Revolve(4, 2), np.float64(0.0), 1.0)
    assert math.isclose(float(result.adjoint), 0.9**4)


# -- check_finite ------------------------------------------------------------------


def _blows_up_at(bad_step, *, adjoint_bad_step=None):
    @timestep
    def step(u, i):
        out = 1.5 * u
        if i == bad_step:
            out[2] = np.inf
        return out

    @step.adjoint
    def step_adjoint(u, lam, i):
        out = 1.5 * lam
        if i == adjoint_bad_step:
            out[0] = np.nan
        return out

    return step


def test_check_finite_names_the_first_forward_step_whose_state_is_not_finite():
    step = _blows_up_at(6)
    with pytest.raises(NonFiniteError) as info:
        run_adjoint(step, Revolve(20, 3), np.ones(4), np.ones(4), check_finite=True)
    err = info.value
    assert isinstance(err, FloatingPointError)
    assert (err.step, err.kind) == (6, "forward")
    assert "forward step 6" in str(err) and "u_7" in str(err)
    # Off by default: the run completes with infinities in it.
    result = run_adjoint(step, Revolve(20, 3), np.ones(4), np.ones(4))
    assert not np.all(np.isfinite(result.final_state))


def test_check_finite_names_the_first_adjoint_step_whose_adjoint_is_not_finite():
    step = _blows_up_at(-1, adjoint_bad_step=12)
    with pytest.raises(NonFiniteError) as info:
        run_adjoint(step, Revolve(20, 3), np.ones(4), np.ones(4), check_finite=True)
    assert (info.value.step, info.value.kind) == (12, "adjoint")
    assert "adjoint step 12" in str(info.value) and "lambda_12" in str(info.value)


def test_check_finite_checks_the_initial_state_the_seed_and_nested_states():
    step = _linear()
    with pytest.raises(NonFiniteError, match="u_0"):
        run_adjoint(step, Revolve(3, 2), np.array([1.0, np.nan]), np.ones(2), check_finite=True)
    with pytest.raises(NonFiniteError, match="adj_final"):
        run_adjoint(step, Revolve(3, 2), np.ones(2), np.array([np.inf, 0.0]), check_finite=True)

    @dataclasses.dataclass
    class State:
        a: np.ndarray
        t: float

    @timestep
    def dc_step(u, i):
        return State(u.a * 2.0, u.t * 1e300)

    @dc_step.adjoint
    def dc_adjoint(u, lam, i):
        return lam

    with pytest.raises(NonFiniteError, match=r"forward step 1.*\.t"):
        run_adjoint(
            dc_step,
            Revolve(4, 2),
            State(np.ones(3), 1e-10),
            State(np.ones(3), 1.0),
            check_finite=True,
        )


def test_check_finite_steps_one_at_a_time_through_forward_many():
    """A solver's forward_many would hide which step blew up: with
    check_finite the executor advances step by step."""

    class Solver:
        def forward(self, u, i):
            return u * 2.0 if i != 9 else u * np.inf

        def forward_many(self, u, a, b):
            for i in range(a, b):
                u = self.forward(u, i)
            return u

        def adjoint(self, u, lam, i):
            return lam * 2.0

    with pytest.raises(NonFiniteError) as info:
        run_adjoint(Solver(), Revolve(30, 2), np.ones(3), np.ones(3), check_finite=True)
    assert info.value.step == 9


# -- the result's repr -------------------------------------------------------------


def test_the_result_repr_summarises_arrays_instead_of_printing_them():
    step = _linear()
    u0 = {"big": np.arange(100_000.0), "small": np.zeros((2, 3), np.float32)}

    @timestep
    def dict_step(u, i):
        return {k: 0.5 * v for k, v in u.items()}

    @dict_step.adjoint
    def dict_adjoint(u, lam, i):
        return {k: 0.5 * v for k, v in lam.items()}

    result = run_adjoint(dict_step, Revolve(3, 2), u0, lambda u: u)
    text = repr(result)
    assert len(text) < 1000
    assert "float64[100000]" in text and "float32[2, 3]" in text
    assert "99999" not in text.replace("100000", "")  # no element listing
    assert "max" in text and "n_steps=3" in text
    assert isinstance(result, AdjointResult)
    text = repr(run_adjoint(step, Revolve(3, 2), np.full(5, np.nan), np.ones(5)))
    assert "nan" in text  # the statistics say what is in there


# -- the SPMD hook -----------------------------------------------------------------


def test_execute_imports_no_integration_until_a_run_asks_for_one():
    code = (
        "import sys, numpy as np\n"
        "from vlcc_adjoint.execute import run_adjoint\n"
        "from vlcc_adjoint import timestep\n"
        "assert not any(m.startswith(('vlcc_adjoint.mpi', 'vlcc_adjoint._mpi', 'mpi4py')) "
        "for m in sys.modules), sorted(sys.modules)\n"
        "from vlcc_adjoint.schedules import Revolve\n"
        "f = timestep(lambda u, i: u)\n"
        "try:\n"
        "    run_adjoint(f, Revolve(2, 1), np.zeros(2), np.zeros(2), comm=object())\n"
        "except Exception as e:\n"
        "    pass\n"
        "print('vlcc_adjoint.mpi' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "True"  # comm= loaded the MPI integration on demand


def test_without_an_spmd_runner_comm_says_what_to_import(monkeypatch):
    from vlcc_adjoint import execute

    monkeypatch.setattr(execute, "_spmd_runner", None)
    with pytest.raises(RuntimeError, match="import vlcc_adjoint.mpi"):
        run_adjoint(_linear(), Revolve(2, 1), np.zeros(2), np.ones(2), comm=object())


def test_a_registered_spmd_runner_takes_comm_runs(monkeypatch):
    from vlcc_adjoint import execute

    seen = {}

    def runner(solver, schedule, u0, adj_final, store, progress, *, comm, **options):
        seen.update(options, comm=comm)
        return "ran"

    monkeypatch.setattr(execute, "_spmd_runner", None)
    register_spmd(runner)
    step = _linear()
    assert (
        run_adjoint(step, Revolve(2, 1), np.zeros(2), np.ones(2), comm="c", check_finite=True)
        == "ran"
    )
    assert seen["comm"] == "c" and seen["check_finite"] is True
    with pytest.raises(TypeError, match="callable"):
        register_spmd("not a function")


def test_importing_the_mpi_integration_registers_its_runner():
    from vlcc_adjoint import execute, mpi

    assert execute._spmd_runner is mpi.run_adjoint
