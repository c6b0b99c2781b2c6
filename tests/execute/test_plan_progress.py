"""plan() and its long solves: an estimate first, how to plan faster, progress, a clean stop.

The exact two-level program of :func:`vlcc_adjoint.plan` can take minutes
(a disk budget of a few hundred states); the user is told early how long,
how to make it faster, and how far it is.  :class:`SolveProgress` is driven
here with a clock of the test's own (no timing is asserted), and once
through a real solve of a few seconds with its thresholds lowered.
"""

from __future__ import annotations

import io

import pytest

import vlcc_adjoint.budget as budget
from vlcc_adjoint import plan
from vlcc_adjoint.budget import SolveProgress

STATE = 1000


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _drive(progress, clock, rate, total, seconds, tick=0.25):
    """Call `progress` as the solve's watcher would, `rate` lengths a second."""
    done = 0
    while done < total and clock.now - 100.0 < seconds:
        clock.now += tick
        done = min(total, int(rate * (clock.now - 100.0)))
        progress(done, total)
    return done


def test_a_short_solve_stays_quiet():
    clock, lines = _Clock(), []
    progress = SolveProgress("solving X", "do less", say=lines.append, clock=clock)
    done = _drive(progress, clock, rate=1000, total=5000, seconds=60)
    assert done == 5000 and lines == []


def test_a_long_solve_says_how_long_and_how_to_be_faster_then_how_far_it_is():
    clock, lines = _Clock(), []
    progress = SolveProgress("solving X", "give fewer disk slots", say=lines.append, clock=clock)
    _drive(progress, clock, rate=100, total=10_000, seconds=1000)
    first = lines[0]
    assert first.startswith("solving X will take about 1.7 min")  # 10,000 at 100 a second
    assert "Ctrl-C stops it" in first and first.endswith("to plan faster, give fewer disk slots")
    middle = lines[1:-1]
    assert len(middle) >= 5  # a line every PROGRESS_LINE_SECONDS of a 100 s solve
    assert all("of 10,000 lengths" in line and "left" in line for line in middle)
    assert lines[-1] == "solving X: solved in 1.7 min"


def test_on_a_terminal_the_progress_is_a_bar():
    clock, stream = _Clock(), _Terminal()
    progress = SolveProgress("solving X", "do less", stream=stream, clock=clock)
    _drive(progress, clock, rate=100, total=3000, seconds=1000)
    text = stream.getvalue()
    assert "will take about 30 s" in text
    assert "3000/3000" in text and "length" in text  # tqdm's bar, finished
    assert text.rstrip().endswith("solving X: solved in 30 s")


def test_closing_after_an_interrupt_leaves_no_bar_open():
    clock, stream = _Clock(), _Terminal()
    progress = SolveProgress("solving X", "do less", stream=stream, clock=clock)
    _drive(progress, clock, rate=100, total=3000, seconds=5)
    assert progress.bar is not None
    progress.close()
    assert progress.bar is None and "X: solved in" not in stream.getvalue()


def _long_plan(**options):
    # Multistage(1000, [10, 50]): about a second or more of solving; the
    # costs are given, so nothing is calibrated.
    return plan(
        1000,
        memory_bytes=13 * STATE,
        disk_bytes=50 * (STATE + budget.DISK_RECORD_OVERHEAD * 5),
        state_bytes=STATE,
        step_seconds=1.0,
        copy_seconds=1.0,
        write_seconds=8.0,
        read_seconds=8.0,
        **options,
    )


def test_plan_announces_a_long_solve_before_it_ends_and_shows_its_progress(monkeypatch):
    monkeypatch.setattr(budget, "LONG_SOLVE_SECONDS", 0.0)
    monkeypatch.setattr(budget, "ESTIMATE_AFTER_SECONDS", 0.3)
    monkeypatch.setattr(budget, "RATE_WINDOW_SECONDS", 0.2)
    monkeypatch.setattr(budget, "PROGRESS_LINE_SECONDS", 0.0)
    lines = []
    bp = _long_plan(verbose=lines.append)
    assert "Multistage(1000, memory 10 + disk 50)" in bp.explain
    solving = [line for line in lines if "Multistage(1000" in line]
    assert (
        solving[0] == "plan: solving the two-level schedule: Multistage(1000, memory 10 + disk 50)"
    )
    estimate = solving[1]
    assert "will take about" in estimate and "to plan faster, give a smaller disk_bytes" in estimate
    assert any("of 1,000 lengths" in line for line in solving[2:-1])
    assert "solved in" in solving[-1]


def test_plan_hands_the_counts_to_a_progress_callable():
    calls = []
    _long_plan(progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (1000, 1000)


def test_plan_without_progress_prints_nothing(monkeypatch, capsys):
    monkeypatch.setattr(budget, "LONG_SOLVE_SECONDS", 0.0)
    monkeypatch.setattr(budget, "ESTIMATE_AFTER_SECONDS", 0.0)
    _long_plan(progress=False)
    assert capsys.readouterr() == ("", "")


def test_plan_shows_a_long_solve_on_standard_error_by_default(monkeypatch, capsys):
    monkeypatch.setattr(budget, "LONG_SOLVE_SECONDS", 0.0)
    monkeypatch.setattr(budget, "ESTIMATE_AFTER_SECONDS", 0.3)
    monkeypatch.setattr(budget, "RATE_WINDOW_SECONDS", 0.2)
    _long_plan()
    out, err = capsys.readouterr()
    assert out == ""
    assert "plan: solving Multistage(1000, memory 10 + disk 50) will take about" in err
    assert "solved in" in err


@pytest.mark.parametrize("value", [0, 1])
def test_progress_on_a_memory_only_plan_changes_nothing(value):
    bp = plan(
        50,
        memory_bytes=10 * STATE,
        state_bytes=STATE,
        step_seconds=1.0,
        copy_seconds=0.1,
        progress=bool(value),
    )
    assert bp.schedule.levels[0].slots == 10
