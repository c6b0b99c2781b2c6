"""The two runs of each schedule kernel agree: its Python function and the
compiled kernel.

Small schedules are built, replayed and planned by the kernels' own Python
functions (``py_func``, :meth:`LazyKernel.python`) so that the first
schedule of a process never waits for numba; large ones by the compiled
kernels.  Both runs are forced here, one against the other: tables byte for
byte, replay results (errors included) and I/O plans exactly.  There is no
hand-written twin to drift: the Python run executes the kernel's own code.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.schedules.tables import moves_between_levels
from vlcc_adjoint.schedules import (
    LOAD,
    MOVE,
    SAVE,
    InvalidScheduleError,
    Level,
    Move,
    Multistage,
    Online,
    Periodic,
    Revolve,
    Save,
    Schedule,
    StoreAll,
    _io_plan,
    _revolve,
    _simulate,
    actions_to_table,
    io_plan,
    simulate,
)
from vlcc_adjoint.schedules._jit import LazyKernel, PythonBudget, njit, python_function

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _same(x, y) -> bool:
    """Tuples of ints and arrays equal item by item, arrays in dtype too."""
    if len(x) != len(y):
        return False
    for u, v in zip(x, y):
        if isinstance(u, np.ndarray) or isinstance(v, np.ndarray):
            u, v = np.asarray(u), np.asarray(v)
            if u.dtype != v.dtype or u.shape != v.shape or u.tobytes() != v.tobytes():
                return False
        elif int(u) != int(v):
            return False
    return True


def _both_tables(n, c):
    c = min(c, max(n - 1, 1))
    return (_revolve.revolve_table(n, c, python=True), _revolve.revolve_table(n, c, python=False))


@pytest.mark.parametrize("n", list(range(1, 70)) + [100, 257, 1000, 4321])
def test_revolve_python_table_is_the_kernel_table_byte_for_byte(n):
    for c in (1, 2, 3, 4, 5, 7, 10, 40, 200):
        py, nb = _both_tables(n, c)
        assert py.dtype == nb.dtype
        assert py.tobytes() == nb.tobytes(), (n, c)


def test_revolve_tables_agree_below_at_and_above_the_threshold():
    limit = _revolve._python_steps.limit
    for n in (limit - 1, limit, limit + 1):
        for c in (3, 25):
            py, nb = _both_tables(n, c)
            assert py.tobytes() == nb.tobytes(), (n, c)
    # The default choice: Python exactly up to the limit, the kernel above it.
    kernel = LazyKernel(lambda: None, {})
    assert PythonBudget(limit).take(limit, kernel)
    assert not PythonBudget(limit).take(limit + 1, kernel)


@pytest.mark.parametrize("n", [1, 2, 3, 9, 37, 300, 1001])
def test_online_and_baseline_tables_are_the_same_from_both_runs(n):
    from vlcc_adjoint.schedules import _baselines, _online

    for c in (1, 2, 3, 8):
        p = (c + 1) // 2
        py = _revolve.build_table(_online._emit_online, n, c, p, python=True)
        nb = _revolve.build_table(_online._emit_online, n, c, p, python=False)
        assert py.tobytes() == nb.tobytes(), (n, c)
    for k, level, buffer in ((1, 0, 0), (4, 0, 0), (7, 1, 1), (5, 0, 2), (n, 0, 0)):
        args = (n, min(k, n), level, buffer)
        py = _revolve.build_table(_baselines._emit_periodic, *args, python=True)
        nb = _revolve.build_table(_baselines._emit_periodic, *args, python=False)
        assert py.tobytes() == nb.tobytes(), args


def test_online_capture_decides_the_same_step_by_step_in_both_runs(monkeypatch):
    from vlcc_adjoint.schedules import _online

    runs = []
    for budget in (PythonBudget(10**9), PythonBudget(0)):
        monkeypatch.setattr(_online, "_python_steps", budget)
        online = Online(snapshots=5)
        runs.append([online.capture(i) for i in range(200)])
    assert runs[0] == runs[1]
    assert sum(len(actions) for actions in runs[0]) > 10  # saves and deletes were decided


def test_python_budget_is_spent_then_the_kernel_takes_over():
    kernel = LazyKernel(lambda: None, {})
    budget = PythonBudget(100)
    assert budget.take(60, kernel)
    assert budget.take(40, kernel)
    assert not budget.take(1, kernel)
    fresh = PythonBudget(100)
    kernel._dispatcher = object()  # a loaded kernel is always cheaper to run
    assert not fresh.take(1, kernel)


def test_revolve_default_path_matches_both_forced_paths(monkeypatch):
    for budget in (PythonBudget(0), PythonBudget(10**9)):
        monkeypatch.setattr(_revolve, "_python_steps", budget)
        for n, c in ((1, 1), (2, 5), (100, 10), (999, 3)):
            py, _ = _both_tables(n, c)
            assert Revolve(n, c).table.tobytes() == py.tobytes()


def _schedules():
    out = [Revolve(n, c) for n in (1, 2, 3, 10, 101, 1000) for c in (1, 2, 4, 9)]
    out += [
        StoreAll(1),
        StoreAll(40, level=1),
        Periodic(57, 8),
        Periodic(60, 7, level=1),
        Periodic(30, 4, level=0, buffer_level=2),
        Online(300, snapshots=5),
        Online(9, snapshots=1),
    ]
    out += [
        Multistage(60, [Level(3), Level(8, 2.0, 2.0)]),
        Multistage(40, [Level(2), Level(3, 0.5, 0.5), Level(10, 3.0, 4.0)], forward_cost=1.0),
    ]
    # A schedule with Moves (none of the classes above moves a record).
    out.append(moves_between_levels())
    return out


def _slots(schedule):
    big = np.iinfo(np.int64).max
    return np.array([big if lv.slots is None else lv.slots for lv in schedule.levels], np.int64)


def _replay(schedule, python):
    """``(error, index, registers)`` of the replay of the whole table."""
    err, index, _, regs = _simulate.replay_pieces(
        [schedule.table], schedule.n_steps, _slots(schedule), python
    )
    return err, index, regs


def _replay_both(schedule):
    py, nb = _replay(schedule, True), _replay(schedule, False)
    assert _same(py, nb), schedule
    return py


def test_replay_python_function_equals_compiled_kernel_on_every_schedule_class():
    for schedule in _schedules():
        assert _replay_both(schedule)[0] == 0, schedule


def test_the_python_run_is_the_kernels_own_code():
    for kernel in (_simulate.replay_rows, _io_plan.scan_rows, _revolve._emit_revolve):
        function = python_function(kernel)
        assert function.__code__ is kernel.py_func.__code__
        # The kernels it calls run as their own Python functions too.
        for name in kernel.py_func.__code__.co_names:
            callee = kernel.py_func.__globals__.get(name)
            if isinstance(callee, LazyKernel):
                assert function.__globals__[name].__code__ is callee.py_func.__code__


def test_no_schedule_module_keeps_a_python_twin_of_a_kernel():
    import ast
    import pathlib

    folder = pathlib.Path(_simulate.__file__).parent
    twins = [
        f"{path.name}: {node.name}"
        for path in sorted(folder.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef)
        and (node.name.endswith("_python") or node.name.startswith("_python"))
    ]
    assert twins == []


def _mutants(schedule, rng, count):
    """Tables with one random defect each (a field changed, a row dropped or swapped)."""
    t = schedule.table
    for _ in range(count):
        m = t.copy()
        i = int(rng.integers(len(m)))
        what = int(rng.integers(7))
        if what == 0:
            m["kind"][i] = rng.integers(0, 8)
        elif what == 1:
            m["a"][i] += rng.integers(-3, 4)
        elif what == 2:
            m["b"][i] = rng.integers(-1, schedule.n_steps + 3)
        elif what == 3:
            m["level"][i] = rng.integers(-1, 4)
        elif what == 4:
            m["dst"][i] = rng.integers(-1, 4)
        elif what == 5:
            m = np.delete(m, i)
        else:
            j = int(rng.integers(len(m)))
            m[[i, j]] = m[[j, i]]
        yield m


def test_replay_python_function_equals_kernel_on_broken_tables_with_every_error():
    rng = np.random.default_rng(7)
    errors = set()
    for schedule in _schedules():
        if len(schedule.table) < 2:
            continue
        for table in _mutants(schedule, rng, 60):
            broken = Schedule(table, schedule.n_steps, schedule.levels)
            errors.add(int(_replay_both(broken)[0]))
    # Moves are rare in the schedules: two tables that break them.
    for actions in ([Move(0, 0, 1)], [Save(0, 0), Save(0, 1), Move(0, 0, 1)]):
        broken = Schedule(actions_to_table(actions), 3, (Level(2), Level(2)))
        errors.add(int(_replay_both(broken)[0]))
    # The defects reach every check the replay makes.
    assert errors >= set(range(1, 17)), sorted(errors)


def test_simulate_gives_the_same_stats_and_errors_through_both_paths(monkeypatch):
    rng = np.random.default_rng(11)
    cases = list(_schedules())
    cases += [
        Schedule(t, s.n_steps, s.levels)
        for s in cases[:8]
        if len(s.table) > 1
        for t in _mutants(s, rng, 5)
    ]
    results = []
    for budget in (PythonBudget(10**9), PythonBudget(0)):
        monkeypatch.setattr(_simulate, "_python_rows", budget)
        got = []
        for schedule in cases:
            try:
                got.append(simulate(schedule))
            except InvalidScheduleError as error:
                got.append((str(error), error.index))
        results.append(got)
    assert results[0] == results[1]


def _scan(schedule, python):
    t = schedule.table
    kind = t["kind"]
    nsaves = int(np.count_nonzero((kind == SAVE) | (kind == MOVE)))
    nloads = int(np.count_nonzero((kind == LOAD) | (kind == MOVE)))
    return _io_plan.scan_pieces(
        [t], len(t), schedule.n_steps, len(schedule.levels), nsaves, nloads, python
    )


def test_io_plan_scan_python_function_equals_kernel():
    moves = 0
    for schedule in _schedules():
        assert _same(_scan(schedule, True), _scan(schedule, False)), schedule
        moves += int(np.count_nonzero(schedule.table["kind"] == MOVE))
    assert moves > 0  # the scans were compared on Moves too


def test_io_plan_is_the_same_through_both_paths(monkeypatch):
    plans = []
    for budget in (PythonBudget(10**9), PythonBudget(0)):
        monkeypatch.setattr(_io_plan, "_python_rows", budget)
        plans.append([io_plan(s) for s in _schedules()])
    for a, b in zip(*plans):
        assert a.records.tobytes() == b.records.tobytes()
        assert np.array_equal(a.record_of_action, b.record_of_action)
        assert len(a.levels) == len(b.levels)
        for x, y in zip(a.levels, b.levels):
            for name in ("index", "step", "record", "next_read_of_record"):
                assert np.array_equal(getattr(x, name), getattr(y, name)), name


def test_lazy_kernels_call_each_other_and_compile_once_called():
    @njit(nogil=True)
    def inner(x):
        return x + 1

    @njit(nogil=True)
    def outer(x):
        return inner(x) * 2

    assert not inner.loaded and not outer.loaded
    assert outer(3) == 8
    assert outer.loaded and inner.loaded  # the caller's compilation typed the callee


def _run(code: str, **extra_env: str) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(extra_env)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_first_small_schedule_runs_no_numba_kernel():
    out = _run("""
        import vlcc_adjoint
        from vlcc_adjoint.schedules import _io_plan, _revolve, _simulate
        s = vlcc_adjoint.Revolve(100, 10)
        s.stats()
        vlcc_adjoint.io_plan(s)
        print(_revolve._revolve_fill.loaded, _simulate.replay_rows.loaded,
              _io_plan.scan_rows.loaded)
    """)
    assert out.split() == ["False", "False", "False"]


def test_import_and_a_small_schedule_do_not_import_numba():
    out = _run("""
        import sys
        import vlcc_adjoint
        vlcc_adjoint.Revolve(100, 10).stats()
        print("numba" in sys.modules)
    """)
    assert out.split() == ["False"]


def test_load_kernels_makes_every_size_run_the_kernels():
    out = _run("""
        import vlcc_adjoint
        from vlcc_adjoint.schedules import _io_plan, _jit, _revolve, _simulate, load_kernels
        load_kernels()
        left = (_revolve._python_steps.left, _simulate._python_rows.left,
                _io_plan._python_rows.left)
        s = vlcc_adjoint.Revolve(100, 10)
        s.stats()
        vlcc_adjoint.io_plan(s)
        spent = left != (_revolve._python_steps.left, _simulate._python_rows.left,
                         _io_plan._python_rows.left)
        print(all(k.loaded for k in _jit._KERNELS), len(_jit._KERNELS) > 3, spent)
    """)
    assert out.split() == ["True", "True", "False"]  # no plain-Python work charged


def test_kernels_that_read_the_kind_constants_compile_and_load_from_the_cache(tmp_path):
    """The action kinds are module-level ints that numba freezes into the
    compiled code; the kernels that read them still cache: a second process
    loads them from numba's cache instead of compiling again."""
    code = """
        import numpy as np
        from vlcc_adjoint.schedules import Revolve, _io_plan, _simulate, io_plan, simulate
        from vlcc_adjoint.schedules._jit import PythonBudget
        _simulate._python_rows = PythonBudget(0)
        _io_plan._python_rows = PythonBudget(0)
        s = Revolve(60, 4)
        stats = simulate(s)
        io_plan(s).records
        for kernel in (_simulate.replay_rows, _io_plan.scan_rows):
            d = kernel.dispatcher.stats
            print(sum(d.cache_hits.values()), sum(d.cache_misses.values()))
        print(stats.forward_count)
    """
    cache = str(tmp_path / "numba-cache")
    first = _run(code, NUMBA_CACHE_DIR=cache).split()
    second = _run(code, NUMBA_CACHE_DIR=cache).split()
    assert first[-1] == second[-1] == str(Revolve(60, 4).stats().forward_count)
    assert first[:4] == ["0", "1", "0", "1"]  # compiled (a miss each)
    assert second[:4] == ["1", "0", "1", "0"]  # loaded from the cache
