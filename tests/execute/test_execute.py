"""The executor: run_adjoint, the solver protocol, the budget planner."""

import dataclasses

import numpy as np
import pytest

from vlcc_adjoint import timestep
from vlcc_adjoint._checks import matcher, signature
from vlcc_adjoint.budget import plan
from vlcc_adjoint.execute import StateMismatchError, run_adjoint
from vlcc_adjoint.schedules import Level, Multistage, Online, Periodic, Revolve, StoreAll
from vlcc_adjoint.storage import MemoryTier, StorageError, TieredStore, ZarrTier

DT = 0.05


def _problem(size=6, seed=0):
    """u' = -u^3 + B u, explicit Euler; J = 0.5 ||u_n||^2."""
    rng = np.random.default_rng(seed)
    B = rng.standard_normal((size, size)) * 0.5

    @timestep
    def step(u, i):
        return u + DT * (-(u**3) + B @ u)

    @step.adjoint
    def step_adjoint(u, lam, i):
        # (d u_{i+1} / d u_i)^T lam = lam + dt (-3 u^2 lam + B^T lam)
        return lam + DT * (-3 * u**2 * lam + B.T @ lam)

    u0 = rng.standard_normal(size) * 0.5
    return step, u0


def _objective(step, u0, n):
    u = u0.copy()
    for i in range(n):
        u = step(u, i)
    return 0.5 * float(u @ u)


def _reference_gradient(step, u0, n):
    """Store every state, then the reverse loop: the referee."""
    states = [u0]
    for i in range(n):
        states.append(step(states[-1], i))
    lam = states[-1].copy()
    for i in range(n - 1, -1, -1):
        lam = step.adjoint(states[i], lam, i)
    return lam


SCHEDULES = [
    lambda n: Revolve(n, 3),
    lambda n: Revolve(n, 1),
    lambda n: StoreAll(n),
    lambda n: Periodic(n, 4),
    lambda n: Online(n, snapshots=4),
    lambda n: Multistage(n, [Level(2), Level(3, 2.0, 2.0)]),
]


@pytest.mark.parametrize("make", SCHEDULES)
@pytest.mark.parametrize("n", [1, 2, 17])
def test_run_adjoint_matches_the_store_everything_reference(make, n):
    step, u0 = _problem()
    schedule = make(n)
    result = run_adjoint(step, schedule, u0, lambda u: u)
    np.testing.assert_allclose(result.adjoint, _reference_gradient(step, u0, n), rtol=1e-13)
    assert result.forward_steps in (
        schedule.stats().forward_count,
        schedule.stats().forward_count + 1,
    )
    u = u0.copy()
    for i in range(n):
        u = step(u, i)
    np.testing.assert_array_equal(result.final_state, u)


def test_gradient_passes_a_taylor_test():
    step, u0 = _problem(seed=3)
    n = 25
    g = run_adjoint(step, Revolve(n, 4), u0, lambda u: u).adjoint
    du = np.random.default_rng(7).standard_normal(u0.shape)
    j0 = _objective(step, u0, n)
    remainders = []
    for h in [1e-2, 5e-3, 2.5e-3, 1.25e-3]:
        remainders.append(abs(_objective(step, u0 + h * du, n) - j0 - h * g @ du))
    rates = np.log2(np.array(remainders[:-1]) / np.array(remainders[1:]))
    assert np.all(rates > 1.8), rates  # second order: the gradient is exact


def test_online_without_steps_matches_revolve_and_stops_where_told():
    step, u0 = _problem(seed=1)
    n = 23
    result = run_adjoint(step, Online(snapshots=4), u0, lambda u: u, stop=lambda u, i: i == n)
    assert result.n_steps == n
    np.testing.assert_allclose(
        result.adjoint, run_adjoint(step, Revolve(n, 4), u0, lambda u: u).adjoint, rtol=1e-13
    )
    assert result.forward_steps == result.schedule_stats.forward_count


def test_online_needs_a_stop_criterion_and_respects_max_steps():
    step, u0 = _problem()
    with pytest.raises(ValueError, match="stop="):
        run_adjoint(step, Online(snapshots=4), u0, lambda u: u)
    with pytest.raises(RuntimeError, match="max_steps=10"):
        run_adjoint(
            step, Online(snapshots=4), u0, lambda u: u, stop=lambda u, i: False, max_steps=10
        )


def test_adj_final_may_be_an_array():
    step, u0 = _problem()
    lam_n = np.ones_like(u0)
    states = [u0]
    for i in range(9):
        states.append(step(states[-1], i))
    lam = lam_n
    for i in range(8, -1, -1):
        lam = step.adjoint(states[i], lam, i)
    np.testing.assert_allclose(run_adjoint(step, Revolve(9, 2), u0, lam_n).adjoint, lam, rtol=1e-13)


