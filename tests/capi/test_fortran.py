"""Fortran programs run adjoints and lineage through the module ``vlcc``: the
answers on regions of every type and rank the generic protect takes, the
example, bad calls, versions committed from Fortran read by Python and
versions committed from Python checked out from Fortran."""

from __future__ import annotations

import json

import numpy as np
import pytest
from capi_support import EXAMPLES, PROGRAMS, ROOT, SCHEDULES, run_program

from vlcc_adjoint.lineage import History


def _values(k: int, shape: tuple[int, ...]) -> np.ndarray:
    """The region of version (or step) `k` as Python sees it: C order, the
    elements k * 100 + 0, 1, 2, ... in memory order."""
    return (k * 100 + np.arange(int(np.prod(shape)))).reshape(shape)


#: The history regions of programs/regions.f90 as Python sees them: the
#: Fortran shapes reversed, numpy's dtypes.
HISTORY_REGIONS = {
    "x": ((2, 3, 4), np.float64),  # real(real64) :: x(4, 3, 2)
    "s": ((), np.float32),  # real(real32) :: s
    "ids": ((3,), np.int32),  # integer(int32) :: ids(3)
    "m": ((3, 2), np.int64),  # integer(int64) :: m(2, 3)
}


@pytest.mark.parametrize("name", ["revolve", "multistage-zarr"])
def test_every_answer_finds_the_fortran_regions_holding_the_state_it_names(
    name, fortran_program, tmp_path
):
    config, steps = SCHEDULES[name]
    exe = fortran_program(PROGRAMS / "regions.f90")
    out = run_program(exe, "run", json.dumps(config), str(steps), cwd=tmp_path).stdout
    assert out.strip() == f"ok: 1 turn, {steps} adjoint steps", out


def test_the_fortran_answers_check_catches_a_wrong_step_count(fortran_program, tmp_path):
    exe = fortran_program(PROGRAMS / "regions.f90")
    config = json.dumps(SCHEDULES["revolve"][0])
    proc = run_program(exe, "run", config, "39", cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "violation" in proc.stdout, proc.stdout


def test_the_fortran_example_gradients_are_bitwise_those_of_store_all_and_pass_taylor(
    fortran_program, tmp_path
):
    exe = fortran_program(EXAMPLES / "fortran" / "heat_adjoint.f90")
    out = run_program(exe, str(tmp_path), cwd=tmp_path).stdout
    assert "Revolve(500, 10) gradient bitwise equal to store-all: yes" in out
    assert "Multistage(memory 3 + zarr disk 12) gradient bitwise equal to store-all: yes" in out
    assert "Taylor test passed: yes" in out
    assert (tmp_path / "heat_checkpoints_f.zarr").is_dir()
    assert list(ROOT.glob("*.mod")) == []  # the compiler's module files went elsewhere


#: name -> (code, a part of the message); 1 argument, 2 handle, 3 state.
BAD_CALLS = {
    "next_null": (2, "run is NULL"),
    "open_bad_json": (1, "config_json is not valid JSON"),
    "open_trailing_blanks": (0, ""),
    "protect_strided": (1, "the array is not contiguous"),
    "protect_rank_4": (1, "rank 0 to 3"),
    "protect_trailing_blank_name": (0, ""),
    "protect_twice": (1, "'u' is already protected"),
    "protect_same_memory": (1, "overlaps region 'u'"),
    "run_to_done": (0, ""),
    "next_after_done": (3, "the run is over"),
    "close": (0, ""),
    "close_closed": (2, "not an open run handle"),
    "next_closed": (2, "not an open run handle"),
    "history_commit_null": (2, "history is NULL"),
}


def test_bad_fortran_calls_get_a_code_and_the_whole_message(fortran_program, tmp_path):
    exe = fortran_program(PROGRAMS / "regions.f90")
    proc = run_program(exe, "errors", cwd=tmp_path)
    assert proc.stdout.rstrip().endswith("the end"), proc.stdout
    got = {}
    for line in proc.stdout.splitlines():
        if line.count("|") >= 3:
            name, code, length, message = line.split("|", 3)
            got[name] = (int(code), int(length), message)
    for name, (code, part) in BAD_CALLS.items():
        assert name in got, f"{name} did not run:\n{proc.stdout}"
        got_code, length, message = got[name]
        assert got_code == code, f"{name}: {got[name]}"
        assert part in message, f"{name}: {got[name]}"
        # vlcc_last_error() is exactly the message: no blank padding, nothing cut
        assert length == len(message.encode()), f"{name}: {got[name]}"
        if code:
            assert message.startswith("vlcc_") and not message.endswith(" "), message


def test_versions_committed_from_fortran_are_read_by_python_in_c_order(fortran_program, tmp_path):
    exe = fortran_program(PROGRAMS / "regions.f90")
    path = tmp_path / "h"
    out = run_program(exe, "commit", str(path), "2", cwd=tmp_path).stdout
    ids = [line.split()[2] for line in out.splitlines() if line.startswith("version ")]
    assert len(ids) == 2 and all(len(v) == 12 for v in ids), out
    with History(path, mode="r") as h:
        for k, vid in enumerate(ids):
            state = h.load(vid)
            assert list(state) == list(HISTORY_REGIONS)
            for name, (shape, dtype) in HISTORY_REGIONS.items():
                array = np.asarray(state[name])
                assert array.shape == shape and array.dtype == dtype, name
                np.testing.assert_array_equal(array, _values(k, shape).astype(dtype))
        assert h.version(ids[1]).message == "from Fortran"


def test_versions_committed_from_python_are_checked_out_from_fortran(fortran_program, tmp_path):
    exe = fortran_program(PROGRAMS / "regions.f90")
    path = tmp_path / "h"
    with History(path) as h:
        for k in (3, 4):
            h.commit(
                {
                    name: _values(k, shape).astype(dtype)
                    for name, (shape, dtype) in HISTORY_REGIONS.items()
                },
                message=f"from Python {k}",
            )
        h.tag("three", "HEAD~1")
    assert (
        run_program(exe, "checkout", str(path), "three", cwd=tmp_path).stdout.split() == ["3"] * 4
    )
    assert run_program(exe, "checkout", str(path), "HEAD", cwd=tmp_path).stdout.split() == ["4"] * 4
