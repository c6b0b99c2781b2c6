"""plan(): the adjoint step is calibrated too, and timing noise does not change the schedule."""

from __future__ import annotations

import numpy as np
import pytest

import vlcc_adjoint.budget as budget
from vlcc_adjoint import plan, timestep

STATE = 10**6


def _plan(step, copy, write, read, adjoint):
    return plan(
        300,
        memory_bytes=8 * STATE,
        disk_bytes=20 * STATE,
        state_bytes=STATE,
        step_seconds=step,
        copy_seconds=copy,
        write_seconds=write,
        read_seconds=read,
        adjoint_cost=adjoint,
    )


@pytest.mark.parametrize("seed", range(8))
def test_jittered_timings_give_the_same_schedule(seed):
    # Costs at the centres of the rounding grid, each timing jittered by up to
    # +-4% (a ratio of two of them by up to +-8%, inside the +-9% half cell).
    g = 2.0**0.25
    base = dict(step=1e-3, copy=1e-3 * g**3, write=1e-3 * g**17, read=1e-3 * g**13, adjoint=g**6)
    reference = _plan(**base)
    assert type(reference.schedule).__name__ == "Multistage"
    rng = np.random.default_rng(seed)
    jittered = _plan(**{k: v * (1 + rng.uniform(-0.04, 0.04)) for k, v in base.items()})
    assert np.array_equal(jittered.schedule.table, reference.schedule.table)
    assert jittered.schedule.levels == reference.schedule.levels


def test_round_cost_snaps_to_powers_of_the_fourth_root_of_two():
    assert budget.round_cost(0.0) == 0.0
    assert budget.round_cost(1.0) == 1.0
    assert budget.round_cost(2.0**0.25 * 1.08) == 2.0**0.25
    assert budget.round_cost(2.0**0.25 * 1.1) == 2.0**0.5
    for x in np.geomspace(1e-3, 1e3, 50):
        assert abs(np.log2(budget.round_cost(x) / x)) <= 0.125 + 1e-12


class _Clock:
    """A clock that advances only when a step runs: 1 s a forward step, 3 s an adjoint step."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _problem(clock):
    @timestep
    def step(u, i):
        clock.now += 1.0
        return u + 0.01 * np.sin(u)

    @step.adjoint
    def step_adjoint(u, lam, i):
        clock.now += 3.0
        return lam + 0.01 * np.cos(u) * lam

    return step, np.linspace(0.0, 1.0, 100)


def test_plan_times_the_adjoint_step_when_given_the_terminal_adjoint(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(budget.time, "perf_counter", clock)
    step, u0 = _problem(clock)
    p = plan(50, memory_bytes=5 * u0.nbytes, solver=step, u0=u0, adj_final=lambda u: u)
    assert p.step_seconds == 1.0
    assert p.adjoint_cost == 3.0
    assert "one adjoint step takes 3.00 forward steps (measured)" in p.explain
    # Predicted: forward count + n adjoint steps at 3 (rounded: 2^(6/4) = 2.83) forward steps.
    stats = p.schedule.stats()
    copies = budget.round_cost(p.copy_seconds / p.step_seconds)
    expected = (
        stats.forward_count
        + 50 * budget.round_cost(3.0)
        + copies * (stats.writes[0] + stats.reads[0])
    )
    assert p.predicted_seconds == pytest.approx(expected)


def test_without_the_terminal_adjoint_the_adjoint_cost_is_assumed_and_said(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(budget.time, "perf_counter", clock)
    step, u0 = _problem(clock)
    p = plan(50, memory_bytes=5 * u0.nbytes, solver=step, u0=u0)
    assert p.adjoint_cost == 1.0
    assert "assumed; pass adj_final= to measure it" in p.explain


def test_calibration_runs_at_most_the_loop_length_of_steps():
    seen = []

    @timestep
    def step(u, i):
        seen.append(i)
        return u + 1.0

    @step.adjoint
    def step_adjoint(u, lam, i):
        seen.append(-1 - i)
        return lam

    plan(4, memory_bytes=2 * 8, solver=step, u0=np.zeros(1), adj_final=np.zeros(1))
    assert max(i for i in seen if i >= 0) <= 3  # steps 0 .. n-1 only
    assert min(seen) >= -4 and all(-1 - i in range(4) for i in seen if i < 0)


def test_verbose_plan_says_what_it_calibrates(capsys, tmp_path):
    step, u0 = _problem(_Clock())
    plan(
        30,
        memory_bytes=10 * u0.nbytes,
        disk_bytes=10 * (u0.nbytes + 3 * 4096),
        solver=step,
        u0=u0,
        adj_final=lambda u: u,
        disk_path=tmp_path,
        verbose=True,
    )
    out = capsys.readouterr().out
    assert "plan: timing forward and adjoint steps" in out
    assert "plan: timing a disk write and read" in out
    assert "plan: timing memory saves and restores" in out
    assert "plan: solving the two-level schedule" in out


def test_a_disk_never_costs_less_than_the_memory_level():
    # A read timed from the page cache while the memory timing met a busy core.
    p = _plan(step=1e-3, copy=4e-3, write=8e-3, read=1e-3, adjoint=2.0)
    memory, disk = p.schedule.levels
    assert memory.write_cost == memory.read_cost == 4.0
    assert disk.read_cost == 4.0 and disk.write_cost == 8.0


def test_verbose_may_be_a_callable_that_receives_each_line():
    lines = []
    step, u0 = _problem(_Clock())
    plan(30, memory_bytes=4 * u0.nbytes, solver=step, u0=u0, verbose=lines.append)
    assert lines and all(line.startswith("plan: timing") for line in lines)


def _two_level_plan():
    bp = _plan(1e-3, 1e-5, 1e-2, 1e-2, 1.0)
    assert len(bp.schedule.levels) == 2
    return bp


def _scratch(root) -> list:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("vlcc-disk-"))


def test_make_store_removes_the_temporary_directory_it_made(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    store = _two_level_plan().make_store()
    (made,) = _scratch(tmp_path)
    assert store.tiers[1].path == str(tmp_path / made)
    store.save(0, np.ones(10), level=1)
    store.close()
    assert list(tmp_path.iterdir()) == []  # nothing left, not even an empty folder
    store.close()  # idempotent


def test_run_adjoint_closes_the_store_and_so_removes_its_directory(tmp_path, monkeypatch):
    from vlcc_adjoint import run_adjoint

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    step = timestep(lambda u, i: u * 1.01, adjoint=lambda u, lam, i: lam * 1.01)
    n, u0 = 60, np.ones(STATE // 8)
    bp = plan(
        n,
        memory_bytes=6 * STATE,
        disk_bytes=20 * STATE,
        state_bytes=STATE,
        step_seconds=1e-3,
        copy_seconds=1e-5,
        write_seconds=1e-2,
        read_seconds=1e-2,
    )
    assert len(bp.schedule.levels) == 2
    store = bp.make_store()
    assert len(_scratch(tmp_path)) == 1
    result = run_adjoint(step, bp.schedule, u0, lambda u: u, store=store)
    np.testing.assert_allclose(result.adjoint, 1.01 ** (2 * n) * u0)
    assert list(tmp_path.iterdir()) == []


def test_a_store_at_the_callers_path_keeps_its_records(tmp_path):
    path = tmp_path / "ckpt.zarr"
    store = _two_level_plan().make_store(path)
    store.save(0, np.ones(10), level=1)
    store.close()
    assert (path / "zarr.json").is_file() and len(list(path.iterdir())) > 1