class _InPlaceSolver:
    """A solver that owns its buffers (Devito style): advances in place,
    restores into the arrays in hand, stores a dict of two time levels."""

    restore_in_place = True

    def __init__(self):
        self.gradient = 0.0

    def forward(self, state, step):
        prev, cur = state["prev"], state["cur"]
        new = 1.9 * cur - prev + 0.01 * np.sin(cur)
        prev[...] = cur
        cur[...] = new
        return state

    def adjoint(self, state, adj, step):
        # u_{i+1} = (cur, 1.9 cur - prev + 0.01 sin cur); transpose of its Jacobian.
        a_prev, a_cur = adj["prev"], adj["cur"]
        new_prev = -a_cur
        new_cur = a_prev + (1.9 + 0.01 * np.cos(state["cur"])) * a_cur
        self.gradient += float(np.sum(a_cur))
        return {"prev": new_prev, "cur": new_cur}


def _in_place_reference(n):
    solver = _InPlaceSolver()
    u = {"prev": np.linspace(0, 1, 8), "cur": np.linspace(0, 1.1, 8)}
    states = []
    for i in range(n):
        states.append({k: v.copy() for k, v in u.items()})
        solver.forward(u, i)
    adj = {k: v.copy() for k, v in u.items()}
    for i in range(n - 1, -1, -1):
        adj = solver.adjoint(states[i], adj, i)
    return adj, solver.gradient


@pytest.mark.parametrize("make", SCHEDULES)
def test_in_place_solvers_restore_into_their_own_buffers(make):
    n = 15
    solver = _InPlaceSolver()
    u0 = {"prev": np.linspace(0, 1, 8), "cur": np.linspace(0, 1.1, 8)}
    result = run_adjoint(solver, make(n), u0, lambda u: {k: v.copy() for k, v in u.items()})
    want, grad = _in_place_reference(n)
    for k in want:
        np.testing.assert_allclose(result.adjoint[k], want[k], rtol=1e-12)
    assert solver.gradient == pytest.approx(grad, rel=1e-12)


def test_a_disk_tier_gives_the_same_gradient(tmp_path):
    from vlcc_adjoint.schedules import io_plan

    step, u0 = _problem(seed=2)
    n = 30
    schedule = Multistage(n, [Level(2), Level(4, 5.0, 5.0)])
    store = TieredStore([MemoryTier(), ZarrTier(tmp_path / "disk")], plan=io_plan(schedule))
    result = run_adjoint(step, schedule, u0, lambda u: u, store=store)
    np.testing.assert_allclose(result.adjoint, _reference_gradient(step, u0, n), rtol=1e-13)
    assert result.schedule_stats.writes[1] > 0


def test_a_failing_step_propagates_with_its_step_and_closes_the_store():
    step, u0 = _problem()

    @timestep
    def failing(u, i):
        if i == 7:
            raise FloatingPointError("blew up")
        return step(u, i)

    failing.adjoint(step.adjoint)
    store = TieredStore([MemoryTier()])
    with pytest.raises(FloatingPointError, match="blew up") as info:
        run_adjoint(failing, Revolve(12, 3), u0, lambda u: u, store=store)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "forward step 7" in notes and "Advance" in notes
    with pytest.raises(StorageError, match="closed"):
        store.save(0, u0)


def test_a_step_returning_the_wrong_shape_is_named():
    step, u0 = _problem()

    @timestep
    def bad(u, i):
        out = step(u, i)
        return out[:-1] if i == 4 else out

    bad.adjoint(step.adjoint)
    with pytest.raises(StateMismatchError, match=r"forward step 4 .*shape \(5,\).*\(6,\)"):
        run_adjoint(bad, Revolve(10, 3), u0, lambda u: u)


def test_a_step_returning_the_wrong_dtype_is_named():
    step, u0 = _problem()

    @timestep
    def bad(u, i):
        out = step(u, i)
        return out.astype(np.float32) if i == 2 else out

    bad.adjoint(step.adjoint)
    with pytest.raises(StateMismatchError, match="forward step 2.*float32|forward step 2.*<f4"):
        run_adjoint(bad, Revolve(10, 3), u0, lambda u: u)


@dataclasses.dataclass
class _Pair:
    a: np.ndarray
    b: np.ndarray


