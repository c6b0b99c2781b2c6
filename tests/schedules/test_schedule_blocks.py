"""Schedules produced in chunks: the same rows as the whole tables, in bounded memory.

Revolve (large n) and Multistage keep the state of the recursion that emits
their rows, one per chunk, instead of the table (``schedules/_chunks.py``).
These tests pin down that every way of reading such a schedule (blocks of any
size from any row, indexing, iteration, the lazily materialised table) gives
the rows of the whole-table emitter (Revolve) or of the emitter run as one
chunk (Multistage, whose rows are checked to cost the optimum), byte for byte, that simulate and io_plan
read it without materialising it, and that the windowed plan equals the plan's
arrays.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.schedules.tables import moves_between_levels
from vlcc_adjoint.schedules import (
    ACTION_DTYPE,
    ADVANCE,
    DELETE,
    LOAD,
    REVERSE,
    InvalidScheduleError,
    Level,
    Multistage,
    Periodic,
    Revolve,
    Schedule,
    StoreAll,
    _chunks,
    _revolve,
    binomial_forward_count,
    io_plan,
    simulate,
)
from vlcc_adjoint.schedules._chunks import ChunkedTable
from vlcc_adjoint.schedules._jit import PythonBudget
from vlcc_adjoint.schedules._plan_windows import plan_windows


def _old_revolve(n, c):
    """The whole table of the original emitter (one kernel call, no chunks)."""
    return _revolve.build_table(_revolve._emit_revolve, n, min(c, max(n - 1, 1)))


def _one_chunk_multistage(n, levels, fwd, monkeypatch):
    """The table of ``Multistage(n, levels)`` emitted as a single chunk."""
    with monkeypatch.context() as m:
        m.setattr(_chunks, "CHUNK_ROWS", 1 << 20)
        schedule = Multistage(n, levels, forward_cost=fwd)
        assert schedule._source.chunks == 1
        return schedule.table


@pytest.fixture
def kernel_revolve(monkeypatch):
    """Revolve always through the chunked kernel (never the Python table)."""
    monkeypatch.setattr(_revolve, "_python_steps", PythonBudget(0))


def _concat(schedule, rows=1 << 16, start=0):
    parts = list(schedule.blocks(rows=rows, start=start))
    return np.concatenate(parts) if parts else np.empty(0, ACTION_DTYPE)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 10, 33, 100, 257, 1000, 4321])
def test_revolve_chunks_are_the_whole_table_for_every_chunk_size(n):
    for c in (1, 2, 3, 5, 10, 40, 200):
        ref = _old_revolve(n, c).tobytes()
        for limit in (3, 4, 5, 11, 64, 1 << 16):
            source = ChunkedTable(
                _revolve._revolve_fill, _revolve.revolve_state(n, min(c, max(n - 1, 1))), limit
            )
            assert all(source.starts[1:] - source.starts[:-1] <= limit)
            rows = np.concatenate([source.chunk(k) for k in range(source.chunks)])
            assert rows.tobytes() == ref, (n, c, limit)


def test_revolve_blocks_equal_the_table_from_any_start_and_size(kernel_revolve, monkeypatch):
    monkeypatch.setattr(_chunks, "CHUNK_ROWS", 50)
    for n, c in ((1, 1), (2, 1), (60, 3), (500, 7), (999, 40)):
        schedule = Revolve(n, c)
        assert not schedule.materialised
        ref = _old_revolve(n, c)
        assert len(schedule) == len(ref)
        for rows in (1, 2, 49, 50, 51, 1000):
            for start in (0, 1, 49, 50, len(ref) // 2, len(ref) - 1, len(ref), len(ref) + 3):
                blocks = list(schedule.blocks(rows=rows, start=start))
                assert all(0 < len(b) <= rows for b in blocks)
                assert all(not b.flags.writeable and b.dtype == ACTION_DTYPE for b in blocks)
                got = np.concatenate(blocks) if blocks else np.empty(0, ACTION_DTYPE)
                assert got.tobytes() == ref[start:].tobytes(), (n, c, rows, start)
        assert not schedule.materialised
        # Indexing and iteration read the chunks too; the table is built on demand.
        for i in {0, min(1, len(ref) - 1), len(ref) // 3, len(ref) - 1, -1}:
            assert schedule[i] == Schedule(ref, n)[i]
        assert schedule[3:40] == Schedule(ref, n)[3:40]
        assert list(schedule) == list(Schedule(ref, n))
        with pytest.raises(IndexError):
            schedule[len(ref)]
        assert not schedule.materialised
        assert schedule.table.tobytes() == ref.tobytes()
        assert schedule.materialised and not schedule.table.flags.writeable


def test_large_revolve_holds_states_not_rows_and_counts_are_binomial(kernel_revolve):
    n, c = 200_000, 20
    schedule = Revolve(n, c)
    assert schedule._source.nbytes < len(schedule) * ACTION_DTYPE.itemsize / 50
    stats = schedule.stats()
    assert stats.forward_count == binomial_forward_count(n, c)
    assert stats.actions == len(schedule)
    io_plan(schedule)
    assert not schedule.materialised
    assert _concat(schedule).tobytes() == _old_revolve(n, c).tobytes()


MULTISTAGE_CASES = [
    (1, [Level(3), Level(4, 10, 10)], 3.0),
    (2, [Level(3), Level(4, 10, 10)], 3.0),
    (5, [Level(1)], 1.0),
    (200, [Level(3), Level(4, 10, 10)], 3.0),
    (1000, [Level(3), Level(4, 10, 10)], 3.0),
    (300, [Level(10), Level(20, 5, 5)], 1.0),
    (333, [Level(2), Level(3, 0.5, 0.5), Level(10, 3.0, 4.0)], 1.0),
    (700, [Level(4), Level(7, 1.3, 2.9)], 0.7),
    (2500, [Level(2), Level(6, 5, 5)], 1.0),
]


@pytest.mark.parametrize("n, levels, fwd", MULTISTAGE_CASES)
def test_multistage_blocks_are_the_whole_table(n, levels, fwd, monkeypatch):
    """Chunks of 37 rows, read in blocks of any size from any row, give the rows
    of the emitter run in one chunk; those rows cost what the dynamic program
    says is optimal (simulated, an independent reading of the rows)."""
    ref = _one_chunk_multistage(n, levels, fwd, monkeypatch)
    monkeypatch.setattr(_chunks, "CHUNK_ROWS", 37)
    schedule = Multistage(n, levels, forward_cost=fwd)
    assert not schedule.materialised
    assert len(schedule) == len(ref)
    for rows, start in ((1 << 16, 0), (7, 0), (36, 5), (38, len(ref) // 2)):
        assert _concat(schedule, rows, start).tobytes() == ref[start:].tobytes()
    # One decision per distinct segment: far fewer than rows.
    assert len(schedule.decisions.keys) <= max(1, len(ref) // 3)
    stats = schedule.stats()
    assert stats.predicted_time == pytest.approx(schedule.optimal_time, rel=1e-12)
    assert stats == Schedule(ref, n, levels, fwd).stats()
    assert schedule.table.tobytes() == ref.tobytes()


def test_concatenate_copies_rows_byte_for_byte():
    rng = np.random.default_rng(3)
    table = np.zeros(500, ACTION_DTYPE)
    table["a"] = np.arange(500)
    table["kind"] = rng.integers(0, 6, 500)
    cuts = np.sort(rng.choice(np.arange(1, 500), 40, replace=False))
    joined = _chunks.concatenate(np.split(table, cuts))
    assert joined.dtype == ACTION_DTYPE and joined.tobytes() == table.tobytes()
    assert len(_chunks.concatenate([])) == 0


def _table_source(table, limit):
    """A ChunkedTable serving a given table: rows from state[0] on."""

    def fill(out, write, state, lim):
        first = int(state[0])
        rows = min(lim, len(table) - first)
        if write:
            out[:rows] = table[first : first + rows]
        state[0] = first + rows
        return rows

    return ChunkedTable(fill, np.zeros(1, np.int64), limit)


def _mutants(table, n, rng, count):
    for _ in range(count):
        m = table.copy()
        i = int(rng.integers(len(m)))
        what = int(rng.integers(4))
        if what == 0:
            m["a"][i] += rng.integers(-3, 4)
        elif what == 1:
            m["kind"][i] = rng.integers(0, 7)
        elif what == 2:
            m = np.delete(m, i)
        else:
            m["level"][i] = rng.integers(-1, 3)
        yield m


@pytest.mark.parametrize("python", [True, False])
def test_simulate_across_chunks_equals_one_pass_on_valid_and_broken_tables(python, monkeypatch):
    from vlcc_adjoint.schedules import _simulate

    monkeypatch.setattr(_simulate, "_python_rows", PythonBudget(10**9 if python else 0))
    rng = np.random.default_rng(5)
    bases = [
        (_old_revolve(300, 4), 300, (Level(4),)),
        (Periodic(80, 9, level=1).table, 80, (Level(None), Level(None))),
        (Multistage(120, [Level(2), Level(3, 1, 1)]).table, 120, (Level(2), Level(3, 1, 1))),
    ]
    errors = set()
    for table, n, levels in bases:
        for m in [table] + list(_mutants(table, n, rng, 40)):
            expect = got = None
            try:
                expect = simulate(Schedule(m, n, levels))
            except InvalidScheduleError as error:
                expect = (str(error), error.index)
                errors.add(error.index >= 0)
            for limit in (1, 5, 64):
                try:
                    got = simulate(Schedule(_table_source(m, limit), n, levels))
                except InvalidScheduleError as error:
                    got = (str(error), error.index)
                assert got == expect, (limit, expect, got)
    assert errors == {True}  # the mutants did break tables


def _plan_arrays(plan):
    out = [plan.records.tobytes(), plan.record_of_action.tobytes()]
    for lv in plan.levels:
        out += [
            lv.index.tobytes(),
            lv.step.tobytes(),
            lv.record.tobytes(),
            lv.next_read_of_record.tobytes(),
        ]
    return out


def _window_fields(w):
    return [w.start, w.stop] + [
        getattr(w, f).tobytes()
        for f in ("index", "kind", "step", "level", "dst", "record", "source", "next_read")
    ]


def _schedules_with_moves():
    return [moves_between_levels()]


def test_io_plan_is_lazy_and_its_windows_equal_its_arrays(kernel_revolve, monkeypatch):
    monkeypatch.setattr(_chunks, "CHUNK_ROWS", 23)
    cases = [
        Revolve(400, 5),
        Revolve(3000, 30),
        StoreAll(40, level=1),
        Periodic(57, 8),
        Multistage(300, [Level(3), Level(4, 10, 10)], 3.0),
        Multistage(120, [Level(2), Level(3, 0.5, 0.5), Level(10, 3.0, 4.0)]),
    ]
    cases += _schedules_with_moves()
    for schedule in cases:
        held = schedule.materialised
        plan = io_plan(schedule)
        assert not plan.materialised
        streamed = list(plan_windows(plan, streamed=True))
        assert not plan.materialised and schedule.materialised == held
        # The arrays, built from the chunks, equal those built from the table.
        eager = io_plan(Schedule(schedule.table, schedule.n_steps, schedule.levels))
        assert _plan_arrays(plan) == _plan_arrays(eager)
        cut = list(plan_windows(plan, streamed=False))
        assert [_window_fields(w) for w in streamed] == [_window_fields(w) for w in cut]
        # Every I/O action once, in order, with the record and next read of the arrays.
        index = np.concatenate([w.index for w in streamed])
        kinds = schedule.table["kind"]
        assert np.array_equal(index, np.flatnonzero((kinds >= 1) & (kinds <= 4)))
        record = np.concatenate([w.record for w in streamed])
        assert np.array_equal(record, plan.record_of_action[index])
        for w in streamed:
            for q in range(len(w)):
                expect = (
                    -1 if w.kind[q] == 3 else plan.next_use(int(w.record[q]), int(w.index[q]) + 1)
                )
                assert w.next_read[q] == expect
        # Windows from a later action start at the chunk holding it.
        later = list(plan.windows(start=int(schedule.chunk_starts()[-1]) - 1))
        assert len(later) == 1 and later[0].stop == len(schedule)


def test_window_reads_list_each_levels_reads_in_order():
    for schedule in _schedules_with_moves() + [Periodic(57, 8, level=1)]:
        plan = io_plan(schedule)
        for lv in plan.levels:
            idx, rec = zip(*(w.reads(lv.level) for w in plan.windows()))
            assert np.array_equal(np.concatenate(idx), lv.index)
            assert np.array_equal(np.concatenate(rec), lv.record)


@pytest.mark.parametrize("room", [3, 4, 7, 50])
def test_a_restart_paused_for_room_resumes_with_the_same_rows(room):
    """restart_rows, the restart from a base shared by every emitter: paused
    whenever fewer than 3 rows of room are left, its pieces are the rows of
    one uninterrupted call, and they reverse every step with l (l - 1) / 2
    forward steps from a base loaded before every step but the first."""
    s, hi, level = 10, 17, 1
    whole = np.zeros(64, ACTION_DTYPE)
    end, j = _revolve.restart_rows(whole, 0, True, s, hi, hi, level, _revolve.NO_LIMIT)
    assert j == s - 1
    whole = whole[:end]
    pieces, j = [], hi
    while j >= s:
        out = np.zeros(room, ACTION_DTYPE)
        end, j = _revolve.restart_rows(out, 0, True, s, hi, j, level, room)
        assert 0 < end <= room
        pieces.append(out[:end])
    assert np.array_equal(np.concatenate(pieces), whole)
    kinds = whole["kind"].tolist()
    reversed_steps = [int(a) for a, k in zip(whole["a"], kinds) if k == REVERSE]
    assert reversed_steps == list(range(hi, s - 1, -1))
    advances = whole[whole["kind"] == ADVANCE]
    assert int((advances["b"] - advances["a"]).sum()) == (hi - s + 1) * (hi - s) // 2
    assert kinds.count(LOAD) == hi - s and kinds.count(DELETE) == 1 and kinds[-2] == DELETE
    assert set(whole["level"][whole["kind"] == LOAD].tolist()) == {level}
