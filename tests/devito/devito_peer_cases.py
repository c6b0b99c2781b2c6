"""Devito's own checkpointing scenarios, with ``vlcc_adjoint.devito.Revolver``
in the place of ``pyrevolve.Revolver`` (run by ``test_devito.py`` in a
process of its own, as ``devito_cases.py``).

The scenarios are those of Devito's ``tests/test_checkpointing.py``
(``test_forward_with_breaks``, ``test_index_alignment``) and the
checkpointed cases of ``tests/test_gradient.py`` (``test_gradientFWI``,
including the viscoacoustic ``sls`` model at ``time_order=1``), on smaller
grids.  Referees: a plain forward run, the uncheckpointed gradient, a Taylor
test, and pyrevolve itself: where pyrevolve runs, the drop-in must give the
same bits.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("DEVITO_LANGUAGE", "C")
os.environ.setdefault("DEVITO_ARCH", "gcc")
os.environ.setdefault("DEVITO_LOGGING", "WARNING")
devito = pytest.importorskip("devito")
pyrevolve = pytest.importorskip("pyrevolve")

from devito import (  # noqa: E402
    CheckpointOperator,
    Constant,
    DevitoCheckpoint,
    Eq,
    Function,
    Grid,
    Operator,
    TimeFunction,
    smooth,
)

from vlcc_adjoint.devito import DevitoSolver, Revolver  # noqa: E402

REVOLVERS = {"vlcc": Revolver, "pyrevolve": pyrevolve.Revolver}


# ---------------------------------------------------------------------------
# the sweeps, step by step
# ---------------------------------------------------------------------------


class _Recording:
    """A pyrevolve-style operator that only records its calls."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def apply(self, t_start, t_end):
        self.log.append((self.name, t_start, t_end))


def _trace(revolver_class, n, checkpoints):
    grid = Grid(shape=(2, 2))
    u = TimeFunction(name="u", grid=grid)
    u.data[:] = 0  # allocates: pyrevolve's snapshots take views of it
    log = []
    wrp = revolver_class(
        DevitoCheckpoint([u]), _Recording("F", log), _Recording("R", log), checkpoints, n
    )
    wrp.apply_forward()
    forward_sweep = list(log)
    wrp.apply_reverse()
    return forward_sweep, log[len(forward_sweep) :]


@pytest.mark.parametrize("n, checkpoints", [(1, None), (3, None), (10, 3), (25, 4)])
def test_reverse_sweep_is_pyrevolves_n_reverse_steps_each_after_its_forward_step(n, checkpoints):
    ours_fwd, ours_rev = _trace(Revolver, n, checkpoints)
    theirs_fwd, theirs_rev = (
        _trace(pyrevolve.Revolver, n, checkpoints) if n > 1 else ([("F", 0, 1)], [("R", 0, 1)])
    )  # pyrevolve's C scheduler fails on n = 1
    for fwd in (ours_fwd, theirs_fwd):  # the forward sweep ends at u_n
        assert fwd[-1][2] == n and fwd[0][1] == 0
    reverse_steps = [c for c in ours_rev if c[0] == "R"]
    assert reverse_steps == [c for c in theirs_rev if c[0] == "R"]
    assert reverse_steps == [("R", i, i + 1) for i in range(n - 1, -1, -1)]
    # The code of a recording operator cannot be read: the forward step runs
    # before every reverse step but the first, which follows the forward sweep.
    for trace in (ours_rev, theirs_rev):
        assert trace[0] == ("R", n - 1, n)
        for j, call in enumerate(trace[1:], 1):
            if call[0] == "R":
                assert trace[j - 1] == ("F", call[1], call[2])


# ---------------------------------------------------------------------------
# Devito's test_index_alignment
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def alignment_ops():
    const = Constant(name="constant")
    grid = Grid(shape=(2, 2))
    u = TimeFunction(name="u_n", grid=grid)  # time_order 1: a two-slot buffer
    v = TimeFunction(name="v", grid=grid)
    prod = Function(name="prod", grid=grid)
    fwd = Operator(Eq(u.forward, u + 1.0 * const))
    rev = Operator([Eq(v, v.forward - 1.0 * const), Eq(prod, prod + u * v)])
    return fwd, rev, u, v, prod


def _index_alignment(revolver_class, ops, nt):
    fwd, rev, u, v, prod = ops
    for f in (u, v, prod):
        f.data_with_halo[:] = 0
    wrp = revolver_class(
        DevitoCheckpoint([u]),
        CheckpointOperator(fwd, constant=1),
        CheckpointOperator(rev, constant=1),
        None,
        nt,
    )
    wrp.apply_forward()
    after_forward = np.array(u.data[nt % 2])
    v.data[nt % 2] = after_forward  # v starts from the last forward value
    wrp.apply_reverse()
    return after_forward, np.array(v.data[0]), np.array(prod.data)