def test_the_signature_matcher_answers_what_comparing_signatures_answers():
    z = np.zeros
    states = [
        z(3),
        z(4),
        z(3, np.float32),
        z(3).astype(">f8"),
        z((3, 1)),
        [z(3)],
        (z(3),),
        {"u": z(3)},
        {"v": z(3)},
        {"u": z(3), "v": z(3)},
        _Pair(z(3), z(3)),
        _Pair(z(3), z(4)),
        _Pair(z(3), [z(3)]),
        (z(3), {"w": _Pair(z(2), z(2))}),
        (z(3), {"w": _Pair(z(2), z(1))}),
        object(),
        1.5,
        None,
        {1: z(3)},
        {1.0: z(3)},
    ]
    for a in states:
        match = matcher(signature(a))
        for b in states:
            assert match(b) == (signature(a) == signature(b)), (a, b)
        assert match(a) and match(a)  # the dtype seen is remembered, and still checked


def test_a_dataclass_state_changing_a_field_mid_run_is_named():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((4, 4)) * 0.3

    class Solver:
        def forward(self, u, i):
            b = A @ u.b
            return _Pair(u.a, b[:-1] if i == 7 else b)

        def adjoint(self, u, lam, i):
            return _Pair(lam.a, A.T @ lam.b)

    u0 = _Pair(np.zeros(2), np.ones(4))
    with pytest.raises(StateMismatchError, match=r"forward step 7 .*state\.b.*shape \(3,\)"):
        run_adjoint(Solver(), Revolve(12, 3), u0, lambda u: u)


def test_bad_arguments_are_refused_clearly():
    step, u0 = _problem()
    with pytest.raises(TypeError, match="timestep"):
        run_adjoint(object(), Revolve(5, 2), u0, u0)
    with pytest.raises(TypeError, match="Schedule"):
        run_adjoint(step, [1, 2], u0, u0)
    with pytest.raises(ValueError, match="stop= only applies"):
        run_adjoint(step, Revolve(5, 2), u0, u0, stop=lambda u, i: True)

    @timestep
    def no_adjoint(u, i):
        return u

    with pytest.raises(TypeError, match="has no adjoint"):
        run_adjoint(no_adjoint, Revolve(5, 2), u0, u0)


def test_progress_bar_reports_the_actions(capsys):
    step, u0 = _problem()
    run_adjoint(step, Revolve(20, 3), u0, lambda u: u, progress=True)
    err = capsys.readouterr().err
    assert "vlcc adjoint" in err and str(len(Revolve(20, 3).table)) in err


def test_result_times_add_up():
    step, u0 = _problem()
    r = run_adjoint(step, Revolve(50, 4), u0, lambda u: u)
    assert r.forward_seconds > 0 and r.adjoint_seconds > 0
    assert r.forward_seconds + r.adjoint_seconds + r.stall_seconds <= r.wall_seconds * 1.01


def test_plan_picks_store_all_revolve_or_multistage_from_the_budgets():
    state = 10**6
    p = plan(100, memory_bytes=200 * state, state_bytes=state, step_seconds=1e-3)
    assert type(p.schedule).__name__ == "StoreAll"
    p = plan(100, memory_bytes=5 * state, state_bytes=state, step_seconds=1e-3)
    assert type(p.schedule).__name__ == "Revolve" and p.memory_slots == 5
    assert p.schedule.stats().peak_slots[0] <= 5
    # Cheap disk: the two-level schedule recomputes less and wins.
    p = plan(
        100,
        memory_bytes=6 * state,
        disk_bytes=21 * state,
        state_bytes=state,
        step_seconds=1e-3,
        write_seconds=1e-4,
        read_seconds=1e-4,
        copy_seconds=1e-5,
    )
    assert type(p.schedule).__name__ == "Multistage"
    stats = p.schedule.stats()
    assert stats.peak_slots[0] <= 3 and stats.peak_slots[1] <= 20
    assert p.predicted_seconds == min(p.candidates.values())
    assert "chosen" in p.explain


def test_plan_calibrates_from_the_solver_and_runs():
    step, u0 = _problem()
    record = u0.nbytes + 2 * 4096  # a disk record also holds its metadata
    p = plan(40, memory_bytes=7 * u0.nbytes, disk_bytes=10 * record, solver=step, u0=u0)
    assert p.memory_slots == 4 and p.disk_slots == 10
    assert p.step_seconds > 0 and p.write_seconds > 0 and p.read_seconds > 0
    result = run_adjoint(step, p.schedule, u0, lambda u: u, store=p.make_store())
    np.testing.assert_allclose(result.adjoint, _reference_gradient(step, u0, 40), rtol=1e-13)


def test_plan_refuses_budgets_that_hold_no_state():
    with pytest.raises(ValueError, match="memory_bytes=10 holds no state"):
        plan(100, memory_bytes=10, state_bytes=1000, step_seconds=1.0)
    with pytest.raises(ValueError, match="steps"):
        plan(0, memory_bytes=10, state_bytes=1, step_seconds=1.0)
