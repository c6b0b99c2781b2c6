"""examples/mpi_heat_lineage.py under mpiexec: restart on another rank count, suspend, branch.

The referee is the example's serial :func:`reference` (one process, the
global array, the same stencil): the field a distributed run ends with,
however often it was restarted on however many ranks, must equal it bit for
bit.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from vlcc_adjoint.lineage import History

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mpi_heat_lineage.py"
sys.path.insert(0, str(ROOT / "tests" / "mpi"))

from test_mpi import MPIEXEC, needs_mpi  # noqa: E402

pytestmark = needs_mpi


def _example():
    spec = importlib.util.spec_from_file_location("mpi_heat_lineage", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env() -> dict:
    return dict(
        os.environ,
        OMP_NUM_THREADS="1",
        NUMBA_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )


def _run(n: int, *args, timeout: float = 120) -> str:
    proc = subprocess.run(
        [MPIEXEC, "-n", str(n), sys.executable, str(EXAMPLE), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_restart_on_3_ranks_suspend_on_a_signal_and_branch(tmp_path):
    ex = _example()
    path = tmp_path / "heat.vlcc"
    n = 24

    # checkpoint-restart: 4 ranks to step 40, then 3 ranks from the newest version to 60
    assert "started main on 4 ranks" in _run(4, path, "--steps", 40, "--n", n)
    out = _run(3, path, "--steps", 60, "--n", n)
    assert "resumed main from step 40 on 3 ranks" in out
    with History(path, mode="r") as h:
        state = h.load("main")
        assert state["step"] == 60 and state["u"].tobytes() == ex.reference(n, 60).tobytes()
        assert [v.meta["step"] for v in h.log("main")] == [60, 50, 40, 30, 20, 10, 0]

    # suspend: SIGUSR1 to rank 0 of a slow 2-rank run; every rank commits and exits with 0
    proc = subprocess.Popen(
        [MPIEXEC, "-n", "2", sys.executable, str(EXAMPLE), str(path)]
        + ["--steps", "100000", "--n", str(n), "--every", "1000", "--delay", "0.01"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        pid = None
        while pid is None:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()[-3000:]
            if line.startswith("rank 0 pid "):
                pid = int(line.split()[-1])
        assert "resumed main from step 60 on 2 ranks" in proc.stdout.readline()
        time.sleep(1.0)
        os.kill(pid, signal.SIGUSR1)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "suspended at step" in rest
    with History(path, mode="r") as h:
        v = h.version("main")
        stopped = v.meta["step"]
        assert v.message == f"suspended at {stopped}" and 60 < stopped < 100000
    # resume on 3 ranks and finish: the field equals one uninterrupted serial run
    final = stopped + 7
    out = _run(3, path, "--steps", final, "--n", n)
    assert f"resumed main from step {stopped} on 3 ranks" in out
    with History(path, mode="r") as h:
        assert h.load("main")["u"].tobytes() == ex.reference(n, final).tobytes()
        at = next(v.id for v in h.log("main") if v.meta["step"] == 40)

    # branch at step 40 with another diffusivity, then compare the two branches
    out = _run(3, path, "--branch", "alt", "--at", at, "--kappa", 0.05, "--steps", 60, "--n", n)
    assert "branched alt at step 40 with kappa 0.05" in out
    with History(path, mode="r") as h:
        alt = h.load("alt")
        assert alt["kappa"] == 0.05 and alt["step"] == 60
        main60 = next(v.id for v in h.log("main") if v.meta["step"] == 60)
        changed = [leaf.path for leaf in h.diff(main60, "alt").leaves if leaf.status != "same"]
        assert changed == [f"state['u'][{r}]" for r in range(3)], changed
    shown = subprocess.run(
        [sys.executable, str(EXAMPLE), str(path), "--diff", main60, "alt"],
        capture_output=True,
        text=True,
        env=_env(),
        check=True,
    ).stdout
    assert "state['kappa']: 0.2 -> 0.05" in shown and "max |a - b|" in shown


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