@pytest.mark.parametrize("nt", [3, 8])
@pytest.mark.parametrize("name", ["vlcc", "pyrevolve"])
def test_index_alignment_as_devito_checks_it(alignment_ops, name, nt):
    # u: 0 -> 1 -> .. -> nt forward; v: nt -> .. -> 0 backward; prod sums u*v
    # over the same time steps: sum of i^2, i < nt.
    after_forward, v0, prod = _index_alignment(REVOLVERS[name], alignment_ops, nt)
    np.testing.assert_array_equal(after_forward, nt)
    np.testing.assert_array_equal(v0, 0)
    np.testing.assert_array_equal(prod, sum(i * i for i in range(nt)))


def test_a_reverse_step_at_n_would_fail_the_alignment(alignment_ops):
    # The check above can fail: one reverse iteration too many (steps n..0,
    # the old sweep) leaves v[0] = -1 and a different product.
    fwd, rev, u, v, prod = alignment_ops
    nt = 3
    for f in (u, v, prod):
        f.data_with_halo[:] = 0
    wrap_rev = CheckpointOperator(rev, constant=1)
    solver = DevitoSolver(CheckpointOperator(fwd, constant=1), wrap_rev, [u])
    solver.n_steps = nt
    solver.forward_many(solver.live, 0, nt)
    v.data[nt % 2] = u.data[nt % 2]
    wrap_rev.apply(nt, nt + 1)  # the extra reverse iteration at step n
    for i in range(nt - 1, -1, -1):
        solver.adjoint(solver.live, None, i)
    assert not np.array_equal(v.data[0], np.zeros_like(v.data[0]))


