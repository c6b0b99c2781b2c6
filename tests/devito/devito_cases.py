"""Cases of the Devito adapter (run by ``test_devito.py`` in a process of
their own): vlcc schedules drive Devito operators and reproduce
Devito's own store-everything gradient.

Referee: Devito's gradient with the forward wavefield saved at every step
(``save=nt``), computed by the same symbolic equations compiled for a saved
field.  The checkpointed runs use the same compiled operators as pyrevolve
(buffered ``u``, 3 time levels), so they must agree with the referee to
rounding and with pyrevolve bit for bit.

Devito is an optional extra and compiles its operators with gcc on first use
(about 10 s here, cached afterwards); the problem is 51x51, 200 samples.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import tempfile

import numpy as np
import pytest

os.environ.setdefault("DEVITO_LANGUAGE", "C")
os.environ.setdefault("DEVITO_ARCH", "gcc")
os.environ.setdefault("DEVITO_LOGGING", "WARNING")
devito = pytest.importorskip("devito")

from vlcc_adjoint import Level, Multistage, Revolve, StoreAll, io_plan, plan  # noqa: E402
from vlcc_adjoint.devito import DevitoSolver, Revolver, default_snapshots  # noqa: E402
from vlcc_adjoint.storage import MemoryTier, TieredStore, ZarrTier  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
RTOL = 1e-5  # float32; measured: 0 (bitwise equal)


def _load_example():
    spec = importlib.util.spec_from_file_location("devito_fwi", ROOT / "examples" / "devito_fwi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = _load_example()


@pytest.fixture(scope="module")
def problem():
    p = EXAMPLE.AcousticFWI(shape=(51, 51), nbl=10, nt=200)
    p.compile()
    p.observe()
    return p


@pytest.fixture(scope="module")
def reference(problem):
    grad, misfit = problem.gradient_store_all()
    assert np.max(np.abs(grad)) > 0 and misfit > 0
    return grad, misfit


def _rel(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))


def _solver(problem, **kw):
    fwd, u = problem.op("forward")
    grad_op, _ = problem.op("gradient")
    return DevitoSolver(
        fwd,
        grad_op,
        [u],
        forward_kwargs=dict(u=u, src=problem.src, rec=problem.rec, dt=problem.dt),
        reverse_kwargs=dict(
            u=u, v=problem.v, grad=problem.grad, residual=problem.residual, dt=problem.dt
        ),
        **kw,
    )


# ---------------------------------------------------------------------------
# time levels and the circular buffer
# ---------------------------------------------------------------------------


def test_snapshot_holds_the_live_levels_newest_first_whatever_the_buffer_slot(problem):
    # A straight saved run is the referee for which level is where.
    fwd_save, u_save = problem.op("forward", save=True)
    problem._reset(u_save)
    fwd_save.apply(u=u_save, dt=problem.dt)
    saved = np.asarray(u_save._data_allocated)
    solver = _solver(problem)
    assert solver.offset == 1  # Devito's acoustic loop starts at t = 1
    problem._reset()
    for k in range(7):  # covers every rotation of the 3-slot buffer
        levels = solver.on_save(solver.live, k)
        assert len(levels) == 2
        np.testing.assert_array_equal(levels[0], saved[k + 1])  # u[k + o]
        np.testing.assert_array_equal(levels[1], saved[k])  # u[k + o - 1]
        solver.forward_many(solver.live, k, k + 1)


def test_restore_puts_levels_back_in_their_slots_and_the_run_continues_identically(problem):
    solver = _solver(problem)
    problem._reset()
    solver.forward_many(solver.live, 0, 10)
    snap = [np.array(a) for a in solver.on_save(solver.live, 10)]
    solver.forward_many(solver.live, 10, 24)
    straight = solver.copy(solver.live)
    solver.forward_many(solver.live, 24, 29)  # rotate the buffer off its phase at 10
    assert solver.on_load(snap, 10, solver.live) is solver.live
    solver.forward_many(solver.live, 10, 24)
    for a, b in zip(solver.live, straight):
        np.testing.assert_array_equal(a, b)


def test_a_detached_state_advances_without_touching_the_live_buffers(problem):
    solver = _solver(problem)
    problem._reset()
    solver.forward_many(solver.live, 0, 12)
    before = solver.copy(solver.live)
    detached = solver.forward(solver.copy(solver.live), 12)
    for a, b in zip(solver.live, before):
        np.testing.assert_array_equal(a, b)
    solver.forward(solver.live, 12)
    for a, b in zip(solver.live, detached):
        np.testing.assert_array_equal(a, b)


def test_several_fields_of_different_time_orders_are_restored_level_by_level():
    from devito import Eq, Grid, Operator, TimeFunction

    grid = Grid(shape=(12, 10))

    def build(save):
        u = TimeFunction(name="u", grid=grid, time_order=2, space_order=2, save=save)
        w = TimeFunction(name="w", grid=grid, time_order=1, space_order=2, save=save)
        eqs = [
            Eq(u.forward, 2 * u - u.backward + 0.1 * u.laplace + 0.01 * w),
            Eq(w.forward, 0.9 * w + 0.1 * u),
        ]
        return Operator(eqs), u, w

    rng = np.random.default_rng(0)
    init_u, init_w = rng.standard_normal((2, 12, 10)), rng.standard_normal((12, 10))
    op_s, us, ws = build(40)
    us.data[0], us.data[1], ws.data[1] = init_u[0], init_u[1], init_w
    op_s.apply(time_m=1, time_M=30)
    op, u, w = build(None)
    u.data[0], u.data[1], w.data[1] = init_u[0], init_u[1], init_w
    solver = DevitoSolver(
        op,
        op,
        [u, w],
        forward_kwargs=dict(time_m=1, time_M=1),
        reverse_kwargs=dict(time_m=1, time_M=1),
        recompute=False,
    )
    assert solver.offset == 1
    solver.forward_many(solver.live, 0, 17)
    snap = [np.array(a) for a in solver.on_save(solver.live, 17)]
    assert len(snap) == 3  # u: 2 levels, w: 1
    np.testing.assert_allclose(snap[0], us.data_with_halo[18], rtol=1e-6)
    np.testing.assert_allclose(snap[1], us.data_with_halo[17], rtol=1e-6)
    np.testing.assert_allclose(snap[2], ws.data_with_halo[18], rtol=1e-6)
    solver.forward_many(solver.live, 17, 22)
    solver.on_load(snap, 17, solver.live)
    solver.forward_many(solver.live, 17, 29)
    np.testing.assert_allclose(u.data[29 + 1], us.data[30], rtol=1e-5)
    np.testing.assert_allclose(w.data[29 + 1], ws.data[30], rtol=1e-5)


# ---------------------------------------------------------------------------
# gradients
# ---------------------------------------------------------------------------


def test_reverse_operator_reading_only_u_t_needs_no_forward_recompute(problem):
    assert _solver(problem).recompute is False


@pytest.mark.parametrize("recompute", [None, True])
def test_revolve_with_few_snapshots_equals_devito_store_all_gradient(problem, reference, recompute):
    grad, misfit, result = problem.gradient_vlcc(Revolve(problem.steps, 3), recompute=recompute)
    assert misfit == pytest.approx(reference[1], rel=1e-6)
    assert _rel(grad, reference[0]) <= RTOL
    assert result.schedule_stats.forward_count > 2 * problem.steps  # it did recompute


def test_multistage_memory_and_zarr_disk_equals_devito_store_all_gradient(
    problem, reference, tmp_path
):
    n = problem.steps
    schedule = Multistage(n, [Level(2), Level(6, write_cost=2.0, read_cost=1.0)])
    store = TieredStore([MemoryTier(), ZarrTier(tmp_path / "snapshots")], plan=io_plan(schedule))
    grad, _, result = problem.gradient_vlcc(schedule, store)
    assert _rel(grad, reference[0]) <= RTOL
    assert result.store_stats.tiers[1].puts > 0  # the disk tier was used


def test_budget_plans_and_store_all_equal_the_reference_and_leave_no_scratch(problem, reference):
    n = problem.steps
    state_bytes = 2 * problem.u._data_allocated[0].nbytes
    memory_only = plan(n, 4 * state_bytes, state_bytes=state_bytes, step_seconds=1e-4)
    with_disk = plan(
        n,
        4 * state_bytes,
        20 * state_bytes,
        state_bytes=state_bytes,
        step_seconds=1e-4,
        write_seconds=1e-6,
        read_seconds=1e-6,
    )
    assert len(with_disk.schedule.levels) == 2  # cheap disk: the plan uses it
    scratch = pathlib.Path(tempfile.gettempdir())
    before = set(scratch.glob("vlcc-devito-*"))
    for schedule in (memory_only, with_disk, StoreAll(n)):
        grad, _, _ = problem.gradient_vlcc(schedule)
        assert _rel(grad, reference[0]) <= RTOL
    assert set(scratch.glob("vlcc-devito-*")) == before


def test_revolver_dropin_equals_store_all_and_pyrevolve_bit_for_bit(problem, reference):
    pytest.importorskip("pyrevolve")
    ours, misfit, wrp = problem.gradient_checkpointed(Revolver, 4)
    assert _rel(ours, reference[0]) <= RTOL
    assert misfit == pytest.approx(reference[1], rel=1e-6)
    assert wrp.schedule.n_steps == problem.steps and wrp.result is not None
    theirs, _, _ = problem.gradient_checkpointed(devito.Revolver, 4)
    np.testing.assert_array_equal(ours, theirs)


def test_revolver_takes_devito_operators_and_kwargs_without_pyrevolve(problem, reference):
    fwd, u = problem.op("forward")
    grad_op, _ = problem.op("gradient")
    problem._reset()
    wrp = Revolver(
        [u],
        fwd,
        grad_op,
        None,
        problem.steps,
        fwd_kwargs=dict(u=u, src=problem.src, rec=problem.rec, dt=problem.dt),
        rev_kwargs=dict(
            u=u, v=problem.v, grad=problem.grad, residual=problem.residual, dt=problem.dt
        ),
    )
    assert wrp.schedule.stats().peak_slots[0] <= default_snapshots(problem.steps)
    wrp.apply_forward()
    problem._set_residual()
    wrp.apply_reverse()
    assert _rel(np.array(problem.grad.data), reference[0]) <= RTOL


def test_recomputation_rewrites_the_forward_receivers_so_the_residual_has_its_own_object(
    problem, reference
):
    # The module's caveat (as with pyrevolve): the reverse sweep reruns the
    # forward operator, which writes the receivers again; the reverse
    # operator reads the residual from its own object, so the gradient is
    # right whatever the caller leaves in the forward's receivers.
    fwd, u = problem.op("forward")
    grad_op, _ = problem.op("gradient")
    problem._reset()
    wrp = Revolver(
        [u],
        fwd,
        grad_op,
        4,
        problem.steps,
        fwd_kwargs=dict(u=u, src=problem.src, rec=problem.rec, dt=problem.dt),
        rev_kwargs=dict(
            u=u, v=problem.v, grad=problem.grad, residual=problem.residual, dt=problem.dt
        ),
    )
    wrp.apply_forward()
    traces = np.array(problem.rec.data)
    problem._set_residual()
    problem.rec.data[:] = 0.0
    wrp.apply_reverse()
    rewritten = np.any(np.asarray(problem.rec.data) != 0.0, axis=1)
    assert wrp.schedule.stats().forward_count > problem.steps  # it recomputed
    assert rewritten.sum() > problem.steps // 2
    np.testing.assert_array_equal(np.asarray(problem.rec.data)[rewritten], traces[rewritten])
    assert _rel(np.array(problem.grad.data), reference[0]) <= RTOL


def test_revolver_misuse_says_what_to_do(problem):
    fwd, u = problem.op("forward")
    grad_op, _ = problem.op("gradient")
    kw = dict(fwd_kwargs=dict(u=u, dt=problem.dt), rev_kwargs=dict(u=u, dt=problem.dt))
    wrp = Revolver([u], fwd, grad_op, 3, problem.steps, **kw)
    with pytest.raises(RuntimeError, match="apply_forward"):
        wrp.apply_reverse()
    with pytest.raises(ValueError, match="steps"):
        Revolver([u], fwd, grad_op, None, problem.steps, schedule=Revolve(10, 2), **kw)
    with pytest.raises(TypeError, match="TimeFunctions"):
        DevitoSolver(fwd, grad_op, [problem.grad], forward_kwargs=kw["fwd_kwargs"])
