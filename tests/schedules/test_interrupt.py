"""Ctrl-C while a schedule is being planned is a clean ``KeyboardInterrupt``.

A numba kernel cannot be interrupted: the interpreter runs its signal
handler once the kernel has returned, and a ``KeyboardInterrupt`` raised
while the kernel's result is being converted to Python objects left a tuple
with a missing item behind (a segmentation fault when unpacked).  Each case
starts a process that plans a large schedule, sends it SIGINT mid-way, and
checks that it ends with a ``KeyboardInterrupt`` traceback, promptly.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

CASES = {
    "multistage": "Multistage(20_000, [Level(30), Level(60, 10.0, 10.0)])",
    # plan() solving Multistage(20_000, memory 20 + disk 60) with its progress shown
    "plan": "plan(20_000, 23_000, 60 * 21_480, state_bytes=1000, step_seconds=1.0, "
    "copy_seconds=0.0, write_seconds=10.0, read_seconds=10.0)",
    "revolve": "[Revolve(10_000_000, 20) for _ in range(1000)]",
    # simulate() remembers a schedule's result: replay fresh wrappers of one table.
    "simulate": "[simulate(Schedule(rows, table.n_steps, table.levels)) for _ in range(1000)]",
}

SCRIPT = """
import signal
import sys
# A shell starts background jobs with SIGINT ignored, and children inherit it:
# restore Python's own handler, the one an interactive run has.
signal.signal(signal.SIGINT, signal.default_int_handler)
from vlcc_adjoint import plan
from vlcc_adjoint.schedules import Level, Multistage, Revolve, Schedule, simulate
table = Revolve(2_000_000, 10) if sys.argv[1] == "simulate" else None
rows = table.table if table is not None else None  # built before the clock starts
Multistage(50, [Level(3), Level(4, 2.0, 2.0)])  # compiled (or loaded from the cache) before the clock starts
print("ready", flush=True)
{body}
print("finished", flush=True)
"""


def _interrupt(case: str, after: float) -> subprocess.CompletedProcess:
    script = SCRIPT.replace(
        "{body}",
        "case = sys.argv[1]\n"
        + "\n".join(f"if case == {name!r}: {code}" for name, code in CASES.items()),
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, case],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(after)
    proc.send_signal(signal.SIGINT)
    t0 = time.perf_counter()
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, out, err
    ), time.perf_counter() - t0


@pytest.mark.parametrize("case", list(CASES))
def test_ctrl_c_while_planning_raises_keyboard_interrupt(case):
    for attempt in range(3):
        result, seconds = _interrupt(case, after=1.0 + 0.3 * attempt)
        assert result.returncode != -signal.SIGSEGV, f"segmentation fault: {result.stderr}"
        assert "finished" not in result.stdout, "the interrupt came too late to test anything"
        assert result.stderr.rstrip().endswith("KeyboardInterrupt"), result.stderr
        assert result.returncode in (1, -signal.SIGINT), result.returncode
        assert seconds < 20, f"took {seconds:.1f} s to stop"


CLI = """
import signal
import sys
# As an interactive shell starts it (see SCRIPT).
signal.signal(signal.SIGINT, signal.default_int_handler)
from vlcc_adjoint.cli import build_parser, main
from vlcc_adjoint.schedules import Level, Multistage
Multistage(50, [Level(3), Level(4, 2.0, 2.0)])  # compiled (or loaded from the cache) before the clock starts
build_parser()  # the lineage commands' modules imported before it starts, too
print("ready", flush=True)
sys.exit(main(["plan", "multistage", "--steps", "20000", "--snapshots", "30", "--disk", "60"]))
"""


def test_ctrl_c_during_vlcc_plan_multistage_exits_130_with_one_line():
    """``vlcc plan multistage`` stops on Ctrl-C within seconds, with its one
    line and the shell's status for an interrupt, not a traceback."""
    for attempt in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", CLI],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(1.0 + 0.3 * attempt)
        proc.send_signal(signal.SIGINT)
        t0 = time.perf_counter()
        out, err = proc.communicate(timeout=120)
        if "n_steps" in out:
            continue  # the solve ended before the interrupt came: try again
        assert proc.returncode == 130, err
        assert err.rstrip().endswith("vlcc: interrupted") and "Traceback" not in err, err
        assert time.perf_counter() - t0 < 20
        return
    pytest.fail("the solve always ended before the interrupt: nothing was tested")