# ---------------------------------------------------------------------------
# Devito's test_forward_with_breaks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(24, 28), (12, 12, 10)])
def test_forward_with_breaks_leaves_the_plain_forward_run_in_the_fields(shape):
    from examples.seismic.acoustic.acoustic_example import acoustic_setup

    solver = acoustic_setup(
        shape=shape,
        spacing=tuple(15.0 for _ in shape),
        tn=120.0,
        space_order=4,
        kernel="OT2",
        nbl=6,
    )
    rec, dt = solver.geometry.rec, solver.model.critical_dt
    rec1, u1, _ = solver.forward()
    fwd_op, grad_op = solver.op_fwd(save=False), solver.op_grad(save=False)
    results = {}
    for name, revolver_class in REVOLVERS.items():
        u = TimeFunction(name="u", grid=solver.model.grid, time_order=2, space_order=4)
        wrap_fw = CheckpointOperator(fwd_op, rec=rec, src=solver.geometry.src, u=u, dt=dt)
        wrap_rev = CheckpointOperator(grad_op, u=u, dt=dt, rec=rec)
        wrp = revolver_class(
            DevitoCheckpoint([u]), wrap_fw, wrap_rev, None, rec._time_range.num - 2
        )
        wrp.apply_forward()
        np.testing.assert_allclose(u.data, u1.data, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(rec.data, rec1.data, rtol=1e-6, atol=1e-9)
        results[name] = np.array(u.data_with_halo), np.array(rec.data)
    for a, b in zip(results["vlcc"], results["pyrevolve"]):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------
# Devito's test_gradientFWI, checkpointed
# ---------------------------------------------------------------------------

SETUPS = {
    "acoustic": ("examples.seismic.acoustic", "acoustic_setup", "OT2", 2),
    "sls-2": ("examples.seismic.viscoacoustic", "viscoacoustic_setup", "sls", 2),
    "sls-1": ("examples.seismic.viscoacoustic", "viscoacoustic_setup", "sls", 1),
}


def _wave(case, dtype=np.float32):
    import importlib

    module, setup, kernel, time_order = SETUPS[case]
    setup = getattr(importlib.import_module(module), setup)
    return setup(
        shape=(30, 34),
        spacing=(10.0, 10.0),
        dtype=dtype,
        kernel=kernel,
        tn=250.0,
        space_order=4,
        nbl=10,
        time_order=time_order,
    )


def _solver_module(case):
    import importlib

    return importlib.import_module(SETUPS[case][0] + ".wavesolver")


class _FWI:
    """Devito's test_gradientFWI set-up: the smoothed model, the data, the
    residual and the uncheckpointed gradient."""

    def __init__(self, case):
        from examples.seismic import Receiver

        self.case = case
        self.wave = wave = _wave(case)
        self.vel0 = Function(name="vel0", grid=wave.model.grid, space_order=4)
        smooth(self.vel0, wave.model.vp)
        self.rec = wave.forward()[0]
        rec0, u0 = wave.forward(vp=self.vel0, save=True)[0:2]
        self.u0 = u0
        self.F0 = 0.5 * np.linalg.norm(rec0.data - self.rec.data) ** 2
        self.residual = Receiver(
            name="rec",
            grid=wave.model.grid,
            data=rec0.data - self.rec.data,
            time_range=wave.geometry.time_axis,
            coordinates=wave.geometry.rec_positions,
        )

    def gradient(self, revolver_class=None):
        """The gradient, uncheckpointed (``None``) or through Devito's own
        ``jacobian_adjoint(checkpointing=True)`` with `revolver_class` in
        the place of ``devito.Revolver``."""
        module = _solver_module(self.case)
        if revolver_class is None:
            grad, _ = self.wave.jacobian_adjoint(
                self.residual, self.u0, vp=self.vel0, checkpointing=False
            )
            return np.array(grad.data)
        held = module.Revolver
        module.Revolver = revolver_class
        try:
            grad, _ = self.wave.jacobian_adjoint(
                self.residual, self.u0, vp=self.vel0, checkpointing=True
            )
        finally:
            module.Revolver = held
        return np.array(grad.data)


@pytest.fixture(scope="module", params=list(SETUPS))
def fwi(request):
    return _FWI(request.param)


def test_checkpointed_gradient_is_pyrevolves_bit_for_bit_and_the_uncheckpointed_one(fwi):
    ours = fwi.gradient(Revolver)
    theirs = fwi.gradient(pyrevolve.Revolver)
    np.testing.assert_array_equal(ours, theirs)
    plain = fwi.gradient()
    assert np.max(np.abs(plain)) > 0
    np.testing.assert_allclose(ours, plain, rtol=0, atol=1e-5 * np.max(np.abs(plain)))


def test_sls_first_order_gradient_passes_the_taylor_test():
    fwi = _FWI("sls-1")
    wave, vel0 = fwi.wave, fwi.vel0
    gradient = fwi.gradient(Revolver)
    v = wave.model.vp.data
    dm = np.float32(v**-2 - vel0.data**-2)
    G = float(np.dot(gradient.reshape(-1), dm.reshape(-1)))
    H = np.array([0.5, 0.25, 0.125, 0.0625, 0.03125])
    error1, error2 = [], []
    for h in H:

        def initializer(data, h=h):
            data[:] = np.sqrt(vel0.data**2 * v**2 / ((1 - h) * v**2 + h * vel0.data**2))

        vloc = Function(name="vloc", grid=wave.model.grid, space_order=4, initializer=initializer)
        d = wave.forward(vp=vloc)[0]
        F = 0.5 * np.linalg.norm((d.data - fwi.rec.data).reshape(-1)) ** 2
        error1.append(abs(F - fwi.F0))
        error2.append(abs(F - fwi.F0 - h * G))
    p1 = np.polyfit(np.log10(H), np.log10(error1), 1)[0]
    p2 = np.polyfit(np.log10(H), np.log10(error2), 1)[0]
    assert p1 == pytest.approx(1.0, rel=0.1)
    assert p2 == pytest.approx(2.0, rel=0.1)


def test_sls_first_order_reverse_step_is_found_to_need_the_forward_step():
    # Its gradient reads p.dt = (p[t+1] - p[t]) / dt; Devito writes p[t+1] of
    # the two-slot buffer as p[t-1].  Without the forward step the gradient
    # is wrong: the check above can fail.
    fwi = _FWI("sls-1")

    class NoRecompute(Revolver):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, recompute=False, **kwargs)

    class Detected(Revolver):
        seen = []

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            Detected.seen.append(self.solver.recompute)

    wrong = fwi.gradient(NoRecompute)
    right = fwi.gradient(Detected)
    assert Detected.seen == [True]
    assert not np.allclose(wrong, right, rtol=1e-3)


def test_repr_of_a_revolver_whose_construction_failed():
    wrp = Revolver.__new__(Revolver)
    assert "Revolver" in repr(wrp)
    grid = Grid(shape=(2, 2))
    u = TimeFunction(name="u", grid=grid)
    with pytest.raises(ValueError, match="n_timesteps"):
        Revolver(DevitoCheckpoint([u]), _Recording("F", []), _Recording("R", []), None, None)
