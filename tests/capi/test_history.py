"""Lineage across languages: versions committed from C are read by Python's
``History``, by zarr-python and by tensorstore (a second zarr v3
implementation, in C++); versions committed from Python are checked out from C;
a C program killed during a commit leaves every earlier version readable."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import numpy as np
import pytest
from capi_support import CLEAN_ENV, PROGRAMS, run_program

from vlcc_adjoint.lineage import History

SIZE = 1000  # elements of the region "u"


def _expected(k: int, size: int = SIZE) -> np.ndarray:
    return k * 1e6 + np.arange(size, dtype=np.float64)


def _versions(stdout: str) -> list[str]:
    return [line.split()[2] for line in stdout.splitlines() if line.startswith("version ")]


def test_versions_committed_from_c_are_dicts_of_the_protected_names_in_python(c_program, tmp_path):
    exe = c_program(PROGRAMS / "history.c")
    path = tmp_path / "h"
    ids = _versions(run_program(exe, "commit", str(path), str(SIZE), "3", cwd=tmp_path).stdout)
    assert len(ids) == 3
    with History(path, mode="r") as h:
        for k, vid in enumerate(ids):
            state = h.load(vid)
            assert list(state) == ["u", "n"]
            np.testing.assert_array_equal(state["u"], _expected(k))
            assert state["u"].dtype == np.float64
            assert int(state["n"]) == k and np.asarray(state["n"]).dtype == np.int64
        assert [v.id for v in h.log()] == ids[::-1]  # on main, newest first
        assert h.version(ids[0]).message == "from C"


def test_versions_committed_from_c_open_with_zarr_and_tensorstore(c_program, tmp_path):
    zarr = pytest.importorskip("zarr")
    ts = pytest.importorskip("tensorstore")
    exe = c_program(PROGRAMS / "history.c")
    path = tmp_path / "h"
    ids = _versions(run_program(exe, "commit", str(path), str(SIZE), "2", cwd=tmp_path).stdout)
    with History(path, mode="r") as h:
        arrays = {vid: {leaf.path: leaf.array for leaf in h.leaves(vid)} for vid in ids}
    group = zarr.open_group(str(path), mode="r")
    for k, vid in enumerate(ids):
        where = arrays[vid]["state['u']"]
        np.testing.assert_array_equal(group[where][...], _expected(k))
        store = ts.open(
            {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path / where)}},
            open=True,
        ).result()
        np.testing.assert_array_equal(store.read().result(), _expected(k))
        scalar = group[arrays[vid]["state['n']"]][...]
        assert scalar.shape == () and int(scalar) == k


def test_versions_committed_from_python_are_checked_out_from_c(c_program, tmp_path):
    exe = c_program(PROGRAMS / "history.c")
    path = tmp_path / "h"
    with History(path) as h:
        first = h.commit({"u": _expected(7, 5), "n": np.int64(7)}, message="numpy scalar")
        h.commit({"n": np.array(8, dtype=np.int64), "u": _expected(8, 5)}, message="other order")
        h.tag("eight", "HEAD")
    out = run_program(exe, "checkout", str(path), "5", first, cwd=tmp_path).stdout
    assert out.split() == ["7", "7000000.0", "7000004.0"]
    out = run_program(exe, "checkout", str(path), "5", "eight", cwd=tmp_path).stdout
    assert out.split() == ["8", "8000000.0", "8000004.0"]


def test_a_version_that_does_not_fit_the_regions_is_refused_naming_the_difference(
    c_program, tmp_path
):
    exe = c_program(PROGRAMS / "history.c")
    path = tmp_path / "h"
    with History(path) as h:
        wrong_shape = h.commit({"u": np.zeros(4), "n": np.int64(1)})
        wrong_names = h.commit({"v": np.zeros(5), "n": np.int64(1)})
    proc = run_program(exe, "checkout", str(path), "5", wrong_shape, cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "shape (4,)" in proc.stdout, proc.stdout
    proc = run_program(exe, "checkout", str(path), "5", wrong_names, cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "missing: ['u']" in proc.stdout, proc.stdout


def test_commits_on_a_branch_and_a_history_left_open_at_exit_is_closed(c_program, tmp_path):
    exe = c_program(PROGRAMS / "history.c")
    path = tmp_path / "h"
    run_program(exe, "commit", str(path), str(SIZE), "1", cwd=tmp_path)
    ids = _versions(
        run_program(exe, "commit", str(path), str(SIZE), "2", "side", cwd=tmp_path).stdout
    )
    late = _versions(
        run_program(exe, "commit-exit", str(path), str(SIZE), "2", cwd=tmp_path).stdout
    )
    with History(path, mode="r") as h:
        assert h.branches["side"] == ids[-1]
        for k, vid in enumerate(late):  # committed in the background, finished at exit
            np.testing.assert_array_equal(h.load(vid)["u"], _expected(k))


def test_a_c_program_killed_during_a_commit_leaves_every_earlier_version_readable(
    c_program, tmp_path
):
    exe = c_program(PROGRAMS / "history.c")
    path = tmp_path / "h"
    size = 1 << 20  # 8 MiB per version: a commit takes a while
    proc = subprocess.Popen(
        [str(exe), "churn", str(path), str(size)],
        cwd=tmp_path,
        env=CLEAN_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    visible: list[tuple[int, str]] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while len(visible) < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("visible "):
                _, k, vid = line.split()
                visible.append((int(k), vid))
        time.sleep(0.05)  # inside the next commits
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        assert proc.stderr is not None
        errors = proc.stderr.read()
    assert len(visible) == 3, f"the program stopped early: {errors}"
    with History(path) as h:  # opens for writing: the debris of the killed commit is swept
        for k, vid in visible:
            state = h.load(vid)
            assert int(state["n"]) == k
            np.testing.assert_array_equal(state["u"], _expected(k, size))
        for version in h.log(all=True):  # nothing visible is damaged
            state = h.load(version.id)
            np.testing.assert_array_equal(state["u"], _expected(int(state["n"]), size))
        h.commit({"u": np.zeros(3)}, branch="after")  # and it takes new versions
